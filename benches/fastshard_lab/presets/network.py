"""Loads through the shaping proxy (tools/shaper), which gives
SeaweedFS an object store's first-byte latency and per-connection bandwidth.

Loaders, each in a fresh process, in alternating rounds:
  raw-64      64 parallel ranged GETs of a presigned URL into one pre-faulted
              buffer (the proxy's own ceiling; every other row is a ratio of it),
              told the object's size
  raw-64-sized  the same after a one-byte GET for the size, the round trip
              any loader pays first (fastshard's discovery read, a HEAD)
  fastshard   default settings (adaptive), and fixed at 4, 16 and 64 in
              flight: fastshard.load(model, uri) into parameters already
              written, the same kind of memory as the raw client's
  tensorizer  its S3 streaming (s3_endpoint = the proxy), new tensors
  runai       Run:ai Model Streamer on the same tensors as safetensors, new
              tensors
The table says what each row writes into (loaders.RETURNS).

Then the throughput model (--preset network-model) with the proxy's figures,
beside what the fixed-concurrency loads measured.

Then (unless --service-ms 0) the same object through a second proxy that adds
a per-request service time on one shared slot (--service-ms, --service-slots):
a store whose every request costs ~0.1 s whatever its size. fastshard's
default against the same load at each fixed part size (--part-mib), with the
requests each made: the default should come near the best of them.

The proxy is the release build: $FASTSHARD_SHAPER, or
target/shaper/release/shaper of the checkout this runs from (``make
shaper``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import deps, measure, report, sources
from ..params import BENCH_DIR, add_out, size_arg
from ..procs import MissingBinary
from ..shaper import Shaper, find_shaper
from .netmodel import Link
from .netmodel import table as model_table

TARGET = 0.95  # fastshard default / raw 64, in 4 of 5 rounds
SERVICE_TARGET = 0.9  # with a service time: fastshard default / the best fixed part size
FIXED = (4, 16, 64)
PARTS_MIB = (4, 16, 32, 64)
MiB = 1 << 20
WARM = "fastshard-warm"
SIZED = "raw-64-sized"  # raw 64 after a round trip for the object's size
REFERENCES = ("raw-64", SIZED)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", type=size_arg, default="256MiB")
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--conn-mbps", type=float, default=25.0, help="MB/s per connection")
    p.add_argument(
        "--service-ms",
        type=float,
        default=100.0,
        help="per-request service time of the second proxy (0: no service-time case)",
    )
    p.add_argument("--service-slots", type=int, default=1, help="requests served at once")
    p.add_argument(
        "--part-mib",
        type=int,
        nargs="*",
        default=list(PARTS_MIB),
        help="fixed part sizes set beside the default behind the service time",
    )
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", nargs="*", help="labels to run (raw-64 and raw-64-sized always run)")
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
    # raw 64 is told the object's size; every loader must first learn it
    # (fastshard's discovery read): one round trip that this row pays too.
    sized = {**ceiling, "size_lookup": True}
    cases.append(measure.Case("s3", "ceiling", sized, expect["object"], label=SIZED))
    # Into written parameters, as the raw client reads into a pre-faulted
    # buffer: the ratio is then the loaders', not the hypervisor's first
    # touch of new pages (which only the fresh loaders below pay).
    fs = {"loader": WARM, "source": "s3", "uri": obj}
    cases.append(
        measure.Case(
            "s3",
            WARM,
            {**fs, "opts": s3.opts(s3_endpoint=via)},
            expect["tensors"],
            label="fastshard-default",
        )  # fmt: skip
    )
    for n in FIXED:
        spec = {**fs, "opts": s3.opts(s3_endpoint=via, concurrency=n)}
        cases.append(measure.Case("s3", WARM, spec, expect["tensors"], label=f"fastshard-{n}"))
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


def _service_cases(
    src: sources.Source, s3: Any, via: str, expect: dict[str, str], parts: list[int]
) -> list[measure.Case]:
    """fastshard's default and each fixed part size (requests in flight left
    to the load), through the proxy with a service time."""
    fs = {"loader": WARM, "source": "s3", "uri": src.where["fastshard"]["uri"]}
    cases = [
        measure.Case(
            "svc",
            WARM,
            {**fs, "opts": s3.opts(s3_endpoint=via)},
            expect["tensors"],
            label="fastshard-default",
        )  # fmt: skip
    ]
    for mib in parts:
        spec = {**fs, "opts": s3.opts(s3_endpoint=via, part_size_bytes=mib * MiB)}
        cases.append(
            measure.Case("svc", WARM, spec, expect["tensors"], label=f"fastshard-{mib}MiB")
        )
    return cases


def _median(results: measure.Results, source: str, label: str, key: str = "gbps") -> float:
    runs = [r[key] for r in measure.measured(results.get((source, label), [])) if key in r]
    return float(statistics.median(runs)) if runs else float("nan")  # not run (--only)


def _returns(results: measure.Results, label: str) -> str:
    """What the rows of ``label`` wrote into (loaders.RETURNS: warm, fresh)."""
    runs = [r for rs in (v for (_, lb), v in results.items() if lb == label) for r in rs]
    return str(next((r["returns"] for r in runs if "returns" in r), "?"))


def _rounds_at_target(results: measure.Results, ref: str) -> tuple[int, int]:
    """Measured rounds where the default reached TARGET x the raw row ``ref``
    in the same round, and the rounds both ran."""
    raw = measure.measured(results.get(("s3", ref), []))
    default = measure.measured(results.get(("s3", "fastshard-default"), []))
    pairs = list(zip(default, raw, strict=False))
    return sum(d["gbps"] >= TARGET * r["gbps"] for d, r in pairs), len(pairs)


def _service_text(args: argparse.Namespace, results: measure.Results, proxy: dict[str, Any]) -> str:
    def med(label: str, key: str = "gbps") -> float:
        return _median(results, "svc", label, key)

    fixed = [
        f"fastshard-{mib}MiB" for mib in args.part_mib if ("svc", f"fastshard-{mib}MiB") in results
    ]
    if not fixed:
        return f"Service time {args.service_ms:.0f} ms: no fixed part size ran (--only)"
    best = max(fixed, key=med)
    lines = [
        "| loader | GB/s | ÷ best fixed | requests | mean request MiB |",
        "|---|---|---|---|---|",
    ]
    for _, label in results:
        requests = med(label, "requests")
        mean = med(label, "bytes_fetched") / requests / MiB
        lines.append(
            f"| {label} | {med(label):.3f} | {med(label) / med(best):.2f}× | {requests:.0f} "
            f"| {mean:.1f} |"
        )
    ratio = med("fastshard-default") / med(best)
    verdict = (
        f"{'PASS' if ratio >= SERVICE_TARGET else 'FAIL'}: fastshard default {ratio:.2f}× "
        f"the best fixed part size ({best})"
    )
    title = (
        f"With a {args.service_ms:.0f} ms service time per request ({args.service_slots} at a "
        f"time), same latency and bandwidth"
    )
    return f"{title}\n\n" + "\n".join(lines) + f"\n\n{verdict}\n\nProxy counters: {proxy}"


def _verdict(results: measure.Results, ref: str, med: Callable[[str], float]) -> str:
    """The default against one raw row: median ratio, rounds at TARGET."""
    hits, rounds = _rounds_at_target(results, ref)
    passed = "PASS" if rounds and hits >= 0.8 * rounds else "FAIL"
    return (
        f"fastshard default {med('fastshard-default') / med(ref):.2f}× {ref} (median); "
        f"≥ {TARGET}× in {hits} of {rounds} rounds ({passed}: 4 of 5)"
    )


def _text(args: argparse.Namespace, results: measure.Results, proxy: dict[str, Any]) -> str:
    def med(label: str, key: str = "gbps") -> float:
        return _median(results, "s3", label, key)

    raw = med("raw-64")
    lines = [
        "| loader | writes into | GB/s | ÷ raw 64 | most in flight | requests | client CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, label in results:
        conc = 64.0 if label in REFERENCES else med(label, "concurrency")
        # More requests than parts: the default took the store for one
        # serving requests in turn and sent parts again (exec/queueing.rs).
        lines.append(
            f"| {label} | {_returns(results, label)} | {med(label):.3f} | "
            f"{med(label) / raw:.2f}× | {conc:.0f} | {med(label, 'requests'):.0f} "
            f"| {med(label, 'cpu_seconds'):.2f} |"
        )
    verdict = "\n".join(_verdict(results, ref, med) for ref in REFERENCES)
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


def _through_proxy(
    args: argparse.Namespace,
    port: int,
    root: Path,
    service_ms: float,
    binary: str,
    make: Callable[[str], list[measure.Case]],
) -> tuple[measure.Results, dict[str, Any]]:
    """The rounds of the cases ``make(endpoint)`` gives, through a new proxy
    in front of ``port``; and the proxy's counters."""
    shaper = Shaper(
        port,
        root,
        latency_ms=args.latency_ms,
        jitter_ms=args.jitter_ms,
        rate_mbps=args.conn_mbps,
        service_ms=service_ms,
        service_slots=args.service_slots,
    )
    shaper.start(binary)
    try:
        print(f"shaping proxy {binary} on {shaper.endpoint}", flush=True)
        cases = make(shaper.endpoint)
        if args.only:
            cases = [c for c in cases if c.name in {*REFERENCES, *args.only}]
        return measure.rounds(cases, args.repeat, args.seed), shaper.stats()
    finally:
        shaper.stop()


