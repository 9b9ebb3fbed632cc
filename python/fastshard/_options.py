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
import math
import numbers
import operator
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, SupportsIndex, TypedDict

from . import _native
from ._budget import Budget
from .crypt import EncryptionKey, native_key
from .errors import InvalidArgumentError, UnsupportedError

MiB = 1 << 20


class StoreOptions(TypedDict, total=False):
    """Where an S3 object or URL is, which credentials to use, how hard to
    retry; the native ``Reader``, ``write_file`` and object calls take them
    too. ``None`` means "look it up"; unknown names raise InvalidArgumentError.

    s3_endpoint: URL of the S3 API (``http://`` only when it says so; a bare
        host gets ``https://``).
    s3_access_key_id, s3_secret_access_key: static keys, both or neither;
        two empty strings ask for anonymous access (tensorizer's convention).
    s3_session_token: with the explicit keys.
    s3_region: signing region (else AWS_REGION, AWS_DEFAULT_REGION, the
        profile, then us-east-1).
    s3_profile: AWS profile name (else AWS_PROFILE).
    s3_config_path: an s3cmd config to read instead of ``~/.s3cfg``.
    s3_addressing: "auto" (path style for custom endpoints, virtual hosts
        for AWS), "path" or "virtual".
    ca_bundle: PEM file of extra trusted CAs; S3 falls back to AWS_CA_BUNDLE,
        https:// URLs use only this option.
    s3_anonymous: send unsigned requests, whatever credentials exist.
    gcs_endpoint: base URL of the Cloud Storage API (an emulator's; else
        STORAGE_EMULATOR_HOST, else Google's).
    gcs_service_account: a service-account key file (JSON) for gs:// URIs.
    gcs_anonymous: unsigned gs:// requests (public buckets).
    max_attempts: attempts per ranged read, the first included (default 10);
        only transient failures (5xx, 503 SlowDown, resets, timeouts, short
        bodies) are retried, with jittered exponential backoff.
    deadline_seconds: stop retrying this many seconds after the Reader (or
        the write) was created.

    Credentials not given explicitly come from, in order: S3_ACCESS_KEY_ID/
    S3_SECRET_ACCESS_KEY (vLLM), ``~/.s3cfg`` [default] (access_key,
    secret_key; with its host_base and use_https), the AWS chain (AWS_*
    variables, AWS_PROFILE, ~/.aws/credentials and ~/.aws/config, web
    identity, containers; EC2 metadata only on EC2), else anonymous. The
    endpoint: s3_endpoint, S3_ENDPOINT_URL, .s3cfg host_base (when its keys
    were used), AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's
    endpoint_url, else AWS. For gs://: gcs_service_account, gcs_anonymous,
    GOOGLE_APPLICATION_CREDENTIALS, gcloud's default credentials, the metadata
    server; requests to STORAGE_EMULATOR_HOST are unsigned unless a service
    account is given.
    """

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
    # (``fastshard._engine.mapped``) instead of copies in private memory.
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
    values = checked(opts)
    out: dict[str, Any] = {}
    for key, value in opts.items():
        if key not in SOURCE or value is None:
            continue
        if key in _PATHS:
            if not isinstance(value, (str, os.PathLike)):
                raise InvalidArgumentError(f"{key} must be a path, not {type(value).__name__}")
            value = os.fspath(value)
        out[key] = values.get(key, value)
    return out


# The largest values the native layer's unsigned integers hold; a bigger one
# (or a negative one) was a bare OverflowError from the conversion.
_U32, _U64 = (1 << 32) - 1, (1 << 64) - 1


