"""The public API: open/keys/info/load_state_dict/stats, options, load, save."""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest
import torch
from conftest import assert_bit_equal, random_tensor, small_net
from tensorizer_files import tensorizer_read

import fastshard


@pytest.fixture
def mixed(tz_write):
    sd = {
        "zeta": random_tensor(torch.float32, (4, 3), 1),
        "alpha": random_tensor(torch.float16, (5,), 2),
        "bf": torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16),
        "f8": torch.tensor([0.5, 1.0], dtype=torch.float8_e4m3fn),
        "c64": random_tensor(torch.complex64, (3,), 3),
        "i32": torch.tensor([1, -7, 1 << 30], dtype=torch.int32),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "flag": torch.tensor([True, False]),
        "f64": torch.tensor([1e-300, 3.14159], dtype=torch.float64),
    }
    return sd, tz_write(sd)


def test_keys_in_file_order_and_info(mixed):
    sd, path = mixed
    data = path.read_bytes()
    with fastshard.open(path) as f:
        assert f.keys() == list(sd)  # file order, not sorted
        assert len(f) == len(sd) and "zeta" in f and "nope" not in f
        for name, t in sd.items():
            info = f.info(name)
            assert info == fastshard.TensorInfo(
                name=name,
                dtype=t.dtype,
                shape=tuple(t.shape),
                nbytes=t.numel() * t.element_size(),
                offset=info.offset,
                path=None,
                tensor_type=2,
            )
            # The offset really is where the tensor's bytes are.
            raw = data[info.offset : info.offset + info.nbytes]
            assert raw == bytes(t.contiguous().view(-1).view(torch.uint8).numpy())
        with pytest.raises(KeyError):
            f.info("nope")
        assert f.version == 2  # bf16/f8 are opaque dtypes
        assert f.file_size == path.stat().st_size


def test_dtype_casts_floating_tensors_only(mixed):
    sd, path = mixed
    out = fastshard.load_state_dict(path, dtype=torch.bfloat16)
    for name in ("zeta", "alpha", "f8", "f64", "bf"):
        assert out[name].dtype == torch.bfloat16
        assert torch.equal(out[name], sd[name].to(torch.bfloat16))
    # Complex, integer and bool tensors keep type and bits (tensorizer #206).
    for name in ("c64", "i32", "u8", "flag"):
        assert_bit_equal(out[name], sd[name])
    out = fastshard.load_state_dict(path, dtype="float16")
    assert out["zeta"].dtype == torch.float16 and out["c64"].dtype == torch.complex64
    with pytest.raises(fastshard.InvalidArgumentError, match="floating"):
        fastshard.load_state_dict(path, dtype=torch.int8)
    with pytest.raises(fastshard.InvalidArgumentError, match="floating"):
        fastshard.load_state_dict(path, dtype=torch.complex64)


def test_names_selection(mixed):
    sd, path = mixed
    with fastshard.open(path) as f:
        out = f.load_state_dict(names=["i32", "zeta"])
        assert list(out) == ["zeta", "i32"]  # file order
        assert_bit_equal(out["zeta"], sd["zeta"])
        assert_bit_equal(out["i32"], sd["i32"])
        part = f.stats.bytes_fetched
        whole = f.load_state_dict()
        assert f.stats.bytes_fetched > part
        assert list(whole) == list(sd)
        with pytest.raises(fastshard.InvalidArgumentError, match="missing_one"):
            f.load_state_dict(names=["zeta", "missing_one"])
        with pytest.raises(fastshard.InvalidArgumentError):
            f.load_state_dict(names="zeta")


def test_stats(tz_write):
    sd = {f"t{i}": random_tensor(torch.float32, (256, 64), i) for i in range(8)}
    path = tz_write(sd)
    with fastshard.open(path) as f:
        assert f.stats == fastshard.LoadStats()
        f.load_state_dict()
        s = f.stats
    size = path.stat().st_size
    data_bytes = sum(t.numel() * 4 for t in sd.values())
    assert data_bytes <= s.bytes_fetched <= 1.01 * size
    assert s.requests >= 1 and s.retries == 0
    assert s.seconds > 0 and s.gbps == pytest.approx(s.bytes_fetched / s.seconds / 1e9)
    assert s.concurrency >= 1 and s.peak_host_bytes >= 0


def test_context_manager_closes(mixed):
    _, path = mixed
    with fastshard.open(path) as f:
        assert not f.closed
    assert f.closed
    with pytest.raises(fastshard.InvalidArgumentError, match="closed"):
        f.keys()
    with pytest.raises(fastshard.InvalidArgumentError, match="closed"):
        f.load_state_dict()
    f.close()  # idempotent


