"""Per-rank shard files (issue 4, item 1): templates in vLLM's printf form and
as {rank}, save_sharded's manifest, and every way a set can disagree with
the load that is asked of it; locally, through SeaweedFS, and from two
spawned processes."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from conftest import assert_bit_equal, assert_state_equal, random_tensor

import fastshard
from fastshard import shard

TEMPLATES = ["model-rank-%03d.tensors", "model-{rank}.tensors"]
DTYPES = [torch.bfloat16, torch.float32, torch.int64, torch.float8_e4m3fn, torch.bool]


def rank_state(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """Distinct bit patterns (and shapes) per rank, so a load of the wrong
    rank's file cannot pass."""
    seed = 1000 * world_size + 10 * rank
    out = {
        f"t.{dt}".replace("torch.", ""): random_tensor(dt, (rank + 2, 3), seed=seed + i)
        for i, dt in enumerate(DTYPES)
    }
    out["rank"] = torch.tensor([rank, world_size])
    return out


class TPNet(torch.nn.Module):
    """Column- then row-parallel linears, shaped for ``world_size``."""

    def __init__(self, world_size: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, 16 // world_size)
        self.down = torch.nn.Linear(16 // world_size, 8, bias=False)
        self.register_buffer("seen", torch.zeros(2, dtype=torch.int64))


def tp_net(rank: int, world_size: int, seed_base: int = 0) -> TPNet:
    torch.manual_seed(seed_base + 100 * world_size + rank)
    net = TPNet(world_size)
    net.seen.fill_(rank + seed_base)
    return net


@pytest.mark.parametrize("form", TEMPLATES)
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_round_trip_every_rank(tmp_path, form, world_size):
    template = str(tmp_path / form)
    sources = [rank_state(r, world_size) for r in range(world_size)]
    uris = fastshard.save_sharded(sources, template)
    assert uris == [shard.format_rank(template, r) for r in range(world_size)]
    assert all(Path(u).is_file() for u in uris)
    for rank, source in enumerate(sources):
        out = fastshard.load_state_dict(template, rank=rank, world_size=world_size)
        assert_state_equal(out, source)
        # world_size may come from the manifest alone.
        with fastshard.open(template, rank=rank) as f:
            assert f.opened.world_size == world_size
            assert f.uri == uris[rank]
            assert_state_equal(f.load_state_dict(rank=rank, world_size=world_size), source)
            with pytest.raises(fastshard.ShardMismatchError, match="opened as rank"):
                f.load_state_dict(rank=rank + 1)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_load_into_per_rank_models(tmp_path, world_size):
    template = str(tmp_path / "model-rank-%03d.tensors")
    sources = [tp_net(r, world_size) for r in range(world_size)]
    fastshard.save_sharded(sources, template)
    for rank, source in enumerate(sources):
        model = tp_net(rank, world_size, seed_base=7)  # different values
        stats = fastshard.load(model, template, rank=rank, world_size=world_size)
        assert stats.bytes_fetched > 0
        for key, value in source.state_dict().items():
            assert_bit_equal(model.state_dict()[key], value)
    # Meta models get their tensors allocated.
    with torch.device("meta"):
        meta = TPNet(world_size)
    fastshard.load(meta, template, rank=world_size - 1, world_size=world_size)
    assert_bit_equal(meta.down.weight, sources[-1].down.weight)


def test_manifest_contents(tmp_path):
    template = str(tmp_path / "model-rank-%03d.tensors")
    uris = fastshard.save_sharded([rank_state(r, 2) for r in range(2)], template)
    doc = json.loads((tmp_path / shard.MANIFEST_NAME).read_text())
    assert doc["format"] == "fastshard-sharded" and doc["version"] == 1
    assert doc["world_size"] == 2
    assert doc["template"] == "model-rank-%03d.tensors"
    assert doc["created"]["by"] == f"fastshard {fastshard.__version__}"
    assert doc["created"]["utc"].endswith("+00:00")
    assert [e["rank"] for e in doc["files"]] == [0, 1]
    for entry, uri in zip(doc["files"], uris, strict=True):
        data = Path(uri).read_bytes()
        assert entry["name"] == Path(uri).name == f"model-rank-{entry['rank']:03d}.tensors"
        assert entry["size"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()


def test_template_forms():
    assert shard.format_rank("a/m-%d.tensors", 12) == "a/m-12.tensors"
    assert shard.format_rank("a/m-%03d.tensors", 7) == "a/m-007.tensors"
    assert shard.format_rank("s3://b/{rank}/m-{rank}.t", 3) == "s3://b/3/m-3.t"
    # Only the path of a URL is a template; a presigned query string is not.
    url = "https://h/m-%02d.tensors?X-Sig=%25d{rank}"
    assert shard.format_rank(url, 1) == "https://h/m-01.tensors?X-Sig=%25d{rank}"
    assert not shard.is_template("https://h/m.tensors?x={rank}")
    assert not shard.is_template("/m-100%%d.tensors")
    assert shard.is_template("/a/m-%d.tensors")


@pytest.fixture
def two_ranks(tmp_path):
    template = str(tmp_path / "model-rank-%03d.tensors")
    sources = [rank_state(r, 2) for r in range(2)]
    return template, sources, fastshard.save_sharded(sources, template)


def test_wrong_world_size(two_ranks):
    template, _, _ = two_ranks
    for call in (
        lambda: fastshard.load_state_dict(template, rank=0, world_size=4),
        lambda: fastshard.load(TPNet(4), template, rank=0, world_size=4),
    ):
        with pytest.raises(fastshard.ShardMismatchError) as info:
            call()
        assert "says world_size=2" in str(info.value)
        assert "asked world_size=4" in str(info.value)


def test_rank_beyond_world_size(two_ranks, tmp_path):
    template, _, _ = two_ranks
    with pytest.raises(fastshard.ShardMismatchError, match=r"rank 2 does not exist.*0\.\.1"):
        fastshard.load_state_dict(template, rank=2)  # world size from the manifest
    # Without a manifest the asked world size still bounds the rank.
    (tmp_path / shard.MANIFEST_NAME).unlink()
    with pytest.raises(fastshard.ShardMismatchError, match="rank 3"):
        fastshard.load_state_dict(template, rank=3, world_size=2)
    with pytest.raises(fastshard.InvalidArgumentError, match="rank"):
        fastshard.load_state_dict(template, rank=-1)
    with pytest.raises(fastshard.InvalidArgumentError, match="pass rank"):
        fastshard.open(template)


def test_missing_rank_file(two_ranks, tmp_path):
    template, _, uris = two_ranks
    Path(uris[1]).unlink()
    with pytest.raises(fastshard.NotFoundError, match=r"rank 1: .*model-rank-001.tensors"):
        fastshard.load_state_dict(template, rank=1, world_size=2)
    (tmp_path / shard.MANIFEST_NAME).unlink()
    with pytest.raises(FileNotFoundError, match=r"rank 1 of template .*model-rank-001.tensors"):
        fastshard.load_state_dict(template, rank=1, world_size=2)
    other = str(tmp_path / "nothing-{rank}.tensors")
    with pytest.raises(fastshard.NotFoundError, match=r"rank 0 .*nothing-0.tensors"):
        fastshard.load(TPNet(1), other, rank=0)


def test_tampered_files(two_ranks):
    template, sources, uris = two_ranks
    data = bytearray(Path(uris[1]).read_bytes())
    # Same size, other bytes: only a rehash sees it.
    data[-1] ^= 0xFF
    Path(uris[1]).write_bytes(bytes(data))
    fastshard.load_state_dict(template, rank=1, world_size=2)  # no rehash by default
    with pytest.raises(fastshard.IntegrityError, match=r"rank 1: .*sha256"):
        fastshard.load_state_dict(template, rank=1, world_size=2, verify_manifest_hashes=True)
    out = fastshard.load_state_dict(template, rank=0, verify_manifest_hashes=True)
    assert_state_equal(out, sources[0])
    # A size change is caught on every open, before any tensor is read.
    Path(uris[1]).write_bytes(bytes(data) + b"\0")
    with pytest.raises(fastshard.ShardMismatchError, match=r"is \d+ bytes, manifest .* says"):
        fastshard.load_state_dict(template, rank=1, world_size=2)


def test_verify_hashes_needs_local_manifest(two_ranks, tmp_path):
    template, _, _ = two_ranks
    with pytest.raises(fastshard.InvalidArgumentError, match="single file"):
        fastshard.load_state_dict(
            shard.format_rank(template, 0), rank=0, verify_manifest_hashes=True
        )
    with pytest.raises(fastshard.UnsupportedError, match="remote"):
        fastshard.open("s3://b/m-{rank}.tensors", rank=0, verify_manifest_hashes=True)
    (tmp_path / shard.MANIFEST_NAME).unlink()
    with pytest.raises(fastshard.InvalidArgumentError, match="no fastshard-manifest"):
        fastshard.load_state_dict(template, rank=0, verify_manifest_hashes=True)


def test_one_file_with_world_size_over_one(two_ranks):
    _, _, uris = two_ranks
    # One unsharded file: slices need shard specs (fastshard.load infers them).
    with pytest.raises(fastshard.InvalidArgumentError, match="shard_specs"):
        fastshard.load_state_dict(uris[0], rank=0, world_size=2)
    with pytest.raises(fastshard.InvalidArgumentError, match="rank=1"):
        fastshard.load_state_dict(uris[0], rank=1)


def test_directory_uris(tmp_path):
    sharded, single = tmp_path / "sharded", tmp_path / "single"
    sharded.mkdir()
    single.mkdir()
    sources = [rank_state(r, 4) for r in range(4)]
    uris = fastshard.save_sharded(sources, f"{sharded}/")
    assert uris[3] == f"{sharded}/model-rank-003.tensors"
    for rank in (0, 3):
        for uri in (f"{sharded}/", str(sharded)):
            out = fastshard.load_state_dict(uri, rank=rank, world_size=4)
            assert_state_equal(out, sources[rank])
    with pytest.raises(fastshard.ShardMismatchError, match="asked world_size=2"):
        fastshard.load_state_dict(f"{sharded}/", rank=0, world_size=2)
    # No manifest: the directory means its model.tensors.
    fastshard.save(sources[1], single / "model.tensors")
    assert_state_equal(fastshard.load_state_dict(f"{single}/"), sources[1])
    with pytest.raises(fastshard.InvalidArgumentError, match="one unsharded file"):
        fastshard.load_state_dict(f"{single}/", rank=0, world_size=2)


def test_save_sharded_validates(tmp_path):
    with pytest.raises(fastshard.InvalidArgumentError, match="not a per-rank template"):
        fastshard.save_sharded([{"a": torch.ones(1)}], tmp_path / "model.tensors")
    with pytest.raises(fastshard.InvalidArgumentError, match="one state dict"):
        fastshard.save_sharded({"a": torch.ones(1)}, tmp_path / "m-{rank}")
    with pytest.raises(fastshard.InvalidArgumentError, match="at least one"):
        fastshard.save_sharded([], tmp_path / "m-{rank}")
    assert not list(tmp_path.iterdir())
    # Re-saving with another world size replaces the manifest.
    template = str(tmp_path / "m-{rank}.tensors")
    fastshard.save_sharded([rank_state(r, 4) for r in range(4)], template)
    fastshard.save_sharded([rank_state(r, 2) for r in range(2)], template)
    assert json.loads((tmp_path / shard.MANIFEST_NAME).read_text())["world_size"] == 2
    assert_state_equal(fastshard.load_state_dict(template, rank=1), rank_state(1, 2))


@pytest.mark.s3
def test_s3_round_trip(seaweed, caplog):
    opts = seaweed.opts()
    template = f"s3://{seaweed.bucket}/sharded/tp2/model-rank-%03d.tensors"
    sources = [tp_net(r, 2) for r in range(2)]
    with caplog.at_level(logging.WARNING, logger="fastshard"):
        uris = fastshard.save_sharded(sources, template, **opts)
    assert uris == [f"s3://{seaweed.bucket}/sharded/tp2/model-rank-00{r}.tensors" for r in (0, 1)]
    assert caplog.text == ""  # the manifest is written beside them (test_remote_manifest.py)
    for rank, source in enumerate(sources):
        expected = source.state_dict()
        out = fastshard.load_state_dict(template, rank=rank, world_size=2, **opts)
        # write_module names root tensors ".name"
        out = {k.removeprefix("."): v for k, v in out.items()}
        assert list(out) == list(expected)
        model = tp_net(rank, 2, seed_base=7)
        fastshard.load(model, template, rank=rank, world_size=2, **opts)
        for key, value in expected.items():
            assert_bit_equal(model.state_dict()[key], value)
            assert_bit_equal(out[key], value)
    with pytest.raises(fastshard.ShardMismatchError, match=r"rank 2 does not exist.*0\.\.1"):
        fastshard.load_state_dict(template, rank=2, **opts)  # world size from the manifest
    with pytest.raises(fastshard.ShardMismatchError, match="rank 2"):
        fastshard.load_state_dict(template, rank=2, world_size=2, **opts)


def _spawned_rank(rank: int, sd_template: str, net_template: str, world_size: int) -> None:
    """One process per rank, as vLLM's workers are: each reads only its file
    and saves what it got for the parent to compare."""
    sd = fastshard.load_state_dict(sd_template, rank=rank, world_size=world_size)
    model = tp_net(rank, world_size, seed_base=7)
    fastshard.load(model, net_template, rank=rank, world_size=world_size)
    out = Path(sd_template).parent.parent / f"rank{rank}.pt"
    torch.save({"sd": sd, "model": model.state_dict()}, out)


def test_spawned_processes_load_their_rank(tmp_path):
    world_size = 2
    (tmp_path / "sd").mkdir()
    (tmp_path / "net").mkdir()
    sd_template = str(tmp_path / "sd" / "model-%02d.tensors")
    net_template = str(tmp_path / "net" / "model-{rank}.tensors")
    sd_sources = [rank_state(r, world_size) for r in range(world_size)]
    net_sources = [tp_net(r, world_size) for r in range(world_size)]
    fastshard.save_sharded(sd_sources, sd_template)
    fastshard.save_sharded(net_sources, net_template)
    mp.spawn(_spawned_rank, args=(sd_template, net_template, world_size), nprocs=world_size)
    for rank in range(world_size):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert_state_equal(got["sd"], sd_sources[rank])
        assert_state_equal(got["model"], net_sources[rank].state_dict())
