"""What a user sees of a load: a tqdm bar (bytes, GB/s, ETA) and one INFO
line on the "fastshard" logger.

The native loads add landed bytes to a ``_native.Progress`` counter; a
daemon thread here polls it, so no native thread ever calls into Python.
Only the redacted URI (``TensorFile.uri``: no query string, no user info)
is ever shown or logged.
"""

from __future__ import annotations

import logging
import sys
import threading

from .. import _native
from .._layouts import location as _location
from .._types import LoadStats
from ..errors import InvalidArgumentError

log = logging.getLogger("fastshard")

AUTO_THRESHOLD = 1 << 30  # progress=None shows a bar for loads this big, on a terminal
POLL_SECONDS = 0.2


def wanted(progress: object, total: int) -> bool:
    """``progress``: True always, False never, None when stderr is a
    terminal and the load is at least AUTO_THRESHOLD bytes."""
    if progress is None:
        return total >= AUTO_THRESHOLD and sys.stderr.isatty()
    if isinstance(progress, bool):
        return progress
    raise InvalidArgumentError(f"progress must be True, False or None, not {progress!r}")


class Bar:
    """Context manager around one load: ``counter`` goes to every native
    load of it; the bar, when shown, follows the counter."""

    def __init__(self, uri: _location.Uri, total: int, progress: object) -> None:
        self.counter = _native.Progress()
        self.total = total
        self._show = wanted(progress, total)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None
        self._name = _location.name(uri) or _location.display(uri)

    def __enter__(self) -> Bar:
        if self._show:
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.total,
                unit="B",
                unit_scale=True,
                unit_divisor=1000,
                desc=self._name,
                dynamic_ncols=True,
                leave=False,
            )
            self._thread = threading.Thread(
                target=self._follow, name="fastshard-progress", daemon=True
            )
            self._thread.start()
        return self

    def _follow(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            self._sync()

    def _sync(self) -> None:
        bar = self._bar
        if bar is not None:
            seen = min(self.counter.value, self.total)
            if seen > bar.n:
                bar.update(seen - bar.n)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            self._sync()
            self._bar.close()


def report(uri: str, stats: LoadStats) -> None:
    log.info(
        "loaded %s: %d bytes in %.2f s (%.2f GB/s), %d requests, %d retries",
        uri,
        stats.bytes_fetched,
        stats.seconds,
        stats.gbps,
        stats.requests,
        stats.retries,
    )
