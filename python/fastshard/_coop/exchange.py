"""How the ranks of a cooperative load get each other's bytes, one round
at a time (``fastshard._coop.load`` runs the rounds): ``Shared`` copies
this rank's slices straight out of the owners' batches in shared memory
(``fastshard._coop.shm``); ``Collective`` packs each peer's parts, sends
them in one all-to-all over the group and places what it received. Both take the same plan
(``_coop.plan.Schedule``) and fill the same destinations: ``outs`` maps
(file index, slice key) to the tensors that slice goes into.
"""

from __future__ import annotations

from typing import Any

import torch

from .._types import TensorSource
from . import plan as cp
from . import shm as _shm
from .peers import Link
from .trace import Trace


class Shared:
    """Round k through shared memory (``shm``): this rank copies its
    slices out of every owner's batch, where the owner fetched it."""

    def __init__(
        self,
        f: TensorSource,
        plan: cp.Schedule,
        segments: _shm.Segments,
        outs: dict[tuple[int, cp.Key], list[torch.Tensor]],
    ) -> None:
        self.f, self.plan, self.segments, self.outs = f, plan, segments, outs

    # Three areas: the round being placed, the one whose fetch has landed
    # or is ending, and the next, so the fetch thread never waits for a
    # round's agreement (only for the agreement two rounds back).
    depth = _shm.AREAS

    def own(self, k: int) -> torch.Tensor:
        return self.segments.area(self.plan.rank, k)[: self.plan.size(self.plan.rank, k)]

    def around(self, k: int) -> int:
        """Bytes held while round k is fetched: the areas in use."""
        return sum(
            self.plan.size(self.plan.rank, j) for j in range(k - self.depth + 1, k + 1) if j >= 0
        )

    def round(self, k: int, trace: Trace) -> int:
        """Place round k; the bytes read from the other owners' batches."""
        plan, rank, received = self.plan, self.plan.rank, 0
        with trace.phase("place", k):
            for o in range(len(plan.wants)):
                batch, area = plan.batch(o, k), self.segments.area(o, k)
                for at, p in zip(cp.layout(batch)[0], batch, strict=True):
                    for key in plan.wants[rank].get(p.index, []):
                        for out in self.outs.get((p.index, key), []):
                            cp.place(self.f, p, area[at : at + p.nbytes], key, out)
                        if o != rank:
                            received += cp.part_bytes(self.f, p, key)
        return received


class Collective:
    """Round k through the group's all-to-all: every owner packs each peer's
    parts, sends them, and each rank places what it received."""

    def __init__(
        self,
        f: TensorSource,
        plan: cp.Schedule,
        link: Link,
        outs: dict[tuple[int, cp.Key], list[torch.Tensor]],
    ) -> None:
        self.f, self.plan, self.link, self.outs = f, plan, link, outs
        rank, n = plan.rank, plan.count
        # Carved from one allocation made once (fresh ones each round let
        # glibc's adaptive mmap threshold grow the heap past max_host_bytes):
        # two areas for this rank's batches (round k's is exchanged while
        # round k+1's is fetched), one for the parts it sends, one for the rest.
        own_max = plan.area(rank)
        send_max = max((plan.send_bytes(k) for k in range(n)), default=0)
        recv_max = max((plan.recv_bytes(k) for k in range(n)), default=0)
        arena = torch.empty(
            2 * own_max + send_max + recv_max, dtype=torch.uint8, device=link.device
        )
        self.areas = (arena[:own_max], arena[own_max : 2 * own_max])
        self.send_area = arena[2 * own_max : 2 * own_max + send_max]
        self.recv_area = arena[2 * own_max + send_max :]

    # Two batch areas: round k's is exchanged while round k+1's is fetched.
    depth = 2

    def own(self, k: int) -> torch.Tensor:
        return self.areas[k % 2][: self.plan.size(self.plan.rank, k)]

    def around(self, k: int) -> int:
        """Bytes held while round k is fetched: round k-1's batch and
        exchange buffers, and round k's batch."""
        plan, j = self.plan, k - 1
        held = plan.size(plan.rank, j) + plan.send_bytes(j) + plan.recv_bytes(j) if j >= 0 else 0
        return held + plan.size(plan.rank, k)

    def round(self, k: int, trace: Trace) -> int:
        """Exchange and place round k; the bytes received."""
        with trace.phase("pack", k):
            inbox, sent, received = _exchange(
                self.f, self.plan, self.link, k, self.own(k), self.send_area, self.recv_area
            )
        trace.add("sent_bytes", sent, k)
        with trace.phase("wait", k):
            self.link.wait([] if inbox is None else [inbox])
        with trace.phase("place", k):
            _place(self.f, self.plan, k, self.own(k), self.recv_area, self.outs)
        return received


def _exchange(
    f: TensorSource,
    plan: cp.Schedule,
    link: Link,
    k: int,
    own: torch.Tensor,
    send_area: torch.Tensor,
    recv_area: torch.Tensor,
) -> tuple[Any, int, int]:
    """Pack and start round k's one all-to-all (None: no rank has a part
    this round); the bytes this rank sends and receives. ``recv_area`` gets
    what the other owners send this rank, in rank order."""
    rank, ws = link.rank, link.world_size
    out_sizes = [plan.split(o, rank, k) for o in range(ws)]
    in_sizes = [plan.split(rank, r, k) for r in range(ws)]
    # Every rank knows every rank's sizes: all skip an empty all-to-all alike.
    if not any(plan.split(o, r, k) for o in range(ws) for r in range(ws)):
        return None, 0, 0
    send = send_area[: sum(in_sizes)]
    _pack(f, plan, k, own, send)
    inbox = link.all_to_all(recv_area[: sum(out_sizes)], send, out_sizes, in_sizes)
    return inbox, sum(in_sizes), sum(out_sizes)


def _pack(
    f: TensorSource, plan: cp.Schedule, k: int, own: torch.Tensor, send: torch.Tensor
) -> None:
    """This rank's parts for every peer, laid out as ``cp.Schedule.parts`` says."""
    batch = plan.batch(plan.rank, k)
    offsets = dict(zip(map(id, batch), cp.layout(batch)[0], strict=True))
    at = 0
    with torch.no_grad():
        for r in range(len(plan.wants)):
            for p, key in plan.parts(plan.rank, r, k):
                n = cp.part_bytes(f, p, key)
                raw = own[offsets[id(p)] : offsets[id(p)] + p.nbytes]
                cp.extract(f, p, raw, key, send[at : at + n])
                at += cp.aligned(n)


def _place(
    f: TensorSource,
    plan: cp.Schedule,
    k: int,
    own: torch.Tensor,
    recv_area: torch.Tensor,
    outs: dict[tuple[int, cp.Key], list[torch.Tensor]],
) -> None:
    """Copy round k's pieces into this rank's destinations: its own batch,
    then the parts sent to it."""
    rank, ws = plan.rank, len(plan.wants)

    def put(p: cp.Piece, key: cp.Key, raw: torch.Tensor, whole: bool) -> None:
        for out in outs.get((p.index, key), []):
            (cp.place if whole else cp.deposit)(f, p, raw, key, out)

    batch = plan.batch(rank, k)
    for at, p in zip(cp.layout(batch)[0], batch, strict=True):
        for key in plan.wants[rank].get(p.index, []):
            put(p, key, own[at : at + p.nbytes], True)
    at = 0
    for o in range(ws):
        for p, key in plan.parts(o, rank, k):
            n = cp.part_bytes(f, p, key)
            put(p, key, recv_area[at : at + n], False)
            at += cp.aligned(n)
