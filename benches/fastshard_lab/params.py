"""Plain values every preset parses the same way: sizes, lists of integers,
the workload shapes, where results go. Torch-free, so ``python -m fastshard_lab
--help`` (and the missing-extra check) never waits for torch."""

from __future__ import annotations

import argparse
from pathlib import Path

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
# llm: a Llama-like fp16 model; uniform: 16 MiB tensors; many-small: 64 KiB
# tensors; experts: 4-64 KiB tensors of mixed sizes (a mixture of experts).
SHAPES = ("llm", "uniform", "many-small", "experts")
# Benchmark outputs and scratch files of the presets (git-ignored in a checkout).
BENCH_DIR = Path(".bench")
# Where --record puts runs and writes the list of them: the docs site's
# benchmarks folder, from the checkout's root (record.py, runs.py).
DOCS = Path("docs/benchmarks")


def parse_size(text: str) -> int:
    """``64MiB``, ``1GiB``, ``500MB``, ``1e9`` → bytes."""
    units = {"kib": KiB, "mib": MiB, "gib": GiB, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    t = text.strip().lower()
    for unit, factor in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if t.endswith(unit):
            return int(float(t[: -len(unit)]) * factor)
    return int(float(t))


def size_arg(text: str) -> int:
    """``parse_size`` for argparse: a bad size is a usage error, not a traceback."""
    try:
        size = parse_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 64MiB, 1GiB)") from None
    if size <= 0:
        raise argparse.ArgumentTypeError(f"a size must be positive: {text!r}")
    return size


def ints(text: str) -> list[int]:
    """``4,16,64`` → [4, 16, 64]; ``''`` → []."""
    return [int(x) for x in text.split(",") if x.strip()]


def names(text: str) -> list[str]:
    """``a,b`` → ["a", "b"], blanks dropped."""
    return [x.strip() for x in text.split(",") if x.strip()]


def add_out(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument(
        "--out",
        type=Path,
        default=Path(default),
        help=f"folder for results.json, meta.json and table.md (default: {default})",
    )
