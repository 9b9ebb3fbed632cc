"""One measured load in a fresh process: ``python -m fastshard_lab.child``
with the JSON spec in $FASTSHARD_BENCH_SPEC (or as its argument) prints one
JSON line: seconds, bytes, CPU seconds, minor page
faults, RSS before and at its peak during the load, the digest of what the
loader returned, and the loader's own counters.

Everything the loader imports is imported before the clock starts, and the
digest is computed after it stops. Ranks of one tensor-parallel load
(``world_size`` > 1) wait at a barrier (``barrier``: a folder every rank
marks) so they start together; cooperative ranks join a gloo group first.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from . import loaders

SPEC_ENV = "FASTSHARD_BENCH_SPEC"


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so it measures the load alone."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _usage() -> tuple[float, float, int]:
    """(user s, system s, minor faults) of this process and of the children it
    reaped (curl)."""
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + c.ru_utime, s.ru_stime + c.ru_stime, s.ru_minflt + c.ru_minflt


def _disable_thp() -> None:
    """No transparent huge pages in this process, even where a loader madvises them."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(41, 1, 0, 0, 0) != 0:  # PR_SET_THP_DISABLE
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_THP_DISABLE) failed")


def _barrier(folder: str, rank: int, world: int, timeout: float = 600) -> None:
    """Mark this rank ready, then wait (1 ms polls) until every rank is."""
    Path(folder, f"ready-{rank}").touch()
    deadline = time.monotonic() + timeout
    while len(list(Path(folder).glob("ready-*"))) < world:
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: the other ranks did not start in {timeout:.0f} s")
        time.sleep(0.001)


def _join_group(spec: dict[str, Any]) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"file://{spec['group_file']}",
        rank=spec["rank"],
        world_size=spec["world_size"],
    )


def _digest(loader: str, result: Any) -> tuple[int, str | None]:
    """(bytes, digest) of what ``loader`` returned."""
    if loader == "curl":
        return int(result), None
    if loader in loaders.RAW:
        from .workload import bytes_digest

        return len(result), bytes_digest(result)
    from .workload import digest

    return sum(t.nbytes for t in result.values()), digest(result)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    loader = spec["loader"]
    if spec.get("no_thp"):
        _disable_thp()
    loaders.prepare(loader)
    loaders.setup(spec)
    if spec.get("cooperative"):
        _join_group(spec)
    if spec.get("barrier"):
        _barrier(spec["barrier"], spec["rank"], spec["world_size"])
    gc.collect()
    base = _status_bytes("VmRSS")
    hwm_before = _status_bytes("VmHWM")  # the imports' peak
    reset = _reset_peak_rss()
    before = _usage()
    start = time.perf_counter()
    result, extra = loaders.LOADERS[loader](spec)
    seconds = time.perf_counter() - start
    user, system, faults = (a - b for a, b in zip(_usage(), before, strict=True))
    peak = _status_bytes("VmHWM")
    out: dict[str, Any] = {
        "seconds": seconds,
        "start": start,  # perf_counter is system-wide on Linux: ranks compare
        # This process's CPU over the load (all threads, reaped children): on a
        # shared host the client's cost per byte decides what the server gets.
        "cpu_seconds": user + system,
        "cpu_sys_seconds": system,
        "minor_faults": faults,
        "rss_before_bytes": base,
        "peak_rss_bytes": peak,
        "peak_is_load_only": reset,
        "process_max_rss_bytes": max(peak, hwm_before),
        "returns": loaders.returns(spec),
        **extra,
    }
    if spec.get("cooperative"):
        import torch.distributed as dist

        dist.destroy_process_group()
    out["bytes"], out["digest"] = _digest(loader, result)
    out.setdefault("bytes_fetched", out["bytes"])
    if loader not in loaders.RAW:
        out["tensors"] = len(result)
    return out


def main() -> int:
    spec = json.loads(sys.argv[1] if len(sys.argv) > 1 else os.environ.pop(SPEC_ENV))
    print(json.dumps(run(spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
