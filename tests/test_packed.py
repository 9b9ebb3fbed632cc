"""One packed object for all ranks (issue 4, item 2): save_sharded(packed=True)
writes one tensorizer file with every rank's tensors named @rank{r}/{name};
a rank reads only its own byte ranges. Local and through SeaweedFS, read
back by the real tensorizer, and every way a load can disagree with it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import assert_bit_equal, assert_state_equal, random_tensor
from tensorizer_files import tensorizer_write

import fastshard
from fastshard import packed, shard

DTYPES = [torch.bfloat16, torch.float32, torch.int64, torch.float8_e4m3fn, torch.bool]
# Tensors of >= 16 KiB, so the record headers between one rank's tensors
# (which a coalesced read also fetches) stay far below the 2% allowance.
ROW_BYTES = 4096


def rank_state(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """Distinct bit patterns per rank, shapes that grow with the rank and
    one more extra tensor per rank: no two ranks hold the same set."""
    seed = 1000 * world_size + 10 * rank
    out = {
        f"t.{dt}".replace("torch.", ""): random_tensor(
            dt, (rank + 4, ROW_BYTES // dt.itemsize), seed=seed + i
        )
        for i, dt in enumerate(DTYPES)
    }
    for k in range(rank):
        out[f"extra.{k}"] = random_tensor(torch.float16, (8, 1024 + k), seed=seed + 100 + k)
    out["rank"] = torch.tensor([rank, world_size])
    return out


def share(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


class TPNet(torch.nn.Module):
    def __init__(self, world_size: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(64, 256 // world_size)
        self.down = torch.nn.Linear(256 // world_size, 64, bias=False)
        self.scale = torch.nn.Parameter(torch.ones(3))
        self.register_buffer("seen", torch.zeros(2, dtype=torch.int64))


def tp_net(rank: int, world_size: int, seed_base: int = 0) -> TPNet:
    torch.manual_seed(seed_base + 100 * world_size + rank)
    net = TPNet(world_size)
    with torch.no_grad():
        net.scale.normal_()
    net.seen.fill_(rank + seed_base)
    return net


def check_every_rank(uri: str, sources: list[dict], **opts) -> None:
    world_size = len(sources)
    for rank, source in enumerate(sources):
        with fastshard.open(uri, rank=rank, world_size=world_size, **opts) as f:
            assert f.keys() == list(source)
            assert f.opened.packed and f.opened.world_size == world_size
            assert_state_equal(f.load_state_dict(), source)
            fetched = f.stats.bytes_fetched
        # The load's stats leave out the one discovery read (header + index).
        assert share(source) <= fetched <= 1.02 * share(source), (rank, fetched)
        # world_size may be left out: the index knows it.
        assert_state_equal(fastshard.load_state_dict(uri, rank=rank, **opts), source)


def stored_ranks(uri: str, **opts) -> list[int]:
    with fastshard.open(uri, **opts) as f:
        return [packed.rank_of(name) for name in f.keys()]  # type: ignore[misc]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_round_trip_every_rank(tmp_path, world_size):
    uri = str(tmp_path / "model.tensors")
    sources = [rank_state(r, world_size) for r in range(world_size)]
    assert fastshard.save_sharded(sources, uri, packed=True) == [uri]
    assert [p.name for p in tmp_path.iterdir()] == ["model.tensors"]  # no manifest
    check_every_rank(uri, sources)
    # Rank by rank, each rank's records in state-dict order: contiguous.
    assert stored_ranks(uri) == [r for r, s in enumerate(sources) for _ in s]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_tensorizer_reads_packed_object(tmp_path, world_size):
    from tensorizer import TensorDeserializer

    uri = tmp_path / "model.tensors"
    sources = [rank_state(r, world_size) for r in range(world_size)]
    fastshard.save_sharded(sources, uri, packed=True)
    expected = {f"@rank{r}/{k}": v for r, s in enumerate(sources) for k, v in s.items()}
    with TensorDeserializer(str(uri), device="cpu") as d:
        got = {k: v.clone() for k, v in d.items()}
    assert_state_equal(got, expected)
    for rank, source in enumerate(sources):
        pre = f"@rank{rank}/"
        with TensorDeserializer(
            str(uri), device="cpu", filter_func=lambda name, pre=pre: name.startswith(pre)
        ) as d:
            got = {k.removeprefix(pre): v.clone() for k, v in d.items()}
        assert_state_equal(got, source)


def test_tensorizer_written_packed_object(tmp_path):
    """Names decide, not who wrote the file or in which order: interleaved
    ranks still load (in more ranged reads)."""
    a, b, c = (random_tensor(torch.float32, (4, 5), seed=s) for s in (1, 2, 3))
    path = tensorizer_write({"@rank1/b": b, "@rank0/a": a, "@rank1/c": c}, tmp_path / "tz.tensors")
    assert_state_equal(fastshard.load_state_dict(path, rank=0), {"a": a})
    assert_state_equal(fastshard.load_state_dict(path, rank=1, world_size=2), {"b": b, "c": c})
    with pytest.raises(fastshard.ShardMismatchError, match="holds 2 ranks"):
        fastshard.load_state_dict(path, rank=0, world_size=1)


def test_rank_none_shows_stored_names(tmp_path):
    uri = tmp_path / "model.tensors"
    sources = [rank_state(r, 2) for r in range(2)]
    fastshard.save_sharded(sources, uri, packed=True)
    everything = {f"@rank{r}/{k}": v for r, s in enumerate(sources) for k, v in s.items()}
    assert_state_equal(fastshard.load_state_dict(uri), everything)
    assert_state_equal(fastshard.load_state_dict(uri, world_size=2), everything)
    with fastshard.open(uri) as f:
        assert f.opened.packed and f.opened.rank is None and f.opened.world_size == 2
        with pytest.raises(fastshard.ShardMismatchError, match="opened with rank=None"):
            f.load_state_dict(rank=1)
        with pytest.raises(fastshard.ShardMismatchError, match="holds 2 ranks"):
            f.load_state_dict(world_size=4)
    with fastshard.open(uri, rank=1) as f:
        with pytest.raises(fastshard.ShardMismatchError, match="opened as rank 1"):
            f.load_state_dict(rank=0)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_load_into_per_rank_models(tmp_path, world_size):
    uri = str(tmp_path / "model.tensors")
    sources = [tp_net(r, world_size) for r in range(world_size)]
    fastshard.save_sharded(sources, uri, packed=True)
    for rank, source in enumerate(sources):
        model = tp_net(rank, world_size, seed_base=7)  # other values
        stats = fastshard.load(model, uri, rank=rank, world_size=world_size)
        own = share(source.state_dict())
        assert own <= stats.bytes_fetched <= 1.02 * own
        for key, value in source.state_dict().items():
            assert_bit_equal(model.state_dict()[key], value)
    # fastshard.load's default rank is 0; meta tensors get allocated.
    with torch.device("meta"):
        meta = TPNet(world_size)
    fastshard.load(meta, uri)
    for key, value in sources[0].state_dict().items():
        assert_bit_equal(meta.state_dict()[key], value)


def test_nested_state_dicts(tmp_path):
    """Path-form names carry the prefix on their first key."""
    from tensorizer import TensorDeserializer

    sources = [
        {
            "layers": [{"w": random_tensor(torch.float16, (3, r + 1), seed=r)}],
            "top": torch.ones(r + 1),
        }
        for r in range(2)
    ]
    uri = tmp_path / "nested.tensors"
    fastshard.save_sharded(sources, uri, packed=True)
    for rank, source in enumerate(sources):
        got = fastshard.load_state_dict(uri, rank=rank, world_size=2)
        assert list(got) == ["layers", "top"]
        assert_bit_equal(got["layers"][0]["w"], source["layers"][0]["w"])
        assert_bit_equal(got["top"], source["top"])
        with fastshard.open(uri, rank=rank) as f:
            assert f.keys() == ["layers.0.w", "top"]
            assert f.info(("layers", 0, "w")).shape == (3, rank + 1)
    with TensorDeserializer(str(uri), device="cpu") as d:
        tree = d.tree()
        assert_bit_equal(tree["@rank1/layers"][0]["w"], sources[1]["layers"][0]["w"])
    with pytest.raises(fastshard.UnsupportedError, match="top level is a list"):
        fastshard.save_sharded([[torch.ones(1)]], tmp_path / "list.tensors", packed=True)
    assert not (tmp_path / "list.tensors").exists()


def test_wrong_world_size_and_rank(tmp_path):
    uri = str(tmp_path / "model.tensors")
    sources = [tp_net(r, 2) for r in range(2)]
    fastshard.save_sharded(sources, uri, packed=True)
    before = {k: v.clone() for k, v in tp_net(0, 4, seed_base=7).state_dict().items()}
    model = tp_net(0, 4, seed_base=7)
    for call in (
        lambda: fastshard.load_state_dict(uri, rank=0, world_size=4),
        lambda: fastshard.load(model, uri, rank=0, world_size=4),
        lambda: fastshard.open(uri, world_size=1),
    ):
        with pytest.raises(fastshard.ShardMismatchError) as info:
            call()
        assert "packed object holds 2 ranks" in str(info.value)
        assert "asked world_size=" in str(info.value)
        assert info.value.uri == uri
    for call in (
        lambda: fastshard.load_state_dict(uri, rank=2),
        lambda: fastshard.load(model, uri, rank=3, world_size=2),
    ):
        with pytest.raises(fastshard.ShardMismatchError, match=r"rank \d does not exist.*0\.\.1"):
            call()
    assert_state_equal(model.state_dict(), before)  # nothing partially loaded
    with pytest.raises(fastshard.InvalidArgumentError, match="rank"):
        fastshard.load_state_dict(uri, rank=-1)


def test_not_a_packed_object(tmp_path, tz_write):
    one = random_tensor(torch.float32, (2, 2), seed=5)
    mixed = tz_write({"@rank0/a": one, "b": one})
    with pytest.raises(fastshard.FormatError, match=r"mixes packed .*'@rank0/a' and 'b'"):
        fastshard.open(mixed)
    gap = tz_write({"@rank0/a": one, "@rank2/b": one})
    with pytest.raises(fastshard.FormatError, match=r"0\.\.W-1, found 0, 2 .*rank 1\)"):
        fastshard.open(gap, rank=0)
    # Leading zeros are not a rank prefix (one spelling per rank).
    zero = tz_write({"@rank01/a": one, "@rank0/b": one})
    with pytest.raises(fastshard.FormatError, match="mixes"):
        fastshard.open(zero)
    # An ordinary file at world size 2 is sliced, which needs shard specs.
    plain = tz_write({"a": one})
    with pytest.raises(fastshard.InvalidArgumentError, match="shard_specs"):
        fastshard.load_state_dict(plain, rank=0, world_size=2)
    assert_state_equal(fastshard.load_state_dict(plain, rank=0, world_size=1), {"a": one})


def test_save_packed_validates(tmp_path):
    with pytest.raises(fastshard.InvalidArgumentError, match="per-rank template"):
        fastshard.save_sharded([{"a": torch.ones(1)}], tmp_path / "m-{rank}.t", packed=True)
    with pytest.raises(fastshard.InvalidArgumentError, match="rank 1's state dict has no"):
        fastshard.save_sharded([{"a": torch.ones(1)}, {}], tmp_path / "m.t", packed=True)
    with pytest.raises(fastshard.InvalidArgumentError, match="unknown option"):
        fastshard.save_sharded([{"a": torch.ones(1)}], f"{tmp_path}/", packed=True, bogus=1)
    assert not list(tmp_path.iterdir())


def test_directory_uri(tmp_path):
    folder = tmp_path / "tp2"
    folder.mkdir()
    sources = [rank_state(r, 2) for r in range(2)]
    # A per-rank set saved there before is replaced: its manifest goes, so
    # the directory now means the packed object.
    fastshard.save_sharded([rank_state(r, 4) for r in range(4)], f"{folder}/")
    assert (folder / shard.MANIFEST_NAME).exists()
    uris = fastshard.save_sharded(sources, f"{folder}/", packed=True)
    assert uris == [f"{folder}/model.tensors"]
    assert not (folder / shard.MANIFEST_NAME).exists()
    for uri in (f"{folder}/", str(folder)):
        for rank in range(2):
            assert_state_equal(
                fastshard.load_state_dict(uri, rank=rank, world_size=2), sources[rank]
            )
    with pytest.raises(fastshard.ShardMismatchError, match="holds 2 ranks"):
        fastshard.load_state_dict(f"{folder}/", rank=0, world_size=4)


def test_inspect_says_packed(tmp_path):
    uri = tmp_path / "model.tensors"
    fastshard.save_sharded([rank_state(r, 2) for r in range(2)], uri, packed=True)

    def run(*args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "fastshard", "inspect", str(uri), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    lines = run().splitlines()
    assert lines[1].startswith("packed: world_size 2 ") and "per rank: 6, 7 tensors" in lines[1]
    doc = json.loads(run("--json"))
    assert doc["packed"] == {"world_size": 2, "tensors_per_rank": [6, 7]}


@pytest.mark.s3
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_s3_round_trip(seaweed, world_size):
    opts = seaweed.opts()
    uri = f"s3://{seaweed.bucket}/packed/tp{world_size}/model.tensors"
    sources = [rank_state(r, world_size) for r in range(world_size)]
    assert fastshard.save_sharded(sources, uri, packed=True, **opts) == [uri]
    check_every_rank(uri, sources, **opts)
    assert stored_ranks(uri, **opts) == [r for r, s in enumerate(sources) for _ in s]
    with pytest.raises(fastshard.ShardMismatchError, match="asked world_size"):
        fastshard.load_state_dict(uri, rank=0, world_size=world_size + 1, **opts)
    with pytest.raises(fastshard.ShardMismatchError, match="does not exist"):
        fastshard.load_state_dict(uri, rank=world_size, **opts)


@pytest.mark.s3
def test_s3_models_and_directory(seaweed):
    opts = seaweed.opts()
    folder = f"s3://{seaweed.bucket}/packed/net/"
    sources = [tp_net(r, 2) for r in range(2)]
    assert fastshard.save_sharded(sources, folder, packed=True, **opts) == [
        folder + "model.tensors"
    ]
    for rank, source in enumerate(sources):
        model = tp_net(rank, 2, seed_base=7)
        stats = fastshard.load(model, folder, rank=rank, world_size=2, **opts)
        own = share(source.state_dict())
        assert own <= stats.bytes_fetched <= 1.02 * own
        for key, value in source.state_dict().items():
            assert_bit_equal(model.state_dict()[key], value)
    # The real tensorizer reads the object over its own S3 path, one rank at a time.
    from tensorizer import TensorDeserializer, stream_io

    for rank, source in enumerate(sources):
        pre = f"@rank{rank}/"
        stream = stream_io.open_stream(
            folder + "model.tensors",
            "rb",
            s3_endpoint=seaweed.endpoint,
            s3_access_key_id=seaweed.access_key,
            s3_secret_access_key=seaweed.secret_key,
            force_http=True,
        )
        with (
            stream,
            TensorDeserializer(
                stream, device="cpu", verify_hash=True, filter_func=lambda n, p=pre: n.startswith(p)
            ) as d,
        ):
            got = {k.removeprefix(pre).removeprefix("."): v.clone() for k, v in d.items()}
        assert_state_equal(got, source.state_dict())
