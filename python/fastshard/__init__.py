"""fastshard: model weights from storage into torch, fast.

Loads tensorizer ``.tensors`` files and safetensors files (one file, or a
Hugging Face checkpoint's index and shards) from local files, S3 and
S3-compatible stores, HTTP(S) URLs and Google Cloud Storage (``gs://``) into
torch tensors on the CPU or a CUDA GPU (staged through pinned memory), each
rank of a tensor-parallel group reading only its own bytes; writes
tensorizer files; and plugs into vLLM (``--load-format fastshard``, and
``tensorizer`` taken over).

The torch-facing API is imported on first use, so ``fastshard inspect`` and
``fastshard verify`` start quickly and work without torch installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .crypt import EncryptionKey
from .errors import (
    AuthError,
    BudgetError,
    DeviceError,
    FastshardError,
    FormatError,
    IntegrityError,
    InvalidArgumentError,
    NotFoundError,
    ObjectChangedError,
    PeerFailedError,
    ShardMismatchError,
    StorageError,
    ThrottledError,
    UnsupportedError,
)

if TYPE_CHECKING:
    from ._engine.slabs import release as release_staging
    from ._types import LoadStats, TensorInfo
    from .module import load
    from .reader import TensorFile, load_state_dict, open
    from .tp import ShardSpec
    from .writer import save, save_sharded


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fastshard")
    except PackageNotFoundError:
        return "0+unknown"


__version__ = _version()

_LAZY = {
    "open": "reader",
    "load_state_dict": "reader",
    "TensorFile": "reader",
    "TensorInfo": "_types",
    "LoadStats": "_types",
    "load": "module",
    "save": "writer",
    "save_sharded": "writer",
    "ShardSpec": "tp",
    "release_staging": "_engine.slabs",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastshard' has no attribute {name!r}")
    from importlib import import_module

    attr = "release" if name == "release_staging" else name
    value = getattr(import_module(f".{module}", __name__), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AuthError",
    "BudgetError",
    "DeviceError",
    "EncryptionKey",
    "FastshardError",
    "FormatError",
    "IntegrityError",
    "InvalidArgumentError",
    "LoadStats",
    "NotFoundError",
    "ObjectChangedError",
    "PeerFailedError",
    "ShardMismatchError",
    "ShardSpec",
    "StorageError",
    "TensorFile",
    "TensorInfo",
    "ThrottledError",
    "UnsupportedError",
    "__version__",
    "load",
    "load_state_dict",
    "open",
    "release_staging",
    "save",
    "save_sharded",
]
