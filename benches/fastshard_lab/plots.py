"""PNG plots of a run (matplotlib, no display needed): throughput per
loader and source, fastshard's throughput against concurrency and part size,
and RSS over one load. Only the default preset draws them; the dependency
check (deps.py) has made sure matplotlib is there before anything ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def draw(
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
        kind = next((r["returns"] for r in recs if r["loader"] == loader), "fresh")
        ax.bar(xs, ys, width, label=f"{loader} ({kind})")
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
        for label, samples in sorted(timelines.items()):
            ax.plot([t for t, _ in samples], [rss / 2**20 for _, rss in samples], label=label)
        ax.set_xlabel("seconds since the process started")
        ax.set_ylabel("RSS MiB")
        ax.set_title("Memory over one load (process start, imports, load)", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        made.append(out / "memory.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    return made
