"""gpu_check's NCCL section: a cooperative load over an NCCL group, one
process per GPU, each rank checked bit for bit against its slices loaded
alone on the CPU, and the bytes it received from its peers against its
share.

The cooperative code is called the way every load calls it (the group's
``Link`` and the one load dispatch), at any world size, so one GPU still
checks the NCCL path: the group's agreements (all_gather) run over NCCL, the
rank's pieces go through the pinned staging ring into its GPU buffers and
from there into the tensors on that GPU. The all-to-all and broadcasts of
the exchange need two GPUs or more; with one there is nothing to exchange.

The same function runs over gloo on CPU processes (``backend="gloo"``),
which is how the tests check this script without a GPU.
"""

from __future__ import annotations

import os
import socket
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fastshard
from fastshard import tp
from fastshard._coop import peers as _peers
from fastshard._engine import dispatch as _dispatch

MiB = 1 << 20
# name -> (shape, split dim or None): column-parallel rows, row-parallel
# columns, replicated, a 0-d scalar, and one larger than a batch (row blocks).
TENSORS: dict[str, tuple[tuple[int, ...], int | None]] = {
    "qkv.weight": ((384, 256), 0),
    "o_proj.weight": ((256, 128), 1),
    "norm.weight": ((256,), None),
    "scale": ((), None),
    "embed.weight": ((4096, 512), 0),
}
BUDGET = 4 * MiB  # small enough for several rounds and row blocks


def world_size(asked: int | None, gpus: int) -> int:
    """Ranks of the check: as asked, else one per GPU (at least one)."""
    if asked is not None:
        if asked < 1 or (gpus and asked > gpus):
            raise ValueError(f"--nccl-world {asked}: this machine has {gpus} GPUs")
        return asked
    return max(1, gpus)


def write_model(path: Path, seed: int) -> dict[str, int | None]:
    """The unsharded file and its shard specs."""
    gen = torch.Generator().manual_seed(seed)
    sd = {n: torch.randn(shape, generator=gen).half() for n, (shape, _) in TENSORS.items()}
    fastshard.save(sd, path)
    return {n: dim for n, (_, dim) in TENSORS.items()}


def _rank(rank: int, world: int, port: int, path: str, backend: str, out: Any) -> None:
    try:
        device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        specs = {n: dim for n, (_, dim) in TENSORS.items()}
        with fastshard.open(path, max_host_bytes=BUDGET) as f:
            jobs = []
            for name in TENSORS:
                info = f.info(name)
                sl = tp.plan_slice(name, info.shape, None, rank, world, specs)
                shape = tp.sliced_shape(info.shape, sl)
                dest = torch.full(shape, float("nan"), dtype=info.dtype, device=device)
                jobs.append(_dispatch.Job(f.index_of(name), sl, shape, dest, False))
            link = _peers.Link(_peers.group_of(None, rank, world), rank, world)
            stats = _dispatch.load(f.engine, jobs, link)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        alone = fastshard.load_state_dict(path, rank=rank, world_size=world, shard_specs=specs)
        equal = all(
            torch.equal(
                j.dest.cpu().reshape(-1).view(torch.uint8), alone[n].reshape(-1).view(torch.uint8)
            )
            for n, j in zip(TENSORS, jobs, strict=True)
        )
        share = sum(t.numel() * t.element_size() for t in alone.values())
        out.put(
            {
                "rank": rank,
                "equal": equal,
                "on_device": all(j.dest.device == device for j in jobs),
                "buffers": str(link.device),
                "fetched": stats.bytes_fetched,
                "received": stats.bytes_received,
                "share": share,
            }
        )
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the check
        out.put({"rank": rank, "error": traceback.format_exc()[-3000:]})


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check(world: int, backend: str = "nccl", seed: int = 0, timeout: float = 240) -> dict[str, Any]:
    """Run the cooperative load at ``world`` ranks; its verdict and each rank's figures."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="fastshard-nccl-") as tmp:
        path = Path(tmp) / "coop.tensors"
        write_model(path, seed)
        queue = ctx.Queue()
        port = _port()
        procs = [
            ctx.Process(target=_rank, args=(r, world, port, str(path), backend, queue))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        ranks = []
        try:
            ranks = [queue.get(timeout=timeout) for _ in procs]
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
        size = os.path.getsize(path)
    ranks.sort(key=lambda r: r["rank"])
    ok = all("error" not in r for r in ranks)
    if ok:
        ok = all(r["equal"] and r["on_device"] for r in ranks)
        ok = ok and all(r["received"] <= 1.05 * r["share"] for r in ranks)
        ok = ok and sum(r["fetched"] for r in ranks) <= 1.02 * size
    what = "exchange (all_to_all, broadcast)" if world > 1 else "agreement and staging only"
    return {"ok": ok, "world_size": world, "backend": backend, "checks": what, "ranks": ranks}
