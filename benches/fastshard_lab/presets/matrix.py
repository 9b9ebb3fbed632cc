"""Stores x proxies: fastshard's default against fixed settings and a raw
client, one object, every cell checked.

Rows: each S3 store on 127.0.0.1 (--stores: SeaweedFS, moto, ``rclone serve
s3``), then each shaping proxy in front of SeaweedFS (--proxies): the Rust
one (tools/shaper, skipped with its reason when not built: ``make
shaper``) and the Python one (pyshaper.py), each with --latency-ms first
byte and --conn-mbps per connection; ``pyshaper-service`` (and, on request,
``shaper-service``) adds --service-ms per request in --service-slots slots.

Columns, each load in a fresh process in alternating order, --runs rounds
(median): fastshard's default (``load_state_dict`` with no concurrency or
part option), fixed concurrency x part size (64 x 4 MiB, 16 x 16 MiB,
8 x 32 MiB, 4 x 64 MiB), and a raw client (64 ranged GETs of a presigned
URL, Python threads, into fresh memory, as load_state_dict returns new
tensors), told the object's size and again learning it first (a one-byte
ranged GET, the round trip any client given only the URI makes); then the
default ÷ the best fixed setting and ÷ each raw client.
A second table gives each fastshard cell's requests and most in flight
(its LoadStats). Every load's data is checked against the object's.

moto runs without its signature check (moto.py: with it, a presigned URL,
the raw client's, gets a 500); it reads the whole object for every ranged
GET, so its row shows that, not a network. Writes results.json (a record
per cell, LoadStats medians included), matrix.json (the grid), meta.json,
runs.json and table.md to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .. import deps, measure, report
from ..params import BENCH_DIR, MiB, add_out, names
from ..procs import MissingBinary, find_binary
from . import matrix_report
from .matrix_report import RAW, RAW_SIZED, SETTINGS

STORES = ("seaweedfs", "moto", "rclone")
PROXIES = ("shaper", "shaper-service", "pyshaper", "pyshaper-service")
BINARIES = {"seaweedfs": "weed", "moto": "moto_server", "rclone": "rclone"}
KEY = "matrix/model.tensors"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size-mib", type=int, default=256, help="the object's size (about)")
    p.add_argument("--runs", type=int, default=1, help="measured rounds per cell (median)")
    p.add_argument(
        "--warmup", action="store_true", help="an uncounted round first (checked like the rest)"
    )
    p.add_argument("--stores", default=",".join(STORES), help=f"of {', '.join(STORES)}")
    p.add_argument(
        "--proxies",
        default="shaper,pyshaper,pyshaper-service",
        help=f"in front of SeaweedFS, of {', '.join(PROXIES)} ('' for none)",
    )
    p.add_argument("--latency-ms", type=float, default=50.0, help="each proxy's first byte")
    p.add_argument("--conn-mbps", type=float, default=25.0, help="MB/s per connection")
    p.add_argument("--service-ms", type=float, default=100.0, help="the *-service proxies'")
    p.add_argument("--service-slots", type=int, default=1, help="requests served at once")
    p.add_argument("--cell-timeout", type=float, default=900.0, help="seconds a load may take")
    p.add_argument("--seed", type=int, default=0)
    add_out(p, str(BENCH_DIR / "matrix"))


def requires(args: argparse.Namespace) -> list[str]:
    return ["torch", "boto3"]


def _chosen(text: str, known: tuple[str, ...], what: str) -> list[str]:
    picked = names(text)
    unknown = [x for x in picked if x not in known]
    if unknown:
        raise SystemExit(f"{what}: unknown {unknown}; known: {', '.join(known)}")
    return picked


def _binaries(stores: list[str], proxies: list[str], skipped: dict[str, str]) -> dict[str, str]:
    """Store → its server program, for each needed one that is installed
    (SeaweedFS is needed by the proxies too); the others go to ``skipped``."""
    need = list(dict.fromkeys([*stores, *(["seaweedfs"] if proxies else [])]))
    found = {}
    for store in need:
        name = BINARIES[store]
        try:
            found[store] = find_binary(name, os.path.join(os.path.dirname(sys.executable), name))
        except MissingBinary as e:
            skipped[store] = str(e)
            print(f"skipping {store}: {e}", flush=True)
    return found


def _shaper_binary(proxies: list[str], skipped: dict[str, str]) -> str | None:
    if not any(p.startswith("shaper") for p in proxies):
        return None
    from ..shaper import find_shaper

    try:
        return find_shaper(release=True)
    except MissingBinary as e:
        skipped["shaper"] = str(e)
        print(f"skipping the Rust shaping proxy: {e}", flush=True)
        return None


@contextlib.contextmanager
def _store(store: str, binary: str, root: Path) -> Iterator[Any]:
    """The store on 127.0.0.1, stopped on the way out."""
    from ..servers import MotoS3, RcloneS3, SeaweedFS

    made: Any
    if store == "seaweedfs":
        made = SeaweedFS(root / "seaweedfs")
    elif store == "moto":
        made = MotoS3(root / "moto", auth=False)  # presigned URLs (the raw client) need it
    else:
        made = RcloneS3(root / "rclone")
    try:
        yield made.start(binary)
    finally:
        made.stop()


@contextlib.contextmanager
def _proxy(
    proxy: str, args: argparse.Namespace, port: int, root: Path, shaper_bin: str | None
) -> Iterator[tuple[str, int, Callable[[], dict[str, Any]], dict[str, float]]]:
    """(endpoint, the PID whose CPU is the proxy's, its counters, its shape)
    of ``proxy`` in front of ``port``, stopped on the way out."""
    from ..pyshaper import PyShaper
    from ..shaper import Shaper

    service = args.service_ms if proxy.endswith("-service") else 0.0
    shape = {"latency_ms": args.latency_ms, "rate_mbps": args.conn_mbps, "service_ms": service}
    shape["service_slots"] = args.service_slots
    if proxy.startswith("pyshaper"):
        with PyShaper(port, **shape) as py:
            # It runs in this process, which waits on each load meanwhile.
            yield py.endpoint, os.getpid(), py.stats, shape
        return
    assert shaper_bin is not None
    rust = Shaper(port, root / proxy, **shape).start(shaper_bin)
    try:
        assert rust.proc is not None
        yield rust.endpoint, rust.proc.pid, rust.stats, shape
    finally:
        rust.stop()


def _cases(
    row: str, s3: Any, uri: str, via: str, size: int, expect: dict[str, str], pid: int | None
) -> list[measure.Case]:
    """Every setting's load of ``uri`` through ``via``, and the raw client's."""
    out = []
    for label, opts in SETTINGS:
        spec: dict[str, Any] = {"loader": "fastshard", "source": row, "uri": uri}
        spec["opts"] = s3.opts(s3_endpoint=via, **opts)
        out.append(measure.Case(row, "fastshard", spec, expect["tensors"], label=label))
    url = s3.presign(uri, endpoint=via, expires=12 * 3600)
    raw = {"loader": "ceiling", "source": row, "url": url, "size": size, "streams": 64}
    out.append(measure.Case(row, "ceiling", {**raw, "fresh": True}, expect["object"], label=RAW))
    sized = {**raw, "fresh": True, "size_lookup": True}
    out.append(measure.Case(row, "ceiling", sized, expect["object"], label=RAW_SIZED))
    for case in out:
        case.server_pid = pid
    return out


def _rounds(
    cases: list[measure.Case], args: argparse.Namespace, errors: dict[str, str]
) -> measure.Results:
    """measure.rounds, but a load that fails is recorded in ``errors``
    (``row/label``) and the matrix goes on: one store's failure is a cell."""
    results: measure.Results = {(c.source, c.name): [] for c in cases}
    rng, order = random.Random(args.seed), list(cases)
    first = 0 if args.warmup else 1
    for r in range(first, args.runs + 1):
        rng.shuffle(order) if (r - first) % 2 == 0 else order.reverse()
        for case in order:
            key = f"{case.source}/{case.name}"
            if key in errors:
                continue
            try:
                res = measure.run_once(case, timeout=args.cell_timeout)
            except RuntimeError as e:
                errors[key] = str(e)
                print(f"  FAILED   {key}: {e}", flush=True)
                continue
            res["warmup"] = r == 0
            print(measure.line("warm-up" if r == 0 else f"run {r}", case, res), flush=True)
            results[(case.source, case.name)].append(res)
    return results


def _object(args: argparse.Namespace, folder: Path) -> tuple[Path, dict[str, str]]:
    """The tensorizer object (tensorizer's writer, else fastshard.save's:
    the same format) and the digests its loads are checked against."""
    from .. import workload

    sd = workload.state_dict("llm", args.size_mib * MiB, args.seed)
    fmt = "tensorizer" if deps.installed("tensorizer") else "fastshard"
    objects = workload.write_objects(sd, folder, (fmt,))
    expect = {"tensors": workload.digest(sd), "object": workload.file_digest(objects[fmt])}
    return objects[fmt], expect


def _measure(
    args: argparse.Namespace,
    stores: list[str],
    proxies: list[str],
    programs: dict[str, str],
    shaper_bin: str | None,
    scratch: Path,
) -> tuple[measure.Results, dict[str, dict[str, Any]], dict[str, str], int]:
    """Every row's results, each row's description, the failed cells, and
    the object's size."""
    path, expect = _object(args, scratch / "object")
    size = path.stat().st_size
    results: measure.Results = {}
    rows: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    for store in (s for s in STORES if s in programs):
        with _store(store, programs[store], scratch / "servers") as s3:
            print(f"\n## {store} on {s3.endpoint}: uploading {size / MiB:.0f} MiB", flush=True)
            uri = s3.upload(path, KEY)
            pid = s3.proc.pid if s3.proc else None
            if store in stores:
                rows[store] = {"store": store, "proxy": None, "cpu_of": "store"}
                cases = _cases(store, s3, uri, s3.endpoint, size, expect, pid)
                results |= _rounds(cases, args, errors)
            if store != "seaweedfs":
                continue
            for proxy in proxies:
                if proxy.startswith("shaper") and shaper_bin is None:
                    continue
                row = f"{store}+{proxy}"
                with _proxy(proxy, args, s3.s3_port, scratch, shaper_bin) as (via, ppid, st, sh):
                    print(f"\n## {row} on {via} ({sh})", flush=True)
                    cases = _cases(row, s3, uri, via, size, expect, ppid)
                    results |= _rounds(cases, args, errors)
                    rows[row] = {"store": store, "proxy": proxy, "shape": sh, "cpu_of": "proxy"}
                    rows[row]["proxy_stats"] = st()
    return results, rows, errors, size


def run(args: argparse.Namespace) -> int:
    stores = _chosen(args.stores, STORES, "--stores")
    proxies = _chosen(args.proxies, PROXIES, "--proxies")
    if args.runs < 1 or args.size_mib < 1:
        raise SystemExit("--runs and --size-mib: at least 1")
    skipped: dict[str, str] = {}
    programs = _binaries(stores, proxies, skipped)
    shaper_bin = _shaper_binary(proxies, skipped)
    if not any(s in programs for s in stores) and not ("seaweedfs" in programs and proxies):
        raise deps.MissingDependency(
            f"python -m fastshard_lab --preset matrix: no store ({skipped})"
        )
    scratch = Path(tempfile.mkdtemp(prefix="fastshard-matrix-"))
    try:
        results, rows, errors, size = _measure(args, stores, proxies, programs, shaper_bin, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    grid = matrix_report.grid(results, rows, errors)
    text = matrix_report.text(args, grid, size)
    print("\n" + text, flush=True)
    recs = report.records(results)
    meta = {"args": vars(args), "skipped": skipped, "errors": errors, "object_bytes": size}
    report.write(args.out, recs, meta, text, results)
    matrix_report.write_json(args.out / "matrix.json", grid, meta)
    print(f"\nwrote {args.out}")
    code = report.exit_code(recs)
    if errors:
        print(f"error: {len(errors)} cell(s) failed: {', '.join(errors)}")
        return 1
    return code
