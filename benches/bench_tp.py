"""Tensor-parallel loading at world size N from one model on a local S3 server.

One Llama-shaped fp16 model (benches/workloads.py) is stored three ways on
SeaweedFS: unsharded (one object), as N per-rank files, and as one packed
object holding every rank's records. N processes start together (a barrier)
and each gets its rank's tensor-parallel weights (q/k/v/gate/up/embeddings/
lm_head split along dim 0, o/down along dim 1, norms replicated):

- tensorizer: each rank reads the whole unsharded object (open_stream +
  TensorDeserializer), as vLLM's loader does for an unsharded file;
- fastshard per-rank: each rank loads its own file;
- fastshard packed: each rank reads its records of the packed object;
- fastshard unsharded: each rank reads its slices of the unsharded object;
- fastshard cooperative: the ranks (a gloo group) fetch the unsharded object
  once between them and exchange the pieces.

Reported per mode: bytes fetched by all ranks (index reads included), the
slowest rank's seconds, and the aggregate rate at which ranks got their
weights (sum of the ranks' shares / slowest rank's seconds). Every rank's
tensors are checked against its expected slices (a digest).
"""

from __future__ import annotations

import argparse
import inspect
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benches"))

from workloads import SCRATCH, GiB, digest, model_like_state_dict, total_bytes  # noqa: E402

from fastshard.bench import servers  # noqa: E402

ROW_PARALLEL = ("o_proj.weight", "down_proj.weight")


def split_dim(name: str, t: torch.Tensor) -> int | None:
    if t.dim() != 2:
        return None
    return 1 if name.endswith(ROW_PARALLEL) else 0


def specs(sd: dict[str, torch.Tensor]) -> dict[str, int | None]:
    return {name: split_dim(name, t) for name, t in sd.items()}


def shard(sd: dict[str, torch.Tensor], rank: int, world: int) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in sd.items():
        dim = split_dim(name, t)
        out[name] = (t if dim is None else t.chunk(world, dim)[rank]).contiguous()
    return out


def rank_main(
    mode: str,
    rank: int,
    world: int,
    uris: dict[str, str],
    opts: dict[str, Any],
    spec: dict[str, int | None],
    want: str,
    pg_file: str,
    barrier: Any,
    results: Any,
) -> None:
    import fastshard

    if mode == "cooperative":
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", init_method=f"file://{pg_file}", rank=rank, world_size=world
        )
    barrier.wait()
    started = time.perf_counter()
    fetched = 0
    if mode == "tensorizer":
        from tensorizer import TensorDeserializer, stream_io

        stream = stream_io.open_stream(
            uris["full"],
            "rb",
            s3_endpoint=opts["s3_endpoint"],
            s3_access_key_id=opts["s3_access_key_id"],
            s3_secret_access_key=opts["s3_secret_access_key"],
            force_http=True,
        )
        with TensorDeserializer(stream, device="cpu") as d:
            full = dict(d.items())
        sd = {
            n: (t if spec[n] is None else t.chunk(world, spec[n])[rank]).contiguous()
            for n, t in full.items()
        }
        del full
        fetched = -1  # the whole object, filled in by the parent
    else:
        uri = {"per-rank": "per_rank", "packed": "packed"}.get(mode, "full")
        kwargs: dict[str, Any] = {"rank": rank, "world_size": world}
        if mode in ("unsharded", "cooperative"):
            kwargs["shard_specs"] = spec
        if mode == "cooperative":
            kwargs["cooperative"] = True
        with fastshard.open(uris[uri], rank=rank, world_size=world, **opts) as f:
            sd = f.load_state_dict(**kwargs)
            fetched = f.stats.bytes_fetched + f.discovery_bytes
    seconds = time.perf_counter() - started
    results.put((mode, rank, total_bytes(sd), fetched, seconds, digest(sd) == want))
    if mode == "cooperative":
        import torch.distributed as dist

        dist.destroy_process_group()


def run_mode(
    mode: str, world: int, uris: dict[str, str], opts: dict[str, Any], spec: Any, wants: list[str]
) -> list[tuple[str, int, int, int, float, bool]]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(world)
    results = ctx.Queue()
    pg_file = tempfile.mktemp(prefix="bench-tp-pg-", dir=SCRATCH)
    procs = [
        ctx.Process(
            target=rank_main,
            args=(mode, r, world, uris, opts, spec, wants[r], pg_file, barrier, results),
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    out = [results.get(timeout=900) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return sorted(out, key=lambda row: row[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gib", type=float, default=1.0)
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--repeat", type=int, default=1, help="runs per mode (best is reported)")
    p.add_argument(
        "--modes",
        default="tensorizer,per-rank,packed,unsharded,cooperative",
        help="comma-separated subset",
    )
    args = p.parse_args(argv)
    import fastshard

    world = args.world_size
    weed = shutil.which("weed") or os.path.join(os.path.dirname(sys.executable), "weed")
    SCRATCH.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="bench-tp-", dir=SCRATCH))
    server = servers.SeaweedFS(root / "seaweedfs")
    try:
        server.start(weed)
        opts = server.opts()
        sd = model_like_state_dict(int(args.size_gib * GiB))
        spec = specs(sd)
        shards = [shard(sd, r, world) for r in range(world)]
        wants = [digest(s) for s in shards]
        base = f"s3://{server.bucket}/bench-tp"
        uris = {
            "full": f"{base}/full.tensors",
            "per_rank": f"{base}/ranks/model-rank-%03d.tensors",
            "packed": f"{base}/packed.tensors",
        }
        fastshard.save(sd, uris["full"], **opts)
        fastshard.save_sharded(shards, uris["per_rank"], **opts)
        modes = args.modes.split(",")
        if "packed" in modes:
            if "packed" in inspect.signature(fastshard.save_sharded).parameters:
                fastshard.save_sharded(shards, uris["packed"], packed=True, **opts)
            else:
                print("packed: not supported by this build, skipped")
                modes.remove("packed")
        with fastshard.open(uris["full"], **opts) as f:
            size = f.file_size
        share = sum(total_bytes(s) for s in shards)
        print(
            f"SeaweedFS at {server.endpoint}; world size {world}; object {size / 1e9:.2f} GB; "
            f"ranks' shares together {share / 1e9:.2f} GB"
        )
        best: dict[str, tuple[float, int, bool]] = {}
        for _ in range(args.repeat):
            for mode in modes:
                rows = run_mode(mode, world, uris, opts, spec, wants)
                wall = max(r[4] for r in rows)
                fetched = sum(size if r[3] < 0 else r[3] for r in rows)
                ok = all(r[5] for r in rows)
                if mode not in best or wall < best[mode][0]:
                    best[mode] = (wall, fetched, ok)
        print(
            "\n| mode | bytes fetched (all ranks) | × object | slowest rank s "
            "| aggregate GB/s | vs tensorizer | data equal |"
        )
        print("|---|---:|---:|---:|---:|---:|---|")
        base_wall = best["tensorizer"][0] if "tensorizer" in best else None
        for mode, (wall, fetched, ok) in best.items():
            vs = f"{base_wall / wall:.2f}×" if base_wall else "n/a"
            print(
                f"| {mode} | {fetched / 1e9:.3f} GB | {fetched / size:.2f} | {wall:.2f} "
                f"| {share / wall / 1e9:.2f} | {vs} | {'yes' if ok else 'NO'} |"
            )
        return 0 if all(ok for _, _, ok in best.values()) else 1
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
