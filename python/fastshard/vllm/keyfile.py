"""vLLM's ``encryption_keyfile``, read for the loader and the serializer
alike. Imports neither torch nor vLLM, so the serializer does not pull in
the loader (and vLLM's loader registry) just to read a key."""

from __future__ import annotations

from typing import Any

from .. import _native
from ..crypt import EncryptionKey
from ..errors import NotFoundError
from ..reader import source_options

_KEY_MAX_BYTES = 64


def encryption_key(keyfile: str, opts: dict[str, Any]) -> EncryptionKey:
    """The key in ``keyfile``: a local path, or an ``s3://`` / ``http(s)://``
    object read with the weights' source options."""
    if "://" in keyfile and not keyfile.startswith("file://"):
        raw = _native.read_object(keyfile, max_bytes=_KEY_MAX_BYTES, **source_options(opts))
        if raw is None:
            raise NotFoundError(f"encryption_keyfile {keyfile} does not exist", uri=keyfile)
        return EncryptionKey.from_bytes(raw)
    return EncryptionKey.from_file(keyfile.removeprefix("file://"))
