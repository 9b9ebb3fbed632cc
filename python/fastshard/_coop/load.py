"""Cooperative loads: the ranks of a torch.distributed group fetch each byte of
one object once between them and send each other only what each one keeps.

Every rank of a tensor-parallel group needs a slice of most tensors and all
of the replicated ones, and row-parallel slices are strided, so ranks that
each read their own share fetch more than the object between them. Here the
tensors are split into contiguous byte ranges, one per rank (each rank reads
its range at full speed); the ranks first tell each other which slices they
load (``fastshard._coop.plan``), then in rounds each rank fetches a batch of
its range and every rank takes, from every batch, only its slices and the
replicated tensors it loads. Traffic to the store per group is the object's
size, whatever the world size; a rank receives about its own share of the
split tensors plus the replicated ones (``LoadStats.bytes_fetched`` and
``bytes_received``).

How a rank gets the others' bytes (``LoadStats.exchange``,
``fastshard._coop.exchange``): where every rank maps every other's memory
(one host), each copies its slices straight out of the owners' batches in
shared memory (``fastshard._coop.shm``); otherwise every owner sends each
peer its parts in one all-to-all per round. A round is one agreement (a flag
per rank), then the exchange. A thread fetches round k+1 while round k is
exchanged and placed, so under a slow store the exchange hides behind the
fetch; round 0 of the plan this rank guesses (every rank wanting what it
wants) is fetched while the ranks agree on the real one.
``FASTSHARD_COOP_TRACE`` records where each rank's time goes
(``fastshard._coop.trace``).

Memory: a round holds this rank's batch (``max_host_bytes / (world + 3)``
bytes, at most 16 MiB: ``Budget.cooperative_batch``), the next batch it
fetches while the exchange runs and that fetch's own headers and scratch;
through the collective also the parts it sends and what it receives (at most
one batch from each peer). Tensors larger than a batch travel as blocks of
rows.

Failures: a rank that fails to fetch tells the others at the next round; one
that fails otherwise, or dies, stops the others through
``fastshard._coop.peers``, so every rank raises instead of waiting on a
collective that never comes, and no rank returns before every rank has
placed every piece.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from .. import tp
from .._engine import ring as _ring
from .._types import LoadStats, TensorSource
from ..errors import FastshardError, PeerFailedError, ShardMismatchError
from . import plan as cp
from . import shm as _shm
from .exchange import Collective, Shared
from .peers import Link
from .trace import Trace


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


def _share_plan(f: TensorSource, link: Link, wants: cp.Wants, cap: int) -> list[cp.Wants]:
    """Every rank's wants, after checking that the ranks read the same
    object with the same batch size. Ranks may want different tensors (a
    vLLM model may skip one on some rank): the group fetches every tensor
    that any rank wants, once."""
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
    rank, ws = link.rank, link.world_size
    cap = f.budget.cooperative_batch(ws)
    wants = _wants(items)
    # The plan when every rank wants the tensors this one does (tensor
    # parallelism): this rank's first batch is fetched by it into its own
    # segment while the ranks agree on the real plan, and kept if it holds.
    guess = cp.Schedule(f, [wants] * ws, cap, rank)
    # Sized for any plan the ranks may agree on (no batch is larger than the
    # cap or the object), not only the guessed one.
    area = max(guess.area(rank), min(cp.aligned(cap), f.file_size))
    own = _shm.create(area) if _shm.wanted(link) else None
    outs: dict[tuple[int, cp.Key], list[torch.Tensor]] = {}
    for it in items:
        outs.setdefault((it.index, cp.key_of(it.slice)), []).append(it.out)
    try:
        # Leaving the block waits for a fetch still running: it writes into the areas.
        with ThreadPoolExecutor(1, thread_name_prefix="fastshard-coop") as pool:
            return _rounds(
                f, link, trace, pool, _Start(f, guess, cap, own, pool, trace), wants, outs
            )
    finally:
        if own is not None:
            own.unlink()


class _Start:
    """The first batch of the guessed plan, fetched into this rank's own
    segment while the ranks agree (None when there is no segment)."""

    def __init__(
        self,
        f: TensorSource,
        guess: cp.Schedule,
        cap: int,
        own: _shm.Own | None,
        pool: ThreadPoolExecutor,
        trace: Trace,
    ) -> None:
        self.guess, self.own, self.cap = guess, own, cap
        self.first: Future[LoadStats | None] | None = None
        batch = guess.batch(guess.rank, 0)
        if own is not None and batch:
            dest = own.area(0)[: guess.size(guess.rank, 0)]
            self.first = pool.submit(_traced_fetch, f, batch, dest, cap, trace, 0)
        if own is not None and not own.reserve():
            self.drop()

    def drop(self) -> None:
        """Not used after all: the fetch still writing into it ends first."""
        if self.first is not None:
            with contextlib.suppress(Exception):  # a discarded attempt
                self.first.result()
        self.first, self.own = None, None

    def keep(
        self, plan: cp.Schedule, segments: _shm.Segments | None
    ) -> Future[LoadStats | None] | None:
        """Round 0's fetch when it is the real plan's, into the area used."""
        rank = plan.rank
        if segments is not None and plan.batch(rank, 0) == self.guess.batch(rank, 0):
            return self.first
        self.drop()
        return None


def _traced_fetch(
    f: TensorSource, batch: list[cp.Piece], dest: torch.Tensor, cap: int, trace: Trace, k: int
) -> LoadStats | None:
    """Round k's batch into ``dest``; runs on the fetch thread while earlier
    rounds are exchanged and placed (the native load releases the GIL)."""
    if not dest.numel():
        return None
    with trace.phase("fetch", k):
        return _fetch(f, batch, dest, cap)


def _rounds(
    f: TensorSource,
    link: Link,
    trace: Trace,
    pool: ThreadPoolExecutor,
    start: _Start,
    wants: cp.Wants,
    outs: dict[tuple[int, cp.Key], list[torch.Tensor]],
) -> LoadStats:
    rank, cap = link.rank, start.cap
    with trace.phase("plan"):
        reports = _share_plan(f, link, wants, cap)
        same = all(w == wants for w in reports)
        plan = start.guess if same else cp.Schedule(f, reports, cap, rank)
    with trace.phase("attach"):
        needed = [plan.area(o) for o in range(link.world_size)]
        segments = _shm.attach(link, start.own, needed)
    ex: Shared | Collective
    if segments is None:
        ex = Collective(f, plan, link, outs)
    else:
        ex = Shared(f, plan, segments, outs)
    stats = LoadStats(exchange="collective" if segments is None else "shared-memory")
    n = plan.count

    def fetch(j: int) -> Future[LoadStats | None]:
        return pool.submit(_traced_fetch, f, plan.batch(rank, j), ex.own(j), cap, trace, j)

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
    # j - depth + 1 proves it).
    first = start.keep(plan, segments)
    fetches = [first] if first is not None else []
    fetches += [fetch(j) for j in range(len(fetches), min(n, ex.depth - 1))]
    for k in range(n):
        with trace.phase("fetch_wait", k):
            err = landed(fetches[k], k)
        with trace.phase("agree", k):
            link.agree(err)
        if len(fetches) < n:
            fetches.append(fetch(len(fetches)))
        with torch.no_grad():
            received = ex.round(k, trace)
        trace.add("received_bytes", received, k)
        stats.bytes_received += received
        stats.peak_host_bytes = max(stats.peak_host_bytes, ex.around(k + 1))
    return stats
