"""Casts of a local file's large tensors straight out of the mapped file
(``fastshard._engine.mapcast``): bit-equal to torch's own cast from any offset in
the file (tensorizer does not align data), as new tensors, into a model's
parameters and as rank slices; and the loads that must stage (verified,
budgeted) still do."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import assert_cast_equal

import fastshard

MIN = 1 << 20  # tensors past the native copy's 1 MiB split: several jobs each


def _state() -> dict[str, torch.Tensor]:
    """Tensors of every float type, past the native copy's split, with
    NaNs, infinities and subnormals, under names of uneven lengths (so most
    data offsets are odd), and a small one."""
    g = torch.Generator().manual_seed(7)
    out: dict[str, torch.Tensor] = {}
    for k, dtype in enumerate([torch.bfloat16, torch.float32, torch.float16, torch.float64]):
        n = MIN // dtype.itemsize + 1000 * k + 3
        t = (torch.randn(n, generator=g, dtype=torch.float64) * 1e3).to(dtype)
        t[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e-40]).to(dtype)
        out["w" * (k + 1) + "_" + str(dtype).removeprefix("torch.")] = t.reshape(-1, 1)
    out["tiny"] = torch.randn(64, generator=g).to(torch.bfloat16)
    return out


def _big(sd: dict[str, torch.Tensor]) -> int:
    return sum(t.nbytes for t in sd.values() if t.nbytes >= MIN)


@pytest.mark.parametrize("to", [torch.float16, torch.bfloat16, torch.float32])
def test_new_tensors_cast_from_the_mapping_equal_torch(tz_write: Any, to: torch.dtype) -> None:
    sd = _state()
    path = tz_write(sd)
    with fastshard.open(path) as f:
        # Most data sits at odd offsets: misaligned for every type.
        assert sum(i.offset % 2 for i in f.infos()) >= 2, [i.offset for i in f.infos()]
        got = f.load_state_dict(dtype=to)
        stats = f.stats
    for name, t in sd.items():
        assert_cast_equal(got[name], t.to(to))
    # Every tensor came from the mapping, none through the slabs.
    assert stats.bytes_staged == 0, stats
    assert stats.bytes_fetched >= _big(sd), stats


def test_a_models_parameters_are_cast_into_from_the_mapping(tz_write: Any) -> None:
    sd = _state()
    path = tz_write(sd)
    model = torch.nn.Module()
    for name, t in sd.items():
        model.register_buffer(name, torch.full_like(t, 3, dtype=torch.float16))
    stats = fastshard.load(model, path)
    for name, t in sd.items():
        assert_cast_equal(getattr(model, name), t.to(torch.float16))
    assert stats.bytes_staged == 0, stats


def test_rank_slices_along_dim_0_are_cast_from_the_mapping(tz_write: Any) -> None:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(2048, 515, generator=g).to(torch.bfloat16)  # 1 MiB+ a rank
    path = tz_write({"a_w": w})
    for rank in range(2):
        with fastshard.open(path) as f:
            got = f.load_state_dict(
                rank=rank, world_size=2, shard_specs={"a_w": 0}, dtype=torch.float32
            )
            stats = f.stats
        assert_cast_equal(got["a_w"], w.chunk(2, dim=0)[rank].to(torch.float32))
        assert stats.bytes_staged == 0, stats


def test_tied_destinations_are_written_once_from_the_mapping(tz_write: Any) -> None:
    # Two names over one float16 storage (tied weights), from two tensors
    # of the file: one is cast from the mapping, the other staged after it
    # (as a load without a cast writes tied weights once and copies).
    g = torch.Generator().manual_seed(5)
    a = torch.randn(MIN, generator=g).to(torch.bfloat16)
    path = tz_write({"emb": a, "head": a.clone()})
    model = torch.nn.Module()
    shared = torch.zeros(MIN, dtype=torch.float16)
    model.register_buffer("emb", shared)
    model.register_buffer("head", shared)
    fastshard.load(model, path)
    assert_cast_equal(model.emb, a.to(torch.float16))
    assert model.emb.data_ptr() == model.head.data_ptr()


@pytest.mark.parametrize("opts", [{"verify_hash": True}, {"max_host_bytes": 8 << 20}])
def test_verified_or_budgeted_loads_still_stage(tz_write: Any, opts: dict[str, Any]) -> None:
    sd = _state()
    path = tz_write(sd)
    with fastshard.open(path, **opts) as f:
        got = f.load_state_dict(dtype=torch.float16)
        stats = f.stats
    for name, t in sd.items():
        assert_cast_equal(got[name], t.to(torch.float16))
    cast = sum(t.nbytes for t in sd.values() if t.nbytes >= MIN and t.dtype != torch.float16)
    assert stats.bytes_staged >= cast, stats


def test_a_file_cut_short_after_the_open_is_an_error_not_a_partial_load(
    tz_write: Any,
) -> None:
    sd = _state()
    path = tz_write(sd)
    with fastshard.open(path) as f:
        with open(path, "r+b") as fh:
            fh.truncate(path.stat().st_size - 100)
        with pytest.raises(fastshard.FastshardError) as info:
            f.load_state_dict(dtype=torch.float16)
    assert str(path) in str(info.value) or path.name in str(info.value), info.value
