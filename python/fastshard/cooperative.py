"""Cooperative loads: the ranks of a torch.distributed group fetch each
byte of one object once between them and exchange the pieces.

Every rank of a tensor-parallel group needs a slice of most tensors and all
of the replicated ones, and row-parallel slices are strided, so ranks that
each read their own share fetch more than the object between them. Here the
tensors are split into contiguous byte ranges, one per rank (each rank reads
its range at full speed), and every piece is broadcast from the rank that
fetched it; each rank then copies its slice out of it. Traffic to the store
per group is the object's size, whatever the world size.

Memory: a round holds one batch per rank (``max_host_bytes / (world + 2)``
bytes each, ``Budget.cooperative_batch``) plus the next batch this rank
fetches while the broadcasts of the current round run, plus that fetch's own
headers and scratch. Tensors larger than a batch travel as blocks of rows.

Failures: a rank that fails to fetch tells the others before the round's
broadcasts, so every rank raises instead of waiting on a collective that
never comes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from . import tp
from ._types import LoadStats, TensorSource
from .errors import FastshardError, InvalidArgumentError, ShardMismatchError, UnsupportedError

_ALIGN = 64  # piece offsets in a batch buffer, so every dtype view is aligned


@dataclass(frozen=True)
class Item:
    """One destination: the file tensor ``index``, this rank's ``slice`` of
    it (None: whole), copied (and cast) into ``out``."""

    index: int
    slice: tp.Slice | None
    out: torch.Tensor


@dataclass(frozen=True)
class _Piece:
    index: int
    row0: int  # first row (dim 0) of the file tensor in this piece
    rows: int  # rows in this piece (1 for a 0-d tensor)
    nbytes: int


def group_of(group: Any, rank: int, world_size: int) -> Any:
    """The process group to cooperate in, checked against rank/world_size."""
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgumentError(
            "cooperative loading needs torch.distributed initialised (init_process_group) "
            "in every rank"
        )
    g = group if group is not None else dist.group.WORLD
    backend = str(dist.get_backend(g)).lower()
    if "gloo" not in backend:
        # The exchange buffers are host memory; NCCL needs them on the GPU,
        # which this build does not stage yet.
        raise UnsupportedError(
            f"cooperative loading exchanges host buffers and needs a gloo group, not "
            f"{backend!r}: pass group=torch.distributed.new_group(backend='gloo') (vLLM: "
            "get_tp_group().cpu_group)"
        )
    g_rank, g_size = dist.get_rank(g), dist.get_world_size(g)
    if (g_rank, g_size) != (rank, world_size):
        raise ShardMismatchError(
            f"cooperative load asked rank={rank}, world_size={world_size} but the process "
            f"group has rank {g_rank} of {g_size}"
        )
    return g


def agree(group: Any, error: BaseException | None) -> None:
    """Every rank reports whether it may go on; if one may not, all raise
    (the failed rank its own error). A collective, so all ranks call it."""
    mine = None if error is None else f"{type(error).__name__}: {error}"
    reports: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(reports, mine, group=group)
    if error is not None:
        raise error
    failed = [(r, m) for r, m in enumerate(reports) if m is not None]
    if failed:
        rank, msg = failed[0]
        raise FastshardError(f"cooperative load stopped: rank {rank} failed: {msg}")


def _pieces(f: TensorSource, indices: list[int], cap: int) -> list[_Piece]:
    out: list[_Piece] = []
    for i in indices:
        info = f.info_at(i)
        rows = info.shape[0] if info.shape else 1
        if not info.shape or info.nbytes <= cap or rows <= 1:
            out.append(_Piece(i, 0, rows, info.nbytes))
            continue
        row_bytes = info.nbytes // rows
        if row_bytes > cap:
            raise InvalidArgumentError(
                f"{info.name}: one row is {row_bytes} bytes, more than a cooperative batch "
                f"({cap} bytes = max_host_bytes / (world_size + 2)); raise max_host_bytes",
                uri=f.uri,
                tensor=info.name,
            )
        per = cap // row_bytes
        for r0 in range(0, rows, per):
            n = min(per, rows - r0)
            out.append(_Piece(i, r0, n, n * row_bytes))
    return out


def _owners(pieces: list[_Piece], world_size: int) -> list[list[_Piece]]:
    """Contiguous runs of pieces of about equal bytes, one per rank, so each
    rank's reads are sequential in the object."""
    total = sum(p.nbytes for p in pieces) or 1
    owned: list[list[_Piece]] = [[] for _ in range(world_size)]
    seen = 0
    for p in pieces:
        mid = seen + p.nbytes / 2
        owned[min(world_size - 1, int(mid * world_size / total))].append(p)
        seen += p.nbytes
    return owned


def _batches(pieces: list[_Piece], cap: int) -> list[list[_Piece]]:
    out: list[list[_Piece]] = []
    size = 0
    for p in pieces:
        if out and size + _aligned(p.nbytes) <= cap:
            out[-1].append(p)
            size += _aligned(p.nbytes)
        else:
            out.append([p])
            size = _aligned(p.nbytes)
    return out


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _layout(batch: list[_Piece]) -> tuple[list[int], int]:
    offsets, at = [], 0
    for p in batch:
        offsets.append(at)
        at += _aligned(p.nbytes)
    return offsets, at


