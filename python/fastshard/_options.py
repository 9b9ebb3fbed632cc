"""Every option of open, load and save: what each one is (the TypedDicts
the public functions take), checking and splitting them (the one place
that does). The memory budget, ``max_host_bytes``, is a ``Budget``
(_budget.py).

Source options say where an object is and how to reach it; the native
layer owns their list (``_native.SOURCE_OPTIONS``), so the two cannot
disagree (tests/test_api.py checks the TypedDict against it). Load options
go to every native load of an opened file; ``progress`` stays in Python.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from . import _native, _progress
from ._budget import Budget
from .crypt import EncryptionKey, native_key
from .errors import InvalidArgumentError, UnsupportedError

MiB = 1 << 20


class StoreOptions(TypedDict, total=False):
    """Where an S3 object or URL is, which credentials to use, how hard to
    retry (``fastshard.open``'s docstring says what each one means). ``None``
    means "look it up"."""

    s3_endpoint: str | None
    s3_access_key_id: str | None
    s3_secret_access_key: str | None
    s3_session_token: str | None
    s3_region: str | None
    s3_profile: str | None
    s3_config_path: str | os.PathLike[str] | None
    s3_addressing: Literal["auto", "path", "virtual"] | None
    ca_bundle: str | os.PathLike[str] | None
    s3_anonymous: bool | None
    gcs_endpoint: str | None
    gcs_service_account: str | os.PathLike[str] | None
    gcs_anonymous: bool | None
    max_attempts: int | None
    deadline_seconds: float | None


class CacheOptions(TypedDict, total=False):
    """The node-local cache a load reads remote objects through."""

    cache_dir: str | os.PathLike[str] | None
    cache_max_bytes: int | None


class SourceOptions(StoreOptions, CacheOptions, total=False):
    """The source options of a load: the store's, and the node cache's."""


class LoadOptions(TypedDict, total=False):
    """How the tensors of an opened file are read."""

    verify_hash: bool
    concurrency: int | None
    part_size_bytes: int | None
    max_host_bytes: int | None
    throughput_target_gbps: float | None
    encryption: EncryptionKey | None
    progress: bool | None
    mmap: bool


class OpenOptions(SourceOptions, LoadOptions, total=False):
    """The options of ``fastshard.open``, ``load_state_dict`` and ``load``."""


class SaveOptions(StoreOptions, total=False):
    """The options of ``fastshard.save`` and ``save_sharded``."""

    encryption: EncryptionKey | None
    align: int | None


SOURCE = frozenset(_native.SOURCE_OPTIONS)
# A save writes to the store alone: a cache option there would be ignored.
_CACHE = frozenset(CacheOptions.__optional_keys__)
# What every native load of a file takes (``Reader.load``), budget aside.
_NATIVE_LOAD = frozenset(
    {"verify_hash", "concurrency", "part_size_bytes", "throughput_target_gbps", "encryption"}
)
_PATHS = frozenset({"s3_config_path", "ca_bundle", "gcs_service_account", "cache_dir"})


@dataclass(frozen=True)
class OpenSettings:
    """The options of one open, checked: for the native source, for every
    native load, the memory budget, and the progress bar."""

    source: dict[str, Any] = field(default_factory=dict)
    native: dict[str, Any] = field(default_factory=dict)
    budget: Budget = Budget()
    progress: bool | None = None
    # load_state_dict returns views of the file mapped copy-on-write
    # (``_mapped``) instead of copies in private memory.
    mmap: bool = False

    @property
    def verify_hash(self) -> bool:
        return bool(self.native.get("verify_hash"))

    @property
    def encrypted(self) -> bool:
        return self.native.get("encryption") is not None


def source_options(opts: Mapping[str, Any]) -> dict[str, Any]:
    """The source options among ``opts``, checked and normalised (paths as
    str, ``None`` dropped so the native layer looks the value up itself)."""
    out: dict[str, Any] = {}
    for key, value in opts.items():
        if key not in SOURCE or value is None:
            continue
        if key in _PATHS:
            if not isinstance(value, (str, os.PathLike)):
                raise InvalidArgumentError(f"{key} must be a path, not {type(value).__name__}")
            value = os.fspath(value)
        elif key in ("s3_anonymous", "gcs_anonymous"):
            value = bool(value)
        out[key] = value
    return out


# Options counted in whole units (reads, bytes): a positive int each.
_COUNTS = ("concurrency", "part_size_bytes", "max_host_bytes")


def _unknown(key: str, known: Iterable[str], where: str = "") -> InvalidArgumentError:
    """The error for an option nobody knows, with the known names it is
    closest to (a misspelt ``verify_hashes``)."""
    close = difflib.get_close_matches(key, sorted(known), n=2, cutoff=0.75)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return InvalidArgumentError(f"unknown option {key!r}{where}{hint}")


def _check_count(key: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{key} must be a positive whole number, not {value!r}")


def open_settings(opts: Mapping[str, Any]) -> OpenSettings:
    """Check the options of an open (unknown names raise) and split them."""
    native: dict[str, Any] = {}
    others = ("max_host_bytes", "progress", "mmap")
    for key, value in opts.items():
        if key in _NATIVE_LOAD:
            native[key] = value
        elif key not in SOURCE and key not in others:
            raise _unknown(key, {*_NATIVE_LOAD, *SOURCE, *others})
    for key in _COUNTS:
        _check_count(key, opts.get(key))
    if "verify_hash" in native:
        native["verify_hash"] = bool(native["verify_hash"])
    if "encryption" in native:
        native["encryption"] = native_key(native["encryption"])
    source = source_options(opts)
    progress = opts.get("progress")
    _progress.wanted(progress, 0)  # a bad value fails now, not after the open
    mmap = opts.get("mmap", False)
    if not isinstance(mmap, bool):
        raise InvalidArgumentError(f"mmap must be True or False, not {mmap!r}")
    return OpenSettings(source, native, Budget(opts.get("max_host_bytes")), progress, mmap)


def save_settings(opts: Mapping[str, Any]) -> dict[str, Any]:
    """Check the options of a save; the native ``write_file`` options."""
    rest = dict(opts)
    encryption = native_key(rest.pop("encryption", None))
    align = rest.pop("align", None)
    for key in rest:
        if key == "progress":
            raise UnsupportedError("save shows no progress bar yet: progress is a load option")
        if key in _CACHE:
            raise InvalidArgumentError(
                f"{key} is a load option: save writes to the store, not through the node cache"
            )
        if key not in SOURCE:
            raise _unknown(key, {*SOURCE, "encryption", "align"} - _CACHE, " for save")
    out = source_options(rest)
    if encryption is not None:
        out["encryption"] = encryption
    if align is not None:
        if not isinstance(align, int) or isinstance(align, bool):
            raise InvalidArgumentError(f"align must be a number of bytes, not {align!r}")
        out["align"] = align  # the native writer checks the value
    return out


def without_key(native: Mapping[str, Any]) -> dict[str, Any]:
    """Save options for objects that are not tensor files (the manifest):
    the encryption key and the alignment are only for tensor files."""
    return {k: v for k, v in native.items() if k not in ("encryption", "align")}
