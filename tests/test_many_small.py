"""Ten thousand small tensors (the shape where per-tensor costs dominate):
every one loads bit-equal through both destinations, from both formats.
New CPU tensors are carved out of shared blocks (``_tensors.empty_many``),
so these also check that no two of them overlap."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_bit_equal, random_tensor
from safetensors.torch import save_file

import fastshard
from fastshard._engine import tensors as _tensors

COUNT = 10_000
DTYPES = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.int8,
    torch.int64,
    torch.bool,
    torch.float64,
    torch.complex64,
)


def _shape(i: int, dtype: torch.dtype) -> tuple[int, ...]:
    """1-4 KiB, with a 0-dim and an empty tensor every few hundred."""
    if i % 397 == 0:
        return ()
    if i % 401 == 0:
        return (0, 5)
    elements = (1024 + (i * 37) % 3072) // dtype.itemsize
    return (elements,) if i % 3 else (2, elements // 2)


@pytest.fixture(scope="module")
def many() -> dict[str, torch.Tensor]:
    return {
        f"w{i:05d}": random_tensor(DTYPES[i % len(DTYPES)], _shape(i, DTYPES[i % 8]), i)
        for i in range(COUNT)
    }


@pytest.fixture(scope="module", params=["tensors", "safetensors"])
def many_file(request, many, tmp_path_factory):
    path = tmp_path_factory.mktemp("many") / f"many.{request.param}"
    if request.param == "tensors":
        fastshard.save(many, path)
    else:
        save_file(many, str(path))
    return path


def _disjoint(tensors: list[torch.Tensor]) -> None:
    spans = sorted(
        (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors if t.numel()
    )
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert end <= start


def test_load_state_dict_bit_equal(many, many_file):
    out = fastshard.load_state_dict(many_file)
    assert sorted(out) == sorted(many)  # safetensors orders by dtype
    for name, t in many.items():
        assert_bit_equal(out[name], t)
        assert out[name].is_contiguous()
    _disjoint(list(out.values()))


def test_the_loaded_dict_saves_and_loads_back(many, many_file, tmp_path):
    """torch.save refuses tensors that view one storage as different types,
    and safetensors refuses overlapping ones: the blocks must pass both."""
    out = fastshard.load_state_dict(many_file)
    torch.save(out, tmp_path / "many.pt")
    back = torch.load(tmp_path / "many.pt", weights_only=True)
    save_file(out, str(tmp_path / "again.safetensors"))
    for name, t in many.items():
        assert_bit_equal(back[name], t)


def test_load_into_module_bit_equal(many, many_file):
    model = torch.nn.Module()
    for name, t in many.items():
        model.register_buffer(name, torch.zeros_like(t))
    fastshard.load(model, many_file)
    for name, t in many.items():
        assert_bit_equal(getattr(model, name), t)


def test_load_into_meta_module(many, many_file):
    model = torch.nn.Module()
    with torch.device("meta"):
        for name, t in many.items():
            model.register_buffer(name, torch.empty_like(t))
    fastshard.load(model, many_file)
    for name, t in many.items():
        assert_bit_equal(getattr(model, name), t)


def test_aliased_destinations_are_filled_once(tmp_path):
    """Two names over one tensor (tied weights): the second goes through a
    copy, and both end up with the file's bytes."""
    model = torch.nn.Module()
    shared = torch.zeros(64)
    model.register_buffer("a", shared)
    model.register_buffer("b", shared)
    model.register_buffer("c", torch.zeros(64))
    want = random_tensor(torch.float32, (64,), 5)
    path = tmp_path / "tied.tensors"
    fastshard.save({"a": want, "b": want, "c": want}, path)
    fastshard.load(model, path)
    assert_bit_equal(model.a, want)
    assert_bit_equal(model.c, want)


def test_empty_many_layout():
    """Small tensors share blocks, each at an aligned offset, never
    overlapping; a large one gets its own memory."""
    big = _tensors.SMALL_TENSOR // 4 + 1
    specs = [
        ((3,), torch.float16),
        ((), torch.float64),
        ((0, 2), torch.int8),
        ((big,), torch.float32),
    ]
    specs += [((1024,), torch.float32)] * (_tensors.SLAB_BYTES // 4096 + 3)
    tensors, views = _tensors.empty_many(specs)
    for t in tensors:  # a block holds one dtype (torch.save needs it)
        assert all(u.dtype == t.dtype for u in tensors if _same_storage(u, t))
    for (shape, dtype), t, v in zip(specs, tensors, views, strict=True):
        assert t.shape == shape and t.dtype == dtype and t.is_contiguous()
        assert len(v) == math.prod(shape) * dtype.itemsize
        offset = t.data_ptr() - t.untyped_storage().data_ptr()
        assert offset % _tensors.SLAB_ALIGN == 0
    _disjoint(tensors)
    assert tensors[3].untyped_storage().nbytes() == big * 4
    # Two blocks for the 1 KiB tensors: no block grows past SLAB_BYTES.
    storages = {t.untyped_storage().data_ptr() for t in tensors[4:]}
    assert len(storages) == 2
    assert all(t.untyped_storage().nbytes() <= _tensors.SLAB_BYTES for t in tensors)


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())
