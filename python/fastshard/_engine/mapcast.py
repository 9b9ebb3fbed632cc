"""Casts on the CPU straight out of the mapped file. A local file's
tensors that a load casts are converted by the native host cast (the one
the staging engine uses, over the cores, any source alignment) from a
copy-on-write mapping of the file (``Reader.map``) into their
destinations: one pass over memory, where the staging engine reads them
into slabs first and casts out of those (two). It is what safetensors'
``load_file`` followed by ``.to(dtype)`` does. Measured on 2 cores, bf16
to float16, against that (the lab's ``--preset cast``, one run):
10,000 small tensors 1.84x as new tensors and 1.22x into parameters, a
1 GiB file 1.01x and 1.15x (an hour before, through the slabs: 1.02x, 0.62x,
0.75x, 0.43x).

Only where nothing has to happen to the bytes between the file and the
cast: no hash to verify (the staging engine hashes as bytes land), no
decryption, one local file (not a set of shards, not an object in a store,
which the native map refuses anyway), no ``max_host_bytes`` (the mapped
pages count in the process's resident memory, which such a budget bounds:
the staging engine keeps to it); contiguous CPU destinations of a
float type, whole tensors or one range along dim 0. Every tensor goes in
one native call (10,000 small ones too: no torch call per tensor), copies
spread over the cores.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

from .._layouts import location as _location
from .._types import LoadStats, TensorInfo
from . import ring as _ring
from . import tensors as _tensors
from .engine import Engine

# The types the native host cast converts between (``rust/stage/cast.rs``);
# float8 and the rest go through the staging engine's copier.
CASTS = frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16})

Span = tuple[int, int]  # (offset, length) of the file's bytes an item is cast from


def split(
    engine: Engine, items: Sequence[_ring.Item]
) -> tuple[list[tuple[_ring.Item, Span]], list[_ring.Item]]:
    """``items`` as (cast from the mapping, with their bytes in the file;
    through the staging engine)."""
    if (
        engine.budget.bounded
        or engine.verify_hash
        or engine.encrypted
        or not _location.is_local(engine.location)
        or len(engine.native().members()) > 1
    ):
        return [], list(items)
    mapped: list[tuple[_ring.Item, Span]] = []
    staged: list[_ring.Item] = []
    for it in items:
        span = _span(engine.info_at(it.index), it)
        if span is None:
            staged.append(it)
        else:
            mapped.append((it, span))
    return _apart(mapped, staged)


def _apart(
    mapped: list[tuple[_ring.Item, Span]], staged: list[_ring.Item]
) -> tuple[list[tuple[_ring.Item, Span]], list[_ring.Item]]:
    """Tied or aliased destinations are written by one mapped item each
    (the copies run in parallel): any other item over the same memory goes
    to the staging engine, which copies after."""
    by_start = sorted(mapped, key=lambda m: m[0].dest.data_ptr())
    kept: list[tuple[_ring.Item, Span]] = []
    end = 0
    for it, span in by_start:
        start = it.dest.data_ptr()
        if start < end:
            staged.append(it)
            continue
        kept.append((it, span))
        end = max(end, start + it.dest.nbytes)
    return kept, staged


def _span(info: TensorInfo, it: _ring.Item) -> Span | None:
    """The file bytes ``(offset, length)`` item ``it`` is cast from, when
    this path takes it."""
    dest = it.dest
    if (
        info.meta
        or info.dtype not in CASTS
        or dest.dtype not in CASTS
        or dest.device.type != "cpu"
        or not dest.is_contiguous()
    ):
        return None
    nbytes = _tensors.nbytes(it.shape, info.dtype)
    if it.slice is None:
        return info.offset, nbytes
    dim, ranges = it.slice
    if dim != 0 or len(ranges) != 1:
        return None
    row = math.prod(info.shape[1:]) * info.dtype.itemsize
    return info.offset + ranges[0][0] * row, nbytes


def load(engine: Engine, items: Sequence[tuple[_ring.Item, Span]]) -> LoadStats:
    """Casts each item from its span of the mapped file into its
    destination; the mapping's record headers are checked against the
    index and the file's bounds, and every copy against the mapping and its
    destination, before any byte moves."""
    began = time.perf_counter()
    regions: list[tuple[int, int]] = []
    bindings: list[tuple[int, int, str, str] | None] = []
    ops: list[tuple[int, int, int]] = []
    for k, (it, (offset, nbytes)) in enumerate(items):
        stored = engine.info_at(it.index).dtype
        regions.append((it.dest.data_ptr(), it.dest.nbytes))
        bindings.append((k, 0, _ring.dtype_name(stored), _ring.dtype_name(it.dest.dtype)))
        ops.append((k, offset, nbytes))
    engine.cast_mapped([it.index for it, _ in items], regions, bindings, ops)
    stats = LoadStats(bytes_fetched=sum(n for _, _, n in ops))
    stats.bytes_wanted = stats.bytes_fetched
    # Reading and casting are one pass here: all of it counts as fetching.
    stats.fetch_seconds = time.perf_counter() - began
    return stats
