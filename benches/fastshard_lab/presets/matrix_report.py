"""The matrix preset's grid (row → setting → cell), its tables and its JSON.
Torch-free: the grid is built from the measured runs' plain numbers."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from ..measure import Results, measured
from ..params import MiB

# label → fastshard options; "default" sets none (fastshard picks both).
SETTINGS: list[tuple[str, dict[str, int]]] = [
    ("default", {}),
    *(
        (f"{n}x{mib}MiB", {"concurrency": n, "part_size_bytes": mib * MiB})
        for n, mib in ((64, 4), (16, 16), (8, 32), (4, 64))
    ),
]
FIXED = [label for label, opts in SETTINGS if opts]
RAW = "raw-64"  # 64 ranged GETs into fresh memory (raw.py), told the object's size
# The same after learning the size with a one-byte ranged GET, as a client
# given only the URI must: the round trip fastshard's open makes too.
RAW_SIZED = "raw-64-sized"
COLUMNS = [label for label, _ in SETTINGS] + [RAW, RAW_SIZED]
# A cell's medians over its measured runs: the load's, and LoadStats'.
KEYS = ("seconds", "requests", "concurrency", "retries", "bytes_fetched", "cpu_seconds")


def _cell(runs: list[dict[str, Any]]) -> dict[str, Any]:
    counted = measured(runs)
    cell: dict[str, Any] = {
        "gbps": statistics.median(r["gbps"] for r in counted),
        "gbps_runs": [r["gbps"] for r in counted],
        "verified": all(r["verified"] for r in runs),  # the warm-up too
    }
    for key in (*KEYS, "server_cpu_seconds"):
        values = [r[key] for r in counted if r.get(key) is not None]
        if values:
            cell[key] = statistics.median(values)
    return cell


def grid(
    results: Results, rows: dict[str, dict[str, Any]], errors: dict[str, str]
) -> list[dict[str, Any]]:
    """One entry per row, in the order measured: its cells (each setting's
    medians, or the error that stopped it) and the two ratios."""
    out = []
    for row, about in rows.items():
        cells: dict[str, Any] = {}
        for label in COLUMNS:
            if f"{row}/{label}" in errors:
                cells[label] = {"error": errors[f"{row}/{label}"]}
            elif results.get((row, label)):
                cells[label] = _cell(results[(row, label)])
        entry = {"row": row, **about, "cells": cells}
        rate = {k: c["gbps"] for k, c in cells.items() if "gbps" in c}
        fixed = [k for k in FIXED if k in rate]
        best = max(fixed, key=rate.__getitem__) if fixed else None
        entry["best_fixed"] = best
        entry["default_over_best_fixed"] = (
            rate["default"] / rate[best] if best and "default" in rate and rate[best] else None
        )
        default = rate.get("default")
        for key, raw in (("default_over_raw", RAW), ("default_over_raw_sized", RAW_SIZED)):
            entry[key] = default / rate[raw] if default and rate.get(raw) else None
        out.append(entry)
    return out


def _gbps(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "–"
    if "error" in cell:
        return "failed"
    return f"{cell['gbps']:.3f}" + ("" if cell["verified"] else " MISMATCH")


def _ratio(x: float | None, note: str = "") -> str:
    return "–" if x is None else f"{x:.2f}×" + (f" ({note})" if note else "")


def _rates(entries: list[dict[str, Any]]) -> list[str]:
    head = ["store / proxy", *COLUMNS, "default ÷ best fixed", "default ÷ raw", "÷ raw-sized"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for e in entries:
        cells = [_gbps(e["cells"].get(label)) for label in COLUMNS]
        ratios = [
            _ratio(e["default_over_best_fixed"], e["best_fixed"] or ""),
            _ratio(e["default_over_raw"]),
            _ratio(e.get("default_over_raw_sized")),
        ]
        lines.append("| " + " | ".join([e["row"], *cells, *ratios]) + " |")
    return lines


def _stats(entries: list[dict[str, Any]]) -> list[str]:
    """Each fastshard cell's requests / most in flight (LoadStats), and the
    default's mean request size."""
    labels = [label for label, _ in SETTINGS]
    head = ["store / proxy", *labels, "default mean request MiB"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for e in entries:
        row = [e["row"]]
        for label in labels:
            c = e["cells"].get(label, {})
            row.append(
                f"{c['requests']:.0f} / {c['concurrency']:.0f}"
                if "requests" in c and "concurrency" in c
                else "–"
            )
        d = e["cells"].get("default", {})
        mean = d["bytes_fetched"] / d["requests"] / MiB if d.get("requests") else None
        row.append("–" if mean is None else f"{mean:.1f}")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _cpu(entries: list[dict[str, Any]]) -> list[str]:
    """Who spent the CPU: the client (each load's process) and the store or
    proxy (its process; the Python proxy's is this process's)."""
    out = []
    for e in entries:
        parts = []
        for label in ("default", RAW):
            c = e["cells"].get(label, {})
            if "cpu_seconds" in c:
                srv = c.get("server_cpu_seconds")
                who = f", {e['cpu_of']} {srv:.2f} s" if srv is not None else ""
                parts.append(f"{label}: client {c['cpu_seconds']:.2f} s{who}")
        if parts:
            out.append(f"- {e['row']}: " + "; ".join(parts))
        if e.get("proxy_stats"):
            out.append(f"  proxy counters: {e['proxy_stats']}")
    return out


def text(args: argparse.Namespace, entries: list[dict[str, Any]], size: int) -> str:
    title = (
        f"{size / MiB:.0f} MiB tensorizer object, GB/s (median of {args.runs}); proxies in front "
        f"of SeaweedFS: {args.latency_ms:.0f} ms first byte, {args.conn_mbps:.0f} MB/s per "
        f"connection; *-service: + {args.service_ms:.0f} ms per request, {args.service_slots} "
        "at a time"
    )
    return "\n".join(
        [
            title,
            "",
            *_rates(entries),
            "",
            "requests / most in flight (LoadStats, median):",
            "",
            *_stats(entries),
            "",
            "CPU seconds per load (median):",
            "",
            *_cpu(entries),
        ]
    )


def write_json(path: Path, entries: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    body = {"columns": COLUMNS, "settings": dict(SETTINGS), "rows": entries, **meta}
    path.write_text(json.dumps(body, indent=1, default=str))
