"""Turning measurements into ``results.json``, a markdown table with
ratios, and PNG plots (matplotlib, no display needed)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

PEERS = ("ceiling", "tensorizer", "runai", "safetensors", "torch")
GB = 1e9


def records(results: dict[tuple[str, str], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One record per (source, loader): median/min/max GB/s of the measured
    runs, peak RSS, bytes fetched, staging peak, and whether every run
    (warm-up included) returned the expected data."""
    out = []
    for (source, loader), runs in results.items():
        measured = [r for r in runs if not r.get("warmup")] or runs
        rates = [r["gbps"] for r in measured]
        out.append(
            {
                "source": source,
                "loader": loader,
                "gbps_median": statistics.median(rates),
                "gbps_min": min(rates),
                "gbps_max": max(rates),
                "runs": len(measured),
                "peak_rss_bytes": max(r["peak_rss_bytes"] for r in measured),
                "rss_growth_bytes": max(
                    r["peak_rss_bytes"] - r.get("rss_before_bytes", 0) for r in measured
                ),
                "bytes_fetched": int(statistics.median(r["bytes_fetched"] for r in measured)),
                "bytes": measured[0]["bytes"],
                "staging_peak_bytes": max(r.get("staging_peak_bytes", 0) for r in measured),
                "verified": all(r["verified"] for r in runs),
            }
        )
    return out


def table(recs: list[dict[str, Any]]) -> str:
    """Markdown: per source, each loader's GB/s and its ratio to the
    ceiling; then fastshard's ratio to each peer."""
    lines = [
        "| source | loader | GB/s median (min–max) | × ceiling | peak RSS MiB | staging MiB "
        "| fetched MiB | ok |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    ratios: list[str] = []
    for source in sorted({r["source"] for r in recs}):
        rows = [r for r in recs if r["source"] == source]
        by = {r["loader"]: r for r in rows}
        ceiling = by.get("ceiling", {}).get("gbps_median")
        for r in sorted(rows, key=lambda r: -r["gbps_median"]):
            vs = f"{r['gbps_median'] / ceiling:.2f}" if ceiling else "–"
            lines.append(
                f"| {source} | {r['loader']} | {r['gbps_median']:.2f} "
                f"({r['gbps_min']:.2f}–{r['gbps_max']:.2f}) | {vs} | "
                f"{r['peak_rss_bytes'] / 2**20:.0f} | "
                f"{r['staging_peak_bytes'] / 2**20:.0f} | {r['bytes_fetched'] / 2**20:.0f} | "
                f"{'yes' if r['verified'] else 'NO'} |"
            )
        fs = by.get("fastshard")
        if fs:
            parts = [
                f"{fs['gbps_median'] / by[p]['gbps_median']:.2f}× {p}"
                for p in PEERS
                if p in by and by[p]["gbps_median"] > 0
            ]
            ratios.append(f"- {source}: fastshard = " + ", ".join(parts))
    return "\n".join(lines + [""] + ratios)


def write_json(out: Path, recs: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    (out / "results.json").write_text(json.dumps(recs, indent=1))
    (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str))


def plots(
    out: Path,
    recs: list[dict[str, Any]],
    sweep: dict[str, list[tuple[int, float]]],
    timelines: dict[str, list[tuple[float, int]]],
    title: str,
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    sources = sorted({r["source"] for r in recs})
    loaders = sorted({r["loader"] for r in recs})
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(1, len(loaders))
    for i, loader in enumerate(loaders):
        xs, ys = [], []
        for j, source in enumerate(sources):
            rec = next((r for r in recs if r["source"] == source and r["loader"] == loader), None)
            if rec:
                xs.append(j + i * width)
                ys.append(rec["gbps_median"])
        ax.bar(xs, ys, width, label=loader)
    ax.set_xticks([j + width * (len(loaders) - 1) / 2 for j in range(len(sources))], sources)
    ax.set_ylabel("GB/s (median)")
    ax.set_title(f"Load throughput per loader and source\n{title}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    made.append(out / "throughput.png")
    fig.savefig(made[-1], dpi=110)
    plt.close(fig)

    if sweep:
        fig, axes = plt.subplots(1, len(sweep), figsize=(9, 3.8), squeeze=False)
        for ax, (knob, points) in zip(axes[0], sorted(sweep.items()), strict=True):
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o")
            ax.set_xscale("log", base=2)
            ax.set_xlabel(knob)
            ax.set_ylabel("GB/s")
            ax.set_title(f"fastshard: GB/s vs {knob}", fontsize=9)
        fig.tight_layout()
        made.append(out / "sweep.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)

    if timelines:
        fig, ax = plt.subplots(figsize=(9, 3.8))
        for label, points in sorted(timelines.items()):
            ax.plot([p[0] for p in points], [p[1] / 2**20 for p in points], label=label)
        ax.set_xlabel("seconds since the process started")
        ax.set_ylabel("RSS MiB")
        ax.set_title("Memory over one load (process start, imports, load)", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        made.append(out / "memory.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    return made


def save_runs(
    out: Path, title: str, text: str, results: dict[tuple[str, str], list[dict[str, Any]]]
) -> int:
    """For the single-purpose benches (benches/bench_*.py): ``text`` to
    table.md, every run to results.json; 1 when any load returned other
    bytes than the source's (then the numbers mean nothing), else 0."""
    (out / "table.md").write_text(text)
    runs = {f"{s}/{n}": r for (s, n), r in results.items()}
    (out / "results.json").write_text(json.dumps({"title": title, "runs": runs}, indent=1))
    bad = [f"{s}/{n}" for (s, n), r in results.items() if not all(x["verified"] for x in r)]
    if bad:
        print(f"MISMATCH: {bad}")
        return 1
    return 0
