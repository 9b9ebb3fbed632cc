"""The copy side of staged loads (python/fastshard/_engine/ring.py) that CUDA
and cast destinations go through, exercised on the CPU with real torch
copies made late on purpose: a copier that performs each batch's copies
on a thread after a delay, reading the slab only then. An engine that
refilled a slab before its copy completed would hand the copy the next
batch's bytes, which the data checks see; the counters check
backpressure, ordering and what happens after an error."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from conftest import assert_bit_equal, random_tensor
from staging_helpers import KiB, LateCopier, MiB, fp32_file, half_items, late_load, many_file

import fastshard
from fastshard._engine import cuda as _cuda
from fastshard._engine import ring as _ring
from fastshard._engine import slabs as _slabs
from fastshard._options import Budget


def test_a_slab_is_refilled_only_after_its_copy_completed(tmp_path: Path) -> None:
    path, sd = many_file(tmp_path, 48)
    copier = LateCopier(delay=0.02)
    with fastshard.open(path) as f:
        items = half_items(f, sd)
        # 512 KiB of slabs: far fewer than the load's batches.
        stats = late_load(f, items, 1 * MiB, copier)
    for it, t in zip(items, sd.values(), strict=True):
        assert_bit_equal(it.dest, t.to(torch.float16))
    assert copier.tickets >= 10, "many more batches than slabs"
    assert copier.most_in_flight <= 8
    assert copier.finished_with_in_flight == 0
    assert stats.bytes_staged == 48 * 64 * KiB
    assert 0 < stats.peak_host_bytes <= 1 * MiB


@pytest.mark.parametrize("where", ["read", "copy"])
def test_an_error_midway_stops_the_load_after_everything_started_ended(
    tmp_path: Path, where: str
) -> None:
    path, sd = many_file(tmp_path, 48)
    if where == "read":
        # A bad byte in a tensor past the first batches: its hash fails.
        with fastshard.open(path) as f:
            info = f.info("w30")
        raw = bytearray(path.read_bytes())
        raw[info.offset + 100] ^= 0x40
        path.write_bytes(bytes(raw))
    copier = LateCopier(delay=0.01, fail_at=5 if where == "copy" else None)
    with fastshard.open(path, verify_hash=True) as f:
        items = half_items(f, sd)
        with pytest.raises((fastshard.IntegrityError, RuntimeError)) as caught:
            late_load(f, items, 1 * MiB, copier)
    if where == "read":
        assert isinstance(caught.value, fastshard.IntegrityError)
        assert caught.value.tensor == "w30"
    # No copy still reads a slab once the load returned, and no read is
    # left running: the slabs are back in the pool, free to be reused.
    assert copier.finished_with_in_flight == 0
    assert copier.in_flight == 0
    assert not any(t.name == "fastshard-stage" for t in threading.enumerate())


def test_pinned_slabs_are_kept_between_loads_and_released_on_demand(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Pinning needs a GPU: here it only marks the slab, which is what the
    # pool goes by.
    pinned: list[int] = []
    monkeypatch.setattr(_cuda, "pin", lambda t: pinned.append(t.data_ptr()))
    monkeypatch.setattr(_cuda, "unpin", lambda t: pinned.remove(t.data_ptr()))
    _slabs.release()
    first = _slabs.take(3, 64 * KiB, pin=True)
    _slabs.give(first)
    assert _slabs.kept_bytes() == 3 * 64 * KiB and len(pinned) == 3
    again = _slabs.take(2, 32 * KiB, pin=True)  # kept ones that fit: no new pinning
    assert {s.view.data_ptr() for s in again} <= {s.view.data_ptr() for s in first}
    assert len(pinned) == 3
    plain = _slabs.take(2, 64 * KiB, pin=False)  # never one of the pinned
    assert not {s.view.data_ptr() for s in plain} & set(pinned)
    _slabs.give([*again, *plain])
    assert _slabs.kept_bytes() == 3 * 64 * KiB, "unpinned slabs are not kept"
    monkeypatch.setattr(_slabs, "KEEP_BYTES", 64 * KiB)
    _slabs.give(_slabs.take(3, 64 * KiB, pin=True))
    assert _slabs.kept_bytes() == 64 * KiB and len(pinned) == 1, "past the cap: unpinned"
    monkeypatch.setenv("FASTSHARD_KEEP_STAGING", "0")
    _slabs.give(_slabs.take(1, 64 * KiB, pin=True))
    assert _slabs.kept_bytes() == 0 and pinned == []
    monkeypatch.delenv("FASTSHARD_KEEP_STAGING")
    _slabs.give(_slabs.take(1, 64 * KiB, pin=True))
    fastshard.release_staging()
    assert _slabs.kept_bytes() == 0 and pinned == []


def test_sizing_stays_inside_the_budget_and_refuses_what_cannot_fit() -> None:
    for unit in [16 * KiB, 2 * MiB]:
        for budget in [8 * unit, 7 * MiB + 3, 64 * MiB, 4 << 30]:
            if budget < 8 * unit:
                continue
            for total in [0, 100, 5 * MiB, 1 << 30]:
                for cuda in [False, True]:
                    s = _ring.size(Budget(budget), total, cuda, unit)
                    assert s.depth >= 2
                    assert s.depth * s.slab_bytes <= budget // 2
                    assert s.slab_bytes >= 2 * unit
                    assert s.slab_bytes & (s.slab_bytes - 1) == 0, "a power of two"
    with pytest.raises(fastshard.BudgetError, match="raise max_host_bytes"):
        _ring.size(Budget(7 * MiB), 100 * MiB, False, 2 * MiB)
    assert issubclass(fastshard.BudgetError, fastshard.FastshardError)
    s = _ring.size(Budget(), 1 << 30, True, 4 * KiB)
    assert s.slab_bytes == _ring.MAX_SLAB and s.depth == _ring.DEPTH


def test_the_ring_loads_real_files_with_late_copies(tmp_path: Path) -> None:
    path, sd = fp32_file(tmp_path)
    with fastshard.open(path) as f:
        dests = {
            n: torch.full_like(t, float("nan")) if t.is_floating_point() else torch.full_like(t, -1)
            for n, t in sd.items()
        }
        items = [_ring.Item(f.index_of(n), None, tuple(t.shape), dests[n]) for n, t in sd.items()]
        copier = LateCopier(delay=0.01)
        stats = late_load(f, items, 1 * MiB, copier)
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


def test_budget_too_small_for_two_slabs_is_a_typed_error_and_a_wide_row_is_not(
    tmp_path: Path,
) -> None:
    path = tmp_path / "wide.tensors"
    wide = random_tensor(torch.float32, (4, 64 * 1024))
    fastshard.save({"wide": wide}, path)
    model = torch.nn.Module()
    model.wide = torch.nn.Parameter(torch.zeros(4, 64 * 1024, dtype=torch.bfloat16))
    with pytest.raises(fastshard.BudgetError, match="max_host_bytes") as info:
        fastshard.load(model, path, max_host_bytes=16 * KiB)
    assert "Traceback" not in str(info.value)
    assert torch.all(model.wide == 0)
    # Rows are no unit of staging: a row of 256 KiB goes through 32 KiB slabs.
    stats = fastshard.load(model, path, max_host_bytes=256 * KiB)
    assert_bit_equal(model.wide.data, wide.to(torch.bfloat16))
    assert 0 < stats.peak_host_bytes <= 256 * KiB


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
