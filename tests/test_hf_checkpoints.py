"""Hugging Face checkpoints (written by huggingface_hub's own
``save_torch_state_dict``): a directory or S3 prefix with
``model.safetensors.index.json`` and its shards, or one
``model.safetensors``, opens as one state dict; one plan spans the shards;
at world sizes 1, 2 and 4 (spawned processes, gloo, SeaweedFS) every rank
reads only its share, and cooperatively the group reads the repo once."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import assert_bit_equal
from huggingface_hub import save_torch_state_dict
from safetensors.torch import load_file, save_file
from test_tp_loading import DIM0, SD_SPECS, SPECS, TPBlock, check_model, full_state, ref_slice

import fastshard

INDEX = "model.safetensors.index.json"


def write_repo(path: Path, sd: dict[str, torch.Tensor], shard_bytes: int) -> list[Path]:
    """An HF checkpoint as huggingface_hub writes it; its shard files."""
    path.mkdir(parents=True, exist_ok=True)
    save_torch_state_dict(sd, path, max_shard_size=shard_bytes)
    return sorted(path.glob("*.safetensors"))


def reference(shards: list[Path]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for p in shards:
        out.update(load_file(p))
    return out


def small_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    sd = {f"layers.{i}.w": torch.randn(64, 32, generator=g) for i in range(6)}
    sd["embed"] = torch.randn(128, 32, generator=g).to(torch.bfloat16)
    sd["scale"] = torch.tensor(0.5)
    return sd


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, list[Path]]:
    shards = write_repo(tmp_path / "repo", small_state(), 20_000)
    assert len(shards) >= 3
    return tmp_path / "repo", shards


def test_a_sharded_repo_is_one_state_dict(repo):
    path, shards = repo
    want = reference(shards)
    for uri in (path, f"{path}/", path / INDEX):
        with fastshard.open(uri) as f:
            assert f.checkpoint is not None and len(f.checkpoint.files) == len(shards)
            assert f.format == "safetensors" and len(f) == len(want)
            assert f.file_size == sum(p.stat().st_size for p in shards)
            sd = f.load_state_dict()
            # One plan over every shard: one read per file, no more.
            assert f.stats.requests == len(shards)
            assert f.stats.bytes_fetched == sum(t.nbytes for t in want.values())
        assert sorted(sd) == sorted(want)
        for k, v in want.items():
            assert_bit_equal(sd[k], v)
    got = fastshard.load_state_dict(path, names=["layers.5.w", "embed"])
    assert_bit_equal(got["layers.5.w"], want["layers.5.w"])


def test_a_single_file_repo_and_the_old_default_name(tmp_path):
    sd = small_state()
    (tmp_path / "single").mkdir()
    save_file(sd, tmp_path / "single" / "model.safetensors")
    with fastshard.open(tmp_path / "single") as f:
        assert f.checkpoint is None and f.format == "safetensors"
        assert_bit_equal(f.load_state_dict()["embed"], sd["embed"])
    # A directory that also has model.tensors loads that, as it did before.
    fastshard.save({"only": torch.ones(2)}, tmp_path / "single" / "model.tensors")
    assert list(fastshard.load_state_dict(tmp_path / "single")) == ["only"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(fastshard.NotFoundError, match=INDEX):
        fastshard.open(tmp_path / "empty")


def test_model_load_and_inspect(repo):
    path, shards = repo

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for i in range(6):
                self.register_parameter(f"w{i}", torch.nn.Parameter(torch.empty(64, 32)))

    want = reference(shards)
    renamed = {f"layers.{i}.w": f"w{i}" for i in range(6)}
    sd = fastshard.load_state_dict(path, names=list(renamed))
    model = Net()
    model.load_state_dict({renamed[k]: v for k, v in sd.items()})
    out = subprocess.run(
        [sys.executable, "-m", "fastshard", "inspect", str(path), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert doc["count"] == len(want) and len(doc["files"]) == len(shards)


def test_an_index_naming_a_missing_shard(repo):
    path, shards = repo
    shards[1].unlink()
    with pytest.raises(fastshard.NotFoundError) as info:
        fastshard.open(path)
    assert INDEX in str(info.value) and shards[1].name in str(info.value)


def test_two_shards_claiming_one_tensor(repo):
    path, shards = repo
    first = load_file(shards[0])
    name = sorted(first)[0]
    extra = load_file(shards[1])
    extra[name] = first[name]
    save_file(extra, shards[1])
    with pytest.raises(fastshard.FormatError) as info:
        fastshard.open(path)
    err = info.value
    assert err.uri == str(shards[1]) and err.tensor == name
    assert err.byte_range is not None and "two files claim" in str(err)


def test_a_weight_map_that_disagrees_with_the_headers(repo):
    path, shards = repo
    doc = json.loads((path / INDEX).read_text())
    name = next(iter(doc["weight_map"]))
    doc["weight_map"][name] = next(p.name for p in shards if p.name != doc["weight_map"][name])
    (path / INDEX).write_text(json.dumps(doc))
    with pytest.raises(fastshard.FormatError, match="not in the shard") as info:
        fastshard.open(path)
    assert info.value.tensor == name
    doc["weight_map"][name] = "../elsewhere.safetensors"
    (path / INDEX).write_text(json.dumps(doc))
    with pytest.raises(fastshard.FormatError, match="relative"):
        fastshard.open(path)
    (path / INDEX).write_text("{not json")
    with pytest.raises(fastshard.FormatError, match="not a safetensors index"):
        fastshard.open(path)


# -- tensor parallel, on SeaweedFS -------------------------------------------


def _rank_main(rank: int, ws: int, uri: str, opts: dict[str, Any], out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out}/pg", rank=rank, world_size=ws)
    try:
        full = full_state()
        report: dict[str, Any] = {}
        model = TPBlock(ws)
        fastshard.load(model, uri, rank, ws, shard_specs=SPECS, **opts)
        check_model(model, full, rank, ws)
        with fastshard.open(uri, **opts) as f:
            sd = f.load_state_dict(rank=rank, world_size=ws, names=DIM0, shard_specs=SD_SPECS)
            for name in DIM0:
                assert_bit_equal(sd[name], ref_slice(name, full[name], rank, ws))
            share = sum(ref_slice(n, full[n], rank, ws).nbytes for n in DIM0)
            report["dim0"] = {"fetched": f.stats.bytes_fetched, "share": share}
        model = TPBlock(ws)
        stats = fastshard.load(model, uri, rank, ws, shard_specs=SPECS, cooperative=True, **opts)
        check_model(model, full, rank, ws)
        report["cooperative"] = stats.bytes_fetched
        Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def s3_repo(seaweed: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    local = tmp_path_factory.mktemp("hf") / "repo"
    full = full_state()
    files = write_repo(local, full, 6 << 20)
    assert len(files) >= 4
    for p in [*files, local / INDEX]:
        seaweed.upload(p, f"hf-repo/{p.name}")
    size = sum(p.stat().st_size for p in files)
    shutil.rmtree(local)
    return {"uri": f"s3://{seaweed.bucket}/hf-repo/", "opts": seaweed.opts(), "size": size}


@pytest.mark.s3
@pytest.mark.parametrize("ws", [1, 2, 4])
def test_world_sizes_on_s3(ws: int, s3_repo: dict[str, Any], tmp_path: Path) -> None:
    mp.spawn(_rank_main, args=(ws, s3_repo["uri"], s3_repo["opts"], str(tmp_path)), nprocs=ws)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ws)]
    for r in reports:
        assert r["dim0"]["fetched"] <= 1.02 * r["dim0"]["share"], r
    total = sum(r["cooperative"] for r in reports)
    assert total <= 1.02 * s3_repo["size"], (total, s3_repo["size"])
