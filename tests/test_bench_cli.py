"""``fastshard bench`` end to end: it starts SeaweedFS and nginx itself,
measures every installed loader on every source, checks each one's data,
and writes results.json and valid PNG plots."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from servers import require_binary

REQUIRED = {
    "file": {"ceiling", "fastshard", "tensorizer", "runai", "safetensors", "torch"},
    "s3": {"ceiling", "fastshard", "tensorizer", "runai"},
    "http": {"ceiling", "fastshard", "tensorizer"},
}
MODULES = {
    "tensorizer": "tensorizer",
    "runai": "runai_model_streamer",
    "safetensors": "safetensors",
}


def bench(out: Path, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastshard", "bench", "--out", str(out), *args],
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
    done = bench(tmp_path, "--size", "64MiB", "--repeat", "1")
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
    for source, loaders in REQUIRED.items():
        want = {n for n in loaders if installed(n)}
        assert want <= found.get(source, set()), (source, found)
    for name in ("throughput.png", "sweep.png", "memory.png"):
        with Image.open(tmp_path / name) as img:
            img.verify()
            assert img.format == "PNG" and img.size[0] > 100 and img.size[1] > 100
    table = (tmp_path / "table.md").read_text()
    assert "| s3 | fastshard |" in table and "× tensorizer" in table


def test_bench_sharded_mode_and_a_users_own_object(tmp_path: Path) -> None:
    done = bench(
        tmp_path / "tp", "--source", "file", "--size", "16MiB", "--repeat", "1",
        "--world-size", "2", "--loaders", "fastshard", "--sweep", "", "--no-plots",
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
    done = bench(tmp_path / "own", "--uri", str(own), "--repeat", "1", "--sweep", "", "--no-plots")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = json.loads((tmp_path / "own" / "results.json").read_text())
    assert {r["loader"] for r in records} >= {"fastshard", "ceiling"}
    assert all(r["verified"] for r in records)
