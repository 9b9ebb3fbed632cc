"""How staged loads copy out of their slabs: host casts between float
types made natively, bit-equal to torch's; slices along every dim with
a cast into strided destinations, an encrypted tensor larger than a slab,
tensors carved from one block copied as runs, copies without a cast kept
bytewise, the CUDA copier's own logic run on the CPU, and Ctrl-C in the
middle of a stream."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import assert_bit_equal, assert_cast_equal, random_tensor
from staging_helpers import LateCopier, MiB, fp32_file, late_load

import fastshard
from fastshard._engine import cuda as _cuda
from fastshard._engine import places as _places
from fastshard._engine import ring as _ring
from fastshard._engine import slabs as _slabs
from fastshard._engine import tensors as _tensors


def test_tensors_carved_from_one_block_are_copied_as_runs_empty_ones_included(
    tmp_path: Path,
) -> None:
    # What a CUDA load_state_dict does with small tensors, on the CPU: new
    # tensors carved from shared blocks (_tensors.empty_on), copied out as
    # plain bytes, one run over the padding between them per batch.
    path, sd = fp32_file(tmp_path)
    with fastshard.open(path) as f:
        names = list(sd)
        shapes = [tuple(sd[n].shape) for n in names]
        specs = [(s, sd[n].dtype) for n, s in zip(names, shapes, strict=True)]
        dests, carved = _tensors.empty_on(torch.device("cpu"), specs)
        assert carved[names.index("w0")] and not carved[names.index("big")]
        for d in dests:
            d.view(-1).view(torch.uint8).fill_(0xFF)
        items = [
            _ring.Item(f.index_of(n), None, s, d, c)
            for n, s, d, c in zip(names, shapes, dests, carved, strict=True)
        ]
        where, _ = _ring.targets_of(items, [sd[n].dtype for n in names])
        assert sum(w is not None and w[2] for w in where) >= 30, "small ones: padded targets"
        assert where[names.index("empty")] is None
        copier = CountingCopier(items, [sd[n].dtype for n in names])
        stats = _ring.load(f.engine, items, copier=copier)
    for n, d in zip(names, dests, strict=True):
        assert_bit_equal(d, sd[n])
    assert stats.bytes_staged == sum(t.numel() * t.element_size() for t in sd.values())
    # 34 tensors, the 30 small float32 ones back to back in one block.
    assert copier.byte_ops <= 8, copier.byte_ops


class CountingCopier(_places.CpuCopier):
    def __init__(self, items: list[_ring.Item], dtypes: list[torch.dtype]) -> None:
        where, targets = _ring.targets_of(items, dtypes)
        super().__init__(_places.Places(items, dtypes, targets))
        self.byte_ops = 0

    def copy(
        self,
        slab: torch.Tensor,
        slot: int,
        bytes_ops: list[_places.ByteOp],
        item_ops: list[_places.ItemOp],
    ) -> None:
        self.byte_ops += len(bytes_ops)
        super().copy(slab, slot, bytes_ops, item_ops)


FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("stored", FLOATS, ids=str)
def test_host_casts_between_float_types_are_native_and_equal_torchs(
    tmp_path: Path, stored: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Random bits (NaNs, infinities, subnormals), a tensor larger than the
    # slabs (its pieces across batches) and small ones; whole tensors into
    # new memory and into a model's parameters, and dim-0 / dim-1 slices
    # (strided rows) into contiguous destinations; every bit as torch's
    # cast but NaNs' (torch spells those by kernel, not by value). No torch
    # copy may run: the native side makes every one of these.
    sd = {"big": random_tensor(stored, (300, 700), seed=1)}
    sd.update({f"s{i}": random_tensor(stored, (i + 1, 7), seed=i + 2) for i in range(20)})
    path = tmp_path / "m.tensors"
    fastshard.save(sd, path)

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a host cast went through torch")

    monkeypatch.setattr(torch, "_foreach_copy_", refused)
    monkeypatch.setattr(_tensors, "copy", refused)
    for want in FLOATS:
        if want == stored:
            continue
        out = fastshard.load_state_dict(path, dtype=want, max_host_bytes=256 * 1024)
        for name, t in sd.items():
            assert_cast_equal(out[name], t.to(want))
        model = torch.nn.Module()
        for name, t in sd.items():
            model.register_parameter(name, torch.nn.Parameter(torch.zeros(t.shape, dtype=want)))
        fastshard.load(model, path, max_host_bytes=256 * 1024)
        for name, t in sd.items():
            assert_cast_equal(getattr(model, name).data, t.to(want))
        with fastshard.open(path) as f:
            big = sd["big"]
            for dim, ranges, part in [
                (0, [(100, 150)], big[100:250]),
                (1, [(250, 400)], big[:, 250:650]),
            ]:
                dest = torch.full(part.shape, 7.0, dtype=want)
                item = _ring.Item(f.index_of("big"), (dim, ranges), tuple(part.shape), dest)
                _ring.load(f.engine, [item], 256 * 1024)
                assert_cast_equal(dest, part.to(want))


def test_a_block_carved_for_casts_and_plain_copies_alike_keeps_both(tmp_path: Path) -> None:
    # float16 tensors of a file mixing bf16 and fp16 ones, carved from one
    # float16 block (as a staged load onto a GPU carves them): the fp16
    # ones are byte copies, the bf16 ones casts between them, so no byte
    # run may span the padding around a cast.
    sd = {
        f"t{i}": random_tensor(torch.bfloat16 if i % 2 else torch.float16, (5, 9), seed=i)
        for i in range(12)
    }
    path = tmp_path / "m.tensors"
    fastshard.save(sd, path)
    dests, carved = _tensors.empty_on(torch.device("cpu"), [((5, 9), torch.float16)] * 12)
    assert all(carved)
    with fastshard.open(path) as f:
        items = [
            _ring.Item(f.index_of(name), None, (5, 9), d, c)
            for name, d, c in zip(sd, dests, carved, strict=True)
        ]
        dtypes = [f.engine.info_at(it.index).dtype for it in items]
        where, _ = _ring.targets_of(items, dtypes)
        assert [w is None for w in where] == [i % 2 == 1 for i in range(12)]
        assert not any(w[2] for w in where if w is not None)  # no runs over the casts
        _ring.load(f.engine, items)
    for name, d in zip(sd, dests, strict=True):
        assert_cast_equal(d, sd[name].to(torch.float16))


def test_casts_the_native_side_leaves_are_made_by_the_copier_in_the_same_load(
    tmp_path: Path,
) -> None:
    sd = {
        "ids": torch.arange(-50, 50, dtype=torch.int32),
        "w": random_tensor(torch.bfloat16, (64, 33), seed=3),
        "flags": torch.tensor([True, False, True]),
    }
    path = tmp_path / "m.tensors"
    fastshard.save(sd, path)
    model = torch.nn.Module()
    model.ids = torch.nn.Parameter(torch.zeros(100), requires_grad=False)
    model.w = torch.nn.Parameter(torch.zeros(64, 33, dtype=torch.float16))
    model.register_buffer("flags", torch.zeros(3, dtype=torch.uint8))
    fastshard.load(model, path)
    assert_bit_equal(model.ids.data, sd["ids"].to(torch.float32))
    assert_bit_equal(model.w.data, sd["w"].to(torch.float16))
    assert_bit_equal(model.flags, sd["flags"].to(torch.uint8))


def test_copies_without_a_cast_are_byte_copies() -> None:
    # A batched copy of floats may quiet signalling NaNs (CUDA's does):
    # without a cast, both sides of every item copy are bytes.
    dest = torch.empty(3, 5, dtype=torch.float16)
    items = [_ring.Item(0, None, (3, 5), dest)]
    places = _places.Places(items, [torch.float16], [])
    slab = torch.zeros(4096, dtype=torch.uint8)
    whole = places.item_pair((0, 512, 0, 30, 1, 30, 30, True), slab)
    part = places.item_pair((0, 512, 10, 12, 1, 12, 12, True), slab)
    for d, s in (whole, part):
        assert d.dtype == s.dtype == torch.uint8 and d.shape == s.shape
    cast = _places.Places(items, [torch.bfloat16], []).item_pair(
        (0, 512, 0, 30, 1, 30, 30, True), slab
    )
    assert cast[0].dtype == torch.float16 and cast[1].dtype == torch.bfloat16
    assert cast[0].shape == cast[1].shape == (3, 5)
    # The first half of a float32 tensor cast to float16: as many file bytes
    # as the destination holds, yet a piece of it, not the whole.
    wide = torch.empty(4, 5, dtype=torch.float16)
    half = _places.Places([_ring.Item(0, None, (4, 5), wide)], [torch.float32], [])
    d, s = half.item_pair((0, 0, 0, 40, 1, 40, 40, False), slab)
    assert d.shape == s.shape == (10,) and d.data_ptr() == wide.data_ptr()


def test_slices_along_every_dim_are_staged_with_a_cast_and_strided_destinations(
    tmp_path: Path,
) -> None:
    path, sd = fp32_file(tmp_path)
    big = sd["big"]
    cases = [
        (0, [(100, 300)], big[100:400]),
        (0, [(1000, 24), (0, 8)], torch.cat([big[1000:], big[:8]])),
        (1, [(128, 256)], big[:, 128:384]),
        (1, [(500, 12), (3, 5)], torch.cat([big[:, 500:], big[:, 3:8]], dim=1)),
    ]
    with fastshard.open(path) as f:
        for dim, ranges, want in cases:
            for transposed in [False, True]:
                shape = tuple(want.shape)
                dest = torch.full(shape, -1.0, dtype=torch.bfloat16)
                if transposed:  # a non-contiguous destination
                    dest = torch.full(shape[::-1], -1.0, dtype=torch.bfloat16).t()
                item = _ring.Item(f.index_of("big"), (dim, ranges), shape, dest)
                late_load(f, [item], 1 * MiB, LateCopier(delay=0.001))
                assert_bit_equal(dest, want.to(torch.bfloat16))


def test_an_encrypted_tensor_larger_than_a_slab_loads_with_a_cast_and_as_slices(
    tmp_path: Path,
) -> None:
    # The failing case of the GPU engine's issue, at a size for CI: a
    # tensor of 6 MiB through 4 MiB slabs (max_host_bytes 16 MiB).
    key = fastshard.EncryptionKey.from_bytes(bytes(range(32)))
    torch.manual_seed(9)
    big = torch.randn(1024, 3072).to(torch.bfloat16)
    path = tmp_path / "enc.tensors"
    fastshard.save({"big": big, "small": big[:3, :5].clone()}, path, encryption=key)
    out = fastshard.load_state_dict(
        path, encryption=key, dtype=torch.float32, max_host_bytes=16 * MiB
    )
    assert_bit_equal(out["big"], big.float())
    assert_bit_equal(out["small"], big[:3, :5].float())
    with fastshard.open(path, encryption=key, max_host_bytes=16 * MiB) as f:
        rows = f.load_state_dict(
            names=["big"], rank=1, world_size=4, shard_specs={"big": 0}, dtype=torch.float32
        )
    assert_bit_equal(rows["big"], big[256:512].float())
    model = torch.nn.Module()
    model.big = torch.nn.Parameter(torch.zeros(1024, 1536, dtype=torch.float16))
    fastshard.load(
        model,
        path,
        encryption=key,
        strict=False,
        shard_specs={"big": 1},
        rank=1,
        world_size=2,
        max_host_bytes=16 * MiB,
    )
    assert_bit_equal(model.big.data, big[:, 1536:].to(torch.float16))


class HostCudaCopier(_cuda.CudaCopier):
    """The CUDA copier's own logic (bytes grouped by device, items placed
    from a copy of the slab, temporaries for strided destinations) run on
    the CPU: the device is the CPU, streams and events are stubs."""

    def _on_device(self, device: torch.device) -> bool:
        return True

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        self._used.add(device)
        return None  # type: ignore[return-value]

    def ticket(self) -> _places.Ticket:  # type: ignore[override]
        self._used.clear()
        return _places.Done()

    def finish(self) -> None:
        return None


@pytest.mark.parametrize("budget", [None, 16 * MiB])
def test_the_cuda_copier_logic_places_every_dtype_bit_exact(
    tmp_path: Path, budget: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    shapes = [(), (0, 3), (7,), (33, 65), (1024, 1031)]
    sd: dict[str, torch.Tensor] = {}
    for k, dtype in enumerate(
        (torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.bool)
    ):
        for i, shape in enumerate(shapes):
            sd[f"{dtype}_{i}".replace("torch.", "")] = random_tensor(dtype, shape, seed=10 * k + i)
    path = tmp_path / "d.tensors"
    fastshard.save(sd, path)
    names = list(sd)
    dtypes = [sd[n].dtype for n in names]
    with fastshard.open(path) as f:
        dests = [torch.full_like(sd[n], 1) for n in names]
        dests[names.index("float32_4")] = torch.zeros(1031, 1024).t()  # strided
        items = [
            _ring.Item(f.index_of(n), None, tuple(sd[n].shape), d)
            for n, d in zip(names, dests, strict=True)
        ]
        where, targets = _ring.targets_of(items, dtypes)
        # As on a GPU: lone small tensors go through their views.
        big = [
            w if it.dest.nbytes >= _ring.DIRECT_BYTES else None
            for w, it in zip(where, items, strict=True)
        ]
        monkeypatch.setattr(_ring, "targets_of", lambda i, d: (big, targets))
        copier = HostCudaCopier(_places.Places(items, dtypes, targets), 8)
        _ring.load(f.engine, items, budget, copier=copier)
    for n, d in zip(names, dests, strict=True):
        assert_bit_equal(d, sd[n])


def test_ctrl_c_mid_stream_leaves_no_slab_in_use_and_no_thread_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "slow.tensors"
    fastshard.save({f"w{i}": torch.randn(256, 1024) for i in range(64)}, path)  # 64 MiB
    out: list[_slabs.Slab] = []  # slabs taken and not given back
    take, give = _slabs.take, _slabs.give

    def counted_take(count: int, nbytes: int, pin: bool) -> list[_slabs.Slab]:
        got = take(count, nbytes, pin)
        out.extend(got)
        return got

    def counted_give(slabs: list[_slabs.Slab]) -> None:
        for s in slabs:
            out.remove(s)
        give(slabs)

    monkeypatch.setattr(_slabs, "take", counted_take)
    monkeypatch.setattr(_slabs, "give", counted_give)
    finished = False
    timer = threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        # One tiny read at a time: far longer than 50 ms, staged (a cast).
        fastshard.load_state_dict(
            path, dtype=torch.float16, concurrency=1, part_size_bytes=4096, max_host_bytes=1 * MiB
        )
        finished = True
        time.sleep(1)  # let a late signal land here rather than elsewhere
    timer.join()
    assert not finished, "the load ran to completion despite Ctrl-C"
    assert not any(t.name == "fastshard-stage" for t in threading.enumerate())
    assert out == [], "every slab went back"
    loaded = fastshard.load_state_dict(path, dtype=torch.float16, max_host_bytes=1 * MiB)
    assert len(loaded) == 64 and out == []
