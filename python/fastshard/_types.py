"""The value types of a load (``TensorInfo``, ``LoadStats``) and the
protocol the staging ring and cooperative loads fill tensors through.

A leaf: torch is named in annotations only, so the CLI (no torch) can
import what imports this.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar, cast

if TYPE_CHECKING:
    import torch

    from . import _native
    from ._budget import Budget
    from .tp import Slice

PathPart = str | int
NameOrPath = str | Sequence[PathPart]


@dataclass(frozen=True)
class TensorInfo:
    """What the index says about one tensor. ``nbytes`` is its size in memory
    (meta tensors store no bytes but load as zeros of this size); ``offset`` is
    the absolute file offset of its data; ``path`` is set for nested
    (0x1E path) names; ``tensor_type`` is 0 param, 1 buffer, 2 state dict;
    ``meta`` is set for a tensor written from the meta device (no bytes
    stored)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int
    offset: int
    path: tuple[PathPart, ...] | None
    tensor_type: int
    meta: bool = False


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
    their destination. ``bytes_mapped``: tensor bytes a load with
    ``mmap=True`` returned as views of the mapped file (nothing is fetched
    up front: pages come in when touched; the rest was copied, see
    ``fastshard._engine.mapped``). Phases: ``discovery_seconds`` (the open: header and
    index), ``plan_seconds`` (matching names, slicing, allocating, until
    the first read), ``fetch_seconds`` (time in native loads) and
    ``copy_seconds`` (the calling thread copying or casting staged bytes
    and waiting for device copies). The staging ring fetches while it
    copies, so the phases can add up to more than ``seconds``.
    ``bytes_received``: bytes a cooperative load received from the other
    ranks of its group (``bytes_fetched`` counts the store's alone), and
    ``exchange`` how: ``"shared-memory"`` (every rank on one host, reading
    the others' batches where they were fetched), ``"collective"`` (the
    group's all-to-all), ``""`` for a load that exchanged nothing.
    ``bytes_from_cache``: bytes read from the node's cache (``cache_dir``)
    instead of the store (not in ``bytes_fetched`` either).
    ``adaptations``: what the reads decided on their own about the requests
    they sent (more in flight, parts joined into larger requests, parts
    sent again to a store that serves requests in turn), each with the
    throughput before and after it and whether it was kept or undone for
    making the load slower; also logged at DEBUG under ``fastshard.exec``.
    First, where the open saw the store near (its first read quick and
    fast), the few large requests the load started with instead."""

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
    bytes_mapped: int = 0
    discovery_seconds: float = 0.0
    plan_seconds: float = 0.0
    fetch_seconds: float = 0.0
    copy_seconds: float = 0.0
    bytes_received: int = 0
    bytes_from_cache: int = 0
    exchange: str = ""
    adaptations: list[str] = field(default_factory=list)

    @classmethod
    def of_native(cls, raw: Mapping[str, Any]) -> LoadStats:
        """The stats of one native load (``_native.Reader.load``'s dict)."""
        seconds = float(raw.get("seconds", 0.0))
        return cls(
            bytes_fetched=int(raw.get("bytes_fetched", 0)),
            bytes_wanted=int(raw.get("bytes_wanted", 0)),
            requests=int(raw.get("requests", 0)),
            retries=int(raw.get("retries", 0)),
            seconds=seconds,
            peak_host_bytes=int(raw.get("peak_host_bytes", 0)),
            concurrency=int(raw.get("concurrency", 0)),
            fetch_seconds=seconds,
            bytes_from_cache=int(raw.get("bytes_from_cache", 0)),
            adaptations=[str(a) for a in raw.get("adaptations", [])],
        )

    def add(self, other: LoadStats, held: int = 0) -> None:
        """Fold in the stats of one more native call of the same load, made
        while ``held`` bytes of temporaries were alive."""
        self.bytes_fetched += other.bytes_fetched
        self.bytes_wanted += other.bytes_wanted
        self.requests += other.requests
        self.retries += other.retries
        self.bytes_staged += other.bytes_staged
        self.bytes_mapped += other.bytes_mapped
        self.bytes_received += other.bytes_received
        self.bytes_from_cache += other.bytes_from_cache
        self.exchange = self.exchange or other.exchange
        self.adaptations += other.adaptations
        self.fetch_seconds += other.fetch_seconds
        self.copy_seconds += other.copy_seconds
        self.peak_host_bytes = max(self.peak_host_bytes, other.peak_host_bytes + held)
        self.concurrency = max(self.concurrency, other.concurrency)

    def finish(self, seconds: float) -> None:
        """Set the wall time of the whole load and what follows from it."""
        self.seconds = seconds
        self.gbps = self.bytes_fetched / seconds / 1e9 if seconds > 0 else 0.0
        if self.bytes_wanted:
            self.read_amplification = self.bytes_fetched / self.bytes_wanted


class TensorSource(Protocol):
    """What the staging ring and the cooperative load need of an opened
    file: its tensors' index entries, the load's memory budget and hash
    setting, and native loads straight into byte buffers."""

    @property
    def uri(self) -> str: ...
    @property
    def file_size(self) -> int: ...
    @property
    def budget(self) -> Budget: ...
    @property
    def verify_hash(self) -> bool: ...
    @property
    def stage_unit(self) -> int: ...
    def info_at(self, index: int) -> TensorInfo: ...
    def fill(
        self,
        /,
        indices: Sequence[int],
        tensors: Sequence[torch.Tensor],
        slices: Sequence[Slice | None] | None = None,
        **overrides: Any,
    ) -> LoadStats:
        """Read tensors ``indices[i]`` straight into the memory of
        ``tensors[i]`` (contiguous CPU, exact byte size) in one native call;
        ``slices[i]``, when given, loads only that tensor-parallel slice."""
        ...

    def stage(
        self,
        /,
        indices: Sequence[int],
        slices: Sequence[Slice | None],
        targets: Sequence[tuple[int, int, bool] | None],
        slabs: Sequence[_native.Slab],
        slab_bytes: int,
        max_host_bytes: int | None,
    ) -> _native.Staging:
        """A staged load of tensors ``indices`` into ``slabs`` (the staging
        ring copies each batch out); ``targets``: each one's byte target, or
        None to copy it through its own view."""
        ...


_P = ParamSpec("_P")
_R = TypeVar("_R")


def by_engine(method: Callable[Concatenate[Any, _P], _R]) -> Callable[Concatenate[Any, _P], _R]:
    """The protocol's ``method`` as a method of an object that holds the
    engine implementing it (``TensorFile.engine``): one signature and one
    docstring for the file, the engine and the protocol."""
    name = method.__name__

    def forward(holder: Any, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return cast("Callable[_P, _R]", getattr(holder.engine, name))(*args, **kwargs)

    # The protocol's name, docstring and (through __wrapped__) signature,
    # for help() and the docs.
    functools.update_wrapper(forward, method)
    forward.__qualname__ = name
    return forward
