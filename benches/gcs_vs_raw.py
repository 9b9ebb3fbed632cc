"""gs:// loads against a raw ranged-GET client on the same Cloud Storage
emulator, one run: a model's tensors uploaded to fake-gcs-server (started
on 127.0.0.1 for the run), then, alternating, ``fastshard.load`` into
parameters already written and ``streams`` parallel ranged GETs of the whole
object into a buffer already written (``fastshard_lab.raw``). Both pay the
same emulator; the ratio is fastshard's cost over a client that only moves
bytes. Client CPU (this process) per GB beside each.

    python benches/gcs_vs_raw.py --size-mib 512 --repeat 5
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import fastshard
from fastshard_lab.gcs import FakeGcs, find_fake_gcs
from fastshard_lab.raw import parallel_get, split
from fastshard_lab.workload import weights_module


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measured(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall and CPU seconds of one call."""
    c0, t0 = cpu_seconds(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, cpu_seconds() - c0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--streams", type=int, default=16, help="the raw client's GETs at once")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fs-gcs-bench-") as tmp:
        root = Path(tmp)
        src = weights_module(args.size_mib)
        path = root / "model.tensors"
        fastshard.save(src, path)
        size = path.stat().st_size
        server = FakeGcs(root / "gcs").start(find_fake_gcs())
        try:
            uri = server.upload(path, "bench/model.tensors")
            url = f"{server.endpoint}/{server.bucket}/bench/model.tensors"
            opts = server.opts()
            dst = weights_module(args.size_mib)  # parameters already written
            buf = bytearray(size)  # the raw client's memory, already written
            ranges = split(size, args.streams)

            def raw() -> None:
                parallel_get(url, memoryview(buf), ranges)

            raw()
            fastshard.load(dst, uri, **opts)
            runs: dict[str, list[tuple[float, float]]] = {"raw": [], "fastshard": []}
            for _ in range(args.repeat):
                runs["raw"].append(measured(raw))
                runs["fastshard"].append(measured(lambda: fastshard.load(dst, uri, **opts)))
            assert bytes(buf) == path.read_bytes(), "the raw client's bytes differ"
            for name, p in src.named_parameters():
                assert torch.equal(p, dict(dst.named_parameters())[name]), name
        finally:
            server.stop()
    gb = size / 1e9
    med = {
        k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
        for k, v in runs.items()
    }
    for k, (w, c) in med.items():
        times = ", ".join(f"{x:.3f}" for x, _ in runs[k])
        print(f"{k:9s} median {gb / w:.2f} GB/s, client CPU {c / gb:.2f} s/GB  ({times} s)")
    print(
        f"fastshard / raw ({args.streams} streams): throughput "
        f"{med['raw'][0] / med['fastshard'][0]:.2f}, "
        f"client CPU {med['fastshard'][1] / med['raw'][1]:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
