"""How the ranks of a cooperative load exchange: through shared memory only
when every rank maps every other's segment, else (on every rank alike)
through the group's collective; spawned processes on a gloo group against
SeaweedFS, the loads checked bit for bit either way."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_tp_loading import DIM0, SD_SPECS, full_state, ref_slice

import fastshard
from fastshard._coop import shm as _shm

WS = 2
ODD = 1  # the rank whose shared memory is elsewhere


def _rank_main(rank: int, where: str, uri: str, opts: dict[str, Any], out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out}/pg", rank=rank, world_size=WS)
    try:
        if rank == ODD and where == "told":
            os.environ[_shm.ENV] = "collective"
        elif rank == ODD and where in ("missing", "elsewhere"):
            # "missing": it cannot make a segment; "elsewhere": it makes one
            # the others cannot map (as on another host).
            _shm._DIR = Path(out, where)
            if where == "elsewhere":
                _shm._DIR.mkdir()
        full = full_state()
        if rank == ODD and where == "uneven":
            # This rank skips the first tensor: the plan it guessed before
            # the ranks agreed (every rank wanting what it wants) is not the
            # group's, so its first batch, fetched meanwhile, is not used.
            del full[next(iter(full))]
        with fastshard.open(uri, max_host_bytes=3 << 20, **opts) as f:
            sd = f.load_state_dict(
                names=list(full),
                rank=rank,
                world_size=WS,
                shard_specs=SD_SPECS,
                cooperative=True,
            )
            stats = f.stats
        assert list(sd) == list(full)
        for name, t in full.items():
            want = ref_slice(name, t, rank, WS) if name in DIM0 else t
            assert torch.equal(sd[name].view(torch.uint8), want.contiguous().view(torch.uint8))
        report = {"exchange": stats.exchange, "received": stats.bytes_received}
        Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def full_uri(seaweed: Any) -> tuple[str, dict[str, Any]]:
    opts = seaweed.opts()
    uri = f"s3://{seaweed.bucket}/coop-exchange/full.tensors"
    fastshard.save(full_state(), uri, **opts)
    return uri, opts


@pytest.mark.parametrize(
    ("where", "exchange"),
    [
        ("here", "shared-memory"),
        ("uneven", "shared-memory"),  # the ranks load different tensors
        ("missing", "collective"),
        ("elsewhere", "collective"),
        ("told", "collective"),  # one rank's environment says so
    ],
)
def test_shared_memory_only_where_every_rank_maps_every_segment(
    where: str, exchange: str, full_uri: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    uri, opts = full_uri
    mp.spawn(_rank_main, args=(where, uri, opts, str(tmp_path)), nprocs=WS)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WS)]
    assert [r["exchange"] for r in reports] == [exchange] * WS, reports
    assert all(r["received"] > 0 for r in reports), reports
    # Segments are unlinked once every rank has tried them, wherever they are.
    assert not list(tmp_path.glob("elsewhere/fastshard-coop-*"))


def test_a_segment_left_by_a_killed_rank_is_removed_by_the_next_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank killed during the set-up's gathers leaves its segment; the next
    segment made on the host removes it, and only it: not one whose maker
    runs, nor one young enough to be another PID namespace's set-up."""
    import subprocess
    import time

    monkeypatch.setattr(_shm, "_DIR", tmp_path)
    gone = subprocess.Popen(["true"])
    gone.wait()
    old = time.time() - 2 * _shm._STALE_SECONDS

    def segment(name: str, mtime: float) -> Path:
        path = tmp_path / name
        path.write_bytes(b"x")
        os.utime(path, (mtime, mtime))
        return path

    left = segment(f"fastshard-coop-{gone.pid}-{'a' * 32}", old)
    young = segment(f"fastshard-coop-{gone.pid}-{'b' * 32}", time.time())
    running = segment(f"fastshard-coop-{os.getpid()}-{'c' * 32}", old)
    others = [segment(n, old) for n in ("fastshard-coop-x", "fastshard-coop-1", "other-1-a")]

    own = _shm.create(4096)
    assert own is not None
    try:
        assert not left.exists()
        assert young.exists() and running.exists()
        assert all(p.exists() for p in others)
    finally:
        own.unlink()
