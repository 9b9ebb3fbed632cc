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


# The fastshard row each kind of memory is compared within (loaders.RETURNS),
# and the label prefix of the raw client that writes into that kind.
SUBJECT = {"warm": "fastshard-warm", "fresh": "fastshard"}
RAW = {"warm": "ceiling-python", "fresh": "fresh-python"}


def source_table(rows: dict[str, dict[str, Any]]) -> str:
    """Every row with what it returns and the ratio of the fastshard row
    that returns the same kind of memory to it (none for curl, which keeps
    no bytes)."""
    lines = [
        "| loader | returns | median GB/s | min–max | fastshard (same memory) ÷ it | requests "
        "| client CPU s/GB | server CPU s/GB | data equal |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    order = {k: i for i, k in enumerate(report.KINDS)}
    ranked = sorted(
        rows.items(), key=lambda kv: (order.get(kv[1]["returns"], 9), -kv[1]["gbps_median"])
    )
    for name, r in ranked:
        check = "yes" if r["verified"] else "NO"
        if name.startswith("ceiling-curl") and r["verified"]:
            check = "bytes only"
        mine = rows.get(SUBJECT.get(r["returns"], ""))
        vs = mine["gbps_median"] / r["gbps_median"] if mine and r["gbps_median"] else None
        lines.append(
            f"| {name} | {r['returns']} | {r['gbps_median']:.2f} "
            f"| {r['gbps_min']:.2f}–{r['gbps_max']:.2f} | {_fmt(vs, '{:.2f}×')} "
            f"| {_fmt(r['requests'], '{:.0f}')} | {_fmt(r['client_cpu_s_per_gb'])} "
            f"| {_fmt(r['server_cpu_s_per_gb'])} | {check} |"
        )
    return "\n".join(lines)


def targets(
    by: dict[str, dict[str, dict[str, Any]]], want: dict[str, float]
) -> tuple[list[tuple[str, bool]], list[str]]:
    """(the target verdicts, INFO lines): per source and kind of memory,
    fastshard against the best raw client into that memory, in GB/s and in
    client CPU per GB; the fresh row against tensorizer and Run:ai."""
    verdicts, info = [], []
    for source, rows in by.items():
        for kind, subject in SUBJECT.items():
            mine, found = rows.get(subject), _best(rows, RAW[kind])
            if mine is None or found is None:
                continue
            name, ref = found
            label = f"[{source}] {subject} >= {want[kind]}x {name}"
            verdicts.append(
                report.verdict(label, mine["gbps_median"], ref["gbps_median"], want[kind])
            )
            cpu, ref_cpu = mine["client_cpu_s_per_gb"], ref["client_cpu_s_per_gb"]
            if cpu is not None and ref_cpu:
                verdicts.append(
                    (
                        f"[{source}] {subject} client CPU {cpu:.2f} s/GB <= {want['cpu']}x "
                        f"{name}'s {ref_cpu:.2f} = {cpu / ref_cpu:.2f}×",
                        cpu <= want["cpu"] * ref_cpu,
                    )
                )
        fs = rows.get("fastshard")
        for peer in ("tensorizer", "runai"):
            found = _best(rows, peer)
            if fs is not None and found is not None:
                name, ref = found
                label = f"[{source}] fastshard >= {want[peer]}x {name}"
                verdicts.append(
                    report.verdict(label, fs["gbps_median"], ref["gbps_median"], want[peer])
                )
        for subject in SUBJECT.values():
            if subject in rows:
                verdicts.append(
                    (f"[{source}] {subject} data equal to the source", rows[subject]["verified"])
                )
        curl = _best(rows, "ceiling-curl")
        if curl and fs is not None:
            text, _ = report.verdict(
                f"[{source}] fastshard vs {curl[0]} (to /dev/null)",
                fs["gbps_median"],
                curl[1]["gbps_median"],
                0,
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
        size = rows.get("fastshard", next(iter(rows.values())))["bytes"] / 1e9
        out += [f"### {GROUPS[source]}, model.tensors ({size:.3f} GB)\n", source_table(rows), ""]
    out.append(
        "GB/s = 10^9 bytes/s: tensor bytes for loaders, object bytes for raw clients; median "
        "(min–max) of the measured runs. CPU s/GB: CPU seconds of the client process (and its "
        "children, e.g. curl) and of the server process per GB. returns: warm = into memory "
        "already written (fastshard.load into a model; a raw client into a pre-faulted "
        "buffer), fresh = into new memory (load_state_dict, the peers, a raw client into fresh "
        "memory), none = discarded (curl, checked by bytes); rows are compared within a kind."
    )
    verdicts, info = targets(by, want)
    out += ["", *report.verdict_lines(verdicts), *info]
    for source, results in sweeps.items():
        out += ["", *sweep_text(source, results, by.get(source, {}).get("fastshard"))]
    return "\n".join(out), verdicts
