"""S3 (SeaweedFS) and HTTP (nginx) against the raw ceiling of each server,
tensorizer and Run:ai Model Streamer (``make bench-remote``).

64 fp16 tensors of 16 MiB (--quick: 16), seeded, written by tensorizer
(model.tensors, which fastshard and tensorizer read) and safetensors (for
Run:ai), uploaded to a SeaweedFS and published by an nginx started on
127.0.0.1 and stopped by PID at the end. Every load runs in a fresh process;
one warm-up round then --runs measured rounds in alternating order. Then a
sweep over fastshard's concurrency and part size from S3 and nginx.

Each source is measured two ways, each against a raw client (N ranged GETs
of the whole object, one range per stream, Python threads) writing into the
same kind of memory in the same run: warm, ``fastshard.load(model, uri)``
into parameters already written, against the raw client reading into one
pre-faulted buffer (``ceiling-pythonN``); fresh, ``load_state_dict`` into
new tensors, against the raw client reading into fresh memory
(``fresh-pythonN``; tensorizer and Run:ai return new tensors too). curl
processes writing to /dev/null keep no bytes: shown, compared with nothing.
Each load's client CPU and the server process's CPU are recorded, to show
who the bottleneck is (on 2 cores the client's CPU is taken from the
server). Prints tables and the targets as PASS/FAIL lines.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .. import deps, loaders, machine, measure, report, sources
from ..params import BENCH_DIR, MiB, add_out, ints
from . import remote_report

# fastshard ÷ the raw client into the same memory (warm, fresh), ÷ tensorizer
# and Run:ai (fresh); "cpu": fastshard's client CPU per GB at most this × the
# raw client's of the same kind.
TARGETS = {"warm": 0.95, "fresh": 1.0, "tensorizer": 1.8, "runai": 2.5, "cpu": 1.1}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="256 MiB object, 1 run, a small sweep")
    p.add_argument("--runs", type=int, help="measured rounds after the warm-up (5; --quick 1)")
    p.add_argument("--raw-streams", default="4,16", help="streams of the raw clients (4,16)")
    p.add_argument(
        "--tensorizer-readers",
        default="default,8",
        help="tensorizer num_readers to try ('default' = its own choice); the best counts",
    )
    p.add_argument("--sweep-runs", type=int, help="repetitions per sweep point (2; --quick 1)")
    p.add_argument("--sweep-concurrency", help="S3 sweep (4,8,16,32; --quick 8,16)")
    p.add_argument("--sweep-part-mib", help="S3 sweep part sizes (4,8,16,32,64; --quick 8,16)")
    p.add_argument("--http-sweep-concurrency", help="nginx sweep (4,8,16,32; --quick 8,16)")
    p.add_argument("--http-sweep-part-mib", help="nginx sweep part sizes (4,16,64; --quick 16)")
    p.add_argument(
        "--huge-pages-reference",
        action="store_true",
        help="also run fastshard with FASTSHARD_HUGE_PAGES=1 (reference rows)",
    )
    p.add_argument("--no-sweep", action="store_true", help="skip the concurrency/part-size sweep")
    p.add_argument("--tensors", type=int, help="16 MiB tensors in the object (64; --quick 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scratch", type=Path, default=BENCH_DIR / "remote", help="where files go")
    add_out(p, str(BENCH_DIR / "remote"))
    p.add_argument("--keep-files", action="store_true", help="keep the local files afterwards")


def requires(args: argparse.Namespace) -> list[str]:
    return ["torch", "boto3"]


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The options with --quick's defaults filled in."""
    q = args.quick
    readers = [
        None if x.strip() == "default" else int(x) for x in args.tensorizer_readers.split(",")
    ]
    runs: int = args.runs if args.runs is not None else (1 if q else 5)
    sweep_runs: int = args.sweep_runs if args.sweep_runs is not None else (1 if q else 2)
    raw_streams = ints(args.raw_streams)
    if runs < 1 or sweep_runs < 1 or not raw_streams or not readers:
        raise SystemExit("--runs, --sweep-runs, --raw-streams, --tensorizer-readers: non-empty")
    return {
        "runs": runs,
        "sweep_runs": sweep_runs,
        "tensors": args.tensors or (16 if q else 64),
        "raw_streams": raw_streams,
        "readers": readers,
        "sweep": {
            "s3": (
                ints(args.sweep_concurrency or ("8,16" if q else "4,8,16,32")),
                ints(args.sweep_part_mib or ("8,16" if q else "4,8,16,32,64")),
            ),
            "http": (
                ints(args.http_sweep_concurrency or ("8,16" if q else "4,8,16,32")),
                ints(args.http_sweep_part_mib or ("16" if q else "4,16,64")),
            ),
        },
    }


def raw_cases(src: sources.Source, streams: list[int], expect: str) -> list[measure.Case]:
    """The raw clients of one source: Python threads into a pre-faulted buffer
    and curl (together: the ceiling), and Python threads into fresh memory."""
    ceiling = src.where["ceiling"]
    out = []
    for n in streams:
        base = {"source": src.name, "url": ceiling["url"], "size": ceiling["size"], "streams": n}
        for label, loader, extra in (
            (f"ceiling-python{n}", "ceiling", {}),
            (f"ceiling-curl{n}", "curl", {}),
            (f"fresh-python{n}", "ceiling", {"fresh": True}),
        ):
            case = measure.Case(src.name, loader, {"loader": loader, **base, **extra}, label=label)
            if loader == "curl":
                case.expect_bytes = ceiling["size"]
            else:
                case.expect = expect
            case.server_pid = src.server_pid
            out.append(case)
    return out


