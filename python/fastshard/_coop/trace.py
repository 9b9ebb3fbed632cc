"""Where one rank's time goes in a cooperative load, for whoever tunes it.

Off unless ``FASTSHARD_COOP_TRACE`` names a folder: then each cooperative
load writes ``<folder>/coop-rank<R>-<pid>-<n>.json`` when it ends, with one
row per round (seconds spent fetching, agreeing, packing, waiting for the
exchange, placing; bytes fetched, sent and received) and the totals per
phase. Nothing is printed, and nothing is timed when it is off.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV = "FASTSHARD_COOP_TRACE"
_loads = itertools.count()


class Trace:
    """Seconds per phase and round of one rank's cooperative load."""

    def __init__(self, rank: int, world_size: int) -> None:
        folder = os.environ.get(ENV, "")
        self.folder = Path(folder) if folder else None
        self.rank, self.world_size = rank, world_size
        self.start = time.perf_counter()
        self.rows: dict[int, dict[str, float]] = {}

    @property
    def on(self) -> bool:
        return self.folder is not None

    @contextmanager
    def phase(self, name: str, round_: int = -1) -> Iterator[None]:
        """Time the block as ``name`` of round ``round_`` (-1: outside the rounds)."""
        if self.folder is None:
            yield
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0, round_)

    def add(self, name: str, value: float, round_: int = -1) -> None:
        """Add ``value`` (seconds, or bytes for names ending in ``_bytes``)."""
        if self.folder is not None:
            row = self.rows.setdefault(round_, {})
            row[name] = row.get(name, 0.0) + value

    def write(self) -> None:
        if self.folder is None:
            return
        totals: dict[str, float] = {}
        for row in self.rows.values():
            for name, value in row.items():
                totals[name] = totals.get(name, 0.0) + value
        report = {
            "rank": self.rank,
            "world_size": self.world_size,
            "seconds": time.perf_counter() - self.start,
            "t0": self.start,  # perf_counter is system-wide on Linux: ranks compare
            "totals": totals,
            "rounds": {str(k): v for k, v in sorted(self.rows.items())},
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"coop-rank{self.rank}-{os.getpid()}-{next(_loads)}.json"
        (self.folder / name).write_text(json.dumps(report, indent=1))
