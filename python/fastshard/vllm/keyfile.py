"""vLLM's ``encryption_keyfile``, read for the loader and the serializer
alike. Imports neither torch nor vLLM, so the serializer does not pull in
the loader (and vLLM's loader registry) just to read a key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import _core
from .._core import location as _location
from .._core import source_options
from ..crypt import EncryptionKey
from ..errors import NotFoundError

_KEY_MAX_BYTES = 64


def encryption_key(keyfile: str, opts: Mapping[str, Any]) -> EncryptionKey:
    """The key in ``keyfile``: a local path, or an ``s3://`` / ``http(s)://``
    object read with the weights' source options."""
    path = _location.local_path(keyfile)
    if path is not None:
        return EncryptionKey.from_file(path)
    raw = _core.read_object(keyfile, max_bytes=_KEY_MAX_BYTES, **source_options(opts))
    if raw is None:
        shown = _location.display(keyfile)
        raise NotFoundError(f"encryption_keyfile {shown} does not exist", uri=shown)
    return EncryptionKey.from_bytes(raw)