@dataclass(frozen=True)
class _Range:
    """What a numeric option accepts: whole numbers (an int or anything with
    ``__index__``, never a bool) or finite real numbers, from ``low`` (itself
    refused when ``above``) to ``high`` (None: no bound)."""

    low: int
    high: int | None = None
    whole: bool = True
    above: bool = False
    power_of_two: bool = False

    def __str__(self) -> str:
        high = {_U32: "2**32 - 1", _U64: "2**64 - 1"}.get(self.high or 0, str(self.high))
        if self.power_of_two:
            return f"a power of two from {self.low} to {high}"
        if self.whole:
            return f"a whole number from {self.low} to {high}"
        return f"a finite number {'greater than' if self.above else 'of at least'} {self.low}"

    def take(self, value: object) -> int | float | None:
        """``value`` as an int or float when it is in range, else None."""
        number: int | float
        if isinstance(value, bool):  # an int to Python, never meant as a count
            return None
        if self.whole and isinstance(value, SupportsIndex):
            number = operator.index(value)
        elif not self.whole and isinstance(value, numbers.Real):
            number = float(value)
        else:
            return None
        ok = math.isfinite(number) and (number > self.low if self.above else number >= self.low)
        ok = ok and (self.high is None or number <= self.high)
        if ok and self.power_of_two:
            ok = int(number) & (int(number) - 1) == 0
        return number if ok else None


# Every numeric option of open, load and save, checked here before any read
# or write starts (the native layer would raise later, or overflow).
NUMBERS: dict[str, _Range] = {
    "concurrency": _Range(1, _U64),  # reads in flight
    "part_size_bytes": _Range(1, _U64),
    "max_host_bytes": _Range(1, _U64),
    "throughput_target_gbps": _Range(0, whole=False, above=True),
    "max_attempts": _Range(1, _U32),  # the first attempt included
    # 0 passes at once: the load itself fails, not only its retries.
    "deadline_seconds": _Range(0, whole=False, above=True),
    "cache_max_bytes": _Range(0, _U64),  # 0: nothing is kept
    # The native writer's MAX_ALIGN (rust/format/writer.rs), which checks too.
    "align": _Range(1, 4096, power_of_two=True),
}
# Options that are True or False; None means the default (progress: only on
# a terminal, for big loads).
FLAGS = frozenset({"verify_hash", "mmap", "progress", "s3_anonymous", "gcs_anonymous"})


def checked(opts: Mapping[str, Any]) -> dict[str, Any]:
    """The numeric and on/off options among ``opts`` (``None`` left out),
    checked against NUMBERS and FLAGS: ints, floats and bools."""
    out: dict[str, Any] = {}
    for key, value in opts.items():
        if value is None:
            continue
        if key in NUMBERS:
            number = NUMBERS[key].take(value)
            if number is None:
                raise InvalidArgumentError(f"{key} must be {NUMBERS[key]}, not {value!r}")
            out[key] = number
        elif key in FLAGS:
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"{key} must be True or False, not {value!r}")
            out[key] = value
    return out


def _unknown(key: str, known: Iterable[str], where: str = "") -> InvalidArgumentError:
    """The error for an option nobody knows, with the known names it is
    closest to (a misspelt ``verify_hashes``), else all of them."""
    names = sorted(known)
    close = difflib.get_close_matches(key, names, n=2, cutoff=0.75)
    if close:
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?"
    else:
        hint = f"; the options are {', '.join(names)}"
    return InvalidArgumentError(f"unknown option {key!r}{where}{hint}")


def open_settings(opts: Mapping[str, Any]) -> OpenSettings:
    """Check the options of an open (unknown names raise) and split them."""
    others = ("max_host_bytes", "progress", "mmap")
    for key in opts:
        if key not in _NATIVE_LOAD and key not in SOURCE and key not in others:
            raise _unknown(key, {*_NATIVE_LOAD, *SOURCE, *others})
    values = {**opts, **checked(opts)}
    native = {k: v for k, v in values.items() if k in _NATIVE_LOAD}
    if "verify_hash" in native:
        native["verify_hash"] = bool(native["verify_hash"])  # None: off
    if "encryption" in native:
        native["encryption"] = native_key(native["encryption"])
    source = source_options(opts)
    mmap = bool(values.get("mmap"))
    budget = Budget(values.get("max_host_bytes"))
    return OpenSettings(source, native, budget, values.get("progress"), mmap)


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
    out.update(checked({"align": align}))
    return out


def without_key(native: Mapping[str, Any]) -> dict[str, Any]:
    """Save options for objects that are not tensor files (the manifest):
    the encryption key and the alignment are only for tensor files."""
    return {k: v for k, v in native.items() if k not in ("encryption", "align")}
