"""The process group of a cooperative load and the collectives it runs,
each one watched so that a rank that fails or dies stops every rank.

A collective waits for every rank, so a rank that raised (or was killed)
would leave the others waiting until the backend's timeout (30 minutes by
default). Two things prevent that:

- every collective here is started asynchronously and polled; while it
  waits, the rank also polls a flag in the group's store (the c10d store
  every rank already shares) that a failing rank sets with its error;
- a rank whose own code fails, or whose collective fails because a peer
  died (gloo reports the closed connection), sets that flag before it
  raises, so the ranks that were not connected to the dead one learn it
  too.

Each cooperative load of a group has its own flag (the loads of a group
are counted in every process, in the same order on every rank), so a
failure that every rank agreed on leaves the group usable for the next.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..errors import InvalidArgumentError, PeerFailedError, ShardMismatchError, UnsupportedError

# Cooperative loads begun in this process, per group name: the flag of the
# next one. Every rank runs the same loads in the same order.
_begun: dict[str, int] = {}
_POLL_MAX = 0.002  # seconds between polls of a collective without a future, at most
_CHECK_EVERY = 0.1  # seconds between reads of the failure flag while waiting


def group_of(group: Any, rank: int, world_size: int) -> Any:
    """The process group to cooperate in, checked against rank/world_size."""
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgumentError(
            "cooperative loading needs torch.distributed initialised (init_process_group) "
            "in every rank"
        )
    g = group if group is not None else dist.group.WORLD
    buffer_device(g)  # a backend it cannot exchange over fails here, before any load
    g_rank, g_size = dist.get_rank(g), dist.get_world_size(g)
    if (g_rank, g_size) != (rank, world_size):
        raise ShardMismatchError(
            f"cooperative load asked rank={rank}, world_size={world_size} but the process "
            f"group has rank {g_rank} of {g_size}"
        )
    return g


def buffer_device(group: Any) -> torch.device:
    """Where a cooperative load's exchange buffers live, the one decision
    the gloo and NCCL paths differ by: host memory for gloo; this rank's
    current GPU for NCCL, which exchanges device tensors (each rank's
    pieces reach its GPU through the pinned staging ring)."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend:
        return torch.device("cuda", torch.cuda.current_device())
    if "gloo" in backend:
        return torch.device("cpu")
    raise UnsupportedError(
        f"cooperative loading exchanges over gloo or NCCL, not {backend!r}: pass "
        "group=torch.distributed.new_group(backend='gloo') (vLLM: get_tp_group().cpu_group)"
    )


def _name(group: Any) -> str:
    g = group if group is not None else dist.group.WORLD
    return str(getattr(g, "group_name", "") or "world")


def _flag(group: Any, n: int) -> str:
    return f"fastshard/cooperative/{_name(group)}/{n}/failed"


def _message(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:2000] or type(error).__name__


def abandon(group: Any, rank: int, error: BaseException) -> None:
    """Tell the ranks that are about to start (or are starting) the group's
    next cooperative load that this rank will not come: they raise instead
    of waiting for it. For a rank that fails between two loads of a
    sequence (a batch refused by the model)."""
    n = _begun.get(_name(group), 0)
    _set(group, _flag(group, n), f"rank {rank} stopped: {_message(error)}")


def _set(group: Any, key: str, message: str) -> None:
    """Raise the flag ``key`` with ``message``, unless a rank raised it
    first: the first failure is the cause, the ones it caused in other
    ranks (connections closed by ranks that stopped) are not."""
    try:
        store = dist.distributed_c10d._get_default_store()
        if store.add(f"{key}/count", 1) == 1:
            store.set(key, message)
    except Exception:  # noqa: BLE001 - the store may be gone with a dead rank
        pass


