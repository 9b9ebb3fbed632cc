"""safetensors files written by the real ``safetensors`` library load through
the same engine as tensorizer files: bit-equal to ``load_file``, locally,
from SeaweedFS and from nginx, sliced per rank, within a memory budget; the
format is told from the bytes; broken files are typed errors naming the
file and the byte range."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_bit_equal, random_tensor
from safetensors.torch import load_file, save_file

import fastshard

# Every dtype the library writes and load_file reads back.
READABLE = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.bool,
    torch.complex64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
]
# Written by the library (F8_E8M0, F4) but not read back by its load_file.
WRITE_ONLY = [torch.float8_e8m0fnu, torch.float4_e2m1fn_x2]


def name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def every_dtype() -> dict[str, torch.Tensor]:
    sd = {name(d): random_tensor(d, (3, 5), i) for i, d in enumerate(READABLE)}
    sd["scalar"] = torch.tensor(2.5, dtype=torch.float64)
    sd["empty"] = torch.zeros(0, 7)
    sd["one_byte"] = torch.tensor([7], dtype=torch.uint8)
    return sd


def write_only() -> dict[str, torch.Tensor]:
    raw = random_tensor(torch.uint8, (4, 6), 99)
    return {name(d): raw.clone().view(d) for d in WRITE_ONLY}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("st")
    out = {
        "dtypes": root / "dtypes.safetensors",
        "new": root / "new.safetensors",
        "many": root / "many.safetensors",
        "nothing": root / "nothing.safetensors",
    }
    save_file(every_dtype(), out["dtypes"], metadata={"format": "pt", "who": "test"})
    save_file(write_only(), out["new"])
    # 10,000 small tensors: a header larger than the discovery read.
    many = {f"layers.{i}.w": torch.full((2,), float(i), dtype=torch.float16) for i in range(10_000)}
    save_file(many, out["many"])
    save_file({}, out["nothing"])
    return out


TRANSPORTS = [
    "file",
    pytest.param("s3", marks=pytest.mark.s3),
    pytest.param("http", marks=pytest.mark.http),
]


@pytest.fixture(params=TRANSPORTS)
def where(request: pytest.FixtureRequest, files: dict[str, Path]) -> Any:
    """uri(name) and the options that reach the server, per transport."""
    if request.param == "file":
        return lambda name: str(files[name]), {}
    if request.param == "s3":
        seaweed = request.getfixturevalue("seaweed")
        uris = {n: seaweed.upload(p, f"st/{p.name}") for n, p in files.items()}
        return uris.__getitem__, seaweed.opts()
    nginx = request.getfixturevalue("nginx")
    uris = {n: nginx.publish(p, f"st/{p.name}") for n, p in files.items()}
    return uris.__getitem__, {}


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert_bit_equal(got[k], v)


def test_bit_equal_to_load_file(where, files):
    uri, opts = where
    want = load_file(files["dtypes"])
    assert_same(fastshard.load_state_dict(uri("dtypes"), **opts), want)
    assert_same(fastshard.load_state_dict(uri("new"), **opts), write_only())
    with fastshard.open(uri("dtypes"), **opts) as f:
        assert (f.format, f.version) == ("safetensors", None)
        assert f.metadata == {"format": "pt", "who": "test"}
        assert f.file_size == files["dtypes"].stat().st_size
        assert f.info("scalar").shape == () and f.info("empty").nbytes == 0
        # In file order: data offsets increase.
        offsets = [i.offset for i in f.infos()]
        assert offsets == sorted(offsets)
        sel = f.load_state_dict(names=["one_byte", "bfloat16"])
        assert_same(sel, {k: want[k] for k in ("one_byte", "bfloat16")})
        assert f.stats.bytes_fetched >= 1 + 30 and f.stats.requests >= 1


def test_many_small_tensors_and_none(where, files):
    uri, opts = where
    with fastshard.open(uri("many"), **opts) as f:
        assert len(f) == 10_000
        assert f.discovery_bytes > 320 * 1024  # the header needed a second read
        sd = f.load_state_dict()
    assert_same(sd, load_file(files["many"]))
    assert fastshard.load_state_dict(uri("nothing"), **opts) == {}


def test_format_is_told_from_the_bytes(tmp_path, files):
    misnamed = tmp_path / "weights.tensors"
    misnamed.write_bytes(files["dtypes"].read_bytes())
    assert_same(fastshard.load_state_dict(misnamed), load_file(files["dtypes"]))
    tz = tmp_path / "model.safetensors"
    fastshard.save({"a": torch.ones(3)}, tz)
    with fastshard.open(tz) as f:
        assert f.format == "tensorizer" and f.version is not None


def test_verify_hash_says_there_is_nothing_to_check(files):
    with pytest.raises(fastshard.InvalidArgumentError, match="store no hashes"):
        fastshard.load_state_dict(files["dtypes"], verify_hash=True)


class Net(torch.nn.Module):
    def __init__(self, world_size: int = 1) -> None:
        super().__init__()
        self.up = torch.nn.Linear(64, 256 // world_size, dtype=torch.bfloat16)
        self.down = torch.nn.Linear(256 // world_size, 64, bias=False, dtype=torch.bfloat16)
        self.norm = torch.nn.LayerNorm(64)


@pytest.fixture(scope="module")
def net_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(3)
    sd = {k: v.detach().clone() for k, v in Net().state_dict().items()}
    path = tmp_path_factory.mktemp("net") / "model.safetensors"
    save_file(sd, path)
    return path, sd


@pytest.mark.parametrize("world_size", [2, 4])
def test_tp_slices_read_only_the_ranks_bytes(net_file, world_size):
    path, full = net_file
    specs = {"up.*": 0, "down.weight": 1}
    for rank in range(world_size):
        with fastshard.open(path) as f:
            sd = f.load_state_dict(rank=rank, world_size=world_size, shard_specs=specs)
            stats = f.stats
        rows = 256 // world_size
        assert_bit_equal(sd["up.weight"], full["up.weight"][rank * rows : (rank + 1) * rows])
        assert_bit_equal(sd["up.bias"], full["up.bias"][rank * rows : (rank + 1) * rows])
        assert_bit_equal(sd["down.weight"], full["down.weight"][:, rank * rows : (rank + 1) * rows])
        assert_bit_equal(sd["norm.weight"], full["norm.weight"])
        assert stats.bytes_wanted == sum(t.nbytes for t in sd.values())
        # Dim-0 slices are one range each; the dim-1 rows are 64 short runs.
        assert stats.bytes_fetched <= 1.02 * stats.bytes_wanted + 64 * 1024
        model = Net(world_size)
        fastshard.load(model, path, rank=rank, world_size=world_size)
        for k, v in sd.items():
            assert_bit_equal(model.state_dict()[k], v)


def test_budget_and_casts(net_file):
    path, full = net_file
    budget = 40 * 1024
    sd = fastshard.load_state_dict(path, dtype=torch.float32, max_host_bytes=budget)
    for k, v in full.items():
        assert sd[k].dtype == torch.float32 and torch.equal(sd[k], v.float())
    with fastshard.open(path, max_host_bytes=budget) as f:
        f.load_state_dict(dtype=torch.float32)
        assert 0 < f.stats.peak_host_bytes <= budget


def test_inspect(files):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "fastshard", "inspect", str(files["dtypes"]), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert doc["format"] == "safetensors" and doc["version"] is None
    assert doc["metadata"] == {"format": "pt", "who": "test"}
    assert {t["name"] for t in doc["tensors"]} == set(every_dtype())
    text = subprocess.run(
        [sys.executable, "-m", "fastshard", "inspect", str(files["dtypes"])],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "safetensors" in text.splitlines()[0] and "format=pt" in text


# -- broken files ------------------------------------------------------------


def raw(header: dict[str, Any] | bytes, data: bytes = b"", length: int | None = None) -> bytes:
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(body) if length is None else length) + body + data


def t(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


BAD = {
    "header length past the end": (raw({"a": t("U8", [2], 0, 2)}, b"xy", length=500), None),
    "header not JSON": (raw(b'{"a": {"dtype": "U8",   ', b"xy"), None),
    "overlapping offsets": (raw({"a": t("U8", [2], 0, 2), "b": t("U8", [2], 1, 3)}, b"xyz"), "b"),
    "out-of-bounds offsets": (raw({"a": t("U8", [4], 0, 4)}, b"xy"), None),
    "dtype x shape != length": (raw({"a": t("F32", [2], 0, 6)}, b"xyzxyz"), "a"),
    "unknown dtype": (raw({"a": t("Q8", [2], 0, 2)}, b"xy"), "a"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_files_are_typed_errors_naming_file_and_range(tmp_path, case):
    data, tensor = BAD[case]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with pytest.raises(fastshard.FormatError) as info:
        fastshard.load_state_dict(path)
    err = info.value
    assert err.uri == str(path), err
    assert err.byte_range is not None, err
    start, end = err.byte_range
    assert 0 <= start <= end
    if tensor is not None:
        assert err.tensor == tensor, err
