"""Reading: ``fastshard.open`` / ``TensorFile`` and ``fastshard.load_state_dict``."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch

from . import _native, _progress, _ring, _torch, packed, shard, tp
from ._nested import restructure
from .crypt import native_key
from .errors import (
    InvalidArgumentError,
    NotFoundError,
    ShardMismatchError,
)

PathPart = str | int
NameOrPath = str | Sequence[PathPart]
StateDict = dict[str, torch.Tensor] | dict[Any, Any] | list[Any]

# Options of one native load (``Reader.load``).
_LOAD_OPTS = frozenset(
    {
        "verify_hash",
        "concurrency",
        "part_size_bytes",
        "max_host_bytes",
        "encryption",
        "throughput_target_gbps",
    }
)
# Options of the source (``Reader(uri, **opts)``, ``write_file``): where an
# S3 object or URL is, which credentials to use, how hard to retry.
# The native layer owns the list, so the two can never disagree.
SOURCE_OPTS = frozenset(_native.SOURCE_OPTIONS)
_PATH_OPTS = frozenset({"s3_config_path", "ca_bundle"})
# Options of the load that stay in Python (the native load never sees them).
_PY_LOAD_OPTS = frozenset({"progress"})


@dataclass(frozen=True)
class TensorInfo:
    """What the index says about one tensor. ``nbytes`` is its size in memory
    (meta tensors store no bytes but load as zeros of this size); ``offset`` is
    the absolute file offset of its data; ``path`` is set for nested
    (0x1E path) names; ``tensor_type`` is 0 param, 1 buffer, 2 state dict."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int
    offset: int
    path: tuple[PathPart, ...] | None
    tensor_type: int


@dataclass
class LoadStats:
    """Counters of one load. ``seconds`` is the wall time of the whole call
    (allocation, reads, casts, device copies); ``gbps`` = bytes_fetched /
    seconds / 1e9. ``bytes_wanted`` is what the load needed (tensor bytes
    and record headers); ``read_amplification`` = bytes_fetched /
    bytes_wanted (gap bytes bridged between wanted ranges, e.g. the columns
    of other ranks in a row-parallel slice). ``peak_host_bytes``: most
    memory the load held at once beyond the destinations (record headers,
    gap scratch, staging slabs for casts and device copies, exchange
    buffers); with ``max_host_bytes`` it never exceeds that budget.
    ``bytes_staged``: tensor bytes that went through the staging slabs
    (destinations on CUDA or of another dtype) rather than straight into
    their destination. Phases: ``discovery_seconds`` (the open: header and
    index), ``plan_seconds`` (matching names, slicing, allocating, until
    the first read), ``fetch_seconds`` (time in native loads) and
    ``copy_seconds`` (the calling thread copying or casting staged bytes
    and waiting for device copies). The staging ring fetches while it
    copies, so the phases can add up to more than ``seconds``."""

    bytes_fetched: int = 0
    bytes_wanted: int = 0
    read_amplification: float = 0.0
    requests: int = 0
    retries: int = 0
    seconds: float = 0.0
    gbps: float = 0.0
    peak_host_bytes: int = 0
    concurrency: int = 0
    bytes_staged: int = 0
    discovery_seconds: float = 0.0
    plan_seconds: float = 0.0
    fetch_seconds: float = 0.0
    copy_seconds: float = 0.0

    def add(self, other: LoadStats, held: int = 0) -> None:
        """Fold in the stats of one more native call of the same load, made
        while ``held`` bytes of temporaries were alive."""
        self.bytes_fetched += other.bytes_fetched
        self.bytes_wanted += other.bytes_wanted
        self.requests += other.requests
        self.retries += other.retries
        self.bytes_staged += other.bytes_staged
        self.fetch_seconds += other.fetch_seconds
        self.copy_seconds += other.copy_seconds
        self.peak_host_bytes = max(self.peak_host_bytes, other.peak_host_bytes + held)
        self.concurrency = max(self.concurrency, other.concurrency)


def check_rank(
    rank: int | None, world_size: int | None, opened: shard.Resolved | None = None
) -> None:
    """A load's rank and world size must be those the file was opened for
    (a per-rank file), or fit a single file (rank 0, world size 1)."""
    shard.check_rank_args(rank, world_size)
    if opened is not None and opened.packed and opened.rank is None:
        packed.check_all_ranks(opened, rank, world_size)
        return
    if opened is None or opened.rank is None:
        shard.check_single(opened.uri if opened else "this file", rank, world_size)
        return
    if (rank is not None and rank != opened.rank) or (
        world_size is not None and opened.world_size not in (None, world_size)
    ):
        raise ShardMismatchError(
            f"{opened.uri} was opened as rank {opened.rank} of world_size "
            f"{opened.world_size}; asked rank={rank}, world_size={world_size}",
            uri=opened.uri,
        )


