"""Running the measured loads: each in a fresh child process (child.py), in
rounds whose order alternates; a tensor-parallel load as N children that
start together (the one rank harness: every preset and demo with ranks uses
it); the RSS of one load sampled over time; the CPU the server spent on it."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .child import SPEC_ENV

Results = dict[tuple[str, str], list[dict[str, Any]]]
Log = Callable[[str], None]
VMSTAT_KEYS = ("thp_fault_alloc", "thp_fault_fallback", "compact_stall", "pgfault")


@dataclass
class Case:
    """One loader on one source. The result must have digest ``expect`` (or,
    for a client that keeps no bytes, ``expect_bytes`` bytes); with
    ``world_size`` > 1 that many ranks load at once, rank r's result digest
    ``expect_ranks[r]``."""

    source: str
    loader: str
    spec: dict[str, Any]
    expect: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    label: str = ""
    world_size: int = 1
    expect_ranks: list[str] = field(default_factory=list)
    expect_bytes: int | None = None
    server_pid: int | None = None  # whose CPU seconds to charge to this load

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


def _cpu_seconds(pid: int | None) -> float | None:
    """utime + stime of a process (all its threads), from /proc."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _vmstat() -> dict[str, int]:
    """Machine-wide counters that show huge-page allocation and compaction."""
    out = {}
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key in VMSTAT_KEYS:
                    out[key] = int(value)
    except OSError:
        pass
    return out


def _spawn(case: Case, spec: dict[str, Any]) -> subprocess.Popen[str]:
    # The spec travels in the environment, not argv: it can hold S3 keys,
    # and any user can read a process's argv.
    return subprocess.Popen(
        [sys.executable, "-m", "fastshard_lab.child"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **case.env, SPEC_ENV: json.dumps(spec)},
    )


def _finish(proc: subprocess.Popen[str], case: Case, timeout: float) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise RuntimeError(f"{case.source}/{case.name} ran over {timeout:.0f} s") from None
    if proc.returncode != 0 or not out.strip():
        tail = err.strip().splitlines()[-5:]
        raise RuntimeError(f"{case.source}/{case.name} failed (rc {proc.returncode}): {tail}")
    return dict(json.loads(out.strip().splitlines()[-1]))


def _ranks(case: Case, timeout: float) -> dict[str, Any]:
    """``case.world_size`` children at once, released together by a barrier;
    the load's time runs from the first rank's start to the last one's end."""
    shared = tempfile.mkdtemp(prefix="fastshard-ranks-")
    try:
        base = {**case.spec, "world_size": case.world_size, "barrier": shared}
        if case.spec.get("cooperative"):
            base["group_file"] = os.path.join(shared, "group")
        procs = [_spawn(case, {**base, "rank": r}) for r in range(case.world_size)]
        try:
            outs = [_finish(p, case, timeout) for p in procs]
        except BaseException:
            for p in procs:  # the others would wait at the barrier for the one that failed
                p.kill()
                p.wait()
            raise
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    begin = min(o["start"] for o in outs)
    wants: list[str | None] = [*case.expect_ranks] or [None] * len(outs)
    for o, want in zip(outs, wants, strict=True):
        o["verified"] = want is None or o["digest"] == want
    return {
        "seconds": max(o["start"] + o["seconds"] for o in outs) - begin,
        "slowest_rank_seconds": max(o["seconds"] for o in outs),
        "bytes": sum(o["bytes"] for o in outs),
        "bytes_fetched": sum(o["bytes_fetched"] for o in outs),
        "discovery_bytes": sum(o.get("discovery_bytes", 0) for o in outs),
        "bytes_received": sum(o.get("bytes_received", 0) for o in outs),
        "exchange": outs[0].get("exchange", "") if outs else "",
        "cpu_seconds": sum(o["cpu_seconds"] for o in outs),
        "peak_rss_bytes": max(o["peak_rss_bytes"] for o in outs),
        "rss_before_bytes": max(o["rss_before_bytes"] for o in outs),
        "staging_peak_bytes": max(o.get("staging_peak_bytes", 0) for o in outs),
        "verified": all(o["verified"] for o in outs),
        "ranks": outs,
    }


