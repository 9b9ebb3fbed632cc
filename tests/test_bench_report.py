"""The benchmark compares like with like: every row says what its loader
returns, and fastshard is compared only with rows that return the same kind
of memory (warm, fresh, mapped), in GB/s and in client CPU per GB."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fastshard_lab import loaders, report
from fastshard_lab.presets import remote_report


def _rec(loader: str, kind: str, gbps: float, cpu: float | None) -> dict[str, Any]:
    return {
        "source": "s3",
        "loader": loader,
        "returns": kind,
        "gbps_median": gbps,
        "gbps_min": gbps,
        "gbps_max": gbps,
        "client_cpu_s_per_gb": cpu,
        "server_cpu_s_per_gb": None,
        "requests": None,
        "verified": True,
    }


ROWS = [
    _rec("ceiling", "warm", 2.0, 0.5),
    _rec("fastshard-warm", "warm", 1.9, 0.5),
    _rec("ceiling-fresh", "fresh", 1.0, 1.0),
    _rec("fastshard", "fresh", 1.2, 1.1),
    _rec("tensorizer", "fresh", 0.6, 2.0),
    _rec("fastshard-tp2", "fresh", 9.0, 1.0),
    _rec("fastshard-mmap", "mapped", 3.0, 0.1),
    _rec("safetensors-mmap", "mapped", 2.0, 0.1),
    _rec("curl", "none", 5.0, 0.2),
]


def test_each_kind_is_compared_within_itself() -> None:
    assert report.comparisons(ROWS) == [
        "warm: fastshard-warm = 0.95× ceiling; client CPU 1.00× ceiling",
        "fresh: fastshard = 1.20× ceiling-fresh, 2.00× tensorizer; client CPU 1.10× ceiling-fresh",
        "mapped: fastshard-mmap = 1.50× safetensors-mmap",
    ]


def test_what_each_loader_returns() -> None:
    assert loaders.returns({"loader": "ceiling"}) == "warm"
    assert loaders.returns({"loader": "ceiling", "fresh": True}) == "fresh"
    assert loaders.returns({"loader": "fastshard-warm"}) == "warm"
    assert loaders.returns({"loader": "fastshard-mmap"}) == "mapped"
    assert loaders.returns({"loader": "fastshard", "device": "cuda:0"}) == "device"
    assert set(loaders.RETURNS) == set(loaders.LOADERS)
    assert set(loaders.RETURNS.values()) <= set(report.KINDS)


def test_remote_targets_compare_warm_with_the_pre_faulted_client() -> None:
    rows = {
        "ceiling-python16": _rec("ceiling-python16", "warm", 2.0, 0.5),
        "ceiling-curl16": _rec("ceiling-curl16", "none", 3.0, 0.1),
        "fastshard-warm": _rec("fastshard-warm", "warm", 1.9, 0.6),
        "fresh-python16": _rec("fresh-python16", "fresh", 1.0, 1.0),
        "fastshard": _rec("fastshard", "fresh", 1.1, 1.0),
    }
    want = {"warm": 0.95, "fresh": 1.0, "tensorizer": 1.8, "runai": 2.5, "cpu": 1.1}
    verdicts, info = remote_report.targets({"s3": rows}, want)
    got = dict(verdicts)
    assert got["[s3] fastshard-warm >= 0.95x ceiling-python16: 1.90 / 2.00 GB/s = 0.95×"]
    assert not got[
        "[s3] fastshard-warm client CPU 0.60 s/GB <= 1.1x ceiling-python16's 0.50 = 1.20×"
    ]
    assert got["[s3] fastshard >= 1.0x fresh-python16: 1.10 / 1.00 GB/s = 1.10×"]
    assert info == [
        "INFO [s3] fastshard vs ceiling-curl16 (to /dev/null): 1.10 / 3.00 GB/s = 0.37×"
    ]
    table = remote_report.source_table(rows)
    assert "| ceiling-python16 | warm | 2.00 | 2.00–2.00 | 0.95× |" in table
    assert "| ceiling-curl16 | none | 3.00 | 3.00–3.00 | – |" in table


@pytest.mark.parametrize("shape", [(5, 4097), (3,), ()])
def test_touch_pages_reads_every_page(shape: tuple[int, ...]) -> None:
    t = torch.ones(shape, dtype=torch.float32)
    # One byte per 4096 plus the last byte, of float32 ones (0x3f800000 little-endian).
    want = sum(int(b) for b in t.reshape(-1).view(torch.uint8)[::4096]) + 0x3F
    assert loaders.touch_pages({"t": t, "empty": torch.empty(0)}) == want
