"""The copy side of a staged load: how tensors reach destinations the
native load cannot write into directly (CUDA memory, another dtype,
non-contiguous views).

The native staging engine (``_native.Staging``) reads every tensor into a
few slabs, several batches ahead, checking, decrypting and hashing as the
bytes land; this file takes each final batch out of its slab and gives the
slab back once its copies completed (its ticket: a CUDA event, or nothing
for a synchronous CPU copy). It runs one Python iteration per batch, none
per tensor: a batch's copies come as ops (``_native.pyi``), plain bytes
into a destination's memory, or through an item's own view when it casts
or is not contiguous. Copies into host memory, casts between float types
included, are made by the native side itself (``host_binding``: the
destinations' storages are handed over once per load); a ``Copier``
(places.py) makes the rest (CUDA, other casts, non-contiguous views).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from .._budget import Budget
from .._types import LoadStats, TensorSource
from ..errors import BudgetError
from . import cuda as _cuda
from . import slabs as _slabs
from . import tensors as _tensors
from .places import ByteOp, Copier, CpuCopier, ItemOp, Places, Ticket
from .places import Item as Item

MiB = 1 << 20
RING_BYTES = 256 * MiB  # the slabs' bytes when no max_host_bytes is given
CUDA_RING_BYTES = 512 * MiB  # the same into a GPU: reads run further ahead
MAX_SLAB = 64 * MiB  # one H2D copy of 64 MiB runs at 93% of the link's peak
MIN_SLAB = 4 * MiB  # unless the budget allows no more
DEPTH = 8  # slabs: reads fill the rest while one or two are copied out
# A lone CUDA destination smaller than this is placed by the batched copy
# from device staging (one kernel a batch) rather than a copy call of its own.
DIRECT_BYTES = 256 * 1024


@dataclass(frozen=True)
class Sizing:
    depth: int
    slab_bytes: int


def _pow2_at_most(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def size(budget: Budget, total: int, cuda: bool, unit: int) -> Sizing:
    """Slabs for a load of ``total`` bytes: the budget's staging share
    (``Budget.staging``), ``DEPTH`` slabs of up to ``MAX_SLAB`` (powers of
    two, so that slabs kept between loads fit the next), fewer and smaller
    for a small load (fresh memory costs page faults on first touch); each
    at least two of the engine's ``unit``s (``TensorSource.stage_unit``)."""
    ring = budget.staging(CUDA_RING_BYTES if cuda else RING_BYTES)
    least = 2 * unit
    if ring < 2 * least:
        raise BudgetError(
            f"max_host_bytes={budget.limit} leaves {ring} bytes (half) for staging slabs, but "
            f"a staged load needs two slabs of {least} bytes; raise max_host_bytes to at "
            f"least {4 * least}"
        )
    slab = min(MAX_SLAB, _pow2_at_most(max(least, ring // DEPTH)))
    # A small load gets smaller slabs, but not so small that its batches
    # (a Python iteration each) outnumber its tensors' worth of work.
    small = max(MIN_SLAB, 1 << max(0, (-(-total // DEPTH) - 1).bit_length()))
    slab = max(least, min(slab, small, _pow2_at_most(ring // 2)))
    batches = max(1, -(-total // slab))
    depth = max(2, min(DEPTH, ring // slab, batches + 1))
    return Sizing(depth, slab)


def targets_of(
    items: Sequence[Item], dtypes: Sequence[torch.dtype]
) -> tuple[list[tuple[int, int, bool] | None], list[torch.Tensor]]:
    """Each item's byte target ``(id, base, padded)`` or None (copied
    through its view), and the targets: uint8 views of whole storages, so
    that items sharing one (views of one block) are copied as runs, over
    the gaps between them where every item in it was carved (``padded``).
    A lone small device tensor goes through its view: the batch's one
    placing kernel beats a copy call of its own."""
    Key = tuple[torch.device, int]
    keys: list[Key | None] = []
    shared: dict[Key, int] = {}
    padded: dict[Key, bool] = {}
    others: list[torch.Tensor] = []  # destinations copied through their view
    for it, dtype in zip(items, dtypes, strict=True):
        dest = it.dest
        # An empty tensor has no address (torch gives 0) and nothing to copy.
        if dest.numel() == 0:
            keys.append(None)
            continue
        if dest.dtype != dtype or not dest.is_contiguous():
            keys.append(None)
            others.append(dest)
            continue
        small = dest.nbytes < DIRECT_BYTES and dest.device.type != "cpu"
        if small and dest._base is None:
            keys.append(None)  # not a view of a block: alone in its storage
            continue
        key = (dest.device, dest.untyped_storage().data_ptr())
        keys.append(key)
        shared[key] = shared.get(key, 0) + 1
        padded[key] = padded.get(key, True) and it.carved
    # Storages that also hold items copied otherwise (a cast carved from
    # the same block): a run over their padding would write over those.
    mixed = {(d.device, d.untyped_storage().data_ptr()) for d in others} if shared else set()
    out: list[tuple[int, int, bool] | None] = []
    targets: list[torch.Tensor] = []
    found: dict[Key, int] = {}
    for it, k in zip(items, keys, strict=True):
        small = it.dest.device.type != "cpu" and it.dest.nbytes < DIRECT_BYTES
        if k is None or (small and shared[k] == 1):
            out.append(None)
            continue
        tid = found.get(k)
        if tid is None:
            tid = found[k] = len(targets)
            view = torch.empty(0, dtype=torch.uint8, device=it.dest.device)
            targets.append(view.set_(it.dest.untyped_storage()))
        out.append((tid, it.dest.data_ptr() - k[1], padded[k] and k not in mixed))
    return out, targets


HostBinding = tuple[list[tuple[int, int]], list[int | None], list[tuple[int, int, str, str] | None]]
_NAMES: dict[torch.dtype, str] = {}


def dtype_name(dtype: torch.dtype) -> str:
    """A dtype as the native host copies name it (``bfloat16``)."""
    got = _NAMES.get(dtype)
    if got is None:
        got = _NAMES[dtype] = str(dtype).removeprefix("torch.")
    return got


def host_binding(
    items: Sequence[Item],
    dtypes: Sequence[torch.dtype],
    where: Sequence[tuple[int, int, bool] | None],
    targets: Sequence[torch.Tensor],
) -> HostBinding:
    """What ``Staging.bind_host`` takes: the host memory the native side
    copies into as ``(address, bytes)`` regions (each byte target's whole
    storage, and each other contiguous host item's own bytes), and each
    item's region with its stored and wanted dtype (the native side leaves
    the casts it cannot make to the copier). The items and targets keep
    that memory alive; nothing else touches it until the load returns."""
    regions: list[tuple[int, int]] = []
    bound_targets: list[int | None] = []
    for t in targets:
        cpu = t.device.type == "cpu" and t.numel() > 0
        bound_targets.append(len(regions) if cpu else None)
        if cpu:
            regions.append((t.data_ptr(), t.numel()))
    bound_items: list[tuple[int, int, str, str] | None] = []
    for it, dtype, w in zip(items, dtypes, where, strict=True):
        dest = it.dest
        # An item with a byte target is copied by byte ops alone.
        if w is not None or not dest.is_cpu or not dest.is_contiguous() or not dest.numel():
            bound_items.append(None)
            continue
        bound_items.append((len(regions), 0, dtype_name(dtype), dtype_name(dest.dtype)))
        regions.append((dest.data_ptr(), dest.nbytes))
    return regions, bound_targets, bound_items


def load(
    source: TensorSource,
    items: Sequence[Item],
    budget: Budget | int | None = None,
    copier: Copier | None = None,
) -> LoadStats:
    """Load ``items`` through staging slabs sized from ``budget`` (the
    source's when None; a number is a max_host_bytes)."""
    if budget is None:
        budget = source.budget
    elif not isinstance(budget, Budget):
        budget = Budget(budget)
    dtypes = [source.info_at(it.index).dtype for it in items]
    total = sum(_tensors.nbytes(it.shape, d) for it, d in zip(items, dtypes, strict=True))
    # Each piece starts at an aligned offset in its slab: many tiny tensors
    # take more slab than their bytes.
    padded = total + len(items) * (_tensors.STAGED_ALIGN - 1)
    cuda = any(it.dest.device.type == "cuda" for it in items)
    sizing = size(budget, padded, cuda, source.stage_unit)
    where, targets = targets_of(items, dtypes)
    places = Places(items, dtypes, targets)
    host = None
    if copier is None:
        copier = _cuda.CudaCopier(places, sizing.depth) if cuda else CpuCopier(places)
        host = host_binding(items, dtypes, where, targets)
    slabs = _slabs.take(sizing.depth, sizing.slab_bytes, pin=cuda)
    try:
        fill_budget = budget.beside_slabs(sizing.depth * sizing.slab_bytes)
        staging = source.stage(
            [it.index for it in items],
            [it.slice for it in items],
            where,
            [s.native for s in slabs],
            sizing.slab_bytes,
            fill_budget,
        )
        with staging:
            if host is not None:
                staging.bind_host(*host)
            out = _run(staging, [s.view for s in slabs], copier)
            out.bytes_staged = total
            for k in staging.zeros:
                items[k].dest.zero_()
    finally:
        _slabs.give(slabs)
    out.peak_host_bytes += sizing.depth * sizing.slab_bytes
    return out


def _run(staging: Staging, slabs: list[torch.Tensor], copier: Copier) -> LoadStats:
    """Copies every batch out as it becomes final; a slab goes back once
    its copies completed, before a batch that may need it is waited for.
    Every copy issued has completed when this returns, error or not."""
    depth = len(slabs)
    copying: deque[tuple[int, Ticket]] = deque()
    copy_seconds = 0.0
    try:
        while True:
            batch = staging.next()
            if batch is None:
                break
            began = time.perf_counter()
            bytes_ops, item_ops = staging.take(batch)
            copier.copy(slabs[batch % depth], batch % depth, bytes_ops, item_ops)
            copying.append((batch, copier.ticket()))
            # A read may span two batches, so the next batch can need the
            # slab after its own: give back every batch up to the one that
            # slab held (waiting for its copies if need be), and any other
            # whose copies are done.
            while copying and (copying[0][1].done() or copying[0][0] <= batch + 2 - depth):
                done, ticket = copying.popleft()
                ticket.wait()
                staging.release(done)
            copy_seconds += time.perf_counter() - began
        stats = LoadStats.of_native(staging.finish())
    finally:
        began = time.perf_counter()
        while copying:
            copying.popleft()[1].wait()
        copier.finish()
        copy_seconds += time.perf_counter() - began
    stats.copy_seconds = copy_seconds
    return stats


class Staging(Protocol):
    """What ``_run`` needs of ``_native.Staging``."""

    @property
    def zeros(self) -> list[int]: ...
    def next(self) -> int | None: ...
    def take(self, batch: int) -> tuple[list[ByteOp], list[ItemOp]]: ...
    def release(self, batch: int) -> None: ...
    def finish(self) -> dict[str, float]: ...
