"""The one load dispatch, for ``TensorFile.load_state_dict`` and
``fastshard.load`` alike: planned jobs (a tensor, the slice of it to read,
where it goes) are fetched cooperatively by a process group, or by this
process alone, each one straight into its destination when the native load
can write there, else staged through the ring (``ring.py``).

Cooperation: the ranks must agree that every one of them planned its load
(``planning``) before any collective moves bytes, so that a rank whose
plan failed makes all of them raise instead of waiting forever.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from .. import tp
from .._coop import load as _cooperative
from .._coop import peers as _peers
from .._types import LoadStats, TensorInfo
from ..errors import FastshardError
from . import mapcast as _mapcast
from . import ring as _ring
from . import tensors as _tensors
from .engine import Engine


@dataclass(frozen=True)
class Job:
    """One tensor to load: file index, the slice to read (None: whole), its
    loaded shape, where it goes, and whether the native load may write
    there itself (contiguous CPU memory of the file's dtype that no other
    in-place destination overlaps) rather than through the staging ring;
    ``buffer``: the writable bytes of an in-place ``dest``, when its
    allocation already made them (``_tensors.empty_many``); ``carved``: a
    new tensor cut from a block of ours, whose gaps are padding."""

    index: int
    slice: tp.Slice | None
    shape: tuple[int, ...]
    dest: torch.Tensor
    in_place: bool
    buffer: memoryview | None = None
    carved: bool = False  # a view of a block of our own (``_tensors.empty_on``)

    @property
    def item(self) -> _ring.Item:
        return _ring.Item(self.index, self.slice, self.shape, self.dest, self.carved)


def group_for(
    cooperative: bool, group: Any, sliced: bool, rank: int | None, world_size: int | None
) -> _peers.Link | None:
    """The process group a load shares its fetch with, None when it loads
    alone. Only a sliced load (every rank wanting parts of one unsharded
    file) is worth sharing; per-rank files and packed objects are not."""
    if not sliced or not (cooperative or group is not None):
        return None
    rank, world_size = rank or 0, world_size or 1
    return _peers.Link(_peers.group_of(group, rank, world_size), rank, world_size)


@contextmanager
def planning(link: _peers.Link | None) -> Iterator[None]:
    """Around a cooperative load's planning: a rank that fails tells the
    others, which then raise too (a collective: every rank goes through it
    before ``load``)."""
    try:
        yield
    except FastshardError as e:
        if link is not None:
            link.agree(e)
        raise
    except BaseException as e:
        if link is not None:
            link.fail(e)
        raise


def fresh(
    infos: Sequence[TensorInfo],
    indices: Sequence[int],
    slices: Sequence[tp.Slice | None],
    device: torch.device,
    cast: torch.dtype | None,
) -> list[Job]:
    """Jobs into new tensors allocated where and as they are returned:
    plain CPU tensors of the file's dtype are filled in place (allocated
    together, ``_tensors.empty_many``), the rest (CUDA, cast) go through the
    staging ring (small ones carved from shared blocks, ``_tensors.empty_on``)."""
    planned: list[tuple[int, tp.Slice | None, tuple[int, ...], torch.dtype]] = []
    for index, sl in zip(indices, slices, strict=True):
        info = infos[index]
        shape = info.shape if sl is None else tp.sliced_shape(info.shape, sl)
        dtype = info.dtype
        if cast is not None and _tensors.is_castable_float(dtype):
            dtype = cast
        planned.append((index, sl, shape, dtype))
    direct = device.type == "cpu"
    in_place = [direct and p[3] == infos[p[0]].dtype for p in planned]
    specs = [(p[2], p[3]) for p, ok in zip(planned, in_place, strict=True) if ok]
    tensors, views = _tensors.empty_many(specs)
    staged, carved = _tensors.empty_on(
        device, [(p[2], p[3]) for p, ok in zip(planned, in_place, strict=True) if not ok]
    )
    jobs: list[Job] = []
    k = s = 0
    for (index, sl, shape, _), ok in zip(planned, in_place, strict=True):
        if ok:
            jobs.append(Job(index, sl, shape, tensors[k], True, views[k]))
            k += 1
        else:
            jobs.append(Job(index, sl, shape, staged[s], False, carved=carved[s]))
            s += 1
    return jobs


def load(
    engine: Engine,
    jobs: Sequence[Job],
    link: _peers.Link | None = None,
) -> LoadStats:
    """Fill every job's destination, with its progress bar; the caller
    closes the books (``Engine.finish``) once the result is built."""
    total = sum(_tensors.nbytes(j.shape, engine.info_at(j.index).dtype) for j in jobs)
    with engine.loading(total):
        if link is not None:
            link.agree(None)
            items = [_cooperative.Item(j.index, j.slice, j.dest) for j in jobs]
            return _cooperative.load(engine, items, link)
        stats = LoadStats()
        # An encrypted file's slices are decrypted as whole cipher chunks
        # in the staging slabs, then cut: never straight into place.
        direct = [j for j in jobs if j.in_place and not (j.slice is not None and engine.encrypted)]
        if direct:
            indices = [j.index for j in direct]
            buffers = [
                j.buffer if j.buffer is not None else _tensors.writable_bytes(j.dest)
                for j in direct
            ]
            stats.add(engine.fill_bytes(indices, buffers, [j.slice for j in direct]))
        chosen = {id(j) for j in direct}
        mapped, staged = _mapcast.split(engine, [j.item for j in jobs if id(j) not in chosen])
        if mapped:
            stats.add(_mapcast.load(engine, mapped))
        if staged:
            stats.add(_ring.load(engine, staged))
        return stats
