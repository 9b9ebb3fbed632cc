"""What the number of requests costs on SeaweedFS, one run: the same object
read by the raw client (ranged GETs ``readinto`` a pre-faulted buffer) as
16 GETs of 1/16 of it and as 64 of 1/64 at once, and by fastshard into
parameters already written, at its default and at fixed request counts,
alternating in one process. On loopback the server shares the client's
cores, so a request it serves costs the load whatever the client does;
the raw client's two rows say how much, fastshard's rows say whether it
adds to it.

    python benches/s3_requests.py --size-mib 1024 --repeat 4
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import fastshard
from fastshard_lab import raw
from fastshard_lab.servers import SeaweedFS, find_binary
from fastshard_lab.workload import weights_module

MiB = 1 << 20


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=4)
    args = ap.parse_args()
    weed = find_binary("weed")
    with tempfile.TemporaryDirectory(prefix="fs-requests-bench-") as tmp:
        root = Path(tmp)
        path = root / "model.tensors"
        fastshard.save(weights_module(args.size_mib), path)
        size = path.stat().st_size
        server = SeaweedFS(root / "weed").start(weed)
        try:
            uri = server.upload(path, "bench/requests.tensors")
            url = server.presign(uri, expires=3600)
            buf = memoryview(bytearray(size))
            dst = weights_module(args.size_mib)  # parameters already written
            opts = server.opts()

            def fs(**extra: int) -> Callable[[], object]:
                return lambda: fastshard.load(dst, uri, **opts, **extra)

            cases: dict[str, Callable[[], object]] = {
                "raw, 16 GETs": lambda: raw.parallel_get(url, buf, raw.split(size, 16)),
                "raw, 64 GETs": lambda: raw.parallel_get(url, buf, raw.split(size, 64)),
                "fastshard, default": fs(),
                "fastshard, 16 x 64 MiB": fs(concurrency=16, part_size_bytes=64 * MiB),
                "fastshard, 16 x 16 MiB": fs(concurrency=16, part_size_bytes=16 * MiB),
            }
            runs: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
            for round_ in range(args.repeat + 1):  # the first round warms up
                for name, go in cases.items():
                    c0, t0 = cpu(), time.perf_counter()
                    go()
                    if round_:
                        runs[name].append((time.perf_counter() - t0, cpu() - c0))
        finally:
            server.stop()
    gb = size / 1e9
    base = statistics.median(t for t, _ in runs["raw, 16 GETs"])
    print(f"{size:,} bytes, {args.repeat} rounds, medians")
    for name, v in runs.items():
        t = statistics.median(x for x, _ in v)
        c = statistics.median(y for _, y in v)
        ratio = base / t
        print(f"{name:24s} {gb / t:5.2f} GB/s  {ratio:4.2f}x raw 16  client CPU {c / gb:.3f} s/GB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
