"""``python -m fastshard_lab``: one run that measures fastshard against the raw
ceiling of each source and against tensorizer, Run:ai Model Streamer,
safetensors and torch.load, on the same tensors.

Without ``--uri`` it writes a seeded workload as a tensorizer object (by
tensorizer), a fastshard object (aligned: ``fastshard.save(align=64)``, as
safetensors aligns its tensors), a safetensors object and a torch file,
starts SeaweedFS (S3) and nginx (HTTP) on 127.0.0.1 as needed, and stops
them when done. Every load runs in a fresh process; one warm-up round
precedes ``--repeat`` measured rounds whose order alternates, and every
round checks each loader's data against the source.

Every source is measured two ways, each against a raw client writing into
the same kind of memory in the same run (loaders.py says what each row
returns): warm, ``fastshard.load(model, uri)`` into parameters already
written, against the raw client reading into a pre-faulted buffer
(``ceiling``); fresh, ``load_state_dict`` into new memory, against the raw
client reading into new memory (``ceiling-fresh``) and the peers, which all
return new tensors (safetensors: ``load_file`` + ``clone``). Local files are
also loaded mapped: ``load_state_dict(mmap=True)`` against safetensors'
mapped ``load_file``, every page touched.

Needs the development requirements (pip install -r requirements-dev.txt), checked before
anything runs; a peer or server program that is missing is skipped with the
reason. Writes results.json (one record per source and loader), runs.json,
meta.json, table.md and PNG plots (throughput per loader and source;
fastshard's throughput against concurrency and part size; RSS over one load)
to --out.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .. import deps, loaders, machine, measure, report, sources
from ..params import SHAPES, names, size_arg

LOADERS = (
    "ceiling",
    "ceiling-fresh",
    "fastshard",
    "fastshard-warm",
    "fastshard-mmap",
    "tensorizer",
    "runai",
    "safetensors",
    "safetensors-mmap",
    "torch",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--source",
        default="all",
        choices=["s3", "http", "file", "all"],
        help="where the objects are read from (default: all)",
    )
    p.add_argument("--size", type=size_arg, default="1GiB", help="workload size (default: 1GiB)")
    p.add_argument(
        "--shape",
        default="llm",
        choices=SHAPES,
        help="llm: Llama-like fp16 model; uniform: 16 MiB tensors; many-small: 64 KiB "
        "tensors; experts: 4-64 KiB tensors (default: llm)",
    )
    p.add_argument(
        "--world-size",
        type=int,
        default=1,
        help="also load N tensor-parallel ranks at once from the one object, each reading "
        "its dim-0 slices (loader 'fastshard-tpN'; default: 1, off)",
    )
    p.add_argument("--repeat", type=int, default=3, help="measured rounds (default: 3)")
    measure.add_warmup_flag(p)
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="output folder")
    p.add_argument(
        "--uri",
        default=None,
        help="benchmark this tensorizer object instead (s3://, http(s):// or a path; "
        "credentials from the environment); loaders: fastshard (warm, fresh, mapped), "
        "tensorizer, ceiling (warm, fresh)",
    )
    p.add_argument(
        "--loaders",
        default="all",
        help=f"comma-separated subset of {','.join(LOADERS)} (default: all that are installed)",
    )
    p.add_argument(
        "--sweep",
        default="4,16,64",
        help="fastshard concurrencies and part sizes (MiB) to sweep on the first remote "
        "source, one load each; '' for none (default: 4,16,64)",
    )
    p.add_argument("--seed", type=int, default=0, help="workload and order seed (default: 0)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def requires(args: argparse.Namespace) -> list[str]:
    return ["torch"] + ([] if args.no_plots else ["matplotlib"])


def _cases(
    srcs: list[sources.Source], wanted: list[str], expect: dict[str, Any], ws: int
) -> list[measure.Case]:
    out: list[measure.Case] = []
    for src in srcs:
        for loader in wanted:
            base = loaders.SAME_SOURCE.get(loader, loader)
            if base not in src.where or (loader in loaders.LOCAL_ONLY and src.name != "file"):
                continue
            spec = {"loader": loader, "source": src.name, **src.where[base]}
            want = expect.get("ceiling" if loader in loaders.RAW else "tensors")
            case = measure.Case(src.name, loader, spec, want, src.env.get(base, {}))
            case.server_pid = src.server_pid
            out.append(case)
        if ws > 1 and "fastshard" in src.where and "fastshard" in wanted:
            spec = {"loader": "fastshard", "source": src.name, **src.where["fastshard"]}
            spec["shard_specs"] = expect["specs"]
            case = measure.Case(src.name, "fastshard", spec, label=f"fastshard-tp{ws}")
            case.world_size, case.expect_ranks = ws, expect["ranks"]
            out.append(case)
    return out


def _sweep(
    src: sources.Source, values: list[int], log: Any
) -> tuple[dict[str, list[tuple[int, float]]], list[dict[str, Any]]]:
    """One load per value of each knob, from ``src`` (the first remote source)."""
    where = src.where["fastshard"]
    points: dict[str, list[tuple[int, float]]] = {"concurrency": [], "part size MiB": []}
    raw = []
    for knob, key, scale in (
        ("concurrency", "concurrency", 1),
        ("part size MiB", "part_size_bytes", 1 << 20),
    ):
        for v in values:
            opts = {**where.get("opts", {}), key: v * scale}
            spec = {"loader": "fastshard", "source": src.name, **where, "opts": opts}
            res = measure.run_once(measure.Case(src.name, "fastshard", spec))
            points[knob].append((v, res["gbps"]))
            raw.append({"source": src.name, knob: v, "gbps": res["gbps"]})
            log(f"  sweep    {src.name:<5} {knob} {v:<4} {res['gbps']:6.2f} GB/s")
    return points, raw


def _user_source(uri: str) -> sources.Source:
    if uri.startswith("s3://"):
        name = "s3"
    elif uri.startswith(("http://", "https://")):
        name = "http"
    else:
        name = "file"
    src = sources.Source(name)
    src.where["fastshard"] = {"uri": uri}
    if deps.peer_missing("tensorizer") is None:
        opts = {"force_http": True} if name == "http" else {}
        src.where["tensorizer"] = {"uri": uri, "opts": opts}
    if name == "file":
        src.where["ceiling"] = {"path": uri, "size": os.path.getsize(uri)}
    elif name == "http":
        import urllib.request

        with urllib.request.urlopen(urllib.request.Request(uri, method="HEAD")) as resp:
            src.where["ceiling"] = {"url": uri, "size": int(resp.headers["Content-Length"])}
    return src


def _workload(args: argparse.Namespace, scratch: Path) -> tuple[Any, dict[str, Any]]:
    """The objects and what each load must return (digests; rank shares)."""
    from .. import workload

    print(f"writing a {args.shape} workload of {args.size / 2**20:.0f} MiB ...", flush=True)
    sd = workload.state_dict(args.shape, args.size, args.seed)
    objects = workload.write_objects(sd, scratch / "objects")
    expect: dict[str, Any] = {
        "tensors": workload.digest(sd),
        "ceiling": workload.file_digest(objects["fastshard"]),
    }
    if args.world_size > 1:
        expect["specs"] = workload.split_specs(sd, args.world_size, rule="dim0")
        expect["ranks"] = workload.rank_digests(sd, expect["specs"], args.world_size)
    return objects, expect


def _measure(
    args: argparse.Namespace, scratch: Path, programs: dict[str, str], wanted: list[str]
) -> tuple[measure.Results, dict[str, Any]]:
    which = {"s3", "http", "file"} if args.source == "all" else {args.source}
    objects, expect = (None, {}) if args.uri else _workload(args, scratch)
    with sources.local_servers(scratch, programs) as up:
        if args.uri:
            srcs = [_user_source(args.uri)]
        else:
            srcs = [sources.file_source(objects)] if "file" in which else []
            if "s3" in up:
                srcs.append(sources.s3_source(up["s3"], objects, "bench"))
            if "http" in up:
                srcs.append(sources.http_source(up["http"], objects, "bench"))
        cases = _cases(srcs, wanted, expect, args.world_size)
        first = srcs[0].name
        sample = {(first, n) for n in ("fastshard", "tensorizer", "safetensors", "runai")}
        results = measure.rounds(cases, args.repeat, args.seed, sample, warmup=args.warmup)
        remote = [s for s in srcs if s.name != "file"] or srcs
        values = [int(x) for x in args.sweep.split(",") if x.strip()]
        sweep = _sweep(remote[0], values, print) if values and remote else ({}, [])
    if args.uri:  # no reference data: the loaders must agree with each other
        got = {
            r["digest"] for (_, n), runs in results.items() if n not in loaders.RAW for r in runs
        }
        for runs in results.values():
            for r in runs:
                r["verified"] = len(got) <= 1
    return results, {"points": sweep[0], "raw": sweep[1]}


def run(args: argparse.Namespace) -> int:
    skipped: dict[str, str] = {}
    wanted = list(LOADERS) if args.loaders == "all" else names(args.loaders)
    wanted = deps.runnable(wanted, skipped)
    which = {"s3", "http", "file"} if args.source == "all" else {args.source}
    programs = {} if args.uri else sources.find_servers(which, skipped)
    if not wanted or (not args.uri and not programs and "file" not in which):
        raise deps.MissingDependency(
            f"python -m fastshard_lab: nothing left to measure ({skipped})"
        )
    meta: dict[str, Any] = {"machine": machine.describe(), "args": vars(args), "skipped": skipped}
    scratch = Path(tempfile.mkdtemp(prefix="fastshard-bench-"))
    try:
        results, sweep = _measure(args, scratch, programs, wanted)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _report(args, results, sweep, meta)


def _report(
    args: argparse.Namespace, results: measure.Results, sweep: dict[str, Any], meta: dict[str, Any]
) -> int:
    recs = report.records(results)
    meta["sweep"] = sweep["raw"]
    title = (
        f"{args.shape}, {args.size / 2**20:.0f} MiB, {meta['machine']['date']}, "
        f"{os.cpu_count()} CPUs"
    )
    text = f"{title}\n\n{report.table(recs)}"
    if meta["skipped"]:
        text += "\n\nskipped: " + "; ".join(f"{k}: {v}" for k, v in meta["skipped"].items())
    report.write(args.out, recs, meta, text, results)
    if not args.no_plots:
        from .. import plots

        # The first measured run of each sampled loader recorded its RSS
        # (measure.rounds), with or without a warm-up before it.
        timelines = {
            f"{loader} ({source})": sampled[0]["timeline"]
            for (source, loader), runs in results.items()
            if (sampled := [r for r in runs if "timeline" in r])
        }
        for path in plots.draw(args.out, recs, sweep["points"], timelines, title):
            print(f"wrote {path}")
    print(f"\n{text}")
    return report.exit_code(recs)
