"""The cooperative plan's copies, without a group: for any tensor, split
into row blocks, and any rank's slice of it (replicated, fused dim-0 parts,
a later dim), the part a sender cuts out of each block and the receiver
puts back rebuild exactly the rank's slice, as the owner's own copy from the
whole block does; the parts' sizes add up to the slice's bytes. Also the
one-thread host copy those copies use, and the per-round trace."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastshard import tp
from fastshard._coop import plan as cp
from fastshard._coop import trace as _trace
from fastshard._engine import tensors as _tensors
from fastshard._types import TensorInfo


@dataclass
class _File:
    """The part of a TensorSource the plan reads: one tensor's index entry."""

    info: TensorInfo
    uri: str = "mem://t"

    def info_at(self, index: int) -> TensorInfo:
        return self.info


def _ref(full: torch.Tensor, sl: tp.Slice | None) -> torch.Tensor:
    if sl is None:
        return full
    dim, ranges = sl
    return torch.cat([full.narrow(dim, a, n) for a, n in ranges], dim)


@st.composite
def cases(draw: st.DrawFn) -> tuple[torch.Tensor, tp.Slice | None, int]:
    ws = draw(st.integers(2, 4))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.int8]))
    ndim = draw(st.integers(1, 3))
    dim = draw(st.integers(0, ndim - 1))
    parts = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    shape = [draw(st.integers(1, 5)) for _ in range(ndim)]
    shape[dim] = sum(parts) * ws
    full = (torch.arange(int(torch.tensor(shape).prod())) % 251).reshape(shape).to(dtype)
    spec = draw(
        st.sampled_from(
            [
                tp.REPLICATED,
                tp.ShardSpec(dim),
                tp.ShardSpec(dim, parts=tuple(p * ws for p in parts)),
            ]
        )
    )
    rank = draw(st.integers(0, ws - 1))
    sl = tp.rank_slice("t", shape, spec, rank, ws)
    row_bytes = full.nbytes // shape[0]
    cap = row_bytes * draw(st.integers(1, shape[0]))
    return full, sl, cap


@settings(max_examples=300, deadline=None)
@given(cases())
def test_parts_rebuild_every_slice(case: tuple[torch.Tensor, tp.Slice | None, int]) -> None:
    full, sl, cap = case
    info = TensorInfo("t", full.dtype, tuple(full.shape), full.nbytes, 0, None, 0)
    f = _File(info)
    raw = full.contiguous().view(-1).view(torch.uint8)
    key = cp.key_of(sl)
    want = _ref(full, sl)
    placed, received = torch.zeros_like(want), torch.zeros_like(want)
    total = 0
    for p in cp.pieces(f, [0], cap):
        assert p.nbytes <= cap
        start = p.row0 * (full.nbytes // full.shape[0])
        block = raw[start : start + p.nbytes]
        cp.place(f, p, block, key, placed)
        n = cp.part_bytes(f, p, key)
        part = torch.empty(n, dtype=torch.uint8)
        cp.extract(f, p, block, key, part)
        cp.deposit(f, p, part, key, received)
        total += n
    assert torch.equal(placed, want)
    assert torch.equal(received, want)
    assert total == want.nbytes


def test_a_scalar_travels_whole() -> None:
    full = torch.tensor(3.5)
    f = _File(TensorInfo("s", full.dtype, (), full.nbytes, 0, None, 0))
    (p,) = cp.pieces(f, [0], 64)
    out = torch.zeros(())
    raw = full.reshape(1).view(torch.uint8)
    part = torch.empty(cp.part_bytes(f, p, None), dtype=torch.uint8)
    cp.extract(f, p, raw, None, part)
    cp.deposit(f, p, part, None, out)
    assert out.item() == 3.5


def test_a_receiver_gets_every_piece_it_wants_replicated_ones_included() -> None:
    other: cp.Wants = {0: [None], 1: [(1, ((0, 2),))], 2: [(0, ((4, 4),))]}
    pieces = [cp.Piece(2, 0, 8, 64), cp.Piece(0, 0, 1, 10), cp.Piece(1, 0, 1, 100)]
    (batch,) = cp.batches(pieces, 1 << 20)
    assert batch == pieces  # the owner's order: its reads stay sequential
    assert cp.sends(batch, other) == [
        (pieces[0], (0, ((4, 4),))),
        (pieces[1], None),
        (pieces[2], (1, ((0, 2),))),
    ]
    assert cp.sends(batch, {}) == []


def test_host_copies_match_torch_for_strided_cast_and_scalar_tensors() -> None:
    src = torch.randn(6, 10).to(torch.bfloat16)
    out = torch.zeros(6, 4, dtype=torch.bfloat16)
    _tensors.copy(out, src.narrow(1, 3, 4))  # one thread, bytes
    assert torch.equal(out, src[:, 3:7])
    wide = torch.zeros(6, 4)
    _tensors.copy(wide, src.narrow(1, 3, 4))  # a cast: torch's own copy
    assert torch.equal(wide, src[:, 3:7].float())
    scalar = torch.zeros(())
    _tensors.copy(scalar, torch.tensor(2.5))
    assert scalar.item() == 2.5


def test_the_trace_is_off_by_default_and_writes_each_rounds_phases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(_trace.ENV, raising=False)
    off = _trace.Trace(0, 2)
    with off.phase("fetch", 0):
        pass
    off.write()
    assert not off.on and not off.rows
    monkeypatch.setenv(_trace.ENV, str(tmp_path))
    trace = _trace.Trace(1, 2)
    with trace.phase("fetch", 0):
        pass
    trace.add("sent_bytes", 100, 0)
    trace.add("sent_bytes", 28, 1)
    trace.write()
    (written,) = tmp_path.glob("coop-rank1-*.json")
    report = json.loads(written.read_text())
    assert report["rank"] == 1 and report["totals"]["sent_bytes"] == 128
    assert set(report["rounds"]["0"]) == {"fetch", "sent_bytes"}