def run(args: argparse.Namespace) -> int:
    from .. import workload

    try:
        shaper_bin = find_shaper(release=True)
    except MissingBinary as e:
        raise deps.MissingDependency(f"python -m fastshard_lab --preset network: {e}") from None
    skipped: dict[str, str] = {}
    deps.runnable(["tensorizer", "runai"], skipped)
    programs = sources.find_servers({"s3"}, skipped)
    if not programs:
        raise deps.MissingDependency(
            f"python -m fastshard_lab --preset network: no S3 server ({skipped})"
        )
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

            results, proxy = _through_proxy(
                args, s3.s3_port, scratch / "shaper", 0.0, shaper_bin,
                lambda via: _cases(src, s3, via, expect),
            )  # fmt: skip
            served: measure.Results = {}
            served_proxy: dict[str, Any] = {}
            if args.service_ms > 0:
                served, served_proxy = _through_proxy(
                    args, s3.s3_port, scratch / "shaper-service", args.service_ms, shaper_bin,
                    lambda via: _service_cases(src, s3, via, expect, args.part_mib),
                )  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text = _text(args, results, proxy)
    if served:
        text += "\n\n" + _service_text(args, served, served_proxy)
    print("\n" + text)
    everything = {**results, **served}
    recs = report.records(everything)
    meta = {"args": vars(args), "skipped": skipped, "proxy": proxy, "service_proxy": served_proxy}
    report.write(args.out, recs, meta, text, everything)
    return report.exit_code(recs)
