"""The one load dispatch, for ``TensorFile.load_state_dict`` and
``fastshard.load`` alike: planned jobs (a tensor, the slice of it to read,
where it goes) are fetched cooperatively by a process group, or by this
process alone, each one straight into its destination when the native load
can write there, else staged through the ring (``_ring``).

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

from . import _peers, _ring, _torch, tp
from . import cooperative as _coop
from ._engine import Engine
from ._types import LoadStats
from .errors import FastshardError


@dataclass(frozen=True)
class Job:
    """One tensor to load: file index, the slice to read (None: whole), its
    loaded shape, where it goes, and whether the native load may write
    there itself (contiguous CPU memory of the file's dtype that no other
    in-place destination overlaps) rather than through the staging ring."""

    index: int
    slice: tp.Slice | None
    shape: tuple[int, ...]
    dest: torch.Tensor
    in_place: bool

    @property
    def item(self) -> _ring.Item:
        return _ring.Item(self.index, self.slice, self.shape, self.dest)


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


def load(
    engine: Engine,
    jobs: Sequence[Job],
    link: _peers.Link | None = None,
) -> LoadStats:
    """Fill every job's destination, with its progress bar; the caller
    closes the books (``Engine.finish``) once the result is built."""
    total = sum(_torch.nbytes(j.shape, engine.info_at(j.index).dtype) for j in jobs)
    with engine.loading(total):
        if link is not None:
            link.agree(None)
            items = [_coop.Item(j.index, j.slice, j.dest) for j in jobs]
            return _coop.load(engine, items, link)
        stats = LoadStats()
        direct = [j for j in jobs if j.in_place]
        if direct:
            indices = [j.index for j in direct]
            stats.add(engine.fill(indices, [j.dest for j in direct], [j.slice for j in direct]))
        staged = [j.item for j in jobs if not j.in_place]
        if staged:
            stats.add(_ring.load(engine, staged))
        return stats
