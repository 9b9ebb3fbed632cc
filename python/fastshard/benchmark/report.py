"""The rows ``fastshard bench`` prints, and its plot."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass
class Row:
    loader: str
    gbps: float | None  # None: it did not run (``verified`` says why)
    seconds: float | None
    cpu_seconds: float | None
    verified: str  # "reference", "yes", "NO: ...", "skipped: ...", "failed: ..."


def table(rows: list[Row]) -> str:
    """One line per loader under a header, columns aligned."""

    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    lines = [f"{'loader':<12} {'GB/s':>8} {'seconds':>9} {'cpu s':>8}  verified"]
    for r in rows:
        lines.append(
            f"{r.loader:<12} {num(r.gbps, '.3f'):>8} {num(r.seconds, '.3f'):>9} "
            f"{num(r.cpu_seconds, '.2f'):>8}  {r.verified}"
        )
    return "\n".join(lines)


def plot(rows: list[Row], path: str, title: str) -> str:
    """A bar per loader that ran (GB/s, its CPU seconds on the bar) at
    ``path``; returns the line to print (where it went, or why not)."""
    if importlib.util.find_spec("matplotlib") is None:
        return "plot: skipped, matplotlib is not installed (pip install matplotlib)"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [r for r in rows if r.gbps is not None]
    fig, ax = plt.subplots(figsize=(1.6 + 1.2 * max(1, len(ran)), 4))
    bars = ax.bar([r.loader for r in ran], [r.gbps or 0.0 for r in ran], color="#4477aa")
    for bar, r in zip(bars, ran, strict=True):
        ax.annotate(f"{r.cpu_seconds or 0:.2f} cpu s", (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), ha="center", va="bottom", fontsize=8)  # fmt: skip
    ax.set_ylabel("GB/s")
    ax.set_title(f"fastshard bench: {title}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"plot: {path}"
