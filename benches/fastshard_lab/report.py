"""Turning measurements into records, a markdown table with ratios, and the
files every preset writes to its ``--out`` folder: ``results.json`` (one
record per source and loader), ``runs.json`` (every run), ``meta.json``
(machine, versions, arguments, what was skipped) and ``table.md``."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .measure import Results, measured

PEERS = ("ceiling", "tensorizer", "runai", "safetensors", "fastsafetensors", "torch")
MiB = 1 << 20
# What a loader returns (loaders.RETURNS), in table order, and for each kind
# the fastshard row and the raw client row that the kind's rows are compared
# with: like with like, never across kinds.
KINDS = ("warm", "fresh", "mapped", "device", "none")
SUBJECTS = {"warm": "fastshard-warm", "fresh": "fastshard", "mapped": "fastshard-mmap"}
RAW_OF = {"warm": "ceiling", "fresh": "ceiling-fresh"}


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def _per_gb(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] / (r["bytes"] / 1e9) for r in runs if r.get(key) is not None and r["bytes"]]
    return statistics.median(values) if values else None


def record(source: str, loader: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The measured runs of one (source, loader) summarised; ``verified``
    covers the warm-up too."""
    counted = measured(runs)
    rates = [r["gbps"] for r in counted]
    return {
        "source": source,
        "loader": loader,
        "gbps_median": statistics.median(rates),
        "gbps_min": min(rates),
        "gbps_max": max(rates),
        "seconds_median": statistics.median(r["seconds"] for r in counted),
        "runs": len(counted),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in counted),
        "rss_growth_bytes": max(r["peak_rss_bytes"] - r["rss_before_bytes"] for r in counted),
        "process_max_rss_bytes": max(r.get("process_max_rss_bytes", 0) for r in counted),
        "bytes_fetched": int(statistics.median(r["bytes_fetched"] for r in counted)),
        "bytes": counted[0]["bytes"],
        "staging_peak_bytes": max(r.get("staging_peak_bytes", 0) for r in counted),
        "client_cpu_s_per_gb": _per_gb(counted, "cpu_seconds"),
        "server_cpu_s_per_gb": _per_gb(counted, "server_cpu_seconds"),
        "requests": _median(counted, "requests"),
        "concurrency": _median(counted, "concurrency"),
        # What the reads decided on their own, in the last run (words).
        "adaptations": counted[-1].get("adaptations", []),
        "returns": counted[0].get("returns", "fresh"),
        "verified": all(r["verified"] for r in runs),
    }


def records(results: Results) -> list[dict[str, Any]]:
    return [record(s, n, runs) for (s, n), runs in results.items() if runs]


def _cell(x: float | None, fmt: str = "{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def table(recs: list[dict[str, Any]], subject: str = "fastshard") -> str:
    """Markdown: per source, each loader's GB/s, what it returns, its ratio
    to the raw client that returns the same kind of memory, memory, bytes
    fetched and CPU per GB; then, per kind, fastshard's row against the
    others of that kind (``subject`` names the fresh one)."""
    lines = [
        "| source | loader | returns | GB/s median (min–max) | × raw, same memory | peak RSS MiB "
        "| RSS growth MiB | staging MiB | fetched MiB | client CPU s/GB | ok |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    ratios: list[str] = []
    order = {k: i for i, k in enumerate(KINDS)}
    for source in sorted({r["source"] for r in recs}):
        rows = [r for r in recs if r["source"] == source]
        by = {r["loader"]: r for r in rows}
        for r in sorted(rows, key=lambda r: (order.get(r["returns"], 9), -r["gbps_median"])):
            raw = by.get(RAW_OF.get(r["returns"], ""), {}).get("gbps_median")
            vs = r["gbps_median"] / raw if raw else None
            lines.append(
                f"| {source} | {r['loader']} | {r['returns']} | {r['gbps_median']:.2f} "
                f"({r['gbps_min']:.2f}–{r['gbps_max']:.2f}) | {_cell(vs)} | "
                f"{r['peak_rss_bytes'] / MiB:.0f} | {r['rss_growth_bytes'] / MiB:.0f} | "
                f"{r['staging_peak_bytes'] / MiB:.0f} | {r['bytes_fetched'] / MiB:.0f} | "
                f"{_cell(r['client_cpu_s_per_gb'])} | {'yes' if r['verified'] else 'NO'} |"
            )
        ratios += [f"- {source}: {text}" for text in comparisons(rows, subject)]
    legend = (
        "returns: warm = into private memory already written (a model's parameters, a "
        "pre-faulted buffer); fresh = copied into new private memory (its first-touch page "
        "faults included); mapped = views of the file's page cache (copy-on-write), every "
        "page touched; none = bytes discarded. Ratios compare rows of one kind only."
    )
    return "\n".join(lines + ["", *ratios, "", legend])


def comparisons(rows: list[dict[str, Any]], subject: str = "fastshard") -> list[str]:
    """Per kind of memory, fastshard's row against every other row of that
    kind, and its client CPU per GB against the raw client's of that kind:
    ``fresh: fastshard = 0.72× ceiling-fresh, 1.42× tensorizer; client CPU
    1.05× ceiling-fresh``."""
    out = []
    for kind in KINDS:
        name = subject if kind == "fresh" else SUBJECTS.get(kind)
        same = {r["loader"]: r for r in rows if r["returns"] == kind}
        if name not in same:
            continue
        mine = same[name]
        others = [r for n, r in same.items() if n != name and "-tp" not in n]
        if not others:
            continue
        others.sort(key=lambda r: (r["loader"] != RAW_OF.get(kind), -r["gbps_median"]))
        text = f"{kind}: {name} = " + ", ".join(
            f"{mine['gbps_median'] / r['gbps_median']:.2f}× {r['loader']}"
            for r in others
            if r["gbps_median"] > 0
        )
        raw = same.get(RAW_OF.get(kind, ""))
        if raw and raw["client_cpu_s_per_gb"] and mine["client_cpu_s_per_gb"] is not None:
            cpu = mine["client_cpu_s_per_gb"] / raw["client_cpu_s_per_gb"]
            text += f"; client CPU {cpu:.2f}× {raw['loader']}"
        out.append(text)
    return out


def verdict(label: str, have: float, ref: float, want: float) -> tuple[str, bool]:
    """A target line: ``label: have / ref GB/s = ratio×`` and whether it holds."""
    ratio = have / ref if ref else 0.0
    return f"{label}: {have:.2f} / {ref:.2f} GB/s = {ratio:.2f}×", ratio >= want


def verdict_lines(verdicts: list[tuple[str, bool]]) -> list[str]:
    return [f"{'PASS' if ok else 'FAIL'} {text}" for text, ok in verdicts]


def write(
    out: Path,
    recs: list[dict[str, Any]],
    meta: dict[str, Any],
    text: str,
    results: Results | None = None,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(recs, indent=1))
    (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    (out / "table.md").write_text(text.rstrip() + "\n")
    if results is not None:
        runs = {f"{s}/{n}": rs for (s, n), rs in results.items()}
        (out / "runs.json").write_text(json.dumps(runs, indent=1, default=str))


def exit_code(recs: list[dict[str, Any]], log: Callable[[str], None] = print) -> int:
    """1 when any load returned other bytes than the source's (then the
    numbers mean nothing), else 0; speed targets are reported, not enforced."""
    bad = [f"{r['source']}/{r['loader']}" for r in recs if not r["verified"]]
    if bad:
        log(f"error: loaded data differs from the source: {', '.join(bad)}")
        return 1
    return 0
