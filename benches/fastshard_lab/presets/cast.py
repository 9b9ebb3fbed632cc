"""Loads with a cast on the CPU, through the staging engine, beside
safetensors ``load_file`` followed by the same cast: 10,000 small bf16
tensors (4-64 KiB) and a big bf16 file, to float16, into fresh tensors
(``load_state_dict(dtype=...)``) and into a model's warm parameters
(``load``; safetensors: ``load_file`` then ``param.copy_``). Also the
engine's host time per tensor with the copy left out (10,000 tiny tensors
staged with a copier that copies nothing). Each mode in a fresh process,
the order alternating, files in the page cache; ratios in one run. Run
with a release build (``make develop-release``).
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

CHILD = r"""
import json, sys, time
import torch
import fastshard

path, mode = sys.argv[1], sys.argv[2]
st = path.replace(".tensors", ".safetensors")
half = torch.float16
with fastshard.open(path) as f:
    infos = f.infos()
nbytes = sum(i.nbytes for i in infos)
if mode.endswith("warm"):
    model = torch.nn.Module()
    params = {}
    for i in infos:
        p = torch.nn.Parameter(torch.ones(i.shape, dtype=half), requires_grad=False)
        model.register_parameter(i.name, p)
        params[i.name] = p
t0 = time.perf_counter()
if mode == "fastshard":
    sd = fastshard.load_state_dict(path, dtype=half)
elif mode == "safetensors":
    from safetensors.torch import load_file
    sd = {k: v.to(half) for k, v in load_file(st).items()}
elif mode == "fastshard-warm":
    fastshard.load(model, path)
elif mode == "safetensors-warm":
    from safetensors.torch import load_file
    with torch.no_grad():
        for k, v in load_file(st).items():
            params[k].copy_(v)
elif mode == "engine":
    from fastshard._engine import places as _places
    from fastshard._engine import ring as _ring
    class Null:
        def copy(self, *a): pass
        def ticket(self): return _places.Done()
        def finish(self): pass
    with fastshard.open(path) as f:
        dests = [torch.empty(i.shape, dtype=half) for i in infos]
        items = [_ring.Item(k, None, i.shape, d) for k, (i, d) in enumerate(zip(infos, dests))]
        t0 = time.perf_counter()
        _ring.load(f, items, copier=Null())
dt = time.perf_counter() - t0
print(json.dumps({"gbps": nbytes / dt / 1e9, "us_per_tensor": dt / len(infos) * 1e6}))
"""
MODES = ("fastshard", "safetensors", "fastshard-warm", "safetensors-warm")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size-mib", type=int, default=1024, help="the big file")
    p.add_argument("--count", type=int, default=10_000, help="small tensors")
    p.add_argument("--runs", type=int, default=5)


def requires(args: argparse.Namespace) -> list[str]:
    return ["torch", "safetensors"]


def _files(tmp: Path, args: argparse.Namespace) -> dict[str, Path]:
    import torch
    from safetensors.torch import save_file

    import fastshard

    gen = torch.Generator().manual_seed(3)
    rows = torch.randint(32, 513, (args.count,), generator=gen)
    shapes: dict[str, dict[str, tuple[int, ...]]] = {
        "small": {f"e{i}": (int(r), 64) for i, r in enumerate(rows)},
        "big": {f"w{i}": (4096, 4096) for i in range(max(1, args.size_mib // 32))},
        "tiny": {f"t{i}": (32,) for i in range(args.count)},
    }
    out = {}
    for name, spec in shapes.items():
        sd = {k: torch.randn(s, generator=gen).to(torch.bfloat16) for k, s in spec.items()}
        out[name] = tmp / f"{name}.tensors"
        fastshard.save(sd, out[name])
        save_file(sd, str(tmp / f"{name}.safetensors"))
    return out


def _child(path: Path, mode: str) -> dict[str, float]:
    cmd = [sys.executable, "-c", CHILD, str(path), mode]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out))


def run(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="fastshard-cast-"))
    try:
        files = _files(tmp, args)
        gbps: dict[tuple[str, str], list[float]] = {}
        for r in range(args.runs):
            for case in ("small", "big"):
                for mode in MODES if r % 2 == 0 else MODES[::-1]:
                    gbps.setdefault((case, mode), []).append(_child(files[case], mode)["gbps"])
        engine = [_child(files["tiny"], "engine")["us_per_tensor"] for _ in range(args.runs)]
        whole = [_child(files["tiny"], "fastshard")["us_per_tensor"] for _ in range(args.runs)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"bf16 -> float16 on the CPU, {args.runs} runs (medians; min-max)")
    print(f"{'case':<6} {'mode':<17} {'GB/s':>6} {'min':>6} {'max':>6} {'x safetensors':>14}")
    for case in ("small", "big"):
        for mode in MODES:
            v = gbps[(case, mode)]
            peer = "safetensors-warm" if mode.endswith("warm") else "safetensors"
            ratio = statistics.median(v) / statistics.median(gbps[(case, peer)])
            print(
                f"{case:<6} {mode:<17} {statistics.median(v):>6.2f} {min(v):>6.2f} "
                f"{max(v):>6.2f} {ratio:>14.2f}"
            )
    print(
        f"engine host time per tensor, copy left out ({args.count} tiny tensors): "
        f"{statistics.median(engine):.1f} us (min {min(engine):.1f}); the whole "
        f"load_state_dict(dtype=...): {statistics.median(whole):.1f} us"
    )
    return 0
