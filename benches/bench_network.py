"""Network benchmark (issue 9): loads through the shaping proxy, which gives
SeaweedFS an object store's first-byte latency and per-connection bandwidth.

Loaders, each in a fresh process, in alternating rounds (fastshard.bench.measure):
  raw        64 parallel ranged GETs of a presigned URL into one buffer (the
             proxy's own ceiling; every other row is a ratio of it)
  fastshard  default settings (adaptive), and fixed at 4, 16 and 64 in flight
  tensorizer its S3 streaming (s3_endpoint = the proxy)
  runai      Run:ai Model Streamer on the same tensors as safetensors

    python benches/bench_network.py [--size 256MiB] [--latency-ms 50] [--conn-mbps 25]

Then the throughput model (network_model.py) with the proxy's figures, beside
what the fixed-concurrency loads measured. Writes .bench/network/.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from network_model import Link
from network_model import table as model_table

from fastshard.bench import measure, servers, sources, workload
from fastshard.bench import report as report_io
from fastshard.bench.shaper import REPO, Shaper, ensure_shaper

TARGET = 0.8  # fastshard default / raw 64
FIXED = (4, 16, 64)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="256MiB")
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--conn-mbps", type=float, default=25.0, help="MB/s per connection")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(REPO / ".bench" / "network"))
    p.add_argument("--only", nargs="*", help="labels to run (raw-64 always runs)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="fastshard-net-"))
    shaper_bin = ensure_shaper(release=True)
    try:
        size = workload.parse_size(args.size)
        print(f"writing an llm workload of {size / 2**20:.0f} MiB ...", flush=True)
        sd = workload.state_dict("llm", size, args.seed)
        objects = workload.write_objects(sd, scratch / "objects")
        expect = workload.digest(sd)
        del sd
        with sources.local_servers(scratch, {"s3"}, print) as up:
            s3: servers.SeaweedFS = up["s3"]
            src = sources.s3_source(s3, objects, "net")
            shaper = Shaper(
                s3.s3_port,
                scratch / "shaper",
                latency_ms=args.latency_ms,
                jitter_ms=args.jitter_ms,
                rate_mbps=args.conn_mbps,
            ).start(shaper_bin)
            print(f"shaping proxy {shaper_bin} on {shaper.endpoint}", flush=True)
            via = shaper.endpoint
            obj = src.where["fastshard"]["uri"]
            cases = [
                measure.Case(
                    "s3",
                    "ceiling",
                    {
                        "loader": "ceiling",
                        "source": "s3",
                        "url": s3.presign(obj, endpoint=via, expires=12 * 3600),
                        "size": objects["fastshard"].stat().st_size,
                        "streams": 64,
                    },
                    workload.file_sha256(objects["fastshard"]),
                    label="raw-64",
                )
            ]
            fs = {"loader": "fastshard", "source": "s3", "uri": obj}
            cases.append(
                measure.Case(
                    "s3",
                    "fastshard",
                    {**fs, "opts": s3.opts(s3_endpoint=via)},
                    expect,
                    label="fastshard-default",
                )  # fmt: skip
            )
            for n in FIXED:
                opts = s3.opts(s3_endpoint=via, concurrency=n)
                cases.append(
                    measure.Case(
                        "s3", "fastshard", {**fs, "opts": opts}, expect, label=f"fastshard-{n}"
                    )
                )
            if "tensorizer" in src.where:
                tz = dict(src.where["tensorizer"])
                tz["opts"] = {**tz["opts"], "s3_endpoint": via}
                cases.append(
                    measure.Case("s3", "tensorizer", {"loader": "tensorizer", **tz}, expect)
                )
            if "runai" in src.where:
                env = {**src.env["runai"], "AWS_ENDPOINT_URL": via}
                cases.append(
                    measure.Case(
                        "s3", "runai", {"loader": "runai", **src.where["runai"]}, expect, env
                    )
                )
            if args.only:
                cases = [c for c in cases if c.name in {"raw-64", *args.only}]
            results = measure.rounds(cases, args.repeat, args.seed)
            proxy = shaper.stats()
            shaper.stop()

        def med(label: str, key: str = "gbps") -> float:
            runs = [r[key] for r in results.get(("s3", label), []) if not r.get("warmup")]
            return float(statistics.median(runs)) if runs else float("nan")  # not run (--only)

        raw = med("raw-64")
        labels = [c.name for c in cases]
        lines = [
            "| loader | GB/s | ÷ raw 64 | most in flight | client CPU s |",
            "|---|---|---|---|---|",
        ]
        for label in labels:
            conc = med(label, "concurrency") if label.startswith("fastshard") else None
            if label == "raw-64":
                conc = 64
            lines.append(
                f"| {label} | {med(label):.3f} | {med(label) / raw:.2f}× "
                f"| {'–' if conc is None else f'{conc:.0f}'} | {med(label, 'cpu_seconds'):.2f} |"
            )
        ratio = med("fastshard-default") / raw
        verdict = f"{'PASS' if ratio >= TARGET else 'FAIL'}: fastshard default {ratio:.2f}× raw 64"
        # The model with this proxy's figures and the default part size of
        # this load, beside the fixed-concurrency measurements.
        # (rust/io/sink.rs network_part_size: a part per starting request)
        part = min(max(-(-size // 64 // (1 << 20)), 1), 16) << 20
        link = Link(args.latency_ms / 1e3, args.conn_mbps * 1e6, part)
        cmp = ["| in flight | model GB/s | measured GB/s | measured ÷ model |", "|---|---|---|---|"]
        for n in (n for n in FIXED if ("s3", f"fastshard-{n}") in results):
            want = min(n * link.per_request_rate(), raw * 1e9) / 1e9
            got = med(f"fastshard-{n}")
            cmp.append(f"| {n} | {want:.3f} | {got:.3f} | {got / want:.2f}× |")
        title = (
            f"{size / 2**20:.0f} MiB through the shaping proxy ({args.latency_ms:.0f} ms first "
            f"byte, {args.conn_mbps:.0f} MB/s per connection), {time.strftime('%Y-%m-%d %H:%M')}"
        )
        text = "\n".join(lines)
        model = model_table(Link(args.latency_ms / 1e3, 90e6, 16 << 20))
        report = (
            f"{title}\n\n{text}\n\n{verdict}\n\nModel vs measured (model capped at raw 64):\n\n"
            + "\n".join(cmp)
            + f"\n\nProxy counters: {proxy}\n\nReal S3 (90 MB/s per connection):\n\n{model}\n"
        )
        print("\n" + report)
        return report_io.save_runs(out, title, report, results)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
