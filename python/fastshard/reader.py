"""Reading: ``fastshard.open`` / ``TensorFile`` and ``fastshard.load_state_dict``."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from typing import Any, Unpack

# Not used by name: the public signatures' torch types (``_core.DeviceLike``,
# ``DtypeLike``) are forward references that typing.get_type_hints resolves here.
import torch  # noqa: F401

from . import _core, _gc, packed, shard, tp
from ._index import Index
from ._nested import StateDict
from ._options import OpenOptions
from ._types import LoadStats, NameOrPath, TensorInfo, TensorSource, by_engine
from .errors import InvalidArgumentError

# LoadStats and TensorInfo live in _types; they stay importable from here.
__all__ = ["LoadStats", "TensorFile", "TensorInfo", "load_state_dict", "open"]


class TensorFile:
    """An opened ``.tensors`` or ``.safetensors`` file: header and index are
    read on open; tensor bytes only when loaded. Use as a context manager."""

    def __init__(
        self,
        uri: str | os.PathLike[str],
        *,
        rank: int | None = None,
        world_size: int | None = None,
        verify_manifest_hashes: bool = False,
        **opts: Unpack[OpenOptions],
    ) -> None:
        with _gc.paused():  # the index: a TensorInfo per tensor
            self._open(uri, rank, world_size, verify_manifest_hashes, opts)

    def _open(
        self,
        uri: str | os.PathLike[str],
        rank: int | None,
        world_size: int | None,
        verify_manifest_hashes: bool,
        opts: OpenOptions,
    ) -> None:
        opened_at = time.perf_counter()
        settings = _core.open_settings(opts)
        # The URI is parsed once, resolved to this rank's file (checked
        # against a manifest) or a directory's HF checkpoint, and opened.
        source = _core.open_source(
            uri,
            rank,
            world_size,
            verify_hashes=verify_manifest_hashes,
            source_opts=settings.source,
        )
        self.opened, reader, self.checkpoint = source.resolved, source.reader, source.checkpoint
        # Credentials and presigned URLs go to the native source and are not
        # kept here: ``uri`` is the redacted form used in messages.
        self.uri: str = reader.uri
        self.version: int | None = reader.version  # None: safetensors
        self.format: str = reader.format
        # The file's own string metadata (safetensors' __metadata__).
        self.metadata: dict[str, str] = dict(reader.metadata)
        self.file_size: int = reader.file_size
        self.encrypted: bool = reader.encrypted
        if settings.encrypted and not self.encrypted:
            # tensorizer refuses this on open too: a key for a plain file is
            # a sign of the wrong file.
            raise InvalidArgumentError(
                f"{self.uri}: encryption= was given but the file is not encrypted", uri=self.uri
            )
        shard.check_size(self.opened, self.file_size)
        # What open read (header and index); loads' stats do not include it.
        self.discovery_bytes: int = reader.discovery_bytes
        # A packed object shows only this rank's tensors (packed.py); visible
        # index i is the native index native_index[i].
        self.opened, entries, native_index = packed.view(
            reader.entries(), self.opened, rank, world_size, uri=self.uri
        )
        self._index = Index(entries, self.uri)
        self.nested = self._index.nested
        self.discovery_seconds = time.perf_counter() - opened_at
        # What loads the tensors (native loads, progress, stats); every load
        # path (this class's, fastshard.load's) goes through it.
        self.engine = _core.engine(
            reader, settings, self._index.infos, native_index, self.discovery_seconds
        )

    # -- context manager ---------------------------------------------------
    def __enter__(self) -> TensorFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.engine.close()

    @property
    def closed(self) -> bool:
        return self.engine.closed

    @property
    def stats(self) -> LoadStats:
        """The stats of the last load."""
        return self.engine.stats

    # -- index -------------------------------------------------------------
    def keys(self) -> list[str]:
        """Tensor names in file order (nested paths joined with ".")."""
        self.engine.native()
        return [info.name for info in self._index.infos]

    def infos(self) -> list[TensorInfo]:
        self.engine.native()
        return list(self._index.infos)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def index_of(self, name: NameOrPath) -> int:
        return self._index.index_of(name)

    def info(self, name: NameOrPath) -> TensorInfo:
        self.engine.native()
        return self._index.infos[self._index.index_of(name)]

    def info_at(self, index: int) -> TensorInfo:
        return self._index.infos[index]

    # -- what the staging ring needs of a file (a TensorSource) -------------
    @property
    def budget(self) -> _core.Budget:
        return self.engine.budget

    @property
    def verify_hash(self) -> bool:
        return self.engine.verify_hash

    fill = by_engine(TensorSource.fill)

    @property
    def stage_unit(self) -> int:
        return self.engine.stage_unit

    stage = by_engine(TensorSource.stage)

    # -- loading -----------------------------------------------------------
    @_gc.pausing
    def load_state_dict(
        self,
        device: _core.DeviceLike | None = "cpu",
        names: Iterable[NameOrPath] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        dtype: _core.DtypeLike | None = None,
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

        Opened with ``mmap=True`` (a local, unencrypted file; CPU, no
        ``dtype``, not cooperative), the tensors view the file mapped
        copy-on-write instead (``fastshard._engine.mapped`` says which are views).
        """
        started = time.perf_counter()
        packed.check_rank(rank, world_size, self.opened)
        target = _core.as_device(device)
        cast = _core.float_cast(dtype)
        self.engine.native()
        sliced = self._check_slicing(rank, world_size, shard_specs)
        indices: list[int] = []

        def picked() -> tuple[list[int], list[tp.Slice | None]]:
            indices.extend(self._index.select(names))
            return indices, self._slices(indices, sliced, rank, world_size, shard_specs)

        if self.engine.mmap:
            shared = cooperative or group is not None
            tensors, stats = _core.load_mapped(self.engine, target, cast, shared, picked)
        else:
            share = {"cooperative": cooperative, "group": group, "sliced": sliced}
            tensors, stats = _core.load_fresh(
                self.engine, picked, target, cast, rank=rank, world_size=world_size, **share
            )
        result = self._index.state_dict(indices, tensors)
        self.engine.finish(stats, started)
        return result

    def _slices(
        self,
        indices: Sequence[int],
        sliced: bool,
        rank: int | None,
        world_size: int | None,
        shard_specs: tp.Specs | None,
    ) -> list[tp.Slice | None]:
        """Each selected tensor's tensor-parallel slice (None: whole)."""
        if not sliced:
            return [None] * len(indices)
        assert world_size is not None and shard_specs is not None
        return [
            tp.plan_slice(info.name, info.shape, None, rank or 0, world_size, shard_specs)
            for info in (self._index.infos[i] for i in indices)
        ]

    def _check_slicing(
        self, rank: int | None, world_size: int | None, shard_specs: tp.Specs | None
    ) -> bool:
        """Whether the load takes tensor-parallel slices of one unsharded
        file: with ``shard_specs`` and world_size > 1. Per-rank tensors are
        already sliced, and an unsharded file without specs is ambiguous."""
        unsharded = self.opened.rank is None and not self.opened.packed
        if shard_specs and not unsharded:
            raise InvalidArgumentError(
                f"shard_specs= slices one unsharded file; {self.uri} holds per-rank "
                "tensors (a rank's file or a packed object), already sliced",
                uri=self.uri,
            )
        if unsharded and (world_size or 1) > 1 and not shard_specs:
            raise InvalidArgumentError(
                f"{self.uri} is one unsharded file and world_size={world_size}: pass "
                "shard_specs= (name or glob → fastshard.ShardSpec) to get rank "
                f"{rank or 0}'s slices, or use fastshard.load(model, ...), which infers "
                "the splits from the model's shapes",
                uri=self.uri,
            )
        return bool(shard_specs) and unsharded and (world_size or 1) > 1


