"""fastshard's main job: a ~1 GiB model on a local S3 server, loaded by several ranks.

1. Starts a SeaweedFS S3 server on 127.0.0.1 (fastshard.bench.servers; stopped by PID at
   the end).
2. Splits a seeded, Llama-shaped fp16 state dict into --ranks tensor-parallel shards (each
   2-D weight cut along dim 0, the rest replicated), the per-rank files vLLM's sharded
   tensorizer flow produces, and saves them with ``fastshard.save_sharded`` to
   ``s3://models/demo/model-rank-%03d.tensors`` (a streamed multipart upload per rank).
3. Starts one process per rank; all begin together and each loads its own file with
   fastshard (``rank=r, world_size=N``), then checks it bit for bit.
4. Does the same with tensorizer (``open_stream`` + ``TensorDeserializer`` per rank), today's
   way, and prints per-rank and aggregate GB/s for both.

Exits non-zero when any rank's data differs from its shard.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import fastshard
from fastshard.bench import measure, procs, servers, sources, workload
from fastshard.bench.params import BENCH_DIR, GiB

TEMPLATE = "demo/model-rank-%03d.tensors"


def load(loader: str, s3: Any, uri: str, wants: list[str]) -> dict[str, Any]:
    """Every rank's load of its own file at once (the bench's rank harness)."""
    if loader == "fastshard":
        spec = {"loader": "fastshard", "uri": uri, "opts": s3.opts()}
    else:
        spec = {"loader": "tensorizer", "uri": uri, "per_rank": True}
        spec["opts"] = sources.tensorizer_s3_opts(s3)
    case = measure.Case("s3", loader, spec, world_size=len(wants), expect_ranks=wants)
    return measure.run_once(case)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gib", type=float, default=1.0)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--skip-tensorizer", action="store_true")
    args = p.parse_args(argv)

    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="demo-s3-", dir=BENCH_DIR))
    s3 = servers.SeaweedFS(root / "seaweedfs")
    try:
        s3.start(procs.find_binary("weed"))
        sd = workload.state_dict("llm", int(args.size_gib * GiB))
        specs = workload.split_specs(sd, args.ranks, rule="dim0")
        shards = [workload.shard(sd, specs, r, args.ranks) for r in range(args.ranks)]
        wants = [workload.digest(s) for s in shards]
        uri = f"s3://{s3.bucket}/{TEMPLATE}"
        print(
            f"S3 server: SeaweedFS at {s3.endpoint}; {args.ranks} ranks, "
            f"{workload.total_bytes(sd) / 1e9:.2f} GB model, "
            f"{sum(workload.total_bytes(s) for s in shards) / 1e9:.2f} GB in per-rank files"
        )
        del sd
        t = time.perf_counter()
        fastshard.save_sharded(shards, uri, **s3.opts())
        print(f"saved {uri} in {time.perf_counter() - t:.1f} s (streamed multipart uploads)")
        del shards
        runs = {"fastshard": load("fastshard", s3, uri, wants)}
        if not args.skip_tensorizer:
            runs["tensorizer"] = load("tensorizer", s3, uri, wants)
    finally:
        s3.stop()
        shutil.rmtree(root, ignore_errors=True)
    return report(runs, args.ranks)


def report(runs: dict[str, dict[str, Any]], ranks: int) -> int:
    print("\n| loader | rank | bytes | seconds | GB/s | data equal |")
    print("|---|---:|---:|---:|---:|---|")
    agg = {}
    for loader, res in runs.items():
        for rank, r in enumerate(res["ranks"]):
            print(
                f"| {loader} | {rank} | {r['bytes']:,} | {r['seconds']:.3f} "
                f"| {r['bytes'] / r['seconds'] / 1e9:.2f} | {'yes' if r['verified'] else 'NO'} |"
            )
        agg[loader] = res["bytes"] / res["slowest_rank_seconds"] / 1e9
        print(
            f"{loader}: {ranks} ranks, {res['bytes'] / 1e9:.2f} GB in "
            f"{res['slowest_rank_seconds']:.2f} s = {agg[loader]:.2f} GB/s aggregate"
        )
    if "tensorizer" in agg:
        print(f"fastshard / tensorizer (aggregate): {agg['fastshard'] / agg['tensorizer']:.2f}x")
    bad = [loader for loader, res in runs.items() if not res["verified"]]
    if bad:
        print(f"DATA MISMATCH in {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
