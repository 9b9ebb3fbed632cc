"""fastshard's main job: a ~1 GiB model on a local S3 server, loaded by several ranks.

1. Starts a SeaweedFS S3 server on 127.0.0.1 (tests/servers.py; stopped by PID at the end).
2. Splits a seeded, Llama-shaped fp16 state dict into --ranks tensor-parallel shards (each 2-D
   weight cut along dim 0, 1-D tensors replicated), the per-rank files vLLM's sharded
   tensorizer flow produces, and saves them with ``fastshard.save_sharded`` to
   ``s3://models/demo/model-rank-%03d.tensors`` (a streamed multipart upload per rank).
3. Starts one process per rank; all begin together and each loads its own file with
   ``fastshard.load_state_dict(template, rank=r, world_size=N)``, then checks it bit for bit.
4. Does the same with tensorizer (``open_stream`` + ``TensorDeserializer`` per rank), today's
   way, and prints per-rank and aggregate GB/s for both.

Exits non-zero when any rank's data differs from its shard.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benches"))

from workloads import SCRATCH, GiB, digest, model_like_state_dict, total_bytes  # noqa: E402

from fastshard.bench import servers  # noqa: E402

TEMPLATE = "demo/model-rank-%03d.tensors"


def shard(sd: dict[str, torch.Tensor], ranks: int) -> list[dict[str, torch.Tensor]]:
    """Column-parallel style: 2-D weights split along dim 0, the rest replicated."""
    out: list[dict[str, torch.Tensor]] = [{} for _ in range(ranks)]
    for name, t in sd.items():
        parts = t.chunk(ranks, dim=0) if t.dim() == 2 and t.shape[0] % ranks == 0 else None
        for r in range(ranks):
            out[r][name] = (parts[r] if parts is not None else t).contiguous()
    return out


def rank_main(
    loader: str,
    rank: int,
    world: int,
    uri: str,
    opts: dict[str, Any],
    want: str,
    barrier: Any,
    results: Any,
) -> None:
    barrier.wait()
    started = time.perf_counter()
    if loader == "fastshard":
        import fastshard

        sd = fastshard.load_state_dict(uri, rank=rank, world_size=world, **opts)
    else:
        from tensorizer import TensorDeserializer, stream_io

        stream = stream_io.open_stream(
            uri % rank,
            "rb",
            s3_endpoint=opts["s3_endpoint"],
            s3_access_key_id=opts["s3_access_key_id"],
            s3_secret_access_key=opts["s3_secret_access_key"],
            force_http=True,
        )
        with TensorDeserializer(stream, device="cpu") as d:
            # Its CPU tensors already own their memory: no copy needed.
            sd = dict(d.items())
    seconds = time.perf_counter() - started
    results.put((loader, rank, total_bytes(sd), seconds, digest(sd) == want))


def run_ranks(
    loader: str, world: int, uri: str, opts: dict[str, Any], wants: list[str]
) -> list[tuple[str, int, int, float, bool]]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(world)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=rank_main, args=(loader, r, world, uri, opts, wants[r], barrier, results)
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    out = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return sorted(out, key=lambda row: row[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gib", type=float, default=1.0)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--skip-tensorizer", action="store_true")
    args = p.parse_args(argv)

    weed = shutil.which("weed") or os.path.join(os.path.dirname(sys.executable), "weed")
    SCRATCH.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="demo-s3-", dir=SCRATCH))
    server = servers.SeaweedFS(root / "seaweedfs")
    try:
        server.start(weed)
        opts = server.opts()
        sd = model_like_state_dict(int(args.size_gib * GiB))
        shards = shard(sd, args.ranks)
        wants = [digest(s) for s in shards]
        uri = f"s3://{server.bucket}/{TEMPLATE}"
        print(
            f"S3 server: SeaweedFS at {server.endpoint}; {args.ranks} ranks, "
            f"{total_bytes(sd) / 1e9:.2f} GB model, "
            f"{sum(total_bytes(s) for s in shards) / 1e9:.2f} GB in per-rank files"
        )
        import fastshard

        t = time.perf_counter()
        fastshard.save_sharded(shards, uri, **opts)
        print(f"saved {uri} in {time.perf_counter() - t:.1f} s (streamed multipart uploads)")

        rows = run_ranks("fastshard", args.ranks, uri, opts, wants)
        if not args.skip_tensorizer:
            rows += run_ranks("tensorizer", args.ranks, uri, opts, wants)
        print("\n| loader | rank | bytes | seconds | GB/s | data equal |")
        print("|---|---:|---:|---:|---:|---|")
        for loader, rank, nbytes, secs, ok in rows:
            print(
                f"| {loader} | {rank} | {nbytes:,} | {secs:.3f} | {nbytes / secs / 1e9:.2f} "
                f"| {'yes' if ok else 'NO'} |"
            )
        agg: dict[str, float] = {}
        for loader in sorted({r[0] for r in rows}):
            mine = [r for r in rows if r[0] == loader]
            total = sum(r[2] for r in mine)
            agg[loader] = total / max(r[3] for r in mine) / 1e9
            print(
                f"{loader}: {args.ranks} ranks, {total / 1e9:.2f} GB in "
                f"{max(r[3] for r in mine):.2f} s = {agg[loader]:.2f} GB/s aggregate"
            )
        if "tensorizer" in agg:
            print(
                f"fastshard / tensorizer (aggregate): {agg['fastshard'] / agg['tensorizer']:.2f}x"
            )
        bad = [r for r in rows if not r[4]]
        if bad:
            print(f"DATA MISMATCH on {len(bad)} rank loads", file=sys.stderr)
            return 1
        return 0
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