def loader_cases(
    srcs: list[sources.Source], cfg: dict[str, Any], expect: dict[str, str], huge: bool
) -> list[measure.Case]:
    cases = []
    for src in srcs:
        runs: list[tuple[str, str, dict[str, Any], dict[str, str]]] = [
            ("fastshard", "fastshard", {}, {}),
            ("fastshard-warm", "fastshard-warm", {}, {}),
        ]
        if huge:
            runs.append(("fastshard-hugepages", "fastshard", {}, {"FASTSHARD_HUGE_PAGES": "1"}))
        if src.name == "s3" and "tensorizer" in src.where:
            for r in cfg["readers"]:
                runs.append(("tensorizer" if r is None else f"tensorizer-r{r}", "tensorizer",
                             {"num_readers": r}, {}))  # fmt: skip
        if src.name == "s3" and "runai" in src.where:
            runs.append(("runai", "runai", {}, src.env["runai"]))
        for label, loader, extra, env in runs:
            where = src.where[loaders.SAME_SOURCE.get(loader, loader)]
            spec = {"loader": loader, "source": src.name, **where, **extra}
            case = measure.Case(src.name, loader, spec, expect["tensors"], env, label=label)
            case.server_pid = src.server_pid
            cases.append(case)
        cases += raw_cases(src, cfg["raw_streams"], expect["object"])
    return cases


def sweep(
    srcs: list[sources.Source], cfg: dict[str, Any], expect: dict[str, str], seed: int
) -> dict[str, measure.Results]:
    out = {}
    for src in srcs:
        conc, parts = cfg["sweep"][src.name]
        print(f"\n## sweep {src.name}: concurrency {conc} x part size {parts} MiB", flush=True)
        cases = []
        where = src.where["fastshard"]
        for c in conc:
            for p in parts:
                opts = {**where.get("opts", {}), "concurrency": c, "part_size_bytes": p * MiB}
                spec = {"loader": "fastshard", "source": src.name, **where, "opts": opts}
                label = f"c{c}-p{p}"
                cases.append(
                    measure.Case(src.name, "fastshard", spec, expect["tensors"], label=label)
                )
        out[src.name] = measure.rounds(cases, cfg["sweep_runs"], seed + len(src.name), warmup=False)
    return out


def _measure(
    args: argparse.Namespace, cfg: dict[str, Any], programs: dict[str, str]
) -> tuple[measure.Results, dict[str, measure.Results]]:
    from .. import workload

    folder = args.scratch / f"uniform-{cfg['tensors']}x16MiB"
    print(f"\n## data: {cfg['tensors']} fp16 tensors of 16 MiB", flush=True)
    sd = workload.state_dict("uniform", cfg["tensors"] * 16 * MiB, args.seed)
    objects = workload.write_objects(sd, folder, ("tensorizer", "safetensors"))
    objects.paths["fastshard"] = objects["tensorizer"]  # fastshard reads tensorizer's file
    expect = {"tensors": workload.digest(sd), "object": workload.file_digest(objects["tensorizer"])}
    del sd
    gc.collect()
    root = Path(tempfile.mkdtemp(prefix="servers-", dir=args.scratch))
    try:
        with sources.local_servers(root, programs) as up:
            srcs = []
            if "s3" in up:
                srcs.append(sources.s3_source(up["s3"], objects, "bench"))
            if "http" in up:
                srcs.append(sources.http_source(up["http"], objects, "bench"))
            cases = loader_cases(srcs, cfg, expect, args.huge_pages_reference)
            print(f"\n## loaders ({len(cases)}), alternating order", flush=True)
            results = measure.rounds(cases, cfg["runs"], args.seed)
            sweeps = {} if args.no_sweep else sweep(srcs, cfg, expect, args.seed)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if not args.keep_files:
            shutil.rmtree(folder, ignore_errors=True)
    return results, sweeps


def run(args: argparse.Namespace) -> int:
    cfg = settings(args)
    args.scratch.mkdir(parents=True, exist_ok=True)
    skipped: dict[str, str] = {}
    deps.runnable(["tensorizer", "runai"], skipped)
    programs = sources.find_servers({"s3", "http"}, skipped)
    if not programs:
        raise deps.MissingDependency(
            f"python -m fastshard_lab --preset remote: no server ({skipped})"
        )
    info = machine.describe()
    print("# fastshard remote benchmark (S3: SeaweedFS, HTTP: nginx, both on 127.0.0.1)")
    print("\n".join(machine.header(info)), flush=True)
    results, sweeps = _measure(args, cfg, programs)
    recs = report.records(results)
    text, verdicts = remote_report.text(recs, sweeps, TARGETS)
    meta: dict[str, Any] = {"machine": info, "args": vars(args), "settings": cfg}
    meta["skipped"] = skipped
    meta["targets"], meta["native_after"] = verdicts, machine.native_fingerprint()
    if meta["native_after"].get("sha256") != info["native"].get("sha256"):
        text += (
            "\n\nWARNING: the fastshard native library changed during the run; numbers mix builds"
        )
    sweep_recs = [dict(r, sweep=True) for res in sweeps.values() for r in report.records(res)]
    report.write(args.out, recs + sweep_recs, meta, text, results)
    print("\n" + text + f"\n\nwrote {args.out}")
    return report.exit_code(recs + sweep_recs)