def _fetch(f: TensorSource, batch: list[_Piece], buf: torch.Tensor, budget: int) -> LoadStats:
    offsets, _ = _layout(batch)
    views = [buf[o : o + p.nbytes] for o, p in zip(offsets, batch, strict=True)]
    slices: list[tp.Slice | None] = []
    for p in batch:
        info = f.info_at(p.index)
        whole = not info.shape or (p.row0 == 0 and p.rows == info.shape[0])
        slices.append(None if whole else (0, [(p.row0, p.rows)]))
    # Hash checks need whole records: only whole pieces can be verified.
    verify = f.verify_hash and all(s is None for s in slices)
    return f.fill(
        [p.index for p in batch], views, slices, verify_hash=verify, max_host_bytes=budget
    )


def _place(f: TensorSource, piece: _Piece, raw: torch.Tensor, item: Item) -> None:
    """Copy this rank's part of one received piece into its destination."""
    info = f.info_at(piece.index)
    if not info.shape:
        item.out.copy_(raw.view(info.dtype).reshape(()))
        return
    block = raw.view(info.dtype).reshape((piece.rows, *info.shape[1:]))
    r0, r1 = piece.row0, piece.row0 + piece.rows
    if item.slice is None:
        item.out[r0:r1].copy_(block)
        return
    dim, ranges = item.slice
    local = 0
    for start, length in ranges:
        if dim == 0:
            a, b = max(start, r0), min(start + length, r1)
            if a < b:
                item.out[local + a - start : local + b - start].copy_(block[a - r0 : b - r0])
        else:
            item.out[r0:r1].narrow(dim, local, length).copy_(block.narrow(dim, start, length))
        local += length


def load(f: TensorSource, items: list[Item], rank: int, world_size: int, group: Any) -> LoadStats:
    """Fill every item, this rank fetching only its share of the object."""
    cap = f.budget.cooperative_batch(world_size)
    by_index: dict[int, list[Item]] = {}
    for it in items:
        by_index.setdefault(it.index, []).append(it)
    indices = sorted(by_index)
    plan_key = hashlib.sha256(repr((f.file_size, indices, cap)).encode()).hexdigest()
    keys: list[Any] = [None] * world_size
    dist.all_gather_object(keys, plan_key, group=group)
    if len(set(keys)) != 1:
        raise ShardMismatchError(
            f"{f.uri}: the ranks of the cooperative load disagree on what to read "
            "(different tensors, files or max_host_bytes); every rank must load the same "
            "model from the same object with the same options",
            uri=f.uri,
        )
    owned = _owners(_pieces(f, indices, cap), world_size)
    rounds = [_batches(mine, cap) for mine in owned]
    n_rounds = max(len(r) for r in rounds)
    stats = LoadStats()

    def size(owner: int, k: int) -> int:
        return _layout(rounds[owner][k])[1] if k < len(rounds[owner]) else 0

    # Buffers are carved from one allocation made once (see _torch.Arena for
    # why): two areas for this rank's batches (round k's is broadcast while
    # round k+1's is fetched) and one for the other ranks' batches.
    own_max = max((size(rank, k) for k in range(n_rounds)), default=0)
    recv_max = max(
        (sum(size(o, k) for o in range(world_size) if o != rank) for k in range(n_rounds)),
        default=0,
    )
    arena = torch.empty(2 * own_max + recv_max, dtype=torch.uint8)
    own_areas = (arena[:own_max], arena[own_max : 2 * own_max])
    recv_area = arena[2 * own_max :]

    def fetch_own(k: int, held: int) -> tuple[torch.Tensor, BaseException | None]:
        """This rank's batch of round k, fetched while ``held`` bytes of the
        previous round are still alive (the native load gets the rest)."""
        buf = own_areas[k % 2][: size(rank, k)]
        err: BaseException | None = None
        if buf.numel():
            try:
                part = _fetch(f, rounds[rank][k], buf, cap)
                stats.add(part, held + buf.numel())
            except FastshardError as e:
                err = e
        return buf, err

    own, err = fetch_own(0, 0) if n_rounds else (arena[:0], None)
    for k in range(n_rounds):
        agree(group, err)
        bufs, at = [], 0
        for o in range(world_size):
            if o == rank:
                bufs.append(own)
            else:
                bufs.append(recv_area[at : at + size(o, k)])
                at += size(o, k)
        held = sum(b.numel() for b in bufs)
        works = [
            dist.broadcast(bufs[o], src=_global(group, o), group=group, async_op=True)
            for o in range(world_size)
            if bufs[o].numel()
        ]
        if k + 1 < n_rounds:
            own, err = fetch_own(k + 1, held)
        for w in works:
            w.wait()
        stats.peak_host_bytes = max(stats.peak_host_bytes, held)
        with torch.no_grad():
            for o in range(world_size):
                if k >= len(rounds[o]):
                    continue
                offsets, _ = _layout(rounds[o][k])
                for at, p in zip(offsets, rounds[o][k], strict=True):
                    for it in by_index[p.index]:
                        _place(f, p, bufs[o][at : at + p.nbytes], it)
        del bufs
    return stats


def _global(group: Any, group_rank: int) -> int:
    """broadcast's ``src`` is a global rank, even with a subgroup."""
    if group is None or group is dist.group.WORLD:
        return group_rank
    return dist.get_global_rank(group, group_rank)
