"""Tensor-parallel loading at world size N from one model on a local S3
server (``make bench-tp``).

One Llama-shaped fp16 model is stored three ways on SeaweedFS: unsharded
(one object), as N per-rank files, and as one packed object holding every
rank's records. N processes start together (a barrier) and each gets its
rank's tensor-parallel weights (q/k/v/gate/up/embeddings/lm_head split along
dim 0, o/down along dim 1, norms replicated):

- tensorizer: each rank reads the whole unsharded object (open_stream +
  TensorDeserializer), as vLLM's loader does for an unsharded file;
- per-rank: each rank loads its own file with fastshard;
- packed: each rank reads its records of the packed object;
- unsharded: each rank reads its slices of the unsharded object;
- cooperative: the ranks (a gloo group) fetch the unsharded object once
  between them and exchange the pieces (on one host, through shared
  memory);
- cooperative-collective: the same through the group's all-to-all, as
  ranks on several hosts exchange (``FASTSHARD_COOP_EXCHANGE=collective``).

Reported per mode: bytes fetched by all ranks (index reads included), the
bytes the ranks exchanged (cooperative), the slowest rank's seconds, and the
aggregate rate at which ranks got their weights, from each mode's fastest
measured run after one uncounted warm-up round (``--no-warmup``: none; a
mode's first load then pays for cold caches). Every rank's tensors are
checked against its expected slices.

``--node-mbps`` models one node: every mode reads through the shaping
proxy (tools/shaper, built with ``make shaper``), whose connections all
share that bandwidth (the node's NIC), optionally each capped
(``--conn-mbps``) and delayed (``--latency-ms``); the table then adds the
bytes that crossed the cap per load. Loopback without a cap hides what
reading an object several times costs; a node cap does not.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from fastshard._coop import shm as cooperative_exchange

from .. import deps, measure, report, sources
from ..params import BENCH_DIR, GiB, add_out, names
from ..procs import MissingBinary
from ..shaper import Shaper, find_shaper

MODES = ("tensorizer", "per-rank", "packed", "unsharded", "cooperative", "cooperative-collective")
COOPERATIVE = ("cooperative", "cooperative-collective")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size-gib", type=float, default=1.0)
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--repeat", type=int, default=1, help="measured runs per mode")
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="no uncounted warm-up round (a mode's first load then pays for cold caches)",
    )
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--node-mbps",
        type=float,
        default=0.0,
        help="read through the shaping proxy, all connections sharing this many MB/s "
        "(a node's NIC); 0: straight from the server",
    )
    p.add_argument(
        "--conn-mbps",
        type=float,
        default=0.0,
        help="with --node-mbps: each connection's own cap in MB/s (0: none)",
    )
    p.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="with --node-mbps: each request's first-byte latency",
    )
    add_out(p, str(BENCH_DIR / "tp"))


def requires(args: argparse.Namespace) -> list[str]:
    return ["torch", "boto3"]


def _store(s3: Any, args: argparse.Namespace, modes: list[str]) -> dict[str, Any]:
    """The model on the server every way the modes read it; what each rank must get."""
    import fastshard

    from .. import workload

    world = args.world_size
    sd = workload.state_dict("llm", int(args.size_gib * GiB), args.seed)
    specs = workload.split_specs(sd, world, rule="tp")
    shards = [workload.shard(sd, specs, r, world) for r in range(world)]
    base = f"s3://{s3.bucket}/bench-tp"
    uris = {
        "full": f"{base}/full.tensors",
        "per_rank": f"{base}/ranks/model-rank-%03d.tensors",
        "packed": f"{base}/packed.tensors",
    }
    opts = s3.opts()
    fastshard.save(sd, uris["full"], **opts)
    fastshard.save_sharded(shards, uris["per_rank"], **opts)
    if "packed" in modes:
        fastshard.save_sharded(shards, uris["packed"], packed=True, **opts)
    with fastshard.open(uris["full"], **opts) as f:
        size = f.file_size
    return {
        "uris": uris,
        "specs": specs,
        "wants": [workload.digest(s) for s in shards],
        "size": size,
        "share": sum(workload.total_bytes(s) for s in shards),
    }


def mode_case(
    mode: str, s3: Any, stored: dict[str, Any], world: int, via: str | None = None
) -> measure.Case:
    """One mode's load; ``via``: the endpoint of a proxy in front of the server."""
    uris, specs = stored["uris"], stored["specs"]
    if mode == "tensorizer":
        spec = {"loader": "tensorizer", "uri": uris["full"], "shard_specs": specs}
        spec.update(opts=sources.tensorizer_s3_opts(s3, via), object_bytes=stored["size"])
    else:
        uri = {"per-rank": uris["per_rank"], "packed": uris["packed"]}.get(mode, uris["full"])
        opts = s3.opts(s3_endpoint=via) if via else s3.opts()
        spec = {"loader": "fastshard", "uri": uri, "opts": opts}
        if mode == "unsharded" or mode in COOPERATIVE:
            spec["shard_specs"] = specs
        spec["cooperative"] = mode in COOPERATIVE
    case = measure.Case("s3", spec["loader"], spec, label=mode, server_pid=s3.proc.pid)
    if mode == "cooperative-collective":
        case.env = {cooperative_exchange.ENV: "collective"}
    case.world_size, case.expect_ranks = world, stored["wants"]
    return case


