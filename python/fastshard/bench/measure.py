"""Running the measured loads: each in a fresh child process, in rounds
whose order alternates, sharded loads as N concurrent children, and the
RSS of one load sampled over time."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Case:
    """One loader on one source; ``expect`` is the digest its result must have."""

    source: str
    loader: str
    spec: dict[str, Any]
    expect: str | None
    env: dict[str, str] = field(default_factory=dict)
    world_size: int = 1  # > 1: that many ranks at once, each its own child
    expect_ranks: list[str] = field(default_factory=list)
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or self.loader


def _rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _spawn(case: Case, spec: dict[str, Any]) -> subprocess.Popen[str]:
    env = {**os.environ, **case.env}
    return subprocess.Popen(
        [sys.executable, "-m", "fastshard.bench.child", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _finish(proc: subprocess.Popen[str], case: Case, timeout: float) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0 or not out.strip():
        tail = err.strip().splitlines()[-5:]
        raise RuntimeError(f"{case.source}/{case.name} failed (rc {proc.returncode}): {tail}")
    return dict(json.loads(out.strip().splitlines()[-1]))


def run_once(case: Case, sample: bool = False, timeout: float = 1800) -> dict[str, Any]:
    """One measurement; ``sample`` records (seconds, RSS bytes) every 10 ms."""
    if case.world_size > 1:
        procs = [
            _spawn(case, {**case.spec, "rank": r, "world_size": case.world_size})
            for r in range(case.world_size)
        ]
        outs = [_finish(p, case, timeout) for p in procs]
        begin = min(o["start"] for o in outs)
        end = max(o["start"] + o["seconds"] for o in outs)
        verified = all(o["digest"] == want for o, want in zip(outs, case.expect_ranks, strict=True))
        return {
            "seconds": end - begin,
            "bytes": sum(o["bytes"] for o in outs),
            "bytes_fetched": sum(o["bytes_fetched"] for o in outs),
            "peak_rss_bytes": max(o["peak_rss_bytes"] for o in outs),
            "staging_peak_bytes": max(o.get("staging_peak_bytes", 0) for o in outs),
            "verified": verified,
        }
    proc = _spawn(case, case.spec)
    timeline: list[tuple[float, int]] = []
    if sample:
        t0 = time.perf_counter()
        while proc.poll() is None:
            rss = _rss(proc.pid)
            if rss is not None:
                timeline.append((time.perf_counter() - t0, rss))
            time.sleep(0.01)
    out = _finish(proc, case, timeout)
    out["verified"] = case.expect is None or out["digest"] == case.expect
    if sample:
        out["timeline"] = timeline
    return out


def rounds(
    cases: list[Case],
    repeat: int,
    seed: int,
    sample: set[tuple[str, str]] | None = None,
    log: Any = print,
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """A warm-up round (verifies, not measured) then ``repeat`` measured
    rounds; each round shuffles the order and the next one reverses it, so
    machine noise and cache state spread over every loader."""
    results: dict[tuple[str, str], list[dict[str, Any]]] = {(c.source, c.name): [] for c in cases}
    rng = random.Random(seed)
    order = list(cases)
    for r in range(repeat + 1):
        if r % 2 == 0:
            rng.shuffle(order)
        else:
            order.reverse()
        for case in order:
            key = (case.source, case.name)
            want_sample = r == 1 and sample is not None and key in sample
            res = run_once(case, sample=want_sample)
            gbps = res["bytes"] / res["seconds"] / 1e9 if res["seconds"] > 0 else 0.0
            res["gbps"] = gbps
            tag = "warm-up" if r == 0 else f"run {r}"
            ok = "ok" if res["verified"] else "MISMATCH"
            log(f"  {tag:<8} {case.source:<5} {case.name:<18} {gbps:6.2f} GB/s  {ok}")
            if r == 0:
                res["warmup"] = True
            results[key].append(res)
    return results