def display_uri(uri: str) -> str:
    """``uri`` safe to show: a URL loses its query string (a presigned
    URL's signature is a credential), fragment and user info."""
    if "://" not in uri or uri.startswith("s3://"):
        return uri
    scheme, rest = uri.split("://", 1)
    rest, query, _ = rest.partition("?")
    rest = rest.split("#", 1)[0]
    host, slash, path = rest.partition("/")
    host = host.rpartition("@")[2]
    return f"{scheme}://{host}{slash}{path}" + ("?…" if query else "")


def source_options(opts: dict[str, Any]) -> dict[str, Any]:
    """The source options among ``opts``, checked and normalised (paths as
    str, ``None`` dropped so the native layer looks the value up itself)."""
    out: dict[str, Any] = {}
    for key, value in opts.items():
        if key not in SOURCE_OPTS or value is None:
            continue
        if key in _PATH_OPTS:
            if not isinstance(value, (str, os.PathLike)):
                raise InvalidArgumentError(f"{key} must be a path, not {type(value).__name__}")
            value = os.fspath(value)
        elif key == "s3_anonymous":
            value = bool(value)
        out[key] = value
    return out


def split_options(opts: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Validate open options; return (source options, load options)."""
    load_opts: dict[str, Any] = {}
    for key, value in opts.items():
        if key in _LOAD_OPTS:
            load_opts[key] = value
        elif key in SOURCE_OPTS or key in _PY_LOAD_OPTS:
            pass
        else:
            raise InvalidArgumentError(f"unknown option {key!r}")
    if "verify_hash" in load_opts:
        load_opts["verify_hash"] = bool(load_opts["verify_hash"])
    if "encryption" in load_opts:
        load_opts["encryption"] = native_key(load_opts["encryption"])
    return source_options(opts), load_opts


class TensorFile:
    """An opened ``.tensors`` file: header and index are read on open; tensor
    bytes only when loaded. Use as a context manager."""

    def __init__(
        self,
        uri: str | os.PathLike[str],
        *,
        rank: int | None = None,
        world_size: int | None = None,
        verify_manifest_hashes: bool = False,
        **opts: Any,
    ) -> None:
        opened_at = time.perf_counter()
        source_opts, self._load_opts = split_options(opts)
        self._progress_opt = opts.get("progress")
        _progress.wanted(self._progress_opt, 0)  # a bad value fails now, not after the open
        self._counter: _native.Progress | None = None
        self._first_fill: float | None = None
        # A template or directory becomes this rank's file, checked against
        # the manifest before the native open (shard.py).
        self.opened = shard.resolve(
            os.fspath(uri),
            rank,
            world_size,
            verify_hashes=verify_manifest_hashes,
            source_opts=source_opts,
        )
        # Credentials and presigned URLs go to the native source and are not
        # kept here: ``uri`` is the redacted form used in messages.
        try:
            self._reader: _native.Reader | None = _native.Reader(self.opened.uri, **source_opts)
        except NotFoundError as e:
            raise shard.name_rank(e, self.opened) from e
        self.uri: str = self._reader.uri
        self.version: int = self._reader.version
        self.file_size: int = self._reader.file_size
        self.encrypted: bool = self._reader.encrypted
        if self._load_opts.get("encryption") is not None and not self.encrypted:
            # tensorizer refuses this on open too: a key for a plain file is
            # a sign of the wrong file.
            raise InvalidArgumentError(
                f"{self.uri}: encryption= was given but the file is not encrypted", uri=self.uri
            )
        shard.check_size(self.opened, self.file_size)
        # What open read (header and index); loads' stats do not include it.
        self.discovery_bytes: int = self._reader.discovery_bytes
        self.stats = LoadStats()
        self._infos: list[TensorInfo] = []
        self._by_name: dict[str, int] = {}
        self._by_path: dict[tuple[PathPart, ...], int] = {}
        # A packed object shows only this rank's tensors (packed.py); visible
        # index i is the native index _native_index[i].
        self.opened, entries, self._native_index = packed.view(
            self._reader.entries(), self.opened, rank, world_size, uri=self.uri
        )
        ambiguous: set[str] = set()
        for i, (name, path, ttype, dtype, shape, _hoff, doff, _dlen) in enumerate(entries):
            tdtype = _torch.dtype_from_name(dtype, tensor=name, uri=self.uri)
            numel = 1
            for dim in shape:
                numel *= dim
            tpath = tuple(path) if path is not None else None
            info = TensorInfo(
                name, tdtype, tuple(shape), numel * tdtype.itemsize, doff, tpath, ttype
            )
            self._infos.append(info)
            if name in self._by_name:
                ambiguous.add(name)
            self._by_name[name] = i
            self._by_path[tpath if tpath is not None else (name,)] = i
        # ["a.b"] and ["a", "b"] both display as "a.b": only the path selects.
        for name in ambiguous:
            self._by_name[name] = -1
        self.nested = any(info.path is not None for info in self._infos)
        self.discovery_seconds = time.perf_counter() - opened_at

    # -- context manager ---------------------------------------------------
    def __enter__(self) -> TensorFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._reader = None

    @property
    def closed(self) -> bool:
        return self._reader is None

    def _native(self) -> _native.Reader:
        if self._reader is None:
            raise InvalidArgumentError(f"{self.uri}: file is closed", uri=self.uri)
        return self._reader

    # -- index -------------------------------------------------------------
    def keys(self) -> list[str]:
        """Tensor names in file order (nested paths joined with ".")."""
        self._native()
        return [info.name for info in self._infos]

    def infos(self) -> list[TensorInfo]:
        self._native()
        return list(self._infos)

    def __len__(self) -> int:
        return len(self._infos)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._by_name

    def index_of(self, name: NameOrPath) -> int:
        if isinstance(name, str):
            i = self._by_name.get(name)
            if i == -1:
                raise InvalidArgumentError(
                    f"{name!r} names several nested tensors; select it by its path tuple",
                    uri=self.uri,
                    tensor=name,
                )
        else:
            i = self._by_path.get(tuple(name))
        if i is None:
            raise KeyError(name)
        return i

    def info(self, name: NameOrPath) -> TensorInfo:
        self._native()
        return self._infos[self.index_of(name)]

    def info_at(self, index: int) -> TensorInfo:
        return self._infos[index]

    # -- loading -----------------------------------------------------------
    def fill(
        self,
        indices: Sequence[int],
        tensors: Sequence[torch.Tensor],
        slices: Sequence[tp.Slice | None] | None = None,
        **overrides: Any,
    ) -> LoadStats:
        """Read tensors ``indices[i]`` straight into the memory of
        ``tensors[i]`` (contiguous CPU, exact byte size) in one native call;
        ``slices[i]``, when given, loads only that tensor-parallel slice."""
        reader = self._native()
        buffers = [_torch.writable_bytes(t) for t in tensors]
        native = [self._native_index[i] for i in indices]  # a packed rank's own entries
        opts = {**self._load_opts, **overrides}
        if slices is not None and any(s is not None for s in slices):
            opts["slices"] = list(slices)
        if self._counter is not None:
            opts["progress"] = self._counter
        if self._first_fill is None:
            self._first_fill = time.perf_counter()
        raw = reader.load(native, buffers, **opts)
        seconds = float(raw.get("seconds", 0.0))
        return LoadStats(
            bytes_fetched=int(raw.get("bytes_fetched", 0)),
            bytes_wanted=int(raw.get("bytes_wanted", 0)),
            requests=int(raw.get("requests", 0)),
            retries=int(raw.get("retries", 0)),
            seconds=seconds,
            peak_host_bytes=int(raw.get("peak_host_bytes", 0)),
            concurrency=int(raw.get("concurrency", 0)),
            fetch_seconds=seconds,
        )

    @contextmanager
    def loading(self, total: int) -> Iterator[None]:
        """One load of ``total`` tensor bytes: its progress bar (per the
        ``progress`` option) follows every native load made inside."""
        self._first_fill = None
        with _progress.Bar(self.uri, total, self._progress_opt) as bar:
            self._counter = bar.counter
            try:
                yield
            finally:
                self._counter = None

    def finish_stats(self, stats: LoadStats, started: float) -> LoadStats:
        stats.seconds = time.perf_counter() - started
        stats.gbps = stats.bytes_fetched / stats.seconds / 1e9 if stats.seconds > 0 else 0.0
        if stats.bytes_wanted:
            stats.read_amplification = stats.bytes_fetched / stats.bytes_wanted
        stats.discovery_seconds = self.discovery_seconds
        if self._first_fill is not None:
            stats.plan_seconds = max(0.0, self._first_fill - started)
        self.stats = stats
        _progress.report(self.uri, stats)
        return stats

    def load_state_dict(
        self,
        device: _torch.DeviceLike | None = "cpu",
        names: Iterable[NameOrPath] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        dtype: _torch.DtypeLike | None = None,
        shard_specs: tp.Specs | None = None,
        cooperative: bool = False,
        group: Any = None,
    ) -> StateDict:
        """Load tensors (all, or ``names``) as plain tensors.

        Returns ``{name: tensor}`` in file order when every name is plain, or
        the nested dicts/lists that ``write_state_dict`` flattened otherwise.
        ``dtype`` casts real floating tensors only. On any error nothing is
        returned, so no partially filled tensor escapes.

        From one unsharded file, ``rank`` and ``world_size`` with
        ``shard_specs`` (name or glob → ``ShardSpec`` / dim / None) return
        each matching tensor's tensor-parallel slice for that rank, reading
        only its bytes; tensors no spec matches are returned whole. With
        ``cooperative=True`` (or a torch.distributed ``group``) the ranks
        fetch the file once between them and exchange the pieces (see
        ``fastshard.load``).
        """
        started = time.perf_counter()
        check_rank(rank, world_size, self.opened)
        target = _torch.as_device(device)
        cast = None
        if dtype is not None:
            cast = _torch.as_dtype(dtype)
            if not _torch.is_castable_float(cast):
                raise InvalidArgumentError(f"dtype= must be a floating dtype, not {cast}")
        self._native()
        if names is None:
            indices = list(range(len(self._infos)))
        else:
            wanted: set[int] = set()
            unknown: list[NameOrPath] = []
            for name in _name_list(names):
                try:
                    wanted.add(self.index_of(name))
                except KeyError:
                    unknown.append(name)
            if unknown:
                raise InvalidArgumentError(
                    f"{self.uri}: no tensors named {unknown[:20]}", uri=self.uri
                )
            indices = sorted(wanted)  # file order reads sequentially
        slices: list[tp.Slice | None] | None = None
        unsharded = self.opened.rank is None and not self.opened.packed
        if shard_specs and unsharded and (world_size or 1) > 1:
            assert world_size is not None
            slices = [
                tp.plan_slice(
                    self._infos[i].name,
                    self._infos[i].shape,
                    None,
                    rank or 0,
                    world_size,
                    shard_specs,
                )
                for i in indices
            ]
        elif shard_specs and not unsharded:
            raise InvalidArgumentError(
                f"shard_specs= slices one unsharded file; {self.uri} holds per-rank "
                "tensors (a rank's file or a packed object), already sliced",
                uri=self.uri,
            )
        elif unsharded and (world_size or 1) > 1:
            raise InvalidArgumentError(
                f"{self.uri} is one unsharded file and world_size={world_size}: pass "
                "shard_specs= (name or glob → fastshard.ShardSpec) to get rank "
                f"{rank or 0}'s slices, or use fastshard.load(model, ...), which infers "
                "the splits from the model's shapes",
                uri=self.uri,
            )
        # Each tensor is allocated where and as it is returned; those that
        # are plain CPU tensors of the file's dtype are filled in place, the
        # rest (CUDA, cast) go through the staging ring.
        shapes = [
            tp.sliced_shape(self._infos[i].shape, slices[n] if slices else None)
            for n, i in enumerate(indices)
        ]
        dtypes = [self._infos[i].dtype for i in indices]
        out = [
            torch.empty(
                shape,
                dtype=cast if cast is not None and _torch.is_castable_float(dt) else dt,
                device=target,
            )
            for shape, dt in zip(shapes, dtypes, strict=True)
        ]
        total = sum(_torch.nbytes(sh, dt) for sh, dt in zip(shapes, dtypes, strict=True))
        with self.loading(total):
            if slices is not None and (cooperative or group is not None):
                from . import cooperative as coop

                assert world_size is not None
                pg = coop.group_of(group, rank or 0, world_size)
                coop.agree(pg, None)
                items = [coop.Item(i, sl, t) for i, sl, t in zip(indices, slices, out, strict=True)]
                stats = coop.load(self, items, rank or 0, world_size, pg)
            else:
                loads = [
                    _ring.Item(i, slices[n] if slices else None, shapes[n], t)
                    for n, (i, t) in enumerate(zip(indices, out, strict=True))
                ]
                # Fresh tensors: plain CPU ones of the file's dtype are filled in place.
                direct: list[_ring.Item] = []
                staged: list[_ring.Item] = []
                for it in loads:
                    plain = it.dest.device.type == "cpu"
                    plain = plain and it.dest.dtype == self._infos[it.index].dtype
                    (direct if plain else staged).append(it)
                stats = self.fill_items(direct, staged)
        result = self._build(indices, out)
        self.finish_stats(stats, started)
        return result

    def fill_items(self, direct: Sequence[_ring.Item], staged: Sequence[_ring.Item]) -> LoadStats:
        """``direct`` items (contiguous CPU tensors of the file's dtype, no
        overlaps) filled in place in one native call, then ``staged`` ones
        (any device or dtype) through the staging ring, all within
        ``max_host_bytes``."""
        stats = LoadStats()
        budget = self._load_opts.get("max_host_bytes")
        if direct:
            native = {} if budget is None else {"max_host_bytes": budget}
            stats.add(
                self.fill(
                    [d.index for d in direct],
                    [d.dest for d in direct],
                    [d.slice for d in direct],
                    **native,
                )
            )
        if staged:
            stats.add(_ring.load(self, staged, budget))
        return stats

    def _build(self, indices: list[int], tensors: list[torch.Tensor]) -> StateDict:
        if not self.nested:
            return {self._infos[i].name: t for i, t in zip(indices, tensors, strict=True)}
        flat: list[tuple[tuple[PathPart, ...], torch.Tensor]] = []
        for i, t in zip(indices, tensors, strict=True):
            info = self._infos[i]
            flat.append((info.path if info.path is not None else (info.name,), t))
        return restructure(flat, uri=self.uri)


def _name_list(names: Iterable[NameOrPath]) -> list[NameOrPath]:
    if isinstance(names, (str, bytes)):
        raise InvalidArgumentError("names= must be a collection of names, not one string")
    return list(names)


def open(uri: str | os.PathLike[str], **opts: Any) -> TensorFile:  # noqa: A001
    """Open a tensorizer file and read its header and index.

    ``uri`` is a local path (or ``file://``), ``s3://bucket/key``, or an
    ``http(s)://`` URL (a presigned URL works; the server must honour Range).
    A per-rank template (``model-rank-%03d.tensors`` or ``{rank}``) or a
    directory (``…/``) with ``rank=`` (and ``world_size=``) opens that rank's
    file, checked against ``fastshard-manifest.json`` when there is one
    (``verify_manifest_hashes=True`` also rehashes a local file). A packed
    object (``save_sharded(..., packed=True)``) opened with ``rank=`` shows
    only that rank's tensors, unprefixed; with ``rank=None`` every tensor.

    Load options: ``verify_hash`` (check CRC32 and SHA-256 of every tensor
    loaded), ``concurrency`` (ranged reads in flight; unset, network loads
    start at 64 and double while throughput rises, up to 512),
    ``throughput_target_gbps`` (unset concurrency only: start with as many
    reads as that needs at ~70 MB/s each, and stop growing once there),
    ``part_size_bytes`` (bytes per read), ``encryption`` (a ``fastshard.EncryptionKey``, needed
    for files tensorizer or fastshard encrypted; a wrong key or modified
    data raises IntegrityError and returns nothing).

    Source options (S3 and HTTP): ``s3_endpoint``, ``s3_access_key_id`` and
    ``s3_secret_access_key`` (both or neither), ``s3_session_token``,
    ``s3_region``, ``s3_profile`` (an AWS profile), ``s3_config_path`` (an
    s3cmd config to read instead of ``~/.s3cfg``), ``s3_addressing``
    (``"auto"``, ``"path"`` or ``"virtual"``), ``ca_bundle`` (PEM file of
    trusted CAs), ``s3_anonymous`` (send unsigned requests), ``max_attempts``
    (per ranged read, the first included; only 5xx, 503 SlowDown, resets,
    timeouts and short bodies are retried) and ``deadline_seconds`` (stop
    retrying this many seconds after ``open``). Whatever is not given is looked up in this order:
    explicit options, ``S3_ACCESS_KEY_ID``/``S3_SECRET_ACCESS_KEY``/
    ``S3_ENDPOINT_URL`` (vLLM's), ``~/.s3cfg`` ``[default]``, the AWS
    variables, profiles and files, and finally anonymous access.
    """
    return TensorFile(uri, **opts)


_SD_KWARGS = (
    "device",
    "names",
    "rank",
    "world_size",
    "dtype",
    "shard_specs",
    "cooperative",
    "group",
)


def load_state_dict(uri: str | os.PathLike[str], **opts: Any) -> StateDict:
    """``open(uri, **open_opts).load_state_dict(**load_kwargs)`` in one call;
    ``device``, ``names``, ``rank``, ``world_size``, ``dtype``,
    ``shard_specs``, ``cooperative`` and ``group`` go to the
    load, everything else to ``open``."""
    kwargs = {k: opts.pop(k) for k in _SD_KWARGS if k in opts}
    rank, world_size = kwargs.get("rank"), kwargs.get("world_size")
    with TensorFile(uri, rank=rank, world_size=world_size, **opts) as f:
        return f.load_state_dict(**kwargs)