def open(  # noqa: A001
    uri: str | os.PathLike[str],
    *,
    rank: int | None = None,
    world_size: int | None = None,
    verify_manifest_hashes: bool = False,
    **opts: Unpack[OpenOptions],
) -> TensorFile:
    """Open a tensor file and read its header and index: tensorizer
    ``.tensors`` or safetensors, told apart by the first bytes (never the
    name). A safetensors file has no hashes (``verify_hash`` is refused) and
    no encryption; its ``__metadata__`` is ``metadata``.

    ``uri`` is a local path (or ``file://``), ``s3://bucket/key`` (AWS or an
    S3-compatible store), ``gs://bucket/key`` (Google Cloud Storage), or an
    ``http(s)://`` URL (a presigned URL works; the server must honour Range).
    A directory or prefix that holds a Hugging Face checkpoint
    (``model.safetensors.index.json`` and its shards, or
    ``model.safetensors``), or the index file's URI, opens every shard as
    one file: headers read concurrently, any load one plan over all of them.
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
    ``part_size_bytes`` (bytes per read; unset with concurrency unset,
    network loads join queued parts into larger reads while a read's first
    byte takes longer than its bytes), ``max_host_bytes`` (most host
    memory a load holds beyond its destinations), ``progress`` (a progress
    bar: True, False, or None for big loads on a terminal), ``encryption``
    (a ``fastshard.EncryptionKey``, needed for files tensorizer or fastshard
    encrypted; a wrong key or modified data raises IntegrityError and
    returns nothing), ``mmap`` (``load_state_dict`` of a local file returns
    tensors that view the file mapped copy-on-write, as safetensors'
    ``load_file`` does, instead of copies: nothing is read up front, pages
    come from the page cache when touched, writes stay private; CPU only, no
    ``dtype`` cast, not encrypted; the checks and ``verify_hash`` run over
    the mapped pages; see ``fastshard._engine.mapped`` for what is a view).

    Source options (S3, HTTP and Cloud Storage): ``s3_endpoint``, ``s3_access_key_id`` and
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
    variables, profiles and files, and finally anonymous access. For
    ``gs://bucket/key`` (Google Cloud Storage): ``gcs_service_account`` (a
    service-account JSON file), ``gcs_anonymous`` (public buckets),
    ``gcs_endpoint`` (an emulator; else ``STORAGE_EMULATOR_HOST``); else
    ``GOOGLE_APPLICATION_CREDENTIALS`` and Google's default credentials.
    For any remote object: ``cache_dir`` (a node-local directory that keeps
    the bytes a load fetched, keyed by URI, ETag and size, so the next load
    of the same object version reads them from local disk; else
    ``FASTSHARD_CACHE_DIR``) and ``cache_max_bytes`` (the cache's size cap:
    least recently used objects are evicted; else
    ``FASTSHARD_CACHE_MAX_BYTES``; unset: no cap).
    Unknown options raise InvalidArgumentError.
    """
    return opened(uri, rank, world_size, verify_manifest_hashes, opts)


