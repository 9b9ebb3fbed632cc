"""A rank of a cooperative load that dies, fails, or stops between the
batches of an HF-layout feed, in spawned processes on a gloo group against
SeaweedFS: every other rank raises a typed error (``PeerFailedError``)
within seconds, not at the collective's timeout, and returns nothing."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_tp_loading import SPECS, TPBlock, full_state

import fastshard
from fastshard._coop import load as cooperative
from fastshard._coop import shm as _shm

BUDGET = 3 << 20  # small enough that the load runs many rounds
VICTIM = 1
WAIT_S = 120  # how long the parent waits for the ranks at most


def _inject(rank: int, how: str, out: str) -> None:
    """Make ``VICTIM`` die or fail in its second fetch of the load."""
    if rank != VICTIM:
        return
    real = cooperative._fetch
    calls = [0]

    def fetch(*args: Any) -> Any:
        calls[0] += 1
        if calls[0] == 2:
            Path(out, "stopped").write_text(str(time.time()))
            if how == "killed":
                os._exit(3)
            raise RuntimeError("injected failure")
        return real(*args)

    cooperative._fetch = fetch  # type: ignore[assignment]


def _feed(uri: str, rank: int, ws: int, opts: dict[str, Any], out: str) -> None:
    """vLLM's HF-layout route: batches of cooperative loads that every rank
    walks in order; ``VICTIM`` stops taking tensors after the first batch
    (the model refused one) and says so."""
    from fastshard.vllm import hf
    from fastshard.vllm.ranks import Ranks

    with fastshard.open(uri, **opts) as f:
        ranks = Ranks(tp_rank=rank, tp_size=ws, tp_group=dist.group.WORLD)
        feed = hf.Feed(f, torch.nn.Module(), ranks, 4 << 20, cooperative=True)
        for n, (name, _) in enumerate(feed):
            if rank == VICTIM and feed.current is not None and n == 0:
                error = ValueError(f"the model refused {name}")
                Path(out, "stopped").write_text(str(time.time()))
                feed.stop(error)
                raise error


def _rank_main(
    rank: int, ws: int, how: str, exchange: str, uri: str, opts: dict[str, Any], out: str
) -> None:
    os.environ[_shm.ENV] = exchange
    dist.init_process_group("gloo", init_method=f"file://{out}/pg", rank=rank, world_size=ws)
    report: dict[str, Any] = {}
    try:
        if how == "feed":
            _feed(uri, rank, ws, opts, out)
        else:
            _inject(rank, how, out)
            model = TPBlock(ws)
            fastshard.load(
                model, uri, rank, ws, shard_specs=SPECS, cooperative=True,
                max_host_bytes=BUDGET, **opts,
            )  # fmt: skip
        report["result"] = "returned"
    except Exception as e:  # noqa: BLE001 - the report says which
        report.update(error=type(e).__name__, message=str(e), at=time.time())
        report["typed"] = isinstance(e, fastshard.FastshardError)
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    if rank == VICTIM:
        # Stay in the group (its connections open) until the others are done:
        # they must learn of the failure from the failure flag, not a socket.
        deadline = time.time() + WAIT_S
        while time.time() < deadline and len(list(Path(out).glob("rank*.json"))) < ws:
            time.sleep(0.1)
    # A collective of the stopped load is still pending: leave without
    # tearing the group down (that would wait for it).
    os._exit(0)


@pytest.fixture(scope="module")
def full_uri(seaweed: Any) -> tuple[str, dict[str, Any]]:
    opts = seaweed.opts()
    uri = f"s3://{seaweed.bucket}/coop-failures/full.tensors"
    fastshard.save(full_state(), uri, **opts)
    return uri, opts


@pytest.mark.parametrize(
    ("how", "ws", "exchange"),
    [
        ("killed", 2, "auto"),
        ("killed", 4, "auto"),
        ("killed", 4, "collective"),
        ("failed", 4, "auto"),
        ("feed", 2, "auto"),
        ("feed", 4, "collective"),
    ],
)
def test_a_rank_that_stops_stops_every_rank_within_seconds(
    how: str, ws: int, exchange: str, full_uri: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    uri, opts = full_uri
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_rank_main, args=(r, ws, how, exchange, uri, opts, str(tmp_path)))
        for r in range(ws)
    ]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(WAIT_S)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    stopped = float((tmp_path / "stopped").read_text())
    # No rank, the killed one included, leaves its shared memory behind.
    for p in procs:
        assert not list(Path("/dev/shm").glob(f"fastshard-coop-{p.pid}-*")), p.pid
    for r in range(ws):
        if r == VICTIM:
            continue
        report = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert report.get("error") == "PeerFailedError", (r, report)
        assert report["typed"] and report["message"], report
        assert report["at"] - stopped < 10, (r, report["at"] - stopped)
    if how == "killed":
        assert procs[VICTIM].exitcode == 3
        assert not (tmp_path / f"rank{VICTIM}.json").exists()
    else:
        own = json.loads((tmp_path / f"rank{VICTIM}.json").read_text())
        assert own["error"] == ("RuntimeError" if how == "failed" else "ValueError"), own
    if how == "failed":
        for r in range(ws):
            if r != VICTIM:
                msg = json.loads((tmp_path / f"rank{r}.json").read_text())["message"]
                assert f"rank {VICTIM} failed" in msg and "injected failure" in msg, msg
