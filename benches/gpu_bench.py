"""The GPU benchmark: one call on a GPU machine (torch, no network) that
measures fastshard beside safetensors >= 0.9 (prefetch), InstantTensor,
fastsafetensors, tensorizer and safetensors load_file on the same files in
one run, into one GPU, and the machine's ceilings:

  big      a Llama-8B-like bf16 file (embeddings, 14 layers, lm_head)
  small    10,000 bf16 tensors of 4-64 KiB
  slices   rank 1 of 8: the dim-0 slice of every matrix of the big file
  verify   the big file with verify_hash (ceiling: SHA-256 on every core)
  encrypt  ~2 GB encrypted, plain beside it (ceiling: secretbox on every core)
  cold     ~4 GB from disk with the page cache dropped before each load (root)
plus the correctness checks of gpu_check.py (every dtype, casts compared
on the same device). Prints a table and writes gpu_bench.json to --out,
case by case, so a run cut short keeps what it measured.

Here:   make wheel peer-wheels     (fastshard's abi3 wheel, the peers' cp312 wheels)
There:  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
        PYTHONPATH=/tmp/site python3 benches/gpu_bench.py --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import gpu_cases as cases_
import gpu_check
import torch
from gpu_harness import Bench, GiB


def table(b: Bench) -> None:
    print()
    for case, name, shown in b.rows:
        print(f"| {case} | {name} | {shown} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="gpu_bench_out")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--layers", type=int, default=14, help="of the Llama-like file (14: 8.2 GB)")
    ap.add_argument("--small-count", type=int, default=10_000)
    ap.add_argument("--tmp", default=None, help="warm files (default /dev/shm when big enough)")
    ap.add_argument("--cold-dir", default="/var/tmp", help="a folder on disk for the cold case")
    ap.add_argument("--cases", default="correctness,big,ceilings,small,slices,verify,encrypt,cold")
    ap.add_argument("--budget-seconds", type=float, default=480, help="skip what would start later")
    ap.add_argument(
        "--slow-seconds", type=float, default=2.5, help="a load slower than this runs once"
    )
    ap.add_argument(
        "--smoke", action="store_true", help="a tiny run on the CPU: checks the script, no figures"
    )
    args = ap.parse_args()
    if args.smoke:
        args.device, args.layers, args.small_count, args.repeat = "cpu", 1, 300, 1
    elif not torch.cuda.is_available():
        print("gpu_bench: CUDA is not available here", file=sys.stderr)
        return 2
    b = Bench(args)
    b.out.mkdir(parents=True, exist_ok=True)
    if b.cuda:
        torch.cuda.set_device(b.device)
    cases = args.cases.split(",")
    base = args.tmp or ("/dev/shm" if shutil.disk_usage("/dev/shm").free > 40 * GiB else None)
    tmp = Path(tempfile.mkdtemp(prefix="fastshard-gpu-", dir=base))
    b.result["tmp"] = str(tmp)
    try:
        if "correctness" in cases:
            try:
                b.result["correctness"] = gpu_check.correctness(tmp, b.device, 5)
                ok = b.result["correctness"]["ok"]
                verdict = "PASS" if ok else f"FAIL {b.result['correctness']['checks']}"
            except Exception:
                b.result["correctness"] = {"ok": False, "error": traceback.format_exc()}
                verdict = "ERROR " + traceback.format_exc(limit=-3)
            b.rows.append(("correct", "every dtype, casts, slices, budgets", verdict))
            print("correctness:", json.dumps(b.result["correctness"], indent=1), flush=True)
            b.save()
        big = cases_.case_big(b, tmp)
        steps: list[tuple[str, Callable[[], None]]] = [
            ("ceilings", lambda: cases_.ceilings(b, big)),
            ("small", lambda: cases_.case_small(b, tmp)),
            ("slices", lambda: cases_.case_slices(b, big)),
            ("verify", lambda: cases_.case_verify(b, big)),
            ("encrypt", lambda: cases_.case_encrypted(b, tmp, big)),
            ("cold", lambda: cases_.case_cold(b, big)),
        ]
        for name, step in steps:
            if name not in cases:
                continue
            if b.left() < 45:
                b.result["skipped"][name] = "out of time"
                continue
            try:
                step()
            except Exception as e:
                b.result["skipped"][name] = f"{type(e).__name__}: {e}"
                print(f"{name}: {type(e).__name__}: {e}", flush=True)
            if b.cuda:
                torch.cuda.empty_cache()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        b.save()
        table(b)
    return 0


if __name__ == "__main__":
    sys.exit(main())