def run_once(case: Case, sample: bool = False, timeout: float = 1800) -> dict[str, Any]:
    """One measurement; ``sample`` records (seconds, RSS bytes) every 10 ms."""
    server_before, vm_before = _cpu_seconds(case.server_pid), _vmstat()
    if case.world_size > 1:
        out = _ranks(case, timeout)
    else:
        proc = _spawn(case, case.spec)
        timeline: list[tuple[float, int]] = []
        t0 = time.perf_counter()
        while sample and proc.poll() is None:
            rss = _rss(proc.pid)
            if rss is not None:
                timeline.append((time.perf_counter() - t0, rss))
            time.sleep(0.01)
        out = _finish(proc, case, timeout)
        if case.expect is not None:
            out["verified"] = out["digest"] == case.expect
        else:
            out["verified"] = case.expect_bytes is None or out["bytes"] == case.expect_bytes
        if sample:
            out["timeline"] = timeline
    server_after, vm_after = _cpu_seconds(case.server_pid), _vmstat()
    if server_before is not None and server_after is not None:
        out["server_cpu_seconds"] = server_after - server_before
    out["vmstat_delta"] = {k: vm_after[k] - vm_before[k] for k in vm_after if k in vm_before}
    out["gbps"] = out["bytes"] / out["seconds"] / 1e9 if out["seconds"] > 0 else 0.0
    return out


def line(tag: str, case: Case, res: dict[str, Any]) -> str:
    """One progress line: rate, data check, requests, client (and server) CPU."""
    ok = "ok" if res["verified"] else "MISMATCH"
    text = f"  {tag:<8} {case.source:<5} {case.name:<24} {res['gbps']:6.2f} GB/s  {ok}"
    if "requests" in res:
        text += f" {res['requests']:>5} req"
    if res.get("retries"):
        text += f" {res['retries']} retries"
    text += f"  cpu {res['cpu_seconds']:5.2f} s"
    if res.get("server_cpu_seconds") is not None:
        text += f", server {res['server_cpu_seconds']:5.2f} s"
    return text


def add_warmup_flag(p: argparse.ArgumentParser) -> None:
    """``--no-warmup``: skip the uncounted first round (the tests of the
    harness, and a user who measures cold starts on purpose)."""
    p.add_argument(
        "--no-warmup", dest="warmup", action="store_false", help="no uncounted warm-up round"
    )


def rounds(
    cases: list[Case],
    repeat: int,
    seed: int,
    sample: set[tuple[str, str]] | None = None,
    log: Log = print,
    warmup: bool = True,
    after: Callable[[Case, dict[str, Any]], None] | None = None,
) -> Results:
    """A warm-up round (checked like every round, not counted; unless not
    ``warmup``) then ``repeat`` measured rounds; each even round shuffles the
    order and the next one reverses it, so machine noise, cache state and the
    memory a predecessor freed spread over every loader. ``after`` sees
    each run's result first (to add what only the caller can count)."""
    results: Results = {(c.source, c.name): [] for c in cases}
    rng = random.Random(seed)
    order = list(cases)
    first = 0 if warmup else 1
    for r in range(first, repeat + 1):
        if (r - first) % 2 == 0:
            rng.shuffle(order)
        else:
            order.reverse()
        for case in order:
            key = (case.source, case.name)
            res = run_once(case, sample=r == 1 and sample is not None and key in sample)
            res["warmup"] = r == 0
            if after is not None:
                after(case, res)
            log(line("warm-up" if r == 0 else f"run {r}", case, res))
            results[key].append(res)
    return results


def measured(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The counted runs (all of them when there was only a warm-up)."""
    return [r for r in runs if not r.get("warmup")] or runs