class Link:
    """One cooperative load's group: its collectives, watched (see the
    module's doc). ``rank``/``world_size`` are within the group."""

    def __init__(self, group: Any, rank: int, world_size: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = world_size
        name = _name(group)
        n = _begun.get(name, 0)
        _begun[name] = n + 1
        self.key = _flag(group, n)
        self.store = dist.distributed_c10d._get_default_store()
        self.device = buffer_device(group if group is not None else dist.group.WORLD)

    # -- failure -------------------------------------------------------------
    def fail(self, error: BaseException) -> None:
        """This rank stops (``error``): every rank waiting in a collective
        of this load raises."""
        if not isinstance(error, PeerFailedError):
            _set(self.group, self.key, f"rank {self.rank} failed: {_message(error)}")

    def check(self) -> None:
        """Raise if another rank has stopped this load."""
        try:
            failed = self.store.check([self.key])
            message = self.store.get(self.key).decode(errors="replace") if failed else ""
        except Exception as e:  # noqa: BLE001 - a store that is gone: its host died
            raise PeerFailedError(
                f"cooperative load stopped: the group's store does not answer ({e}); "
                "a rank has probably died"
            ) from e
        if failed:
            raise PeerFailedError(f"cooperative load stopped: {message}")

    def wait(self, works: Sequence[Any]) -> None:
        """Wait for collectives this rank started, raising if a peer stops.
        Woken by the collectives' futures where the backend has them (gloo),
        else by polling; either way the failure flag is read only every
        ``_CHECK_EVERY`` seconds (a store round trip)."""
        done = _completion(works, self.device.type == "cpu")
        delay = 0.0001
        checked = time.monotonic()
        while not done():
            if time.monotonic() - checked >= _CHECK_EVERY:
                self.check()
                checked = time.monotonic()
            if isinstance(done, _Countdown):
                done.event.wait(_CHECK_EVERY)
            else:
                time.sleep(delay)
                delay = min(2 * delay, _POLL_MAX)
        for w in works:
            try:
                w.wait()
            except RuntimeError as e:
                self.check()  # a rank that stopped first names the cause
                error = PeerFailedError(
                    f"cooperative load stopped: the exchange with the other ranks failed "
                    f"({e}); a rank has probably died"
                )
                _set(self.group, self.key, f"rank {self.rank}: {error}")
                raise error from e

    # -- collectives -----------------------------------------------------------
    def _global(self, group_rank: int) -> int:
        """A collective's ``src`` is a global rank, even with a subgroup."""
        if self.group is None or self.group is dist.group.WORLD:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    def broadcast(self, buf: torch.Tensor, owner: int) -> Any:
        return dist.broadcast(buf, src=self._global(owner), group=self.group, async_op=True)

    def all_to_all(
        self, out: torch.Tensor, inp: torch.Tensor, out_sizes: list[int], in_sizes: list[int]
    ) -> Any:
        return dist.all_to_all_single(
            out, inp, out_sizes, in_sizes, group=self.group, async_op=True
        )

    def gather(self, data: bytes) -> list[bytes]:
        """Every rank's ``data``, in rank order."""
        ws, dev = self.world_size, self.device
        size = torch.tensor([len(data)], dtype=torch.int64, device=dev)
        sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(ws)]
        self.wait([dist.all_gather(sizes, size, group=self.group, async_op=True)])
        n = max(1, max(int(s) for s in sizes))
        mine = torch.zeros(n, dtype=torch.uint8)
        if data:
            mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        outs = [torch.empty(n, dtype=torch.uint8, device=dev) for _ in range(ws)]
        self.wait([dist.all_gather(outs, mine.to(dev), group=self.group, async_op=True)])
        return [bytes(o[: int(s)].cpu().numpy()) for o, s in zip(outs, sizes, strict=True)]

    def agree(self, error: BaseException | None) -> None:
        """Every rank reports whether it may go on; if one may not, all
        raise (the failed rank its own error). One all_gather of a flag per
        rank; a failed rank's message goes through the store, read only
        when there is one."""
        if error is not None:
            try:
                self.store.set(self._report(self.rank), _message(error))
            except Exception:  # noqa: BLE001 - the others still learn of it below
                pass
        flag = torch.tensor([0 if error is None else 1], dtype=torch.int64, device=self.device)
        flags = [
            torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(self.world_size)
        ]
        try:
            self.wait([dist.all_gather(flags, flag, group=self.group, async_op=True)])
        except PeerFailedError:
            if error is not None:
                raise error from None  # this rank's own failure says more
            raise
        if error is not None:
            raise error
        for rank, failed in enumerate(int(f) for f in flags):
            if failed:
                raise PeerFailedError(
                    f"cooperative load stopped: rank {rank} failed: {self._read_report(rank)}"
                )

    def _report(self, rank: int) -> str:
        return f"{self.key}/report/{rank}"

    def _read_report(self, rank: int) -> str:
        try:
            return str(self.store.get(self._report(rank)).decode(errors="replace"))
        except Exception:  # noqa: BLE001 - its message is lost with it, not the failure
            return "(its message could not be read from the group's store)"


class _Countdown:
    """Done when every work's future has completed: an event to wait on
    instead of polling."""

    def __init__(self, futures: list[Any]) -> None:
        self.event = threading.Event()
        self._left = len(futures)
        self._lock = threading.Lock()
        if not futures:
            self.event.set()
        for fut in futures:
            fut.add_done_callback(self._one)

    def _one(self, _fut: Any) -> None:
        with self._lock:
            self._left -= 1
            if self._left <= 0:
                self.event.set()

    def __call__(self) -> bool:
        return self.event.is_set()


def _completion(works: Sequence[Any], host: bool) -> Any:
    """A callable that says when every work is done: a ``_Countdown`` over
    their futures for a host group (gloo), else one polling
    ``is_completed`` (a device collective's future follows its stream)."""
    if host:
        try:
            return _Countdown([w.get_future() for w in works])
        except RuntimeError:  # a work without a future
            pass
    return lambda: all(w.is_completed() for w in works)
