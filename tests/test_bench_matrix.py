"""The Python shaping proxy (fastshard_lab.pyshaper) in front of each S3
store, and ``python -m fastshard_lab --preset matrix`` end to end at a tiny size:
every cell measured and every load's data checked. Timing is asserted only
as lower bounds (a delay the proxy must add), never as targets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from servers import S3Store, SeaweedFS, require_binary

from fastshard_lab.presets.matrix_report import COLUMNS, FIXED
from fastshard_lab.pyshaper import PyShaper

BODY = os.urandom(3 << 20)  # spans many of the proxy's chunks


def _put(server: S3Store, key: str) -> None:
    server.client().put_object(Bucket=server.bucket, Key=key, Body=BODY)


def test_bytes_through_the_proxy_equal_bytes_direct(s3_server: S3Store) -> None:
    _put(s3_server, "pyshaper/body")
    direct = s3_server.get(f"s3://{s3_server.bucket}/pyshaper/body")
    with PyShaper(s3_server.s3_port, latency_ms=0, rate_mbps=0) as proxy:
        # Signed for the proxy's host:port: valid only if Host is forwarded as sent.
        via = s3_server.client(proxy.endpoint)
        got = via.get_object(Bucket=s3_server.bucket, Key="pyshaper/body")["Body"].read()
        head = via.head_object(Bucket=s3_server.bucket, Key="pyshaper/body")
        part = via.get_object(Bucket=s3_server.bucket, Key="pyshaper/body", Range="bytes=1000-1999")
        ranged = part["Body"].read()
        stats = proxy.stats()
    assert got == direct == BODY
    assert head["ContentLength"] == len(BODY)
    assert ranged == BODY[1000:2000]
    assert part["ContentRange"].startswith("bytes 1000-1999/")
    assert stats["requests"] >= 3 and stats["bytes_down"] >= len(BODY) + 1000
    assert stats["upstream_failures"] == 0


def test_the_proxy_accepts_a_64_way_load_at_once() -> None:
    """socketserver's default listen backlog (5) drops the SYNs of a load
    opening 64 connections together: they come back a second later, a
    delay no store adds."""
    from fastshard_lab.pyshaper import _Server

    assert _Server.request_queue_size >= 64


@pytest.mark.s3
def test_a_presigned_ranged_get_through_the_proxy(seaweed: SeaweedFS) -> None:
    """The raw client's path: a presigned URL signed for the proxy."""
    _put(seaweed, "pyshaper/presigned")
    with PyShaper(seaweed.s3_port, latency_ms=0, rate_mbps=0) as proxy:
        url = seaweed.presign(f"s3://{seaweed.bucket}/pyshaper/presigned", endpoint=proxy.endpoint)
        req = urllib.request.Request(url, headers={"Range": "bytes=5-104"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 206
            assert resp.read() == BODY[5:105]


def _timed_get(server: S3Store, endpoint: str, key: str, range_: str = "bytes=0-0") -> float:
    client = server.client(endpoint)
    start = time.monotonic()
    client.get_object(Bucket=server.bucket, Key=key, Range=range_)["Body"].read()
    return time.monotonic() - start


@pytest.mark.s3
def test_first_byte_latency_and_rate_are_applied(seaweed: SeaweedFS) -> None:
    _put(seaweed, "pyshaper/slow")
    with PyShaper(seaweed.s3_port, latency_ms=200, rate_mbps=0) as proxy:
        assert _timed_get(seaweed, proxy.endpoint, "pyshaper/slow") >= 0.2
    # 3 MiB at 10 MB/s: 0.31 s, less the 5 ms of credit an idle link keeps.
    with PyShaper(seaweed.s3_port, latency_ms=0, rate_mbps=10) as proxy:
        assert _timed_get(seaweed, proxy.endpoint, "pyshaper/slow", "bytes=0-") >= 0.3


@pytest.mark.s3
def test_service_time_serves_requests_in_turn(seaweed: SeaweedFS) -> None:
    """Three requests at once, 150 ms of service each in one slot: the last
    one is answered after at least 0.45 s."""
    _put(seaweed, "pyshaper/svc")
    took: list[float] = []
    with PyShaper(seaweed.s3_port, latency_ms=0, rate_mbps=0, service_ms=150) as proxy:
        threads = [
            threading.Thread(
                target=lambda: took.append(_timed_get(seaweed, proxy.endpoint, "pyshaper/svc"))
            )
            for _ in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        stats = proxy.stats()
    assert len(took) == 3 and max(took) >= 0.45
    assert stats["max_waiting"] >= 2 and stats["waiting"] == 0


@pytest.mark.s3
def test_matrix_preset_tiny_run_has_every_cell(tmp_path: Path) -> None:
    require_binary("weed")
    out = tmp_path / "out"
    args = ["--preset", "matrix", "--size-mib", "8", "--stores", "seaweedfs"]
    args += ["--proxies", "pyshaper", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "fastshard_lab", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    grid = json.loads((out / "matrix.json").read_text())
    assert [r["row"] for r in grid["rows"]] == ["seaweedfs", "seaweedfs+pyshaper"]
    assert grid["columns"] == COLUMNS and not grid["errors"]
    for row in grid["rows"]:
        for label in COLUMNS:
            cell = row["cells"][label]
            assert cell["verified"] is True and cell["gbps"] > 0, (row["row"], label, cell)
            if not label.startswith("raw-64"):  # fastshard's LoadStats
                assert cell["requests"] >= 1 and cell["concurrency"] >= 1, (label, cell)
        # The raw client that learns the size first sends one request more.
        assert row["cells"]["raw-64-sized"]["requests"] == 65, row["cells"]["raw-64-sized"]
        assert row["best_fixed"] in FIXED
        assert row["default_over_best_fixed"] > 0 and row["default_over_raw"] > 0
        assert row["default_over_raw_sized"] > 0
    proxied = grid["rows"][1]
    assert proxied["proxy_stats"]["requests"] > 0 and proxied["shape"]["latency_ms"] == 50
    table = (out / "table.md").read_text()
    assert "| seaweedfs+pyshaper |" in table and "default ÷ best fixed" in table
    records = json.loads((out / "results.json").read_text())
    assert len(records) == 2 * len(COLUMNS) and all(r["verified"] for r in records)
