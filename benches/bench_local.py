"""Local-file benchmark: fastshard against tensorizer, safetensors and torch.load.

Cases (issue 2):
  large  1 GiB of fp16 tensors, 64 x 16 MiB
  small  10,000 fp16 tensors of 4-64 KiB each (~0.34 GB)

Every load runs in a fresh Python process (so its peak RSS belongs to one loader), from a
warm page cache. One warm-up round (which also checks what each loader returned against the
source) is followed by --runs measured rounds; within a round the loaders take turns in a
rotating order, so machine noise spreads over all of them. All loaders run in ONE invocation:
compare ratios from the same run, not absolute numbers across runs.

Prints a markdown table per case, the issue's targets as PASS/FAIL lines, and writes every
measurement to .bench/results-local.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from loaders import LOADERS, describe, run_child, versions  # noqa: E402
from workloads import (  # noqa: E402
    SCRATCH,
    GiB,
    MiB,
    many_small_state_dict,
    uniform_state_dict,
    warm_page_cache,
    write_all,
)

CASES = {
    "large": ("1 GiB: 64 fp16 tensors of 16 MiB", lambda: uniform_state_dict(64, (2048, 4096))),
    "small": ("10,000 fp16 tensors of 4-64 KiB", lambda: many_small_state_dict(10_000)),
}
# Targets from issue 2, for fastshard.
TARGET_VS_TENSORIZER = 1.5  # on the 1 GiB case
TARGET_VS_SAFETENSORS = 1.0  # on the 1 GiB case
TARGET_RSS_SLACK = 256 * MiB  # load's peak RSS growth <= model bytes + this


def prepare(case: str, folder: Path, formats: list[str]) -> dict:
    title, build = CASES[case]
    print(f"\n## {case}: {title}", flush=True)
    start = time.perf_counter()
    sd = build()
    print(f"  generated {len(sd):,} tensors in {time.perf_counter() - start:.1f} s", flush=True)
    written = write_all(sd, folder, formats)
    del sd
    gc.collect()
    return written.to_json()


def bench_case(case: str, written: dict, loaders: list[str], runs: int, no_thp: bool) -> dict:
    for path in written["files"].values():
        warm_page_cache(path)
    samples: dict[str, list[dict]] = {name: [] for name in loaders}
    checks: dict[str, str] = {}
    for rnd in range(1 + runs):
        order = loaders[rnd % len(loaders) :] + loaders[: rnd % len(loaders)]
        for name in order:
            path = written["files"][LOADERS[name][1]]
            res = run_child(name, path, want_digest=rnd == 0, no_thp=no_thp)
            if rnd == 0:
                ok = res["digest"] == written["digest"] and res["bytes"] == written["model_bytes"]
                checks[name] = "yes" if ok else "MISMATCH"
                label = "warm-up"
            else:
                samples[name].append(res)
                label = f"run {rnd}/{runs}"
            gbps = res["bytes"] / res["seconds"] / 1e9
            print(f"  {label:>9} {name:<12} {res['seconds']:7.3f} s {gbps:6.2f} GB/s", flush=True)
    return {"samples": samples, "checks": checks}


def summarize(written: dict, measured: dict) -> dict[str, dict]:
    rows = {}
    for name, samples in measured["samples"].items():
        gbps = [s["bytes"] / s["seconds"] / 1e9 for s in samples]
        growth = [s["peak_rss"] - s["rss_before"] for s in samples]
        rows[name] = {
            "median_gbps": statistics.median(gbps),
            "min_gbps": min(gbps),
            "max_gbps": max(gbps),
            "median_seconds": statistics.median(s["seconds"] for s in samples),
            "peak_rss_growth": max(growth),
            "peak_rss_over_model": max(growth) - written["model_bytes"],
            "process_max_rss": max(s["process_max_rss"] for s in samples),
            "peak_is_load_only": all(s["peak_is_load_only"] for s in samples),
            "verified": measured["checks"].get(name, "not checked"),
        }
    return rows


def table(written: dict, rows: dict[str, dict]) -> str:
    fs = rows.get("fastshard")
    lines = [
        "| loader | reads file written by | median GB/s | min-max GB/s | fastshard / loader "
        "| peak RSS growth (MiB) | growth - model (MiB) | process max RSS (MiB) | data equal |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in rows.items():
        ratio = f"{fs['median_gbps'] / r['median_gbps']:.2f}x" if fs else "-"
        writer = written["writers"][LOADERS[name][1]]
        lines.append(
            f"| {describe(name)} | {writer} | {r['median_gbps']:.2f} "
            f"| {r['min_gbps']:.2f}-{r['max_gbps']:.2f} | {ratio} "
            f"| {r['peak_rss_growth'] / MiB:,.0f} | {r['peak_rss_over_model'] / MiB:+,.0f} "
            f"| {r['process_max_rss'] / MiB:,.0f} | {r['verified']} |"
        )
    return "\n".join(lines)


def targets(case: str, written: dict, rows: dict[str, dict]) -> list[tuple[str, bool]]:
    fs = rows.get("fastshard")
    if not fs:
        return []
    out = []
    if case == "large":
        for peer, want in (
            ("tensorizer", TARGET_VS_TENSORIZER),
            ("safetensors", TARGET_VS_SAFETENSORS),
        ):
            if peer in rows:
                ratio = fs["median_gbps"] / rows[peer]["median_gbps"]
                out.append(
                    (f"[{case}] fastshard >= {want:.1f}x {peer}: {ratio:.2f}x", ratio >= want)
                )
    limit = written["model_bytes"] + TARGET_RSS_SLACK
    out.append(
        (
            f"[{case}] fastshard peak RSS growth <= model + 256 MiB: "
            f"{fs['peak_rss_growth'] / MiB:,.0f} MiB <= {limit / MiB:,.0f} MiB",
            fs["peak_rss_growth"] <= limit,
        )
    )
    out.append(
        (f"[{case}] fastshard data equal to the source: {fs['verified']}", fs["verified"] == "yes")
    )
    return out


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def machine() -> dict:
    return {
        "thp_enabled": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "loadavg_before": os.getloadavg(),
        "mem_total_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB,
        "versions": versions(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--cases", default="large,small", help="comma-separated: large,small")
    p.add_argument("--loaders", default=",".join(LOADERS), help="comma-separated loader names")
    p.add_argument("--runs", type=int, default=5, help="measured rounds after the warm-up")
    p.add_argument("--scratch", type=Path, default=SCRATCH / "local", help="where files go")
    p.add_argument("--out", type=Path, default=SCRATCH / "results-local.json")
    p.add_argument("--keep-files", action="store_true", help="keep the written files afterwards")
    p.add_argument(
        "--no-thp",
        action="store_true",
        help="run every loader with transparent huge pages disabled (prctl PR_SET_THP_DISABLE)",
    )
    args = p.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    loaders = [x for x in args.loaders.split(",") if x]
    for name in cases:
        if name not in CASES:
            p.error(f"unknown case {name!r}; choose from {', '.join(CASES)}")
    for name in loaders:
        if name not in LOADERS:
            p.error(f"unknown loader {name!r}; choose from {', '.join(LOADERS)}")
    if args.runs < 1:
        p.error("--runs must be at least 1")

    info = machine()
    print("# fastshard local-file benchmark")
    print(f"machine: {info['cpus']} CPUs, {info['mem_total_gib']:.0f} GiB, {info['platform']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
    print(f"{args.runs} measured runs per loader after 1 warm-up, each in a fresh process")

    thp = "disabled in every loader's process" if args.no_thp else "as the system sets it"
    print(f"transparent huge pages: {thp}")
    results: dict = {"machine": info, "runs": args.runs, "no_thp": args.no_thp, "cases": {}}
    report: list[str] = []
    verdicts: list[tuple[str, bool]] = []
    formats = sorted({LOADERS[name][1] for name in loaders})
    for case in cases:
        folder = args.scratch / case
        written = prepare(case, folder, formats)
        measured = bench_case(case, written, loaders, args.runs, args.no_thp)
        rows = summarize(written, measured)
        results["cases"][case] = {"written": written, "summary": rows, **measured}
        title = CASES[case][0]
        report.append(f"### {case}: {title}, {written['model_bytes'] / 1e9:.3f} GB\n")
        report.append(table(written, rows))
        report.extend(f"\nNote: {note}" for note in written["notes"])
        report.append("")
        verdicts.extend(targets(case, written, rows))
        if not args.keep_files:
            for path in written["files"].values():
                Path(path).unlink(missing_ok=True)

    print("\n" + "\n".join(report))
    print(
        "GB/s = 10^9 bytes/s. Peak RSS growth = the child's peak RSS during the load (VmHWM, "
        "reset just before it) minus its RSS before the load; process max RSS includes "
        "the interpreter and torch."
    )
    for line, ok in verdicts:
        print(f"{'PASS' if ok else 'FAIL'} {line}")
    results["targets"] = [{"target": line, "pass": ok} for line, ok in verdicts]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    # Speed targets are reported, not enforced; wrong data is an error.
    mismatched = [
        f"{case}/{name}"
        for case, res in results["cases"].items()
        for name, check in res["checks"].items()
        if check != "yes"
    ]
    if mismatched:
        print(f"error: loaded data differs from the source: {', '.join(mismatched)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
