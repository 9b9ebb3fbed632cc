"""benches/gpu_check.py runs on GPU machines only, but its argument parsing
and its NCCL section's logic are checked here: the section runs over gloo
on CPU processes, through the same cooperative code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHES = Path(__file__).resolve().parent.parent / "benches"
sys.path.insert(0, str(BENCHES))

import gpu_nccl  # noqa: E402


def test_help_parses_without_cuda():
    out = subprocess.run(
        [sys.executable, str(BENCHES / "gpu_check.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "--nccl-world" in out and "--nccl-only" in out


def test_world_size_is_one_per_gpu_unless_asked():
    assert gpu_nccl.world_size(None, 8) == 8
    assert gpu_nccl.world_size(None, 1) == 1
    assert gpu_nccl.world_size(2, 8) == 2
    with pytest.raises(ValueError, match="has 1 GPUs"):
        gpu_nccl.world_size(2, 1)


@pytest.mark.parametrize("world", [1, 2])
def test_the_nccl_section_passes_over_gloo(world):
    result = gpu_nccl.check(world, backend="gloo")
    assert result["ok"], result
    ranks = result["ranks"]
    assert [r["rank"] for r in ranks] == list(range(world))
    assert all(r["buffers"] == "cpu" for r in ranks)
    if world > 1:
        assert all(0 < r["received"] <= 1.05 * r["share"] for r in ranks)
    else:
        assert ranks[0]["received"] == 0
