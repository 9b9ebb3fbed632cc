"""Cooperative loads: the ranks of a torch.distributed group fetch each
byte of one object once between them and send each other only what each
one keeps.

Every rank of a tensor-parallel group needs a slice of most tensors and all
of the replicated ones, and row-parallel slices are strided, so ranks that
each read their own share fetch more than the object between them. Here the
tensors are split into contiguous byte ranges, one per rank (each rank reads
its range at full speed); the ranks first tell each other which slices they
load (``_coopplan``), then in rounds each rank fetches a batch of its range
and every rank takes, from every batch, only its slices and the replicated
tensors it loads. Traffic to the store per group is the object's size,
whatever the world size; a rank receives about its own share of the split
tensors plus the replicated ones (``LoadStats.bytes_fetched`` and
``bytes_received``).

How a rank gets the others' bytes (``LoadStats.exchange``): where every rank
maps every other's memory (one host), each copies its slices straight out of
the owners' batches in shared memory (``_coopshm``); otherwise every owner
sends each peer its parts in one all-to-all per round. A round is one
agreement (a flag per rank), then the exchange. A thread fetches round k+1
while round k is exchanged and placed, so under a slow store the exchange
hides behind the fetch. ``FASTSHARD_COOP_TRACE`` records where each rank's
time goes (``_cooptrace``).

Memory: a round holds this rank's batch (``max_host_bytes / (world + 3)``
bytes, at most 16 MiB: ``Budget.cooperative_batch``), the next batch it
fetches while the exchange runs and that fetch's own headers and scratch;
through the collective also the parts it sends and what it receives (at most
one batch from each peer). Tensors larger than a batch travel as blocks of
rows.

Failures: a rank that fails to fetch tells the others at the next round;
one that fails otherwise, or dies, stops the others through ``_peers``, so
every rank raises instead of waiting on a collective that never comes, and
no rank returns before every rank has placed every piece.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from . import _coopplan as cp
from . import _coopshm, _ring, tp
from ._cooptrace import Trace
from ._peers import Link
from ._types import LoadStats, TensorSource
from .errors import FastshardError, PeerFailedError, ShardMismatchError


@dataclass(frozen=True)
class Item:
    """One destination: the file tensor ``index``, this rank's ``slice`` of
    it (None: whole), copied (and cast) into ``out``."""

    index: int
    slice: tp.Slice | None
    out: torch.Tensor


def _fetch(f: TensorSource, batch: list[cp.Piece], buf: torch.Tensor, budget: int) -> LoadStats:
    """This rank's batch into ``buf``: straight in when it is host memory,
    else (a GPU's, for NCCL) through the pinned staging ring."""
    offsets, _ = cp.layout(batch)
    views = [buf[o : o + p.nbytes] for o, p in zip(offsets, batch, strict=True)]
    slices: list[tp.Slice | None] = []
    for p in batch:
        info = f.info_at(p.index)
        whole = not info.shape or (p.row0 == 0 and p.rows == info.shape[0])
        slices.append(None if whole else (0, [(p.row0, p.rows)]))
    if buf.device.type != "cpu":
        blocks = [cp.block(f, p, v) for p, v in zip(batch, views, strict=True)]
        items = [
            _ring.Item(p.index, s, tuple(b.shape), b)
            for p, s, b in zip(batch, slices, blocks, strict=True)
        ]
        # It runs on the fetch thread, whose current GPU is not the rank's.
        with torch.cuda.device(buf.device):
            return _ring.load(f, items, budget)
    # Hash checks need whole records: only whole pieces can be verified.
    verify = f.verify_hash and all(s is None for s in slices)
    return f.fill(
        [p.index for p in batch], views, slices, verify_hash=verify, max_host_bytes=budget
    )


def _wants(items: list[Item]) -> cp.Wants:
    out: cp.Wants = {}
    for it in items:
        keys = out.setdefault(it.index, [])
        if cp.key_of(it.slice) not in keys:
            keys.append(cp.key_of(it.slice))
    return out


def _share_plan(f: TensorSource, link: Link, items: list[Item], cap: int) -> list[cp.Wants]:
    """Every rank's wants, after checking that the ranks read the same
    object with the same batch size. Ranks may want different tensors (a
    vLLM model may skip one on some rank): the group fetches every tensor
    that any rank wants, once."""
    wants = _wants(items)
    key = hashlib.sha256(repr((f.file_size, cap)).encode()).hexdigest()
    mine = json.dumps([key, [[i, ks] for i, ks in wants.items()]]).encode()
    reports = [json.loads(r) for r in link.gather(mine)]
    if len({r[0] for r in reports}) != 1:
        raise ShardMismatchError(
            f"{f.uri}: the ranks of the cooperative load disagree on what to read "
            "(different files or max_host_bytes); every rank must load from the same "
            "object with the same options",
            uri=f.uri,
        )
    return [{int(i): [_key(k) for k in ks] for i, ks in report[1]} for report in reports]


def _key(raw: Any) -> cp.Key:
    return None if raw is None else (int(raw[0]), tuple((int(a), int(n)) for a, n in raw[1]))


class _Schedule:
    """The buffer sizes of every owner's batches and every part each rank
    sends or receives, the same on every rank."""

    def __init__(self, f: TensorSource, wants: list[cp.Wants], cap: int, rank: int) -> None:
        self.f, self.wants, self.rank = f, wants, rank
        ws = len(wants)
        wanted = {i for w in wants for i, keys in w.items() if keys}
        all_pieces = cp.pieces(f, sorted(wanted), cap)
        self.rounds = [cp.batches(o, cap) for o in cp.owners(all_pieces, ws)]
        self.count = max(len(r) for r in self.rounds)

    def batch(self, owner: int, k: int) -> list[cp.Piece]:
        return self.rounds[owner][k] if k < len(self.rounds[owner]) else []

    def size(self, owner: int, k: int) -> int:
        return cp.layout(self.batch(owner, k))[1]

    def area(self, owner: int) -> int:
        """The largest of ``owner``'s batches."""
        return max((self.size(owner, k) for k in range(self.count)), default=0)

    def parts(self, owner: int, receiver: int, k: int) -> list[tuple[cp.Piece, cp.Key]]:
        if owner == receiver:
            return []
        return cp.sends(self.batch(owner, k), self.wants[receiver])

    def split(self, owner: int, receiver: int, k: int) -> int:
        parts = self.parts(owner, receiver, k)
        return sum(cp.aligned(cp.part_bytes(self.f, p, key)) for p, key in parts)

    def send_bytes(self, k: int) -> int:
        return sum(self.split(self.rank, r, k) for r in range(len(self.wants)))

    def recv_bytes(self, k: int) -> int:
        return sum(self.split(o, self.rank, k) for o in range(len(self.wants)))


def load(f: TensorSource, items: list[Item], link: Link) -> LoadStats:
    """Fill every item, this rank fetching only its share of the object.
    Every rank raises if one fails; on success every rank has placed
    everything before any returns."""
    trace = Trace(link.rank, link.world_size)
    try:
        stats = _load(f, items, link, trace)
        with trace.phase("end"):
            link.agree(None)
        trace.write()
        return stats
    except BaseException as e:
        if not isinstance(e, PeerFailedError):
            link.fail(e)
        raise


def _load(f: TensorSource, items: list[Item], link: Link, trace: Trace) -> LoadStats:
    rank = link.rank
    cap = f.budget.cooperative_batch(link.world_size)
    with trace.phase("plan"):
        plan = _Schedule(f, _share_plan(f, link, items, cap), cap, rank)
    by_key: dict[tuple[int, cp.Key], list[Item]] = {}
    for it in items:
        by_key.setdefault((it.index, cp.key_of(it.slice)), []).append(it)
    with trace.phase("attach"):
        segments = _coopshm.attach(link, [plan.area(o) for o in range(link.world_size)])
    ex: _Shared | _Collective
    if segments is None:
        ex = _Collective(f, plan, link, by_key)
    else:
        ex = _Shared(f, plan, segments, by_key)
    stats = LoadStats(exchange="collective" if segments is None else "shared-memory")
    n = plan.count

    def fetch(k: int) -> LoadStats | None:
        """Round k's batch; runs on the fetch thread while round k-1 is
        exchanged and placed (the native load releases the GIL)."""
        if not ex.own(k).numel():
            return None
        with trace.phase("fetch", k):
            return _fetch(f, plan.batch(rank, k), ex.own(k), cap)

    def landed(fetching: Future[LoadStats | None], k: int) -> BaseException | None:
        """Round k's fetch, finished: its error, which the ranks agree on."""
        try:
            got = fetching.result()
        except FastshardError as e:
            return e
        if got is not None:
            stats.add(got, ex.around(k))
        return None

    # One thread fetches the rounds in order, up to ``depth - 1`` ahead of the
    # one this thread exchanges: round j is queued once every rank has left
    # round j - depth, whose area it reuses (the agreement on round
    # j - depth + 1 proves it). Leaving the block waits for a fetch still
    # running: it writes into the areas.
    with ThreadPoolExecutor(1, thread_name_prefix="fastshard-coop") as pool:
        fetches = [pool.submit(fetch, j) for j in range(min(n, ex.depth - 1))]
        for k in range(n):
            with trace.phase("fetch_wait", k):
                err = landed(fetches[k], k)
            with trace.phase("agree", k):
                link.agree(err)
            if len(fetches) < n:
                fetches.append(pool.submit(fetch, len(fetches)))
            with torch.no_grad():
                received = ex.round(k, trace)
            trace.add("received_bytes", received, k)
            stats.bytes_received += received
            stats.peak_host_bytes = max(stats.peak_host_bytes, ex.around(k + 1))
    return stats


class _Shared:
    """Round k through shared memory (``_coopshm``): this rank copies its
    slices out of every owner's batch, where the owner fetched it."""

    def __init__(
        self,
        f: TensorSource,
        plan: _Schedule,
        segments: _coopshm.Segments,
        by_key: dict[tuple[int, cp.Key], list[Item]],
    ) -> None:
        self.f, self.plan, self.segments, self.by_key = f, plan, segments, by_key

    # Three areas: the round being placed, the one whose fetch has landed
    # or is ending, and the next, so the fetch thread never waits for a
    # round's agreement (only for the agreement two rounds back).
    depth = _coopshm.AREAS

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
                        for it in self.by_key.get((p.index, key), []):
                            cp.place(self.f, p, area[at : at + p.nbytes], key, it.out)
                        if o != rank:
                            received += cp.part_bytes(self.f, p, key)
        return received


class _Collective:
    """Round k through the group's all-to-all: every owner packs each peer's
    parts, sends them, and each rank places what it received."""

    def __init__(
        self,
        f: TensorSource,
        plan: _Schedule,
        link: Link,
        by_key: dict[tuple[int, cp.Key], list[Item]],
    ) -> None:
        self.f, self.plan, self.link, self.by_key = f, plan, link, by_key
        rank, n = plan.rank, plan.count
        # Carved from one allocation made once (see _torch.Arena for why):
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
            _place(self.f, self.plan, k, self.own(k), self.recv_area, self.by_key)
        return received


def _exchange(
    f: TensorSource,
    plan: _Schedule,
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


def _pack(f: TensorSource, plan: _Schedule, k: int, own: torch.Tensor, send: torch.Tensor) -> None:
    """This rank's parts for every peer, laid out as ``_Schedule.parts`` says."""
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
    plan: _Schedule,
    k: int,
    own: torch.Tensor,
    recv_area: torch.Tensor,
    by_key: dict[tuple[int, cp.Key], list[Item]],
) -> None:
    """Copy round k's pieces into this rank's destinations: its own batch,
    then the parts sent to it."""
    rank, ws = plan.rank, len(plan.wants)

    def put(p: cp.Piece, key: cp.Key, raw: torch.Tensor, whole: bool) -> None:
        for it in by_key.get((p.index, key), []):
            (cp.place if whole else cp.deposit)(f, p, raw, key, it.out)

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
