"""``load_state_dict(path, mmap=True)``: tensors that view the local file
mapped copy-on-write, checked like a copied load, against the copied load
and the real tensorizer's files."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import DTYPES, assert_bit_equal, assert_state_equal, random_tensor
from tensorizer_files import layout, patch, tensorizer_read

import fastshard
from fastshard import EncryptionKey, ShardSpec
from fastshard.errors import (
    IntegrityError,
    InvalidArgumentError,
    ObjectChangedError,
    UnsupportedError,
)


def _every_dtype() -> dict[str, torch.Tensor]:
    """Every dtype, at shapes whose byte sizes leave later tensors at odd
    offsets in tensorizer's layout, plus a scalar, an empty and a meta tensor."""
    sd = {f"t{i}_{dt}": random_tensor(dt, (3, 5 + i), i) for i, dt in enumerate(DTYPES)}
    sd["scalar"] = torch.tensor(2.5, dtype=torch.float64)
    sd["empty"] = torch.empty(0, 4, dtype=torch.int32)
    sd["meta"] = torch.empty(4, 2, device="meta")
    return sd


def _mapped_regions(path: Path) -> int:
    """How many of this process's mappings are of ``path``."""
    target = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip().endswith(target))


@pytest.mark.parametrize("writer", ["fastshard", "tensorizer"])
def test_every_dtype_is_bit_equal_to_the_copied_load(
    tmp_path: Path, tz_write: Any, writer: str
) -> None:
    sd = _every_dtype()
    path = tmp_path / "m.tensors"
    if writer == "fastshard":
        fastshard.save(sd, path)
    else:
        path = tz_write(sd)
    copied = fastshard.load_state_dict(path)
    with fastshard.open(path, mmap=True, verify_hash=True) as f:
        mapped = f.load_state_dict()
        stats = f.stats
    assert_state_equal(mapped, copied)
    for name, t in mapped.items():
        # Never a misaligned pointer: those tensors are copied instead.
        assert t.data_ptr() % t.element_size() == 0, name
    assert torch.count_nonzero(mapped["meta"]) == 0
    offsets = {e["name"]: e["data_offset"] for e in layout(path)}
    views = [n for n, t in mapped.items() if n != "meta" and offsets[n] % t.element_size() == 0]
    assert stats.bytes_mapped == sum(mapped[n].nbytes for n in views)
    # Both paths ran: tensorizer's layout leaves some tensors misaligned.
    assert 0 < stats.bytes_mapped < sum(t.nbytes for t in mapped.values())
    assert stats.bytes_fetched == 0


def test_views_share_the_mapping_and_writes_stay_private(tmp_path: Path) -> None:
    path = tmp_path / "m.tensors"
    sd = {"w": random_tensor(torch.float32, (256, 64), 1), "b": random_tensor(torch.int8, (33,), 2)}
    fastshard.save(sd, path)
    before = path.read_bytes()
    sd_map = fastshard.load_state_dict(path, mmap=True)
    w = sd_map["w"]
    if w.data_ptr() % 4:  # pragma: no cover (fastshard's layout puts w first, aligned)
        pytest.skip("w landed misaligned")
    w.fill_(7.0)
    sd_map["b"].zero_()
    assert path.read_bytes() == before
    again = fastshard.load_state_dict(path, mmap=True)
    assert_state_equal(again, sd)
    assert torch.all(w == 7.0)


def test_verify_hash_catches_a_corrupt_byte_over_the_mapped_pages(tmp_path: Path) -> None:
    path = tmp_path / "m.tensors"
    sd = {
        "a": random_tensor(torch.float16, (64, 64), 1),
        "b": random_tensor(torch.uint8, (999,), 2),
    }
    fastshard.save(sd, path)
    entry = next(e for e in layout(path) if e["name"] == "b")
    patch(path, entry["data_offset"] + 500, bytes([sd["b"][500].item() ^ 0x01]))
    loose = fastshard.load_state_dict(path, mmap=True)  # no hashes asked: loads the bad byte
    assert loose["b"][500].item() == sd["b"][500].item() ^ 0x01
    with pytest.raises(IntegrityError) as err:
        fastshard.load_state_dict(path, mmap=True, verify_hash=True)
    assert err.value.tensor == "b"
    assert str(path) in str(err.value)
    # The other tensor alone still verifies.
    only_a = fastshard.load_state_dict(path, mmap=True, verify_hash=True, names=["a"])
    assert_bit_equal(only_a["a"], sd["a"])