def table(results: measure.Results, stored: dict[str, Any], capped: bool = False) -> str:
    """One row per mode (its fastest measured run, the warm-up left out);
    ``capped``: the loads went through the node cap, whose bytes get a column."""
    cap_head, cap_rule = (" through the cap |", "---:|") if capped else ("", "")
    lines = [
        "| mode | bytes fetched (all ranks) | × object |" + cap_head
        + " exchanged | slowest rank s | aggregate GB/s | vs tensorizer | data equal |",
        "|---|---:|---:|" + cap_rule + "---:|---:|---:|---:|---|",
    ]  # fmt: skip
    size, share = stored["size"], stored["share"]
    best = {}
    for (_, mode), runs in results.items():
        fastest = min(measure.measured(runs), key=lambda r: r["slowest_rank_seconds"])
        best[mode] = (fastest, all(r["verified"] for r in runs))
    base = best.get("tensorizer", (None,))[0]
    for mode, (r, ok) in best.items():
        fetched = r["bytes_fetched"] + r["discovery_bytes"]
        wall = r["slowest_rank_seconds"]
        vs = f"{base['slowest_rank_seconds'] / wall:.2f}×" if base else "n/a"
        cap = f" {r.get('bytes_through_cap', 0) / 1e9:.3f} GB |" if capped else ""
        lines.append(
            f"| {_label(mode, r)} | {fetched / 1e9:.3f} GB | {fetched / size:.2f} |{cap} "
            f"{r.get('bytes_received', 0) / 1e9:.3f} GB | {wall:.2f} "
            f"| {share / wall / 1e9:.2f} | {vs} | {'yes' if ok else 'NO'} |"
        )
    return "\n".join(lines)


def _label(mode: str, r: dict[str, Any]) -> str:
    """The mode, and how its ranks exchanged where they did."""
    return f"{mode} ({r['exchange']})" if r.get("exchange") else mode


def _settled(shaper: Shaper) -> int:
    """The proxy's byte counter once it stopped moving (it is rewritten
    every 100 ms)."""
    last, deadline = -1, time.monotonic() + 3
    now = int(shaper.stats().get("bytes_down", 0))
    while now != last and time.monotonic() < deadline:
        time.sleep(0.25)
        last, now = now, int(shaper.stats().get("bytes_down", 0))
    return now


def _measure(
    args: argparse.Namespace, s3: Any, stored: dict[str, Any], modes: list[str], root: Path
) -> measure.Results:
    """Every mode's rounds, straight from the server or through a node cap."""
    if args.node_mbps <= 0:
        cases = [mode_case(m, s3, stored, args.world_size) for m in modes]
        return measure.rounds(cases, args.repeat, args.seed, warmup=not args.no_warmup)
    try:
        binary = find_shaper(release=True)
    except MissingBinary as e:
        raise deps.MissingDependency(
            f"python -m fastshard_lab --preset tp --node-mbps: {e}"
        ) from None
    shaper = Shaper(
        s3.s3_port, root / "shaper", latency_ms=args.latency_ms,
        rate_mbps=args.conn_mbps, node_mbps=args.node_mbps, service_slots=0,
    ).start(binary)  # fmt: skip
    try:
        print(f"node cap {args.node_mbps:g} MB/s through {shaper.endpoint}", flush=True)
        cases = [mode_case(m, s3, stored, args.world_size, shaper.endpoint) for m in modes]
        seen = [_settled(shaper)]

        def through(case: measure.Case, res: dict[str, Any]) -> None:
            now = _settled(shaper)
            res["bytes_through_cap"] = now - seen[0]
            seen[0] = now

        return measure.rounds(
            cases, args.repeat, args.seed, warmup=not args.no_warmup, after=through
        )
    finally:
        shaper.stop()


def run(args: argparse.Namespace) -> int:
    modes = [m for m in names(args.modes) if m in MODES]
    skipped: dict[str, str] = {}
    if "tensorizer" in modes and not deps.runnable(["tensorizer"], skipped):
        modes.remove("tensorizer")
    programs = sources.find_servers({"s3"}, skipped)
    if not programs or not modes:
        raise deps.MissingDependency(
            f"python -m fastshard_lab --preset tp: nothing to measure ({skipped})"
        )
    root = Path(tempfile.mkdtemp(prefix="fastshard-tp-"))
    try:
        with sources.local_servers(root, programs) as up:
            s3 = up["s3"]
            stored = _store(s3, args, modes)
            print(
                f"world size {args.world_size}; object {stored['size'] / 1e9:.2f} GB; "
                f"ranks' shares together {stored['share'] / 1e9:.2f} GB",
                flush=True,
            )
            results = _measure(args, s3, stored, modes, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = table(results, stored, capped=args.node_mbps > 0)
    recs = report.records(results)
    report.write(args.out, recs, {"args": vars(args), "skipped": skipped}, text, results)
    print("\n" + text)
    return report.exit_code(recs)
