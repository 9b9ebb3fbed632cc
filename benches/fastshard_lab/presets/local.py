"""Local files: fastshard against tensorizer, safetensors and torch.load
(``make bench``).

Cases: large (1 GiB of fp16 tensors, 64 x 16 MiB; --size) and small (10,000
fp16 tensors of 4-64 KiB each, ~0.34 GB; --small-tensors). The .tensors file
is written by tensorizer, and fastshard and tensorizer both read it (where
tensorizer's writer cannot write that many tensors, fastshard.save writes it
with an exact-size index, and a note says so). Every load runs in a fresh
process from a warm page cache; one warm-up round is followed by --runs
measured rounds in alternating order. Compare ratios from one run.

Prints a table per case and the targets as PASS/FAIL lines (fastshard at
least 1.5x tensorizer and 1.0x safetensors on the large case; its peak RSS
growth at most the model's bytes + 256 MiB; its data equal to the source).
--no-thp runs every loader with transparent huge pages disabled
(prctl PR_SET_THP_DISABLE), to tell page-fault effects from the loaders' work.
"""

from __future__ import annotations

import argparse
import gc
from pathlib import Path
from typing import Any

from .. import deps, machine, measure, report
from ..params import BENCH_DIR, GiB, MiB, add_out, names, size_arg

CASES = {"large": "fp16 tensors of 16 MiB", "small": "fp16 tensors of 4-64 KiB"}
LOADERS = ("fastshard", "tensorizer", "safetensors", "torch")
FORMAT = {"fastshard": "tensorizer", "tensorizer": "tensorizer"}  # both read tensorizer's file
TARGETS = {"tensorizer": 1.5, "safetensors": 1.0}  # fastshard ÷ peer, large case
RSS_SLACK = 256 * MiB  # a load's peak RSS growth <= model bytes + this


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", default="large,small", help="comma-separated: large,small")
    p.add_argument("--loaders", default=",".join(LOADERS), help="comma-separated loader names")
    p.add_argument("--runs", type=int, default=5, help="measured rounds after the warm-up")
    measure.add_warmup_flag(p)
    p.add_argument("--size", type=size_arg, default=GiB, help="the large case (default 1GiB)")
    p.add_argument("--small-tensors", type=int, default=10_000, help="the small case's count")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scratch", type=Path, default=BENCH_DIR / "local", help="where the files go")
    add_out(p, str(BENCH_DIR / "local"))
    p.add_argument("--keep-files", action="store_true", help="keep the written files afterwards")
    p.add_argument(
        "--no-thp",
        action="store_true",
        help="run every loader with transparent huge pages disabled (prctl PR_SET_THP_DISABLE)",
    )


def requires(args: argparse.Namespace) -> list[str]:
    return ["torch"]


def _warm(path: Path) -> None:
    """Read a file once so that every loader starts from a warm page cache."""
    buf = bytearray(16 * MiB)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def _case(name: str, args: argparse.Namespace, loaders: list[str]) -> dict[str, Any]:
    """Write one case's files, load them in rounds; its results and files."""
    from .. import workload

    shape, size = ("uniform", args.size)
    if name == "small":
        shape, size = "experts", args.small_tensors * workload.EXPERT_MEAN
    sd = workload.state_dict(shape, size, args.seed)
    print(f"\n## {name}: {len(sd):,} {CASES[name]}, {workload.total_bytes(sd) / 1e9:.3f} GB")
    formats = tuple(sorted({FORMAT.get(n, n) for n in loaders}))
    objects = workload.write_objects(sd, args.scratch / name, formats)
    expect, model_bytes = workload.digest(sd), workload.total_bytes(sd)
    del sd
    gc.collect()
    cases = []
    for loader in loaders:
        path = objects[FORMAT.get(loader, loader)]
        _warm(path)
        spec = {"loader": loader, "uri": str(path), "path": str(path), "no_thp": args.no_thp}
        cases.append(measure.Case(name, loader, spec, expect))
    results = measure.rounds(cases, args.runs, args.seed, warmup=args.warmup)
    return {"results": results, "objects": objects, "model_bytes": model_bytes}


def targets(name: str, recs: list[dict[str, Any]], model_bytes: int) -> list[tuple[str, bool]]:
    by = {r["loader"]: r for r in recs}
    fs = by.get("fastshard")
    if fs is None:
        return []
    out = []
    for peer, want in TARGETS.items():
        if name == "large" and peer in by:
            label = f"[{name}] fastshard >= {want:.1f}x {peer}"
            out.append(report.verdict(label, fs["gbps_median"], by[peer]["gbps_median"], want))
    limit = model_bytes + RSS_SLACK
    growth = fs["rss_growth_bytes"]
    out.append(
        (
            f"[{name}] fastshard peak RSS growth <= model + 256 MiB: "
            f"{growth / MiB:,.0f} MiB <= {limit / MiB:,.0f} MiB",
            growth <= limit,
        )
    )
    out.append((f"[{name}] fastshard data equal to the source", fs["verified"]))
    return out


def run(args: argparse.Namespace) -> int:
    cases = names(args.cases)
    for c in cases:
        if c not in CASES:
            raise SystemExit(f"unknown case {c!r}; choose from {', '.join(CASES)}")
    skipped: dict[str, str] = {}
    loaders = deps.runnable([n for n in names(args.loaders) if n in LOADERS], skipped)
    if not loaders or "fastshard" not in loaders or args.runs < 1:
        raise SystemExit("--loaders must include fastshard, and --runs must be at least 1")
    info = machine.describe()
    print("# fastshard local-file benchmark\n" + "\n".join(machine.header(info)))
    recs: list[dict[str, Any]] = []
    text: list[str] = []
    verdicts: list[tuple[str, bool]] = []
    for name in cases:
        done = _case(name, args, loaders)
        case_recs = report.records(done["results"])
        recs += case_recs
        objs = done["objects"]
        writers = ", ".join(f"{objs[fmt].name}: {w}" for fmt, w in objs.writers.items())
        text += [f"### {name}: {done['model_bytes'] / 1e9:.3f} GB ({writers})", ""]
        text += [report.table(case_recs)] + [f"\nNote: {n}" for n in objs.notes] + [""]
        verdicts += targets(name, case_recs, done["model_bytes"])
        if not args.keep_files:
            for path in objs.paths.values():
                path.unlink(missing_ok=True)
    body = "\n".join(text + report.verdict_lines(verdicts))
    meta = {"machine": info, "args": vars(args), "skipped": skipped, "targets": verdicts}
    report.write(args.out, recs, meta, body)
    print("\n" + body + f"\n\nwrote {args.out}")
    return report.exit_code(recs)