def test_a_record_header_that_disagrees_with_the_index_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "m.tensors"
    fastshard.save({"abc": torch.arange(8)}, path)
    entry = layout(path)[0]
    # The record header repeats the name 13 bytes in (length, module, type, name length).
    patch(path, entry["header_offset"] + 13, b"x")
    with pytest.raises(fastshard.FormatError, match="disagrees"):
        fastshard.load_state_dict(path, mmap=True)


def _tp_state() -> dict[str, torch.Tensor]:
    return {
        "qkv": random_tensor(torch.bfloat16, (12, 6), 1),
        "o": random_tensor(torch.float32, (6, 8), 2),
        "norm": random_tensor(torch.float16, (7,), 3),
        "odd": random_tensor(torch.float16, (5, 4), 4),  # shifts what follows off alignment
        "down": random_tensor(torch.float32, (4, 10), 5),
    }


def test_tensor_parallel_slices_equal_the_copied_slices(tmp_path: Path) -> None:
    path = tmp_path / "m.tensors"
    sd = _tp_state()
    fastshard.save(sd, path)
    offsets = {e["name"]: e["data_offset"] for e in layout(path)}
    specs = {"qkv": ShardSpec(dim=0, parts=(4, 4, 4)), "o": 1, "norm": None, "odd": 1, "down": 1}
    for rank in range(2):
        kw: dict[str, Any] = {"rank": rank, "world_size": 2, "shard_specs": specs}
        copied = fastshard.load_state_dict(path, **kw)
        mapped = fastshard.load_state_dict(path, mmap=True, **kw)
        assert_state_equal(mapped, copied)
        for name, t in mapped.items():
            assert t.data_ptr() % t.element_size() == 0, name
        # A fused slice is concatenated; a later-dim slice of an aligned
        # tensor is a strided view, of a misaligned one a contiguous copy.
        assert mapped["qkv"].is_contiguous()
        for name in ("o", "odd", "down"):
            view = offsets[name] % sd[name].element_size() == 0
            assert mapped[name].is_contiguous() != view, name


def test_a_dim0_slice_is_a_view_of_the_mapping(tmp_path: Path) -> None:
    path = tmp_path / "m.tensors"
    w = random_tensor(torch.uint8, (8, 4096), 1)  # itemsize 1: always aligned
    fastshard.save({"w": w}, path)
    with fastshard.open(path, mmap=True) as f:
        got = f.load_state_dict(rank=1, world_size=2, shard_specs={"w": 0})
        assert f.stats.bytes_mapped == 4 * 4096
    assert got["w"].is_contiguous()
    assert_bit_equal(got["w"], w[4:])
    with fastshard.open(path, mmap=True) as f:
        got = f.load_state_dict(rank=1, world_size=2, shard_specs={"w": 1})
        assert f.stats.bytes_mapped == 8 * 2048
    assert not got["w"].is_contiguous()
    assert_bit_equal(got["w"], w[:, 2048:])


def test_the_mapping_outlives_the_file_while_tensors_are_alive(tmp_path: Path) -> None:
    path = tmp_path / "m.tensors"
    sd = {"w": random_tensor(torch.uint8, (3 << 20,), 1), "v": random_tensor(torch.int16, (77,), 2)}
    fastshard.save(sd, path)
    gc.collect()
    assert _mapped_regions(path) == 0
    with fastshard.open(path, mmap=True) as f:
        got = f.load_state_dict()
    del f
    gc.collect()
    assert _mapped_regions(path) >= 1
    assert_state_equal(got, sd)
    w = got.pop("w")
    del got
    gc.collect()
    assert _mapped_regions(path) >= 1  # w still views it
    assert_bit_equal(w, sd["w"])
    del w
    gc.collect()
    assert _mapped_regions(path) == 0


def test_packed_rank_view_maps_its_own_tensors(tmp_path: Path) -> None:
    shards = [
        {"a": random_tensor(torch.float32, (4, 3), r), "b": random_tensor(torch.int8, (5,), r)}
        for r in range(2)
    ]
    uri = str(tmp_path / "packed.tensors")
    fastshard.save_sharded(shards, uri, packed=True)
    for rank in range(2):
        copied = fastshard.load_state_dict(uri, rank=rank, world_size=2)
        mapped = fastshard.load_state_dict(uri, rank=rank, world_size=2, mmap=True)
        assert_state_equal(mapped, copied)


