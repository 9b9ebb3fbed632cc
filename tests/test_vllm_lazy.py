"""A LazyWeight reads nothing until used: ``narrow`` (what vLLM's parallel
weight loaders call) reads exactly that part, anything else reads the whole
tensor first, and asking its shape or dtype reads nothing."""

from __future__ import annotations

import pytest
import torch

from fastshard import tp
from fastshard.vllm.lazy import LazyWeight

FULL = torch.arange(6 * 4, dtype=torch.float32).reshape(6, 4)


@pytest.fixture
def lazy() -> tuple[LazyWeight, list[tp.Slice | None]]:
    reads: list[tp.Slice | None] = []

    def read(sl: tp.Slice | None) -> torch.Tensor:
        reads.append(sl)
        if sl is None:
            return FULL.clone()
        dim, [(start, length)] = sl
        return FULL.narrow(dim, start, length).contiguous()

    return LazyWeight(tuple(FULL.shape), FULL.dtype, read), reads


def test_metadata_reads_nothing(lazy):
    w, reads = lazy
    assert w.shape == (6, 4) and w.size(0) == 6 and w.dim() == 2 and w.dtype == torch.float32
    assert w.numel() == 24 and w.device == torch.device("cpu")
    assert reads == []


@pytest.mark.parametrize(("dim", "start", "length"), [(0, 3, 3), (1, 0, 2), (-1, 2, 2)])
def test_narrow_reads_only_that_part(lazy, dim, start, length):
    w, reads = lazy
    part = w.narrow(dim, start, length)
    assert type(part) is torch.Tensor
    assert torch.equal(part, FULL.narrow(dim, start, length))
    assert reads == [(dim % 2, [(start, length)])]


def test_a_tensor_start_works_like_an_int(lazy):
    w, reads = lazy
    assert torch.equal(w.narrow(0, torch.tensor(2), 2), FULL[2:4])
    assert reads == [(0, [(2, 2)])]


def test_any_other_use_reads_the_whole_tensor_once(lazy):
    w, reads = lazy
    dest = torch.zeros(6, 4)
    dest.copy_(w)
    assert torch.equal(dest, FULL)
    assert torch.equal(w[1:3], FULL[1:3])
    assert torch.equal(w.t().contiguous(), FULL.t().contiguous())
    assert torch.equal(w.narrow(0, 1, 2), FULL[1:3])  # already read: no second read
    assert reads == [None]


def test_an_out_of_range_narrow_fails_as_torch_does(lazy):
    w, _ = lazy
    with pytest.raises((RuntimeError, IndexError)):
        w.narrow(0, 5, 3)
