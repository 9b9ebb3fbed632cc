"""The node cache's second load against a plain local-file load of the same
bytes, one run: a model's tensors saved to a local file and uploaded to
SeaweedFS (started on 127.0.0.1 for the run); the S3 object loaded once
with ``cache_dir`` (filling the cache), then, alternating, the local file
and the S3 object again (read from the cache after its one discovery
request). Both load into parameters already written (``fastshard.load``),
so neither pays first-touch page faults, and both read the page cache: the
ratio is the cost of the cache's checks and its discovery request.

    python benches/cache_vs_file.py --size-mib 1024 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import fastshard
from fastshard_lab.servers import SeaweedFS, find_binary
from fastshard_lab.workload import weights_module


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    weed = find_binary("weed")
    with tempfile.TemporaryDirectory(prefix="fs-cache-bench-") as tmp:
        root = Path(tmp)
        src = weights_module(args.size_mib)
        path = root / "model.tensors"
        fastshard.save(src, path)
        server = SeaweedFS(root / "weed").start(weed)
        try:
            uri = server.upload(path, "bench/cache.tensors")
            opts = server.opts(cache_dir=root / "cache")
            dst = weights_module(args.size_mib)  # parameters already written
            fastshard.load(dst, uri, **opts)  # fills the cache
            fastshard.load(dst, path)  # the file into the page cache
            times: dict[str, list[float]] = {"file": [], "cached": []}
            stats = None
            for _ in range(args.repeat):
                times["file"].append(timed(lambda: fastshard.load(dst, path)))
                t0 = time.perf_counter()
                stats = fastshard.load(dst, uri, **opts)
                times["cached"].append(time.perf_counter() - t0)
            for name, p in src.named_parameters():
                assert torch.equal(p, dict(dst.named_parameters())[name]), name
        finally:
            server.stop()
    gb = args.size_mib * (1 << 20) / 1e9
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:7s} median {gb / med[k]:.2f} GB/s  ({', '.join(f'{x:.3f}' for x in v)} s)")
    assert stats is not None
    print(
        f"cached load: {stats.bytes_fetched} bytes from the store, "
        f"{stats.bytes_from_cache} from the cache, {stats.requests} requests; "
        f"open {stats.discovery_seconds:.3f} s, reads {stats.fetch_seconds:.3f} s"
    )
    print(f"cached / file throughput: {med['file'] / med['cached']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
