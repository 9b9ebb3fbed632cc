"""Helpers of the staged-load tests (test_staging_ring.py,
test_staged_copies.py): a copier whose copies complete late, in order, on
a thread of their own (like a GPU stream still busy), and the files."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import torch

import fastshard
from fastshard._engine import places as _places
from fastshard._engine import ring as _ring

KiB, MiB = 1 << 10, 1 << 20
Job = tuple[torch.Tensor, int, list[_places.ByteOp], list[_places.ItemOp]]


class LateTicket:
    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def done(self) -> bool:
        return self.event.is_set()

    def wait(self) -> None:
        self.event.wait()


class LateCopier:
    """A CPU copier whose copies run ``delay`` seconds after the batch's
    ticket is taken, in order on a thread of their own, like a GPU stream
    still busy with earlier copies."""

    def __init__(self, delay: float, fail_at: int | None = None) -> None:
        self.delay = delay
        self.fail_at = fail_at
        self.inner: _places.CpuCopier | None = None
        self.queued: list[Job] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.tickets = 0
        self.most_in_flight = 0
        self.finished_with_in_flight: int | None = None
        self.stream: queue.Queue[tuple[list[Job], threading.Event]] = queue.Queue()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            jobs, event = self.stream.get()
            time.sleep(self.delay)
            assert self.inner is not None
            for job in jobs:
                self.inner.copy(*job)
            with self.lock:
                self.in_flight -= 1
            event.set()

    def copy(
        self,
        slab: torch.Tensor,
        slot: int,
        bytes_ops: list[_places.ByteOp],
        item_ops: list[_places.ItemOp],
    ) -> None:
        if self.fail_at is not None and self.tickets == self.fail_at:
            raise RuntimeError("copy failed")
        self.queued.append((slab, slot, bytes_ops, item_ops))

    def ticket(self) -> LateTicket:
        jobs, self.queued = self.queued, []
        event = threading.Event()
        self.tickets += 1
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.stream.put((jobs, event))
        return LateTicket(event)

    def finish(self) -> None:
        with self.lock:
            self.finished_with_in_flight = self.in_flight


def late_load(
    f: fastshard.TensorFile, items: list[_ring.Item], budget: int, copier: LateCopier
) -> fastshard.LoadStats:
    """``_ring.load`` with the late copier around the real CPU one."""
    dtypes = [f.engine.info_at(it.index).dtype for it in items]
    where, targets = _ring.targets_of(items, dtypes)
    copier.inner = _places.CpuCopier(_places.Places(items, dtypes, targets))
    return _ring.load(f.engine, items, budget, copier=copier)


def many_file(tmp_path: Path, count: int) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(5)
    sd = {f"w{i}": torch.randn(64, 256) for i in range(count)}  # 64 KiB each
    path = tmp_path / "many.tensors"
    fastshard.save(sd, path)
    return path, sd


def half_items(f: fastshard.TensorFile, sd: dict[str, torch.Tensor]) -> list[_ring.Item]:
    """Every tensor cast to float16 on the way: all of them staged."""
    return [
        _ring.Item(
            f.index_of(n), None, tuple(t.shape), torch.full(t.shape, -1.0, dtype=torch.float16)
        )
        for n, t in sd.items()
    ]


def fp32_file(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    sd = {
        "big": torch.randn(1024, 512),  # 2 MiB: split into row blocks
        **{f"w{i}": torch.randn(64, 33) for i in range(30)},
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "ids": torch.arange(100, dtype=torch.int64),
    }
    path = tmp_path / "fp32.tensors"
    fastshard.save(sd, path)
    return path, sd