def test_devices_and_ranks(mixed):
    sd, path = mixed
    out = fastshard.load_state_dict(path, device=torch.device("cpu"), rank=0, world_size=1)
    assert_bit_equal(out["c64"], sd["c64"])
    # One unsharded file at world size 2 needs to know how to slice it.
    with pytest.raises(fastshard.InvalidArgumentError, match="shard_specs"):
        fastshard.load_state_dict(path, rank=0, world_size=2)
    with pytest.raises(fastshard.InvalidArgumentError, match="rank"):
        fastshard.load_state_dict(path, rank=1)
    with pytest.raises(fastshard.InvalidArgumentError):
        fastshard.load_state_dict(path, device="not-a-device")


def test_cuda_device(mixed):
    sd, path = mixed
    if torch.cuda.is_available():
        out = fastshard.load_state_dict(path, device="cuda")
        assert out["c64"].device.type == "cuda"
        assert_bit_equal(out["c64"], sd["c64"])
        assert_bit_equal(out["bf"], sd["bf"])
    else:
        with pytest.raises(fastshard.InvalidArgumentError, match="CUDA"):
            fastshard.load_state_dict(path, device="cuda")


def test_options(mixed):
    _, path = mixed
    out = fastshard.load_state_dict(path, concurrency=2, part_size_bytes=1 << 20, verify_hash=True)
    assert len(out) == 9
    with pytest.raises(fastshard.InvalidArgumentError, match="unknown option"):
        fastshard.open(path, verfy_hash=True)
    with pytest.raises(fastshard.InvalidArgumentError, match="progress must be"):
        fastshard.open(path, progress=1)
    with pytest.raises(fastshard.InvalidArgumentError, match="encryption must be"):
        fastshard.open(path, encryption=1)
    # Source options reach the native reader (a local file ignores them)...
    out = fastshard.load_state_dict(
        path, s3_region="eu-west-1", s3_addressing="path", max_attempts=2, s3_config_path=path
    )
    assert len(out) == 9
    # ...which checks them: a bad value is an InvalidArgumentError.
    with pytest.raises(fastshard.InvalidArgumentError, match="addressing"):
        fastshard.open(path, s3_addressing="sideways")
    with pytest.raises(fastshard.InvalidArgumentError, match="path"):
        fastshard.open(path, ca_bundle=3)


def test_load_into_module_in_place_and_cast(tz_write):
    src = small_net(seed=11)
    path = tz_write(src)
    dst = small_net(seed=12)
    ptr = dst.lin.weight.data_ptr()
    stats = fastshard.load(dst, path)
    assert isinstance(stats, fastshard.LoadStats) and stats.requests >= 1
    assert dst.lin.weight.data_ptr() == ptr  # filled in place, not replaced
    assert_bit_equal(dst.lin.weight, src.lin.weight)
    # A float64 model takes float32 weights through a cast copy.
    dst64 = small_net(seed=13).double()
    fastshard.load(dst64, path)
    assert dst64.lin.weight.dtype == torch.float64
    assert torch.equal(dst64.lin.weight, src.lin.weight.double())
    assert_bit_equal(dst64.norm.num_batches_tracked, src.norm.num_batches_tracked)


def test_load_non_strict_and_non_persistent_absent(tz_write):
    src = small_net(seed=14)
    # Without the non-persistent buffer, as torch's state_dict() has it.
    # (Not write_module(include_non_persistent_buffers=False): tensorizer
    # 2.12.1 then also drops persistent *root* buffers, whose names it
    # compares with a leading dot.)
    path = tz_write(src.state_dict())
    with fastshard.open(path) as f:
        assert "cache" not in f.keys()
    dst = small_net(seed=15)
    cache = dst.cache.clone()
    fastshard.load(dst, path)  # strict, yet the absent "cache" is fine
    assert torch.equal(dst.cache, cache)
    assert_bit_equal(dst.lin.bias, src.lin.bias)
    partial = tz_write({"lin.weight": src.lin.weight, "extra": torch.ones(1)})
    dst = small_net(seed=16)
    bias = dst.lin.bias.clone()
    with pytest.raises(fastshard.InvalidArgumentError):
        fastshard.load(dst, partial)
    fastshard.load(dst, partial, strict=False)
    assert_bit_equal(dst.lin.weight, src.lin.weight)
    assert torch.equal(dst.lin.bias, bias)


