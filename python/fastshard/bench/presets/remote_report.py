"""The remote preset's report: a table per source with each row's ratio to
fastshard and the client and server CPU per GB, the targets, and the sweep's
grid with its best point against fastshard's adaptive default."""

from __future__ import annotations

from typing import Any

from .. import report
from ..measure import Results

GROUPS = {"s3": "S3: SeaweedFS", "http": "HTTP: nginx (sendfile)"}


def _best(rows: dict[str, dict[str, Any]], prefix: str) -> tuple[str, dict[str, Any]] | None:
    names = [n for n in rows if n.startswith(prefix)]
    if not names:
        return None
    best = max(names, key=lambda n: rows[n]["gbps_median"])
    return best, rows[best]


def _fmt(x: float | None, fmt: str = "{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def source_table(rows: dict[str, dict[str, Any]]) -> str:
    fs = rows["fastshard"]["gbps_median"]
    lines = [
        "| loader | median GB/s | min–max | fastshard ÷ it | requests | client CPU s/GB "
        "| server CPU s/GB | data equal |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in sorted(rows.items(), key=lambda kv: -kv[1]["gbps_median"]):
        check = "yes" if r["verified"] else "NO"
        if name.startswith("ceiling-curl") and r["verified"]:
            check = "bytes only"
        lines.append(
            f"| {name} | {r['gbps_median']:.2f} | {r['gbps_min']:.2f}–{r['gbps_max']:.2f} "
            f"| {fs / r['gbps_median']:.2f}× | {_fmt(r['requests'], '{:.0f}')} "
            f"| {_fmt(r['client_cpu_s_per_gb'])} | {_fmt(r['server_cpu_s_per_gb'])} | {check} |"
        )
    return "\n".join(lines)


def targets(
    by: dict[str, dict[str, dict[str, Any]]], want: dict[str, float]
) -> tuple[list[tuple[str, bool]], list[str]]:
    """(the target verdicts, INFO lines against raw clients into fresh memory)."""
    verdicts, info = [], []
    for source, rows in by.items():
        fs = rows["fastshard"]["gbps_median"]
        refs = [("ceiling-", "http-ceiling" if source == "http" else "ceiling")]
        if source == "s3":
            refs += [("tensorizer", "tensorizer"), ("runai", "runai")]
        for prefix, key in refs:
            found = _best(rows, prefix)
            if found:
                name, ref = found
                label = f"[{source}] fastshard >= {want[key]}x {name}"
                verdicts.append(report.verdict(label, fs, ref["gbps_median"], want[key]))
        verdicts.append(
            (f"[{source}] fastshard data equal to the source", rows["fastshard"]["verified"])
        )
        fresh = _best(rows, "fresh-")
        if fresh:
            text, _ = report.verdict(
                f"[{source}] fastshard vs {fresh[0]}", fs, fresh[1]["gbps_median"], 0
            )
            info.append(f"INFO {text}")
    return verdicts, info


def sweep_text(source: str, results: Results, default: dict[str, Any] | None) -> list[str]:
    """The grid (concurrency x part size) and where the best point and the
    adaptive default stand."""
    rows = {r["loader"]: r for r in report.records(results)}
    conc = sorted({int(n[1:].split("-p")[0]) for n in rows})
    parts = sorted({int(n.split("-p")[1]) for n in rows})
    lines = [
        f"### sweep, fastshard from {GROUPS[source]}: median GB/s (min–max)\n",
        "| concurrency \\ part size | " + " | ".join(f"{p} MiB" for p in parts) + " |",
        "|---:|" + "---:|" * len(parts),
    ]
    for c in conc:
        cells = [rows.get(f"c{c}-p{p}") for p in parts]
        lines.append(
            f"| {c} | "
            + " | ".join(
                "–"
                if r is None
                else f"{r['gbps_median']:.2f} ({r['gbps_min']:.2f}–{r['gbps_max']:.2f})"
                for r in cells
            )
            + " |"
        )
    ranked = sorted(rows, key=lambda n: -rows[n]["gbps_median"])
    top = rows[ranked[0]]["gbps_median"]
    lines += ["", f"[{source}] best: {ranked[0]} (concurrency-part MiB): {top:.2f} GB/s"]
    if default is not None:
        d = default["gbps_median"]
        lines.append(
            f"[{source}] fastshard's adaptive default: {d:.2f} GB/s = "
            f"{100 * d / top:.0f}% of the best"
        )
    near = [n for n in ranked if rows[n]["gbps_median"] >= 0.95 * top]
    lines.append(f"[{source}] within 5% of the best: " + ", ".join(near))
    return lines


def text(
    recs: list[dict[str, Any]], sweeps: dict[str, Results], want: dict[str, float]
) -> tuple[str, list[tuple[str, bool]]]:
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for r in recs:
        by.setdefault(r["source"], {})[r["loader"]] = r
    out: list[str] = []
    for source, rows in by.items():
        size = rows["fastshard"]["bytes"] / 1e9
        out += [f"### {GROUPS[source]}, model.tensors ({size:.3f} GB)\n", source_table(rows), ""]
    out.append(
        "GB/s = 10^9 bytes/s: tensor bytes for loaders, object bytes for raw clients; median "
        "(min–max) of the measured runs. CPU s/GB: CPU seconds of the client process (and its "
        "children, e.g. curl) and of the server process per GB. Raw clients into a pre-faulted "
        "buffer are the ceiling; into fresh memory, a reference. curl is checked by bytes."
    )
    verdicts, info = targets(by, want)
    out += ["", *report.verdict_lines(verdicts), *info]
    for source, results in sweeps.items():
        out += ["", *sweep_text(source, results, by.get(source, {}).get("fastshard"))]
    return "\n".join(out), verdicts
