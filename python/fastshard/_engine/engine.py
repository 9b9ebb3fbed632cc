"""The engine of an opened file: native loads into byte buffers, the
progress of one load, and its stats. ``TensorFile`` (reader.py) is the
public object over it; the load dispatch, the staging ring and cooperative
loads use the engine (it is their ``TensorSource``), never the file.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from .. import _native, tp
from .._budget import Budget, native_limit
from .._options import OpenSettings
from .._types import LoadStats, TensorInfo
from ..errors import InvalidArgumentError
from . import progress as _progress
from . import tensors as _tensors


class Engine:
    """Native loads of one opened file's tensors. Index ``i`` is the i-th
    visible tensor (``infos[i]``); a packed rank's view maps it to the
    native index ``native_index[i]``."""

    def __init__(
        self,
        reader: _native.Reader,
        settings: OpenSettings,
        infos: list[TensorInfo],
        native_index: list[int],
        discovery_seconds: float,
    ) -> None:
        self._reader: _native.Reader | None = reader
        self._settings = settings
        # The open's settings, which no load changes (a TensorSource's).
        self.budget: Budget = settings.budget
        self.verify_hash: bool = settings.verify_hash
        self._infos = infos
        self._native_index = native_index
        self.uri: str = reader.uri
        self.location = reader.location  # parsed by the open: asked, never parsed again
        self.file_size: int = reader.file_size
        self.discovery_seconds = discovery_seconds
        self.stats = LoadStats()  # of the last load
        self._counter: _native.Progress | None = None
        self._first_fill: float | None = None

    # -- TensorSource ------------------------------------------------------
    @property
    def encrypted(self) -> bool:
        return self.native().encrypted

    @property
    def stage_unit(self) -> int:
        """The smallest piece a staged load cuts tensors in (``ring.py``)."""
        return self.native().stage_unit

    @property
    def infos(self) -> list[TensorInfo]:
        return self._infos

    def info_at(self, index: int) -> TensorInfo:
        return self._infos[index]

    @property
    def mmap(self) -> bool:
        """Whether loads of new tensors map the file (``mapped.py``)."""
        return self._settings.mmap

    def map(self, indices: Sequence[int]) -> _native.Mapping:
        """The whole file mapped copy-on-write, after checking the record
        headers of tensors ``indices`` over the mapped pages (and their
        hashes, with ``verify_hash``)."""
        native = [self._native_index[i] for i in indices]
        return self.native().map(native, verify_hash=self.verify_hash)

    def cast_mapped(
        self,
        indices: Sequence[int],
        regions: Sequence[tuple[int, int]],
        bindings: Sequence[tuple[int, int, str, str] | None],
        ops: Sequence[tuple[int, int, int]],
    ) -> None:
        """Maps the file (checking tensors ``indices``) and copies ``ops``
        out of it into the bound host memory (``mapcast.py``:
        ``Mapping.copy_into``), counted by the load's progress bar."""
        progress = self._reading()
        self.map(indices).copy_into(regions, bindings, ops, progress=progress)

    def fill(
        self,
        indices: Sequence[int],
        tensors: Sequence[torch.Tensor],
        slices: Sequence[tp.Slice | None] | None = None,
        **overrides: Any,
    ) -> LoadStats:
        """``TensorSource.fill``, with the whole budget this call's unless
        ``overrides`` say otherwise."""
        self.native()
        buffers = [_tensors.writable_bytes(t) for t in tensors]
        return self.fill_bytes(indices, buffers, slices, **overrides)

    def fill_bytes(
        self,
        indices: Sequence[int],
        buffers: Sequence[memoryview],
        slices: Sequence[tp.Slice | None] | None = None,
        **overrides: Any,
    ) -> LoadStats:
        """``fill`` into the writable bytes of each destination."""
        reader = self.native()
        native = [self._native_index[i] for i in indices]
        opts = {**self._settings.native, **self.budget.whole(), **overrides}
        if slices is not None and any(sl is not None for sl in slices):
            opts["slices"] = list(slices)
        progress = self._reading()
        if progress is not None:
            opts["progress"] = progress
        return LoadStats.of_native(reader.load(native, buffers, **opts))

    def stage(
        self,
        indices: Sequence[int],
        slices: Sequence[tp.Slice | None],
        targets: Sequence[tuple[int, int, bool] | None],
        slabs: Sequence[_native.Slab],
        slab_bytes: int,
        max_host_bytes: int | None,
    ) -> _native.Staging:
        """``TensorSource.stage`` (``ring.py`` copies each batch out)."""
        reader = self.native()
        native = [self._native_index[i] for i in indices]
        opts = {**self._settings.native, **native_limit(max_host_bytes)}
        progress = self._reading()
        if progress is not None:
            opts["progress"] = progress
        return reader.stage(native, list(slices), list(targets), list(slabs), slab_bytes, **opts)

    def _reading(self) -> _native.Progress | None:
        """A native read of this load starts now: the first marks the end of
        its planning (``plan_seconds``). Returns the load's progress counter."""
        if self._first_fill is None:
            self._first_fill = time.perf_counter()
        return self._counter

    # -- lifetime ----------------------------------------------------------
    def native(self) -> _native.Reader:
        if self._reader is None:
            raise InvalidArgumentError(f"{self.uri}: file is closed", uri=self.uri)
        return self._reader

    def close(self) -> None:
        self._reader = None

    @property
    def closed(self) -> bool:
        return self._reader is None

    # -- one load ----------------------------------------------------------
    @contextmanager
    def loading(self, total: int) -> Iterator[None]:
        """One load of ``total`` tensor bytes: its progress bar (per the
        ``progress`` option) follows every native load made inside."""
        self._first_fill = None
        with _progress.Bar(self.location, total, self._settings.progress) as bar:
            self._counter = bar.counter
            try:
                yield
            finally:
                self._counter = None

    def finish(self, stats: LoadStats, started: float) -> LoadStats:
        """Close the books of a load that began at ``started``."""
        stats.finish(time.perf_counter() - started)
        stats.discovery_seconds = self.discovery_seconds
        if self._first_fill is not None:
            stats.plan_seconds = max(0.0, self._first_fill - started)
        self.stats = stats
        _progress.report(self.uri, stats)
        return stats
