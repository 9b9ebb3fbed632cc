"""No import order breaks the plugin: every fastshard.vllm module imports
cleanly before vLLM, after vLLM loaded its plugins but not its loader
registry (its front end on a warm model-info cache, where importing the
serializer used to be a circular import), and after the registry; in each
case both formats end up registered (tests/vllm_import_orders.py). The
engine tests start real engines cold and warm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("stage", ["bare", "plugins", "registry"])
def test_every_module_imports_at_every_stage(stage):
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "FASTSHARD_TAKEOVER_TENSORIZER": "1"}
    out = subprocess.run(
        [sys.executable, str(HERE / "vllm_import_orders.py"), stage],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert "fastshard.vllm.serialize" in results and "fastshard.vllm.loader" in results
    failed = {m: r for m, r in results.items() if r != "ok"}
    assert not failed, failed
