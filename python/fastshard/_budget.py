"""The memory budget of one load, ``max_host_bytes``, and how each way of
loading divides it: the only place that does (a leaf, so the value types
and the loaders below the options can name it)."""

from __future__ import annotations

from dataclasses import dataclass

# max_host_bytes when a cooperative load is given none: it must size its
# exchange buffers from something.
COOPERATIVE_BYTES = 1 << 30
# A cooperative round's batch at most. A round's exchange overlaps the
# fetch of the next round only: at world size 4 the default budget made a
# 0.5 GB object one round per rank, so its exchange ran after the whole
# fetch (slowest rank 4.35 s = 2.65 s through a node cap + 1.7 s exchange).
# The first fetch and the last exchange overlap nothing: 16 MiB rounds cut a
# 0.27 GB load at world size 4 from 3.6 to 2.9 s (loopback) and 4.9 to
# 4.0 s (200 MB/s node cap) against 32 MiB, on a busy 2-core machine.
COOPERATIVE_ROUND = 16 << 20


@dataclass(frozen=True)
class Budget:
    """``max_host_bytes`` of one load (None: unbounded) and how each way of
    loading divides it; the only place that does. A load straight into the
    destinations gives its native load all of it. A staged load keeps half
    for its slabs and gives the rest to its reads. A
    cooperative load holds one batch per rank, the next batch it fetches,
    and that fetch's own headers and scratch."""

    limit: int | None = None

    @property
    def bounded(self) -> bool:
        return self.limit is not None

    def whole(self) -> dict[str, int]:
        """Native load options of a load into the destinations themselves."""
        return native_limit(self.limit)

    def staging(self, unbounded: int) -> int:
        """Bytes the staging ring's slabs may hold (``unbounded``: the
        ring's own size when there is no budget)."""
        return unbounded if self.limit is None else self.limit // 2

    def beside_slabs(self, slabs: int) -> int | None:
        """The budget of a staged load's reads (record headers, gap
        scratch) beside ``slabs`` bytes of staging slabs."""
        if self.limit is None:
            return None
        return max(0, self.limit - slabs)

    def cooperative_batch(self, world_size: int) -> int:
        """Bytes of one rank's batch in a cooperative round: a round holds
        one per rank, the parts this rank sends, its next batch and that
        fetch's scratch; never more than ``COOPERATIVE_ROUND``."""
        share = (self.limit or COOPERATIVE_BYTES) // (world_size + 3)
        return max(1, min(COOPERATIVE_ROUND, share))

    def or_default(self, default: int) -> int:
        """The budget, or ``default`` when there is none (a batch size)."""
        return default if self.limit is None else self.limit


def native_limit(limit: int | None) -> dict[str, int]:
    """The native load option for a budget of ``limit`` bytes (None: none)."""
    return {} if limit is None else {"max_host_bytes": limit}
