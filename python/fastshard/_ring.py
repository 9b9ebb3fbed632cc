"""The staging ring: how tensors reach destinations the native load cannot
write into directly (CUDA memory, another dtype, non-contiguous views).

A few Rust-owned slabs (``_native.Slab``, page-aligned; pinned once for
CUDA) are filled by native loads running on worker threads, a batch of
pieces per slab, while the calling thread copies finished slabs into their
destinations. A slab is refilled only after its copy completed (its
ticket: a CUDA event, or nothing for a synchronous CPU copy), so at most
``depth`` slabs of host memory are ever in use, and a failed fill or copy
stops the ring only after every running fill and copy has ended (none can
touch a slab after the load returns). CPU and CUDA destinations share this
code; only the ``Copier`` differs.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import torch

from . import _cuda, _native, _torch, tp
from ._budget import Budget, native_limit
from ._types import LoadStats, TensorSource
from .errors import BudgetError

MiB = 1 << 20
RING_BYTES = 256 * MiB  # the ring's size when no max_host_bytes is given
MAX_SLAB = 64 * MiB  # bigger slabs stop paying back: a fill's fixed cost is ~1 ms
MIN_SLAB = 16 * MiB  # a small budget gets fewer, larger slabs rather than tiny fills
DEPTH = 4  # slabs: FILLS being filled, the rest being copied
FILLS = 2  # native loads in flight, so one's tail overlaps the next's start
ALIGN = 512  # of pieces in a slab: any dtype view, and DMA-friendly


@dataclass(frozen=True)
class Item:
    """One tensor to load: file index, the slice of it to read (None: all),
    its loaded shape, and where it goes (any device or dtype, this shape)."""

    index: int
    slice: tp.Slice | None
    shape: tuple[int, ...]
    dest: torch.Tensor


@dataclass(frozen=True)
class Piece:
    """What one slab region holds: a whole item or a block of its dim-0 rows."""

    index: int
    slice: tp.Slice | None
    shape: tuple[int, ...]
    dtype: torch.dtype  # the file's
    dest: torch.Tensor  # the region of the item's destination it fills

    @property
    def nbytes(self) -> int:
        return _torch.nbytes(self.shape, self.dtype)


Batch = list[tuple[int, Piece]]  # (offset in the slab, piece)


class Ticket(Protocol):
    def done(self) -> bool: ...
    def wait(self) -> None: ...


class Copier(Protocol):
    """Copies slab views into destinations; ``ticket`` covers every copy
    issued since the previous ticket; ``finish`` orders the caller after
    all copies (the CUDA copier's current stream waits on its side streams)."""

    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None: ...
    def ticket(self) -> Ticket: ...
    def finish(self) -> None: ...


class Done:
    """The ticket of a copy that completed before ``copy`` returned."""

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None


class CpuCopier:
    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        with torch.no_grad():
            dst.copy_(src)

    def ticket(self) -> Ticket:
        return Done()

    def finish(self) -> None:
        return None


@dataclass(frozen=True)
class Sizing:
    depth: int
    slab_bytes: int
    fills: int
    fill_budget: int | None  # max_host_bytes of each native load (Budget.per_fill)


@dataclass
class RingStats:
    bytes_staged: int = 0
    slabs_peak: int = 0  # most slabs holding data at once
    copy_seconds: float = 0.0  # the calling thread copying and waiting for copies
    native_peak: int = 0  # largest native peak_host_bytes of one fill
    loads: list[LoadStats] = field(default_factory=list)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def unit_bytes(item: Item, dtype: torch.dtype, whole_only: bool) -> int:
    """The smallest piece ``item`` can be staged in: one dim-0 row, unless
    it is sliced along another dim or must stay whole (hash checks need
    whole records)."""
    n = _torch.nbytes(item.shape, dtype)
    if whole_only or not item.shape or item.shape[0] == 0:
        return n
    if item.slice is not None and item.slice[0] != 0:
        return n
    return n // item.shape[0]


def size(budget: Budget, units: Sequence[int], total: int) -> Sizing:
    """Slabs for a load: the budget's staging share (``Budget.staging``),
    ``DEPTH`` slabs when a slab still holds the largest unit, fewer (down
    to one) when it must grow; a ring no bigger than the load (fresh memory
    costs page faults on first touch)."""
    biggest = _aligned(max(units, default=0)) or ALIGN
    ring = budget.staging(RING_BYTES)
    depth = max(2, min(DEPTH, ring // MIN_SLAB))
    slab = min(MAX_SLAB, ring // depth, _aligned(-(-total // depth)))
    slab = max(slab // ALIGN * ALIGN, biggest)
    depth = min(depth, ring // slab)
    if not budget.bounded:
        depth = max(2, depth)  # no budget: a huge unit gets two slabs, not four
    if depth < 1:
        raise BudgetError(
            f"max_host_bytes={budget.limit} leaves {ring} bytes (half) for staging, but one "
            f"indivisible piece (a row, a non-row slice, or a whole tensor when hashes "
            f"are verified) needs {biggest}; raise max_host_bytes to at least {2 * biggest}"
        )
    fills = max(1, min(FILLS, depth - 1))
    return Sizing(depth, slab, fills, budget.per_fill(depth * slab, fills))


def split(item: Item, dtype: torch.dtype, slab_bytes: int) -> list[Piece]:
    """``item`` as pieces of at most ``slab_bytes`` (blocks of dim-0 rows of
    the slice, each one a dim-0 slice of the file's tensor)."""
    n = _torch.nbytes(item.shape, dtype)
    if n <= slab_bytes or not item.shape or item.shape[0] == 0:
        return [Piece(item.index, item.slice, item.shape, dtype, item.dest)]
    assert item.slice is None or item.slice[0] == 0, "size() kept such items whole"
    per = max(1, slab_bytes // (n // item.shape[0]))
    ranges = item.slice[1] if item.slice is not None else [(0, item.shape[0])]
    out, local = [], 0
    for start, length in ranges:
        for off in range(0, length, per):
            k = min(per, length - off)
            shape = (k, *item.shape[1:])
            dest = item.dest[local + off : local + off + k]
            out.append(Piece(item.index, (0, [(start + off, k)]), shape, dtype, dest))
        local += length
    return out


def batches(pieces: Sequence[Piece], slab_bytes: int) -> list[Batch]:
    """Pieces packed in order into slab-sized batches."""
    out: list[Batch] = []
    cur: Batch = []
    at = 0
    for p in pieces:
        if cur and at + p.nbytes > slab_bytes:
            out.append(cur)
            cur, at = [], 0
        cur.append((at, p))
        at = _aligned(at + p.nbytes)
    if cur:
        out.append(cur)
    return out


def view(slab: torch.Tensor, offset: int, piece: Piece) -> torch.Tensor:
    return slab[offset : offset + piece.nbytes].view(piece.dtype).view(piece.shape)


class Slabs:
    """``depth`` Rust-owned slabs as uint8 tensors, pinned while open when
    ``pin``/``unpin`` are given (the CUDA path), unpinned on close."""

    def __init__(
        self,
        depth: int,
        slab_bytes: int,
        pin: Callable[[torch.Tensor], None] | None = None,
        unpin: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        self.views: list[torch.Tensor] = []
        self._unpin = unpin
        self._pinned: list[torch.Tensor] = []
        try:
            for _ in range(depth):
                t = torch.frombuffer(_native.Slab(slab_bytes), dtype=torch.uint8)
                self.views.append(t)
                if pin is not None:
                    pin(t)
                    self._pinned.append(t)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        while self._pinned:
            t = self._pinned.pop()
            if self._unpin is not None:
                self._unpin(t)
        self.views.clear()

    def __enter__(self) -> Slabs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Fill = Callable[[Batch, torch.Tensor], LoadStats]


def run(
    fill: Fill, work: Sequence[Batch], slabs: list[torch.Tensor], copier: Copier, fills: int
) -> RingStats:
    """Fill and copy every batch, in order, ``fills`` fills in flight; a
    slab is refilled only once its copy's ticket is done. Raises the first
    error after every fill and copy already started has ended."""
    stats = RingStats()
    free: deque[int] = deque(range(len(slabs)))
    copying: deque[tuple[int, Ticket]] = deque()
    filling: deque[tuple[Batch, int, Future[LoadStats]]] = deque()
    todo: Iterator[Batch] = iter(work)
    upcoming: list[Batch | None] = [next(todo, None)]
    pool = ThreadPoolExecutor(max_workers=max(1, fills), thread_name_prefix="fastshard-fill")

    def start() -> None:
        """Start fills while a slab is free and fewer than ``fills`` run."""
        while copying and copying[0][1].done():
            free.append(copying.popleft()[0])
        while upcoming[0] is not None and free and len(filling) < fills:
            # Most recently freed first: its pages are faulted in and warm
            # in cache, and slabs a load never needs are never touched.
            slab = free.pop()
            filling.append((upcoming[0], slab, pool.submit(fill, upcoming[0], slabs[slab])))
            stats.slabs_peak = max(stats.slabs_peak, len(slabs) - len(free))
            upcoming[0] = next(todo, None)

    try:
        start()
        while filling:
            batch, slab, fut = filling.popleft()
            try:
                loaded = fut.result()
            except BaseException:
                free.append(slab)
                raise
            start()  # the next fill runs while this batch is copied
            stats.loads.append(loaded)
            stats.native_peak = max(stats.native_peak, loaded.peak_host_bytes)
            began = time.perf_counter()
            for offset, piece in batch:
                copier.copy(view(slabs[slab], offset, piece), piece.dest)
                stats.bytes_staged += piece.nbytes
            copying.append((slab, copier.ticket()))
            stats.copy_seconds += time.perf_counter() - began
            start()
            if upcoming[0] is not None and not filling:
                # Backpressure: every slab holds a batch still being copied.
                began = time.perf_counter()
                slab, ticket = copying.popleft()
                ticket.wait()
                free.append(slab)
                stats.copy_seconds += time.perf_counter() - began
                start()
    finally:
        # Running fills write into slabs and copies read them: all must end
        # before the slabs can be unpinned and freed, error or not.
        for _, _, fut in filling:
            fut.exception()
        pool.shutdown(wait=True)
        began = time.perf_counter()
        while copying:
            copying.popleft()[1].wait()
        copier.finish()
        stats.copy_seconds += time.perf_counter() - began
    return stats


def load(
    source: TensorSource,
    items: Sequence[Item],
    budget: Budget | int | None = None,
    copier: Copier | None = None,
) -> LoadStats:
    """Load ``items`` through a ring sized from ``budget`` (the source's
    when None; a number is a max_host_bytes)."""
    if budget is None:
        budget = source.budget
    elif not isinstance(budget, Budget):
        budget = Budget(budget)
    dtypes = [source.info_at(it.index).dtype for it in items]
    units = [unit_bytes(it, d, source.verify_hash) for it, d in zip(items, dtypes, strict=True)]
    total = sum(_aligned(_torch.nbytes(it.shape, d)) for it, d in zip(items, dtypes, strict=True))
    sizing = size(budget, units, total)
    pieces = [
        p for it, d in zip(items, dtypes, strict=True) for p in split(it, d, sizing.slab_bytes)
    ]
    cuda = any(it.dest.device.type == "cuda" for it in items)
    if copier is None:
        copier = _cuda.CudaCopier() if cuda else CpuCopier()
    pin, unpin = (_cuda.pin, _cuda.unpin) if cuda else (None, None)

    def fill(batch: Batch, slab: torch.Tensor) -> LoadStats:
        views = [slab[o : o + p.nbytes] for o, p in batch]
        indices = [p.index for _, p in batch]
        slices = [p.slice for _, p in batch]
        return source.fill(indices, views, slices, **native_limit(sizing.fill_budget))

    with Slabs(sizing.depth, sizing.slab_bytes, pin, unpin) as slabs:
        ring = run(fill, batches(pieces, sizing.slab_bytes), slabs.views, copier, sizing.fills)
    out = LoadStats()
    for part in ring.loads:
        out.add(part)
    out.bytes_staged = ring.bytes_staged
    out.copy_seconds = ring.copy_seconds
    # The pool's peak plus the native loads that can run beside it.
    out.peak_host_bytes = ring.slabs_peak * sizing.slab_bytes + sizing.fills * ring.native_peak
    return out
