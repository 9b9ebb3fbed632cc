"""The one exception hierarchy. The native module raises these classes (it
imports this module), so Python and Rust errors look the same to callers."""

from __future__ import annotations


class FastshardError(Exception):
    """Base class. ``uri``, ``tensor`` and ``byte_range`` locate the failure
    when known; messages never contain credentials. ``reason`` names a
    condition callers act on, e.g. ``"index_too_small"`` (tensorizer's fixed
    index cannot hold the entries); None for most errors."""

    def __init__(
        self,
        message: str,
        *,
        uri: str | None = None,
        tensor: str | None = None,
        byte_range: tuple[int, int] | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.uri = uri
        self.tensor = tensor
        self.byte_range = byte_range
        self.reason = reason


class FormatError(FastshardError):
    """The bytes are not a valid tensorizer file, or disagree with its index."""


class IntegrityError(FastshardError):
    """A stored hash or authentication tag did not match the data."""


class ShardMismatchError(FastshardError):
    """Shard files or ranks do not fit the requested world size."""


class PeerFailedError(FastshardError):
    """Another rank of a cooperative load failed, died or left, so this
    rank's load stopped too (nothing it loaded is returned)."""


class StorageError(FastshardError):
    """The storage (file system, S3, HTTP) failed."""


class NotFoundError(StorageError, FileNotFoundError):
    """The file, object or bucket does not exist."""


class AuthError(StorageError):
    """Credentials were missing or rejected."""


class ThrottledError(StorageError):
    """The store kept asking us to slow down."""


class ObjectChangedError(StorageError):
    """The object changed while it was being read."""


class InvalidArgumentError(FastshardError, ValueError):
    """An option, buffer or name the caller passed cannot be used."""


class BudgetError(InvalidArgumentError):
    """``max_host_bytes`` is smaller than one piece that cannot be split
    (one read of the plan, one row of a tensor to stage)."""


class DeviceError(InvalidArgumentError):
    """The requested device does not exist here (no CUDA, or no such index)."""


class UnsupportedError(FastshardError):
    """A request this build cannot serve: a feature of the file (a newer
    format version, a dtype this torch lacks), or an option or scheme this
    kind of source or load does not take. Not a FormatError: the file may be
    perfectly valid."""


__all__ = [
    "AuthError",
    "BudgetError",
    "DeviceError",
    "FastshardError",
    "FormatError",
    "IntegrityError",
    "InvalidArgumentError",
    "NotFoundError",
    "ObjectChangedError",
    "PeerFailedError",
    "ShardMismatchError",
    "StorageError",
    "ThrottledError",
    "UnsupportedError",
]
