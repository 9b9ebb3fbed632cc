"""Loads through the shaping proxy (examples/shaper.rs), which gives
SeaweedFS an object store's first-byte latency and per-connection bandwidth.

Loaders, each in a fresh process, in alternating rounds:
  raw-64      64 parallel ranged GETs of a presigned URL into one buffer (the
              proxy's own ceiling; every other row is a ratio of it)
  fastshard   default settings (adaptive), and fixed at 4, 16 and 64 in flight
  tensorizer  its S3 streaming (s3_endpoint = the proxy)
  runai       Run:ai Model Streamer on the same tensors as safetensors

Then the throughput model (--preset network-model) with the proxy's figures,
beside what the fixed-concurrency loads measured. The proxy is the release
build: $FASTSHARD_SHAPER, or target/release/examples/shaper of the checkout
this runs from (cargo build --release --example shaper --no-default-features).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import deps, measure, report, sources
from ..params import BENCH_DIR, add_out, size_arg
from ..procs import MissingBinary
from ..shaper import Shaper, find_shaper
from .netmodel import Link
from .netmodel import table as model_table

TARGET = 0.8  # fastshard default / raw 64
FIXED = (4, 16, 64)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", type=size_arg, default="256MiB")
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--conn-mbps", type=float, default=25.0, help="MB/s per connection")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", nargs="*", help="labels to run (raw-64 always runs)")
    add_out(p, str(BENCH_DIR / "network"))


def requires(args: argparse.Namespace) -> list[str]:
    return ["torch", "boto3"]


def _cases(src: sources.Source, s3: Any, via: str, expect: dict[str, str]) -> list[measure.Case]:
    obj = src.where["fastshard"]["uri"]
    ceiling = {
        "loader": "ceiling",
        "source": "s3",
        "streams": 64,
        "size": src.where["ceiling"]["size"],
    }
    ceiling["url"] = s3.presign(obj, endpoint=via, expires=12 * 3600)
    cases = [measure.Case("s3", "ceiling", ceiling, expect["object"], label="raw-64")]
    fs = {"loader": "fastshard", "source": "s3", "uri": obj}
    cases.append(
        measure.Case(
            "s3",
            "fastshard",
            {**fs, "opts": s3.opts(s3_endpoint=via)},
            expect["tensors"],
            label="fastshard-default",
        )  # fmt: skip
    )
    for n in FIXED:
        spec = {**fs, "opts": s3.opts(s3_endpoint=via, concurrency=n)}
        cases.append(
            measure.Case("s3", "fastshard", spec, expect["tensors"], label=f"fastshard-{n}")
        )
    if "tensorizer" in src.where:
        tz = {**src.where["tensorizer"], "opts": sources.tensorizer_s3_opts(s3, via)}
        cases.append(
            measure.Case("s3", "tensorizer", {"loader": "tensorizer", **tz}, expect["tensors"])
        )
    if "runai" in src.where:
        env = sources.runai_env(s3, via)
        spec = {"loader": "runai", **src.where["runai"]}
        cases.append(measure.Case("s3", "runai", spec, expect["tensors"], env))
    return cases


def _text(args: argparse.Namespace, results: measure.Results, proxy: dict[str, Any]) -> str:
    def med(label: str, key: str = "gbps") -> float:
        runs = [r[key] for r in measure.measured(results.get(("s3", label), [])) if key in r]
        return float(statistics.median(runs)) if runs else float("nan")  # not run (--only)

    raw = med("raw-64")
    lines = [
        "| loader | GB/s | ÷ raw 64 | most in flight | client CPU s |",
        "|---|---|---|---|---|",
    ]
    for _, label in results:
        conc = 64.0 if label == "raw-64" else med(label, "concurrency")
        lines.append(
            f"| {label} | {med(label):.3f} | {med(label) / raw:.2f}× | {conc:.0f} "
            f"| {med(label, 'cpu_seconds'):.2f} |"
        )
    ratio = med("fastshard-default") / raw
    verdict = f"{'PASS' if ratio >= TARGET else 'FAIL'}: fastshard default {ratio:.2f}× raw 64"
    # The default part size of this load (rust/io/sink.rs network_part_size:
    # bytes / 64, 1-16 MiB) for the model, capped at what raw 64 reached.
    part = min(max(-(-args.size // 64 // (1 << 20)), 1), 16) << 20
    link = Link(args.latency_ms / 1e3, args.conn_mbps * 1e6, part)
    cmp = ["| in flight | model GB/s | measured GB/s | measured ÷ model |", "|---|---|---|---|"]
    for n in (n for n in FIXED if ("s3", f"fastshard-{n}") in results):
        want = min(n * link.per_request_rate(), raw * 1e9) / 1e9
        got = med(f"fastshard-{n}")
        cmp.append(f"| {n} | {want:.3f} | {got:.3f} | {got / want:.2f}× |")
    title = (
        f"{args.size / 2**20:.0f} MiB through the shaping proxy ({args.latency_ms:.0f} ms first "
        f"byte, {args.conn_mbps:.0f} MB/s per connection), {time.strftime('%Y-%m-%d %H:%M')}"
    )
    model = model_table(Link(args.latency_ms / 1e3, 90e6, 16 << 20))
    return (
        f"{title}\n\n" + "\n".join(lines) + f"\n\n{verdict}\n\nModel vs measured (model capped "
        "at raw 64):\n\n" + "\n".join(cmp)
        + f"\n\nProxy counters: {proxy}\n\nReal S3 (90 MB/s per connection):\n\n{model}"
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from .. import workload

    try:
        shaper_bin = find_shaper(release=True)
    except MissingBinary as e:
        raise deps.MissingDependency(f"fastshard bench --preset network: {e}") from None
    skipped: dict[str, str] = {}
    deps.runnable(["tensorizer", "runai"], skipped)
    programs = sources.find_servers({"s3"}, skipped)
    if not programs:
        raise deps.MissingDependency(f"fastshard bench --preset network: no S3 server ({skipped})")
    scratch = Path(tempfile.mkdtemp(prefix="fastshard-net-"))
    try:
        print(f"writing an llm workload of {args.size / 2**20:.0f} MiB ...", flush=True)
        sd = workload.state_dict("llm", args.size, args.seed)
        objects = workload.write_objects(
            sd, scratch / "objects", ("fastshard", "tensorizer", "safetensors")
        )
        expect = {
            "tensors": workload.digest(sd),
            "object": workload.file_digest(objects["fastshard"]),
        }
        del sd
        with sources.local_servers(scratch, programs) as up:
            s3 = up["s3"]
            src = sources.s3_source(s3, objects, "net")
            shaper = Shaper(s3.s3_port, scratch / "shaper", latency_ms=args.latency_ms,
                            jitter_ms=args.jitter_ms, rate_mbps=args.conn_mbps)  # fmt: skip
            shaper.start(shaper_bin)
            try:
                print(f"shaping proxy {shaper_bin} on {shaper.endpoint}", flush=True)
                cases = _cases(src, s3, shaper.endpoint, expect)
                if args.only:
                    cases = [c for c in cases if c.name in {"raw-64", *args.only}]
                results = measure.rounds(cases, args.repeat, args.seed)
                proxy = shaper.stats()
            finally:
                shaper.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text = _text(args, results, proxy)
    print("\n" + text)
    recs = report.records(results)
    report.write(
        args.out, recs, {"args": vars(args), "skipped": skipped, "proxy": proxy}, text, results
    )
    return report.exit_code(recs)
