"""The staging ring (python/fastshard/_ring.py) that CUDA and cast
destinations go through, exercised on the CPU with real torch copies made
late on purpose: a copier that performs each batch's copies on a thread
after a delay. A ring that refilled a slab before its copy completed would
hand the copy the next batch's bytes, which the data checks see; the
counters check backpressure, ordering and what happens after an error."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import assert_bit_equal, random_tensor

import fastshard
from fastshard import _ring
from fastshard._options import Budget
from fastshard._types import LoadStats

KiB, MiB = 1 << 10, 1 << 20


class LateTicket:
    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def done(self) -> bool:
        return self.event.is_set()

    def wait(self) -> None:
        self.event.wait()


class LateCopier:
    """Real ``copy_``s, run ``delay`` seconds after the batch's ticket is
    taken, on a thread, like a GPU copy still in flight."""

    def __init__(self, delay: float, fail_at: int | None = None) -> None:
        self.delay = delay
        self.fail_at = fail_at
        self.queued: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.tickets = 0
        self.finished_with_in_flight: int | None = None
        self.done_batches: list[int] = []

    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        if self.fail_at is not None and self.tickets == self.fail_at:
            raise RuntimeError("copy failed")
        self.queued.append((src, dst))

    def ticket(self) -> LateTicket:
        jobs, self.queued = self.queued, []
        event = threading.Event()
        batch = self.tickets
        self.tickets += 1
        with self.lock:
            self.in_flight += 1

        def work() -> None:
            time.sleep(self.delay)
            for src, dst in jobs:
                dst.copy_(src)
            with self.lock:
                self.in_flight -= 1
                self.done_batches.append(batch)
            event.set()

        threading.Thread(target=work, daemon=True).start()
        return LateTicket(event)

    def finish(self) -> None:
        with self.lock:
            self.finished_with_in_flight = self.in_flight


class Recorder:
    """A fill that writes batch k's byte pattern into the slab (slowly) and
    records what the ring asked of it."""

    def __init__(self, copier: LateCopier, fail_at: int | None = None) -> None:
        self.copier = copier
        self.fail_at = fail_at
        self.lock = threading.Lock()
        self.running = 0
        self.most_running = 0
        self.started: list[int] = []
        self.ahead = 0  # most fills started beyond the copies completed

    def __call__(self, batch: _ring.Batch, slab: torch.Tensor) -> LoadStats:
        k = batch[0][1].index
        with self.lock:
            self.started.append(k)
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            with self.copier.lock:
                done = len(self.copier.done_batches)
            self.ahead = max(self.ahead, len(self.started) - done)
        try:
            time.sleep(0.002)
            if k == self.fail_at:
                raise fastshard.StorageError("injected fill failure", uri="mem://x")
            for offset, piece in batch:
                slab[offset : offset + piece.nbytes].fill_(k % 251)
            return LoadStats(peak_host_bytes=100)
        finally:
            with self.lock:
                self.running -= 1


def work(count: int, nbytes: int) -> tuple[list[_ring.Batch], list[torch.Tensor]]:
    dests = [torch.full((nbytes,), 255, dtype=torch.uint8) for _ in range(count)]
    pieces = [_ring.Piece(k, None, (nbytes,), torch.uint8, dests[k]) for k in range(count)]
    return _ring.batches(pieces, nbytes), dests


def slabs(depth: int, nbytes: int) -> list[torch.Tensor]:
    return _ring.Slabs(depth, nbytes).views


def test_a_slab_is_refilled_only_after_its_copy_completed() -> None:
    batches, dests = work(24, 64 * KiB)
    copier = LateCopier(delay=0.03)
    fill = Recorder(copier)
    stats = _ring.run(fill, batches, slabs(3, 64 * KiB), copier, fills=2)
    for k, d in enumerate(dests):
        assert torch.all(d == k % 251), f"batch {k} got another batch's bytes"
    assert fill.started == list(range(24))  # in order
    assert fill.most_running <= 2
    assert fill.ahead <= 3  # never more batches in slabs than slabs
    assert stats.slabs_peak == 3
    assert stats.bytes_staged == 24 * 64 * KiB
    assert copier.finished_with_in_flight == 0


def test_without_delay_the_ring_runs_ahead_up_to_its_depth() -> None:
    # The control for the test above: copies that complete at once let
    # fills run ahead as far as the slabs allow, so "ahead" can be seen.
    batches, dests = work(12, 4 * KiB)
    copier = LateCopier(delay=0.0)
    fill = Recorder(copier)
    _ring.run(fill, batches, slabs(4, 4 * KiB), copier, fills=3)
    assert all(torch.all(d == k % 251) for k, d in enumerate(dests))
    assert fill.most_running <= 3


@pytest.mark.parametrize("where", ["fill", "copy"])
def test_an_error_midway_stops_the_ring_after_everything_started_ended(where: str) -> None:
    batches, dests = work(20, 16 * KiB)
    copier = LateCopier(delay=0.02, fail_at=5 if where == "copy" else None)
    fill = Recorder(copier, fail_at=5 if where == "fill" else None)
    with pytest.raises((fastshard.StorageError, RuntimeError)) as info:
        _ring.run(fill, batches, slabs(3, 16 * KiB), copier, fills=2)
    if where == "fill":
        assert isinstance(info.value, fastshard.StorageError)
        assert info.value.uri == "mem://x"
    # No copy still reads a slab and no fill still writes one once run
    # returns, and nothing beyond the slabs in hand was started.
    assert copier.finished_with_in_flight == 0
    assert fill.running == 0
    assert max(fill.started) <= 5 + 3
    time.sleep(0.05)
    assert all(torch.all(d == 255) for d in dests[5:]), "work after the error was done"


def test_sizing_stays_inside_the_budget_and_refuses_what_cannot_fit() -> None:
    for budget in [64 * KiB, 1 * MiB, 7 * MiB + 3, 64 * MiB, 4 << 30]:
        for unit in [1, 4 * KiB, 20 * KiB]:
            s = _ring.size(Budget(budget), [unit], 100 * MiB)
            assert s.depth >= 1 and s.fills >= 1
            assert s.depth * s.slab_bytes <= budget // 2
            assert s.slab_bytes >= unit
            assert s.fill_budget is not None
            assert s.depth * s.slab_bytes + s.fills * s.fill_budget <= budget
    with pytest.raises(fastshard.BudgetError, match="raise max_host_bytes"):
        _ring.size(Budget(1 * MiB), [600 * KiB], 100 * MiB)
    assert issubclass(fastshard.BudgetError, fastshard.FastshardError)
    # Without a budget a unit larger than the default slab still fits.
    s = _ring.size(Budget(), [300 * MiB], 1 << 30)
    assert s.slab_bytes >= 300 * MiB and s.depth == 2


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


def test_the_ring_loads_real_files_with_late_copies(tmp_path: Path) -> None:
    path, sd = fp32_file(tmp_path)
    with fastshard.open(path) as f:
        dests = {
            n: torch.full_like(t, float("nan")) if t.is_floating_point() else torch.full_like(t, -1)
            for n, t in sd.items()
        }
        items = [_ring.Item(f.index_of(n), None, tuple(t.shape), dests[n]) for n, t in sd.items()]
        copier = LateCopier(delay=0.01)
        stats = _ring.load(f, items, 1 * MiB, copier=copier)
    for name, t in sd.items():
        assert_bit_equal(dests[name], t)
    assert stats.bytes_staged == sum(t.numel() * t.element_size() for t in sd.values())
    assert 0 < stats.peak_host_bytes <= 1 * MiB
    assert copier.tickets > 4  # the 2 MiB tensor alone needs several slabs
    assert copier.finished_with_in_flight == 0


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.big = torch.nn.Parameter(torch.zeros(1024, 512))
        self.ws = torch.nn.ParameterList([torch.zeros(64, 33) for _ in range(3)])
        self.register_buffer("ids", torch.zeros(100, dtype=torch.int64))


def net_file(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(3)
    sd = {
        "big": torch.randn(1024, 512),
        **{f"ws.{i}": torch.randn(64, 33) for i in range(3)},
        "ids": torch.randint(0, 1 << 40, (100,)),
    }
    path = tmp_path / "net.tensors"
    fastshard.save(sd, path)
    return path, sd


def test_cast_model_load_goes_through_the_ring_within_budget(tmp_path: Path) -> None:
    path, sd = net_file(tmp_path)
    model = Net().to(torch.bfloat16)
    model.ids = torch.zeros(100, dtype=torch.int64)  # ints keep their dtype: in place
    budget = 512 * KiB
    stats = fastshard.load(model, path, max_host_bytes=budget)
    state = model.state_dict()
    for name, t in sd.items():
        expected = t.to(torch.bfloat16) if t.is_floating_point() else t
        assert_bit_equal(state[name], expected)
    floats = sum(t.numel() * 4 for t in sd.values() if t.is_floating_point())
    assert stats.bytes_staged == floats
    assert 0 < stats.peak_host_bytes <= budget


def test_meta_model_is_materialised_on_the_requested_device(tmp_path: Path) -> None:
    path, sd = net_file(tmp_path)
    with torch.device("meta"):
        model = Net()
    assert model.big.is_meta
    stats = fastshard.load(model, path, device="cpu")
    assert not any(t.is_meta for t in model.state_dict().values())
    assert isinstance(model.big, torch.nn.Parameter)
    for name, t in model.state_dict().items():
        assert_bit_equal(t, sd[name])
    assert stats.bytes_staged == 0  # same dtype on the CPU: filled in place

    with torch.device("meta"):
        half = Net().to(torch.float16)
    fastshard.load(half, path, device="cpu", max_host_bytes=1 * MiB)
    assert half.big.dtype == torch.float16 and half.big.device.type == "cpu"
    assert_bit_equal(half.big.data, sd["big"].to(torch.float16))


def test_state_dict_cast_is_staged_and_bounded(tmp_path: Path) -> None:
    path, sd = fp32_file(tmp_path)
    with fastshard.open(path, max_host_bytes=256 * KiB) as f:
        out = f.load_state_dict(dtype=torch.float16)
        stats = f.stats
    for name, t in sd.items():
        expected = t.to(torch.float16) if t.is_floating_point() else t
        assert_bit_equal(out[name], expected)
    assert 0 < stats.peak_host_bytes <= 256 * KiB
    assert stats.bytes_staged == sum(t.numel() * 4 for t in sd.values() if t.is_floating_point())


def test_budget_smaller_than_one_row_is_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "wide.tensors"
    fastshard.save({"wide": random_tensor(torch.float32, (4, 64 * 1024))}, path)
    model = torch.nn.Module()
    model.wide = torch.nn.Parameter(torch.zeros(4, 64 * 1024, dtype=torch.bfloat16))
    with pytest.raises(fastshard.BudgetError, match="max_host_bytes") as info:
        fastshard.load(model, path, max_host_bytes=256 * KiB)  # one row is 256 KiB
    assert "Traceback" not in str(info.value)
    assert torch.all(model.wide == 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_asking_for_cuda_without_it_is_a_device_error(tmp_path: Path, device: str) -> None:
    path, _ = net_file(tmp_path)
    with pytest.raises(fastshard.DeviceError, match="CUDA"):
        fastshard.load_state_dict(path, device=device)
    with torch.device("meta"):
        model = Net()
    with pytest.raises(fastshard.DeviceError, match="CUDA"):
        fastshard.load(model, path, device=device)
    assert issubclass(fastshard.DeviceError, fastshard.FastshardError)


def test_slabs_are_rust_owned_page_aligned_and_outlive_their_views() -> None:
    from fastshard import _native

    slab = _native.Slab(3 * 4096 + 5)
    view = torch.frombuffer(slab, dtype=torch.uint8)
    assert slab.nbytes == len(slab) == view.numel() == 3 * 4096 + 5
    assert view.data_ptr() % 4096 == 0
    assert torch.all(view == 0)
    del slab  # the view keeps the memory alive
    view.fill_(7)
    assert int(view.sum()) == 7 * (3 * 4096 + 5)
    mv = memoryview(_native.Slab(16))
    assert not mv.readonly and mv.format == "B" and mv.nbytes == 16
