"""``python -m fastshard_lab --preset safetensors`` end to end, tiny: every loader
of the file, S3 and tensor-parallel cases measured and its data checked
(every rank's, for the HF repo at world size 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from servers import require_binary


@pytest.mark.s3
def test_safetensors_preset_tiny_run(tmp_path: Path) -> None:
    require_binary("weed")
    done = subprocess.run(
        [sys.executable, "-m", "fastshard_lab", "--out", str(tmp_path / "out"),
         "--preset", "safetensors", "--size", "32MiB", "--runs", "1", "--no-warmup",
         "--shards", "4", "--world-size", "2", "--scratch", str(tmp_path / "scratch")],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = json.loads((tmp_path / "out" / "results.json").read_text())
    got = {(r["source"], r["loader"]) for r in records}
    want = {("file", "fastshard"), ("file", "safetensors"), ("file", "runai"), ("file", "ceiling"),
            ("file", "fastsafetensors"),
            ("s3", "fastshard"), ("s3", "runai"), ("s3", "ceiling"),
            ("tp", "fastshard"), ("tp", "runai")}  # fmt: skip
    assert got == want, got
    assert all(r["verified"] and r["gbps_median"] > 0 for r in records), records
    runs = json.loads((tmp_path / "out" / "runs.json").read_text())
    for key, results in runs.items():
        if key.startswith("tp/"):
            for res in results:
                assert [r["verified"] for r in res["ranks"]] == [True, True], key
    # fastshard reads only each rank's rows of the repo; Run:ai all of it, per rank.
    tp = {r["loader"]: r for r in records if r["source"] == "tp"}
    assert tp["fastshard"]["bytes_fetched"] <= 1.02 * tp["fastshard"]["bytes"], tp
    assert tp["runai"]["bytes_fetched"] >= 2 * tp["runai"]["bytes"], tp
    assert "data equal" in done.stdout
    assert not list((tmp_path / "scratch").rglob("*.safetensors"))
