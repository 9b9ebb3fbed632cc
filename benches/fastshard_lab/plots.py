"""PNG plots of a run (matplotlib, no display needed): throughput per
loader and source, fastshard's throughput against concurrency and part size,
and RSS over one load. The default preset draws all three into its --out;
a recorded run (record.py) gets the throughput chart of its results.json,
drawn by the same function, whatever its preset. The dependency check
(deps.py) has made sure matplotlib is there before anything ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

Points = dict[str, list[tuple[int, float]]]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plottable(recs: Any) -> list[dict[str, Any]]:
    """The records a throughput chart shows: one per source and loader with
    a median GB/s (a sweep's extra records left out); [] when ``recs`` is
    not such a list (a preset whose results.json is something else)."""
    if not isinstance(recs, list):
        return []
    return [
        r
        for r in recs
        if isinstance(r, dict)
        and {"source", "loader", "gbps_median"} <= r.keys()
        and not r.get("sweep")
    ]


def throughput(path: Path, recs: list[dict[str, Any]], title: str) -> Path:
    """Bars of median GB/s: a group per source, a bar per loader, both in
    the order of ``recs`` (the order the preset measured and tabled them)."""
    plt = _pyplot()
    sources = list(dict.fromkeys(r["source"] for r in recs))
    loaders = list(dict.fromkeys(r["loader"] for r in recs))
    kinds = {r["loader"]: r.get("returns", "fresh") for r in recs}
    several_kinds = len(set(kinds.values())) > 1
    fig, ax = plt.subplots(figsize=(max(8.0, 1.3 * len(sources) + 3), 4.8))
    width = 0.8 / max(1, len(loaders))
    for i, loader in enumerate(loaders):
        xs, ys = [], []
        for j, source in enumerate(sources):
            rec = next((r for r in recs if r["source"] == source and r["loader"] == loader), None)
            if rec:
                xs.append(j + i * width)
                ys.append(rec["gbps_median"])
        label = f"{loader} ({kinds[loader]})" if several_kinds else loader
        ax.bar(xs, ys, width, label=label)
    ticks = [j + width * (len(loaders) - 1) / 2 for j in range(len(sources))]
    ax.set_xticks(ticks, sources, rotation=15 if len(sources) > 3 else 0, fontsize=8)
    ax.set_ylabel("GB/s (median)")
    ax.set_title(f"Load throughput per loader and source\n{title}", fontsize=9)
    ax.legend(fontsize=7, ncol=2 if len(loaders) > 6 else 1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sweep_points(raw: Any) -> Points:
    """The default preset's sweep as meta.json keeps it (``{"source",
    knob: value, "gbps"}`` per load) → knob → [(value, GB/s)]."""
    points: Points = {}
    for entry in raw if isinstance(raw, list) else []:
        knobs = [k for k in entry if k not in ("source", "gbps")]
        if len(knobs) == 1 and "gbps" in entry:
            points.setdefault(knobs[0], []).append((entry[knobs[0]], entry["gbps"]))
    return points


def sweep(path: Path, points: Points) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(points), figsize=(9, 3.8), squeeze=False)
    for ax, (knob, values) in zip(axes[0], sorted(points.items()), strict=True):
        ax.plot([p[0] for p in values], [p[1] for p in values], marker="o")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(knob)
        ax.set_ylabel("GB/s")
        ax.set_title(f"fastshard: GB/s vs {knob}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def memory(path: Path, timelines: dict[str, list[tuple[float, int]]]) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.8))
    for label, samples in sorted(timelines.items()):
        ax.plot([t for t, _ in samples], [rss / 2**20 for _, rss in samples], label=label)
    ax.set_xlabel("seconds since the process started")
    ax.set_ylabel("RSS MiB")
    ax.set_title("Memory over one load (process start, imports, load)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw(
    out: Path,
    recs: list[dict[str, Any]],
    points: Points,
    timelines: dict[str, list[tuple[float, int]]],
    title: str,
) -> list[Path]:
    """The default preset's three plots into ``out``."""
    made = [throughput(out / "throughput.png", plottable(recs), title)]
    if points:
        made.append(sweep(out / "sweep.png", points))
    if timelines:
        made.append(memory(out / "memory.png", timelines))
    return made