def opened(
    uri: str | os.PathLike[str],
    rank: int | None,
    world_size: int | None,
    verify_manifest_hashes: bool,
    opts: OpenOptions,
) -> TensorFile:
    """``open``'s arguments as they come to the functions that open a file
    for one load (``load_state_dict``, ``fastshard.load``)."""
    return TensorFile(
        uri,
        rank=rank,
        world_size=world_size,
        verify_manifest_hashes=verify_manifest_hashes,
        **opts,
    )


@_gc.pausing
def load_state_dict(
    uri: str | os.PathLike[str],
    *,
    device: _core.DeviceLike | None = "cpu",
    names: Iterable[NameOrPath] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    dtype: _core.DtypeLike | None = None,
    shard_specs: tp.Specs | None = None,
    cooperative: bool = False,
    group: Any = None,
    verify_manifest_hashes: bool = False,
    **opts: Unpack[OpenOptions],
) -> StateDict:
    """``open(uri, **open_opts).load_state_dict(**load_kwargs)`` in one call;
    ``device``, ``names``, ``rank``, ``world_size``, ``dtype``,
    ``shard_specs``, ``cooperative`` and ``group`` go to the
    load, everything else to ``open``."""
    dtype = _core.float_cast(dtype)  # a bad name fails before the open reads anything
    with opened(uri, rank, world_size, verify_manifest_hashes, opts) as f:
        return f.load_state_dict(
            device=device,
            names=names,
            rank=rank,
            world_size=world_size,
            dtype=dtype,
            shard_specs=shard_specs,
            cooperative=cooperative,
            group=group,
        )