class _Shared(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(2, 2)
        self.b = self.a  # one submodule under two names
        self.c = torch.nn.Linear(2, 1)


def test_load_shared_submodule(tz_write):
    src = _Shared()
    path = tz_write(src)  # write_module stores "a.*" only: named_modules() dedups
    with fastshard.open(path) as f:
        assert f.keys() == ["a.weight", "a.bias", "c.weight", "c.bias"]
    with torch.device("meta"):
        dst = _Shared()
    fastshard.load(dst, path)  # strict: "b.*" are filled through "a.*"
    assert dst.b is dst.a and not dst.b.weight.is_meta
    assert_bit_equal(dst.b.weight, src.a.weight)
    assert_bit_equal(dst.c.bias, src.c.bias)


def test_load_from_state_dict_file(tz_write):
    src = small_net(seed=17)
    path = tz_write(src.state_dict())  # plain names, no leading dots
    dst = small_net(seed=18)
    fastshard.load(dst, path)
    assert_bit_equal(dst.scale, src.scale)
    assert_bit_equal(dst.norm.running_var, src.norm.running_var)


def test_load_template_and_world_size_of_one_file(tz_write):
    path = tz_write(small_net(seed=19))
    # A template whose rank file is missing names the file and the rank.
    with pytest.raises(fastshard.NotFoundError, match=r"rank 0 .*-rank-000"):
        fastshard.load(small_net(seed=19), str(path) + "-rank-%03d")
    # One file for several ranks: a model whose shapes equal the file's is
    # replicated, so every rank reads it whole.
    model = small_net(seed=3)
    fastshard.load(model, path, rank=3, world_size=4)
    for name, t in small_net(seed=19).state_dict().items():
        assert_bit_equal(model.state_dict()[name], t)


def test_save_returns_size_and_validates(tmp_path):
    path = tmp_path / "a.tensors"
    size = fastshard.save({"a": torch.ones(3)}, path)
    assert size == path.stat().st_size
    with pytest.raises(fastshard.InvalidArgumentError, match="nothing to save"):
        fastshard.save({}, tmp_path / "b.tensors")
    with pytest.raises(fastshard.InvalidArgumentError, match="keys must be str"):
        fastshard.save({1: torch.ones(1)}, tmp_path / "b.tensors")
    with pytest.raises(fastshard.InvalidArgumentError, match="leaves must be tensors"):
        fastshard.save({"a": 3}, tmp_path / "b.tensors")
    with pytest.raises(fastshard.UnsupportedError, match=r"local paths, s3:// and gs:// only"):
        fastshard.save({"a": torch.ones(1)}, "https://host.invalid/key.tensors?X-Amz-Signature=s")
    with pytest.raises(fastshard.InvalidArgumentError, match="unknown option"):
        fastshard.save({"a": torch.ones(1)}, tmp_path / "b.tensors", concurrency=4)
    with pytest.raises(fastshard.InvalidArgumentError, match="encryption must be"):
        fastshard.save({"a": torch.ones(1)}, tmp_path / "b.tensors", encryption=b"k" * 32)
    # Source options are accepted for local paths too (they are unused there).
    fastshard.save({"a": torch.ones(1)}, tmp_path / "c.tensors", s3_region="us-east-1")


def test_exact_index(tmp_path):
    sd = {
        f"model.layers.{i}.mlp.down_proj.weight.x": torch.full((1,), float(i)) for i in range(4000)
    }
    # tensorizer's fixed 256 KiB index cannot hold these names.
    with pytest.raises(fastshard.InvalidArgumentError) as info:
        fastshard.save(sd, tmp_path / "fixed.tensors", exact_index=False)
    assert info.value.reason == "index_too_small"  # what save() falls back on
    auto = tmp_path / "auto.tensors"
    fastshard.save(sd, auto)  # falls back to an exact-size index
    (metadata_len,) = struct.unpack_from("<Q", auto.read_bytes(), 0x41)
    assert 262144 < metadata_len < 400_000
    out = fastshard.load_state_dict(auto, verify_hash=True)
    assert list(out) == list(sd)
    assert all(torch.equal(out[k], v) for k, v in sd.items())
    back = tensorizer_read(auto, verify_hash=True)
    assert torch.equal(back["model.layers.3999.mlp.down_proj.weight.x"], torch.full((1,), 3999.0))
    small = tmp_path / "small.tensors"
    fastshard.save({"a": torch.ones(2)}, small, exact_index=True)
    (metadata_len,) = struct.unpack_from("<Q", small.read_bytes(), 0x41)
    assert metadata_len < 100
    assert torch.equal(tensorizer_read(small, verify_hash=True)["a"], torch.ones(2))


def test_import_does_not_load_torch():
    code = "import sys, fastshard; assert 'torch' not in sys.modules; print(fastshard.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    assert "load" in dir(fastshard) and callable(fastshard.load)
    assert callable(fastshard.save_sharded)
    with pytest.raises(AttributeError):
        fastshard.no_such_name  # noqa: B018
