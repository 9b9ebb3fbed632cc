"""``fastshard.EncryptionKey``: the key of an encrypted tensorizer file.

Files are encrypted the way tensorizer 2.12.1 does it (XSalsa20-Poly1305
over 2 MiB chunks, the MACs in each record header), so either library reads
what the other wrote. A key is a raw 32-byte key (tensorizer's
``EncryptionParams(key)``/``DecryptionParams.from_key``, vLLM's
``encryption_keyfile``) or a passphrase (``EncryptionParams.from_string``/
``DecryptionParams.from_string``: Argon2id, with the costs and salt stored in
the file). The secret is never shown by ``repr`` or in error messages.
"""

from __future__ import annotations

import os
import secrets
from typing import Literal

from .errors import InvalidArgumentError

KEY_BYTES = 32
# libsodium's crypto_pwhash MODERATE preset: tensorizer's from_string default.
OPSLIMIT_MODERATE = 3
MEMLIMIT_MODERATE = 256 << 20
_MEMLIMIT_MIN = 8192

_Kind = Literal["key", "passphrase"]
# What the native module takes as ``encryption=`` (_native._EncryptionTuple).
NativeKey = tuple[_Kind, bytes, int, int]


class EncryptionKey:
    """Pass as ``encryption=`` to ``fastshard.open``, ``load_state_dict``,
    ``load`` and ``save``. Build one with :meth:`from_passphrase`,
    :meth:`from_bytes`, :meth:`from_file` or :meth:`random`."""

    __slots__ = ("_kind", "_secret", "opslimit", "memlimit")

    def __init__(self, kind: _Kind, secret: bytes, opslimit: int, memlimit: int) -> None:
        self._kind = kind
        self._secret = secret
        self.opslimit = opslimit
        self.memlimit = memlimit

    @classmethod
    def from_passphrase(
        cls,
        passphrase: str | bytes,
        *,
        opslimit: int = OPSLIMIT_MODERATE,
        memlimit: int = MEMLIMIT_MODERATE,
    ) -> EncryptionKey:
        """A passphrase (UTF-8 if ``str``). Reading takes the Argon2id costs
        and salt from the file; ``opslimit`` (passes) and ``memlimit``
        (bytes) only apply when saving, as in tensorizer's ``from_string``
        (default: libsodium's MODERATE, about a second and 256 MiB)."""
        secret = passphrase.encode("utf-8") if isinstance(passphrase, str) else passphrase
        if not isinstance(secret, bytes) or not secret:
            raise InvalidArgumentError("the passphrase must be a non-empty str or bytes")
        if opslimit < 1 or memlimit < _MEMLIMIT_MIN:
            raise InvalidArgumentError(
                f"opslimit must be >= 1 and memlimit >= {_MEMLIMIT_MIN} bytes"
            )
        return cls("passphrase", secret, int(opslimit), int(memlimit))

    @classmethod
    def from_bytes(cls, key: bytes | bytearray | memoryview) -> EncryptionKey:
        """A raw 32-byte key (tensorizer's ``EncryptionParams.key``)."""
        raw = bytes(key)
        if len(raw) != KEY_BYTES:
            raise InvalidArgumentError(
                f"an encryption key must be {KEY_BYTES} bytes, not {len(raw)} "
                "(use from_passphrase for a passphrase)"
            )
        return cls("key", raw, OPSLIMIT_MODERATE, MEMLIMIT_MODERATE)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> EncryptionKey:
        """A key file holding the raw 32 bytes (vLLM's ``encryption_keyfile``,
        as ``tensorize_vllm_model`` writes it)."""
        with open(path, "rb") as f:
            raw = f.read(KEY_BYTES + 1)
        if len(raw) != KEY_BYTES:
            raise InvalidArgumentError(
                f"key file {os.fspath(path)!r} must hold exactly {KEY_BYTES} bytes"
            )
        return cls.from_bytes(raw)

    @classmethod
    def random(cls) -> EncryptionKey:
        """A fresh random key; keep :attr:`key_bytes` (or :meth:`to_file`) to read
        the file later."""
        return cls.from_bytes(secrets.token_bytes(KEY_BYTES))

    @property
    def key_bytes(self) -> bytes:
        """The raw key (only for keys that are not passphrases)."""
        if self._kind != "key":
            raise InvalidArgumentError("a passphrase key has no fixed raw bytes")
        return self._secret

    def to_file(self, path: str | os.PathLike[str]) -> None:
        """Write the raw key to ``path`` (created with mode 0600)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(self.key_bytes)

    def native(self) -> NativeKey:
        """What ``fastshard._native`` takes as ``encryption=``."""
        return (self._kind, self._secret, self.opslimit, self.memlimit)

    def __repr__(self) -> str:
        if self._kind == "key":
            return "EncryptionKey(<32-byte key>)"
        return f"EncryptionKey(<passphrase>, opslimit={self.opslimit}, memlimit={self.memlimit})"

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("EncryptionKey is not picklable: pass the key file or passphrase instead")


def native_key(value: object) -> NativeKey | None:
    """The native form of an ``encryption=`` option value."""
    if value is None:
        return None
    if not isinstance(value, EncryptionKey):
        raise InvalidArgumentError(
            "encryption must be a fastshard.EncryptionKey "
            f"(from_passphrase, from_bytes or from_file), not {type(value).__name__}"
        )
    return value.native()