def test_refused_cases_raise_typed_errors(tmp_path: Path) -> None:
    path = tmp_path / "m.tensors"
    fastshard.save({"w": torch.randn(4, 4)}, path)
    with fastshard.open(path, mmap=True) as f:
        with pytest.raises(InvalidArgumentError, match="device=meta"):
            f.load_state_dict(device="meta")
        with pytest.raises(InvalidArgumentError, match="dtype="):
            f.load_state_dict(dtype=torch.float16)
        with pytest.raises(InvalidArgumentError, match="cooperative"):
            f.load_state_dict(rank=0, world_size=2, shard_specs={"w": 0}, cooperative=True)
    with pytest.raises(InvalidArgumentError):
        fastshard.load_state_dict(path, mmap=True, device="cuda")
    with pytest.raises(InvalidArgumentError, match="mmap must be"):
        fastshard.open(path, mmap="yes")  # type: ignore[typeddict-item]
    with pytest.raises(InvalidArgumentError, match="fastshard.load"):
        fastshard.load(torch.nn.Linear(4, 4), path, mmap=True)


def test_an_encrypted_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "enc.tensors"
    key = EncryptionKey.from_bytes(bytes(range(32)))
    fastshard.save({"w": torch.randn(4, 4)}, path, encryption=key)
    with pytest.raises(UnsupportedError, match="encrypted"):
        fastshard.load_state_dict(path, mmap=True, encryption=key)


def test_a_file_grown_since_the_open_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.tensors"
    fastshard.save({"w": torch.randn(4, 4)}, path)
    with fastshard.open(path, mmap=True) as f:
        with open(path, "ab") as out:
            out.write(b"\0" * 10)
        with pytest.raises(ObjectChangedError):
            f.load_state_dict()


@pytest.mark.http
def test_a_remote_object_is_refused(nginx: Any, tmp_path: Path) -> None:
    path = tmp_path / "m.tensors"
    fastshard.save({"w": torch.randn(4, 4)}, path)
    url = nginx.publish(path, "mmap/m.tensors")
    with pytest.raises(UnsupportedError, match="local files"):
        fastshard.load_state_dict(url, mmap=True)
    assert_bit_equal(fastshard.load_state_dict(url)["w"], fastshard.load_state_dict(path)["w"])


def test_an_aligned_save_is_mapped_whole_and_tensorizer_reads_it(tmp_path: Path) -> None:
    sd = _every_dtype()
    path = tmp_path / "aligned.tensors"
    fastshard.save(sd, path, align=64)
    assert all(e["data_offset"] % 64 == 0 for e in layout(path) if e["data_length"])
    with fastshard.open(path, mmap=True, verify_hash=True) as f:
        mapped = f.load_state_dict()
        stats = f.stats
    copied = fastshard.load_state_dict(path, verify_hash=True)
    assert_state_equal(mapped, copied)
    assert stats.bytes_mapped == sum(t.nbytes for n, t in mapped.items() if n != "meta")
    theirs = tensorizer_read(path, verify_hash=True)
    for name, t in sd.items():
        if name != "meta":
            assert_bit_equal(theirs[name], t)
    # Alignment 1 is tensorizer's layout: the same bytes as no alignment.
    fastshard.save(sd, tmp_path / "one.tensors", align=1)
    fastshard.save(sd, tmp_path / "plain.tensors")
    assert (tmp_path / "one.tensors").read_bytes() == (tmp_path / "plain.tensors").read_bytes()


def test_a_bad_alignment_is_refused(tmp_path: Path) -> None:
    sd = {"w": torch.randn(4)}
    for bad in (3, 8192, 0):
        with pytest.raises(InvalidArgumentError, match="power of two"):
            fastshard.save(sd, tmp_path / "x.tensors", align=bad)
    with pytest.raises(InvalidArgumentError, match="power of two"):
        fastshard.save(sd, tmp_path / "x.tensors", align="64")  # type: ignore[typeddict-item]
    key = EncryptionKey.from_bytes(bytes(range(32)))
    with pytest.raises(InvalidArgumentError, match="encrypted"):
        fastshard.save(sd, tmp_path / "x.tensors", align=64, encryption=key)
    assert not (tmp_path / "x.tensors").exists()
