"""What the staging ring costs on the CPU: the same local file loaded
(a) straight into CPU tensors of its dtype (no staging), (b) through the
ring into CPU tensors of its dtype (fill + synchronous copy: the CUDA path
minus the GPU), (c) through the ring with a bf16 cast, each in a fresh
process, alternating order, as GB/s of file bytes. Run with a release build
(``make develop-release``); the GPU numbers come from benches/gpu_check.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# The ring is internal (fastshard._engine.ring), so its load runs here rather than
# as a loader of the public set (loaders.py).
CHILD = r"""
import json, sys, time
import torch
import fastshard
from fastshard._engine import ring as _ring

path, mode, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]) or None
opts = {} if budget is None else {"max_host_bytes": budget}
with fastshard.open(path, **opts) as f:
    infos = f.infos()
    nbytes = sum(i.nbytes for i in infos)
    dtype = torch.bfloat16 if mode == "ring-cast" else None
    dests = [torch.empty(i.shape, dtype=dtype or i.dtype) for i in infos]
    for d in dests:
        d.view(-1).view(torch.uint8).fill_(1)  # first touch outside the timing
    t0 = time.perf_counter()
    if mode == "direct":
        stats = f.fill(list(range(len(infos))), dests)
    else:
        items = [_ring.Item(k, None, i.shape, d) for k, (i, d) in enumerate(zip(infos, dests))]
        stats = _ring.load(f, items, budget)
    dt = time.perf_counter() - t0
print(json.dumps({"gbps": nbytes / dt / 1e9, "peak": stats.peak_host_bytes}))
"""
MODES = ("direct", "ring", "ring-cast")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--budget-mib", type=int, default=0, help="max_host_bytes (0: none)")


def requires(args: argparse.Namespace) -> list[str]:
    return ["torch"]


def run(args: argparse.Namespace) -> int:
    import torch

    import fastshard

    tmp = Path(tempfile.mkdtemp(prefix="fastshard-staging-"))
    results: dict[str, list[float]] = {m: [] for m in MODES}
    peaks: dict[str, int] = {}
    try:
        path = tmp / "model.tensors"
        n = max(1, args.size_mib // 16)
        fastshard.save({f"w{i}": torch.randn(2048, 2048) for i in range(n)}, path)
        budget = str(args.budget_mib << 20)
        for r in range(args.runs):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                cmd = [sys.executable, "-c", CHILD, str(path), mode, budget]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                rec = json.loads(out)
                results[mode].append(rec["gbps"])
                peaks[mode] = rec["peak"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = statistics.median(results["direct"])
    print(f"{n * 16} MiB float32, {args.runs} runs, max_host_bytes={args.budget_mib} MiB")
    print(f"{'mode':<10} {'GB/s median':>12} {'min':>6} {'max':>6} {'/direct':>8} {'peak MiB':>9}")
    for mode in MODES:
        v = results[mode]
        med = statistics.median(v)
        print(
            f"{mode:<10} {med:>12.2f} {min(v):>6.2f} {max(v):>6.2f} {med / base:>8.2f} "
            f"{peaks[mode] / 2**20:>9.0f}"
        )
    return 0
