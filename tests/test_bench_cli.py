"""``python -m fastshard_lab`` (the lab's default preset) end to end: it
starts SeaweedFS and nginx itself, measures every installed loader on every
source, checks each one's data, and writes results.json and valid PNG
plots."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from servers import MissingBinary, require_binary, require_shaper

from fastshard_lab.loaders import RETURNS

# Every source: warm and fresh, each beside the raw client into that memory;
# local files mapped too.
BOTH = {"ceiling", "ceiling-fresh", "fastshard", "fastshard-warm"}
REQUIRED = {
    "file": BOTH
    | {"fastshard-mmap", "safetensors-mmap", "tensorizer", "runai", "safetensors", "torch"},
    "s3": BOTH | {"tensorizer", "runai"},
    "http": BOTH | {"tensorizer"},
}
MODULES = {
    "tensorizer": "tensorizer",
    "runai": "runai_model_streamer",
    "safetensors": "safetensors",
    "safetensors-mmap": "safetensors",
}


def bench(out: Path, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastshard_lab", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def installed(loader: str) -> bool:
    module = MODULES.get(loader)
    return module is None or importlib.util.find_spec(module) is not None


@pytest.mark.s3
@pytest.mark.http
def test_bench_measures_every_installed_loader_on_every_source(tmp_path: Path) -> None:
    require_binary("weed")  # fails under CI when missing, like the other server tests
    require_binary("nginx", "/usr/sbin/nginx")
    # No warm-up round and a two-point sweep: the harness's mechanics, in half the loads.
    done = bench(tmp_path, "--size", "64MiB", "--repeat", "1", "--no-warmup", "--sweep", "4,16")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = json.loads((tmp_path / "results.json").read_text())
    assert isinstance(records, list)
    found: dict[str, set[str]] = {}
    for rec in records:
        for key in ("source", "loader", "gbps_median", "gbps_min", "gbps_max",
                    "peak_rss_bytes", "bytes_fetched", "verified"):  # fmt: skip
            assert key in rec, (key, rec)
        assert rec["gbps_min"] > 0 and rec["gbps_min"] <= rec["gbps_median"] <= rec["gbps_max"]
        assert rec["verified"] is True, rec
        assert rec["peak_rss_bytes"] > 0 and rec["bytes_fetched"] >= 60 << 20
        found.setdefault(rec["source"], set()).add(rec["loader"])
        assert rec["returns"] == RETURNS[rec["loader"]], rec
    for source, loaders in REQUIRED.items():
        want = {n for n in loaders if installed(n)}
        assert want <= found.get(source, set()), (source, found)
    for name in ("throughput.png", "sweep.png", "memory.png"):
        with Image.open(tmp_path / name) as img:
            img.verify()
            assert img.format == "PNG" and img.size[0] > 100 and img.size[1] > 100
    table = (tmp_path / "table.md").read_text()
    assert "| s3 | fastshard | fresh |" in table and "× tensorizer" in table
    assert "- s3: warm: fastshard-warm = " in table and "× ceiling; client CPU" in table
    if installed("safetensors"):
        assert "- file: mapped: fastshard-mmap = " in table and "× safetensors-mmap" in table


def test_bench_sharded_mode_and_a_users_own_object(tmp_path: Path) -> None:
    done = bench(
        tmp_path / "tp", "--source", "file", "--size", "16MiB", "--repeat", "1",
        "--world-size", "2", "--loaders", "fastshard", "--sweep", "", "--no-plots", "--no-warmup",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = json.loads((tmp_path / "tp" / "results.json").read_text())
    by = {r["loader"]: r for r in records}
    assert set(by) == {"fastshard", "fastshard-tp2"}
    assert by["fastshard-tp2"]["verified"] and by["fastshard-tp2"]["gbps_median"] > 0

    import torch

    import fastshard

    own = tmp_path / "own.tensors"
    fastshard.save({f"w{i}": torch.randn(256, 256) for i in range(4)}, own)
    done = bench(
        tmp_path / "own", "--uri", str(own), "--repeat", "1", "--sweep", "", "--no-plots",
        "--no-warmup",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = json.loads((tmp_path / "own" / "results.json").read_text())
    assert {r["loader"] for r in records} >= {"fastshard", "ceiling"}
    assert all(r["verified"] for r in records)


def bench_without(out: Path, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The lab's harness in a process where ``module`` cannot be imported
    (``sys.modules[name] = None`` makes import and find_spec fail)."""
    code = (
        f"import sys; sys.modules[{module!r}] = None; from fastshard_lab.command import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_missing_extra_stops_the_run_before_anything_is_measured(tmp_path: Path) -> None:
    done = bench_without(tmp_path, "matplotlib", "--source", "file", "--size", "1MiB")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "matplotlib" in lines[0] and "requirements-dev.txt" in lines[0]
    assert "Traceback" not in done.stderr
    assert done.stdout == ""  # nothing written, nothing measured
    assert not (tmp_path / "results.json").exists()


def test_a_missing_peer_is_skipped_with_its_reason(tmp_path: Path) -> None:
    done = bench_without(
        tmp_path, "tensorizer", "--source", "file", "--size", "2MiB", "--repeat", "1",
        "--loaders", "ceiling,fastshard,tensorizer", "--sweep", "", "--no-plots", "--no-warmup",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "skipping tensorizer: tensorizer is not installed" in done.stdout
    records = json.loads((tmp_path / "results.json").read_text())
    assert {r["loader"] for r in records} == {"ceiling", "fastshard"}
    assert all(r["verified"] for r in records)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert "requirements-dev.txt" in meta["skipped"]["tensorizer"]
    assert "skipped: tensorizer" in (tmp_path / "table.md").read_text()


def test_local_preset_tiny_run(tmp_path: Path) -> None:
    done = bench(
        tmp_path / "out", "--preset", "local", "--size", "4MiB", "--small-tensors", "300",
        "--runs", "1", "--no-warmup", "--loaders", "fastshard,tensorizer,safetensors",
        "--scratch", str(tmp_path / "scratch"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = json.loads((tmp_path / "out" / "results.json").read_text())
    want = {n for n in ("fastshard", "tensorizer", "safetensors") if installed(n)}
    for case in ("large", "small"):
        got = {r["loader"] for r in records if r["source"] == case}
        assert got == want, (case, records)
    assert all(r["verified"] and r["gbps_median"] > 0 for r in records)
    assert "PASS [small] fastshard data equal to the source" in done.stdout
    assert not list((tmp_path / "scratch").rglob("*.tensors"))  # --keep-files not given


@pytest.mark.s3
def test_tp_preset_tiny_run_checks_every_rank(tmp_path: Path) -> None:
    require_binary("weed")
    done = bench(
        tmp_path, "--preset", "tp", "--size-gib", "0.01", "--world-size", "2",
        "--modes", "tensorizer,per-rank,unsharded,cooperative", "--no-warmup",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = json.loads((tmp_path / "runs.json").read_text())
    want = {"per-rank", "unsharded", "cooperative"} | (
        {"tensorizer"} if installed("tensorizer") else set()
    )
    assert {key.split("/")[1] for key in runs} == want
    for key, results in runs.items():
        for res in results:
            assert [r["verified"] for r in res["ranks"]] == [True, True], key
    assert "| per-rank |" in (tmp_path / "table.md").read_text()


@pytest.mark.s3
def test_tp_preset_under_a_node_cap_counts_bytes_through_it_and_exchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """World size 4 from one object through the shaping proxy's node cap:
    every mode's bytes crossed the cap, and only the cooperative ranks
    exchanged any; each rank's data checked."""
    require_binary("weed")
    monkeypatch.setenv("FASTSHARD_SHAPER", require_shaper())
    done = bench(
        tmp_path, "--preset", "tp", "--size-gib", "0.01", "--world-size", "4",
        "--node-mbps", "400", "--latency-ms", "1", "--no-warmup",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = json.loads((tmp_path / "runs.json").read_text())
    modes = {key.split("/")[1] for key in runs}
    assert {"per-rank", "packed", "unsharded", "cooperative", "cooperative-collective"} <= modes
    exchanges = {"cooperative": "shared-memory", "cooperative-collective": "collective"}
    for key, results in runs.items():
        mode = key.split("/")[1]
        for res in results:
            assert [r["verified"] for r in res["ranks"]] == [True] * 4, key
            assert res["bytes_through_cap"] >= res["bytes_fetched"], (key, res)
            exchanged = res["bytes_received"]
            assert exchanged > 0 if mode in exchanges else exchanged == 0, key
            assert res["exchange"] == exchanges.get(mode, ""), (key, res["exchange"])
    assert "through the cap" in (tmp_path / "table.md").read_text()


def test_the_shaping_proxy_is_found_never_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastshard_lab.shaper import BUILD, find_shaper

    fake = tmp_path / "shaper"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("FASTSHARD_SHAPER", str(fake))
    assert find_shaper(release=True) == str(fake)
    monkeypatch.setenv("FASTSHARD_SHAPER", str(tmp_path / "missing"))
    with pytest.raises(MissingBinary, match="FASTSHARD_SHAPER"):
        find_shaper()
    monkeypatch.delenv("FASTSHARD_SHAPER")
    monkeypatch.setenv("CARGO_TARGET_DIR", str(tmp_path / "empty-target"))
    with pytest.raises(MissingBinary) as err:
        find_shaper(release=True)
    assert BUILD in str(err.value)
    assert not (tmp_path / "empty-target").exists()  # nothing was built
