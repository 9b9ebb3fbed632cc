"""fastshard's main job: a ~1 GiB model on a local S3 server, loaded by several ranks.

1. Starts a SeaweedFS S3 server on 127.0.0.1 (fastshard_lab.servers; stopped by PID at
   the end).
2. Splits a seeded, Llama-shaped fp16 state dict into --ranks tensor-parallel shards (each
   2-D weight cut along dim 0, the rest replicated), the per-rank files vLLM's sharded
   tensorizer flow produces, and saves them with ``fastshard.save_sharded`` to
   ``s3://models/demo/model-rank-%03d.tensors`` (a streamed multipart upload per rank).
3. Starts one process per rank; all begin together and each loads its own file with
   fastshard (``rank=r, world_size=N``), then checks it bit for bit.
4. Does the same with tensorizer (``open_stream`` + ``TensorDeserializer`` per rank), today's
   way, and prints per-rank and aggregate GB/s for both.
5. Loads both again through the shaping proxy (tools/shaper, `make shaper`) in front of the same
   server, which gives every request an object store's first-byte latency (--latency-ms,
   50) and every connection its bandwidth (--conn-mbps, 25 MB/s): on loopback a request
   answers in microseconds and one connection carries a gigabyte a second, so both loaders
   are bound by this machine's cores; across a network the loader with enough requests in
   flight wins, and that is what fastshard is for. Prints both ratios. The proxy is built
   from the checkout (``make demo`` builds it; ``--no-shaped`` skips this step).

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
from fastshard_lab import measure, procs, servers, sources, workload
from fastshard_lab.params import BENCH_DIR, GiB
from fastshard_lab.shaper import Shaper, find_shaper

TEMPLATE = "demo/model-rank-%03d.tensors"
LOADERS = ("fastshard", "tensorizer")


def load(loader: str, s3: Any, uri: str, wants: list[str], via: str | None) -> dict[str, Any]:
    """Every rank's load of its own file at once (the bench's rank harness),
    from the server or through the proxy at ``via``."""
    if loader == "fastshard":
        spec = {"loader": "fastshard", "uri": uri, "opts": s3.opts(s3_endpoint=via or s3.endpoint)}
    else:
        spec = {"loader": "tensorizer", "uri": uri, "per_rank": True}
        spec["opts"] = sources.tensorizer_s3_opts(s3, via)
    case = measure.Case("s3", loader, spec, world_size=len(wants), expect_ranks=wants)
    return measure.run_once(case)


def shaped(args: argparse.Namespace, s3: Any, uri: str, wants: list[str], root: Path) -> Any:
    """Both loaders through the shaping proxy, or None when it is not built."""
    try:
        binary = find_shaper(release=True)
    except procs.MissingBinary as e:
        print(f"\nskipping the run through the shaping proxy: {e}")
        return None
    proxy = Shaper(
        s3.s3_port, root / "shaper", latency_ms=args.latency_ms, rate_mbps=args.conn_mbps
    ).start(binary)
    try:
        print(
            f"\nthrough the shaping proxy on {proxy.endpoint}: {args.latency_ms:g} ms to the "
            f"first byte of every request, {args.conn_mbps:g} MB/s per connection"
        )
        return {name: load(name, s3, uri, wants, proxy.endpoint) for name in _loaders(args)}
    finally:
        proxy.stop()


def _loaders(args: argparse.Namespace) -> tuple[str, ...]:
    return LOADERS[:1] if args.skip_tensorizer else LOADERS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gib", type=float, default=1.0)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--skip-tensorizer", action="store_true")
    p.add_argument("--no-shaped", action="store_true", help="skip the run through the proxy")
    p.add_argument("--latency-ms", type=float, default=50.0, help="proxy: first-byte latency")
    p.add_argument("--conn-mbps", type=float, default=25.0, help="proxy: MB/s per connection")
    args = p.parse_args(argv)

    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="demo-s3-", dir=BENCH_DIR))
    s3 = servers.SeaweedFS(root / "seaweedfs")
    networks: dict[str, dict[str, dict[str, Any]]] = {}
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
        networks["loopback"] = {name: load(name, s3, uri, wants, None) for name in _loaders(args)}
        if not args.no_shaped:
            through = shaped(args, s3, uri, wants, root)
            if through is not None:
                networks["shaped"] = through
    finally:
        s3.stop()
        shutil.rmtree(root, ignore_errors=True)
    return report(networks, args)


def _table(runs: dict[str, dict[str, Any]], ranks: int) -> dict[str, float]:
    """Per-rank rows and each loader's aggregate GB/s."""
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
    return agg


def report(networks: dict[str, dict[str, dict[str, Any]]], args: argparse.Namespace) -> int:
    titles = {
        "loopback": "loopback (SeaweedFS on this machine: both loaders bound by its cores)",
        "shaped": (
            f"through the shaping proxy ({args.latency_ms:g} ms first byte, "
            f"{args.conn_mbps:g} MB/s per connection: an object store across a network)"
        ),
    }
    ratios = []
    for network, runs in networks.items():
        print(f"\n### {titles[network]}")
        agg = _table(runs, args.ranks)
        if "tensorizer" in agg:
            ratios.append(
                f"fastshard / tensorizer, {network}: {agg['fastshard'] / agg['tensorizer']:.2f}x "
                f"({agg['fastshard']:.2f} vs {agg['tensorizer']:.2f} GB/s aggregate)"
            )
    if ratios:
        print("\n" + "\n".join(ratios))
    bad = [f"{n}/{loader}" for n, runs in networks.items() for loader, res in runs.items()
           if not res["verified"]]  # fmt: skip
    if bad:
        print(f"DATA MISMATCH in {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
