"""The benchmark run: workload, sources, cases, rounds, sweep, report."""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from . import measure, report, sources, workload


def _cases(
    srcs: list[sources.Source],
    wanted: set[str] | None,
    expect: str | None,
    ws: int,
    expect_ranks: list[str],
) -> list[measure.Case]:
    out: list[measure.Case] = []
    for src in srcs:
        for loader, where in src.where.items():
            if wanted is not None and loader not in wanted:
                continue
            spec = {"loader": loader, "source": src.name, **where}
            if loader == "ceiling":
                spec["size"] = where.get("size", 0)
                want = where.get("sha256")
            else:
                want = expect
            out.append(measure.Case(src.name, loader, spec, want, src.env.get(loader, {})))
        if ws > 1 and "fastshard" in src.where and (wanted is None or "fastshard" in wanted):
            spec = {"loader": "fastshard", "source": src.name, **src.where["fastshard"]}
            out.append(
                measure.Case(
                    src.name,
                    "fastshard",
                    spec,
                    None,
                    world_size=ws,
                    expect_ranks=expect_ranks,
                    label=f"fastshard-tp{ws}",
                )  # fmt: skip
            )
    return out


def _rank_digests(sd: workload.StateDict, ws: int) -> list[str]:
    out = []
    for r in range(ws):
        part = {}
        for name, t in sd.items():
            if t.dim() == 2 and t.shape[0] % ws == 0:
                n = t.shape[0] // ws
                part[name] = t[r * n : (r + 1) * n]
            else:
                part[name] = t
        out.append(workload.digest(part))
    return out


def _sweep(
    src: sources.Source, values: list[int], log: Any
) -> tuple[dict[str, list[tuple[int, float]]], list[dict[str, Any]]]:
    where = src.where["fastshard"]
    points: dict[str, list[tuple[int, float]]] = {"concurrency": [], "part size MiB": []}
    raw = []
    knobs = (("concurrency", "concurrency", 1), ("part size MiB", "part_size_bytes", 1 << 20))
    for knob, key, scale in knobs:
        for v in values:
            opts = {**where.get("opts", {}), key: v * scale}
            spec = {"loader": "fastshard", "source": src.name, **where, "opts": opts}
            res = measure.run_once(measure.Case(src.name, "fastshard", spec, None))
            gbps = res["bytes"] / res["seconds"] / 1e9
            points[knob].append((v, gbps))
            raw.append({"source": src.name, knob: v, "gbps": gbps})
            log(f"  sweep    {src.name:<5} {knob} {v:<4} {gbps:6.2f} GB/s")
    return points, raw


def run(args: argparse.Namespace, log: Any = print) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    size = workload.parse_size(args.size)
    wanted = None if args.loaders == "all" else set(args.loaders.split(","))
    sweep_values = [int(x) for x in args.sweep.split(",") if x.strip()]
    scratch = Path(tempfile.mkdtemp(prefix="fastshard-bench-"))
    meta: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "args": vars(args),
    }
    try:
        if args.uri:
            srcs = [_user_source(args.uri)]
            expect, ranks = None, []
        else:
            log(f"writing a {args.shape} workload of {size / 2**20:.0f} MiB ...")
            sd = workload.state_dict(args.shape, size, args.seed)
            objects = workload.write_objects(sd, scratch / "objects")
            expect = workload.digest(sd)
            ranks = _rank_digests(sd, args.world_size) if args.world_size > 1 else []
            ceiling = {
                "size": objects["fastshard"].stat().st_size,
                "sha256": workload.file_sha256(objects["fastshard"]),
            }
            del sd
        which = {"s3", "http", "file"} if args.source == "all" else {args.source}
        with sources.local_servers(scratch, which - {"file"} if not args.uri else set(), log) as up:
            if not args.uri:
                srcs = []
                if "file" in which:
                    srcs.append(sources.file_source(objects))
                if "s3" in up:
                    srcs.append(sources.s3_source(up["s3"], objects, "bench"))
                if "http" in up:
                    srcs.append(sources.http_source(up["http"], objects, "bench"))
                for s in srcs:
                    s.where["ceiling"].update(ceiling)
            cases = _cases(srcs, wanted, expect, args.world_size, ranks)
            first = srcs[0].name if srcs else ""
            sample = {(first, n) for n in ("fastshard", "tensorizer", "safetensors", "runai")}
            results = measure.rounds(cases, args.repeat, args.seed, sample, log)
            remote = [s for s in srcs if s.name != "file"] or srcs
            sweep_points, sweep_raw = (
                _sweep(remote[0], sweep_values, log) if sweep_values and remote else ({}, [])
            )
        if args.uri:
            # No reference data: the loaders must agree with each other.
            got = {r["digest"] for (_, n), runs in results.items() if n != "ceiling" for r in runs}
            if len(got) > 1:
                for runs in results.values():
                    for r in runs:
                        r["verified"] = False
        recs = report.records(results)
        timelines = {
            f"{loader} ({source})": runs[1]["timeline"]
            for (source, loader), runs in results.items()
            if len(runs) > 1 and "timeline" in runs[1]
        }
        meta["sweep"] = sweep_raw
        report.write_json(out, recs, meta)
        text = report.table(recs)
        title = f"{args.shape}, {size / 2**20:.0f} MiB, {meta['date']}, {os.cpu_count()} CPUs"
        (out / "table.md").write_text(f"{title}\n\n{text}\n")
        if not args.no_plots:
            for path in report.plots(out, recs, sweep_points, timelines, title):
                log(f"wrote {path}")
        log("")
        log(title)
        log(text)
        return 0 if all(r["verified"] for r in recs) else 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _user_source(uri: str) -> sources.Source:
    if uri.startswith("s3://"):
        name = "s3"
    elif uri.startswith(("http://", "https://")):
        name = "http"
    else:
        name = "file"
    src = sources.Source(name)
    src.where["fastshard"] = {"uri": uri}
    if sources.installed("tensorizer"):
        opts = {"force_http": True} if name == "http" else {}
        src.where["tensorizer"] = {"uri": uri, "opts": opts}
    if name == "file":
        src.where["ceiling"] = {"path": uri, "size": os.path.getsize(uri)}
    elif name == "http":
        import urllib.request

        with urllib.request.urlopen(urllib.request.Request(uri, method="HEAD")) as resp:
            src.where["ceiling"] = {"url": uri, "size": int(resp.headers["Content-Length"])}
    return src
