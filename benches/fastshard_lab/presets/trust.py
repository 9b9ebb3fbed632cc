"""What verify_hash and encryption cost.

Each variant (plain, verify_hash, encrypted, encrypted + verify_hash) is loaded by fastshard
and by tensorizer from a local file and from S3 (SeaweedFS on loopback), every load in a
fresh process, in rounds whose order alternates (fastshard_lab.measure). The table gives
each variant's throughput as a ratio of the same loader's plain load in the same run, and
fastshard's verify_hash and encrypted rows as a ratio of their ceiling: min(its plain load,
the reference code on every core, measured in this run): hashlib's SHA-256 (OpenSSL) for the
hashes, libsodium's secretbox through tensorizer's own binding (libnacl) for decryption. The
targets: >= 0.9x the ceiling, and an encrypted load >= 1.2x tensorizer's.

    python -m fastshard_lab --preset trust [--size 512MiB] [--repeat 3] [--sources file,s3]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import secrets
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import deps, measure, report, sources
from ..params import BENCH_DIR, SHAPES, add_out, names, size_arg

TARGET = 0.9  # of the ceiling
OVER_TENSORIZER = 1.2  # an encrypted load against tensorizer's
VARIANTS = {  # name -> (verify_hash, encrypted)
    "plain": (False, False),
    "verify_hash": (True, False),
    "encrypted": (False, True),
    "encrypted+verify_hash": (True, True),
}
# Which reference bounds a variant (the target covers these two).
CEILING = {"verify_hash": "sha256", "encrypted": "secretbox_open"}
BOX = 2 << 20  # tensorizer's encryption chunk


def _secretbox_open(nbytes: int) -> Callable[[], None] | None:
    """Opens ``nbytes`` of 2 MiB secretboxes with libsodium as tensorizer calls it (its
    ``libnacl`` binding of the system library); None where that is not installed."""
    try:
        from libnacl import nacl  # type: ignore[import-untyped]
    except (ImportError, OSError):
        return None
    key, nonce = os.urandom(32), os.urandom(24)
    boxes = [ctypes.create_string_buffer(BOX + 16) for _ in range(max(1, nbytes // BOX))]
    out = ctypes.create_string_buffer(BOX)
    size = ctypes.c_ulonglong(BOX)
    for b in boxes:
        nacl.crypto_secretbox_easy(b, os.urandom(BOX), size, nonce, key)

    def run() -> None:
        for b in boxes:
            if nacl.crypto_secretbox_open_easy(out, b, ctypes.c_ulonglong(BOX + 16), nonce, key):
                raise RuntimeError("libsodium could not open its own box")

    return run


def _sha256(nbytes: int) -> Callable[[], None] | None:
    data = os.urandom(nbytes)

    def run() -> None:
        hashlib.sha256(data).digest()

    return run


def ceilings(per_thread: int = BOX, passes: int = 96) -> dict[str, float]:
    """GB/s of the reference code on every core (one thread each, own buffers, all at
    once): hashlib's SHA-256 and libsodium's secretbox open (absent without libnacl). One
    2 MiB buffer per thread, so it runs from cache: the strictest ceiling, the one a load
    that checks each chunk while it is still in cache could reach."""
    threads = len(os.sched_getaffinity(0))
    out = {}
    for name, make in (("sha256", _sha256), ("secretbox_open", _secretbox_open)):
        runs = [r for r in (make(per_thread) for _ in range(threads)) if r is not None]
        if len(runs) < threads:
            continue
        ts = [threading.Thread(target=lambda r=r: [r() for _ in range(passes)]) for r in runs]
        start = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        out[name] = threads * passes * per_thread / (time.perf_counter() - start) / 1e9
    return out


def cases(
    where: dict[str, dict[str, Any]], source: str, key_hex: str, expect: str
) -> list[measure.Case]:
    """``where``: per loader and "plain"/"encrypted" object, the spec fields to read it."""
    out = []
    for variant, (verify, encrypted) in VARIANTS.items():
        obj = "encrypted" if encrypted else "plain"
        for loader in ("fastshard", "tensorizer"):
            if loader not in where:
                continue
            spec: dict[str, Any] = {"loader": loader, "source": source, **where[loader][obj]}
            spec["verify_hash"] = verify
            if encrypted:
                spec["key_hex"] = key_hex
            out.append(measure.Case(source, loader, spec, expect, label=f"{loader}:{variant}"))
    return out


def table(
    results: dict[tuple[str, str], list[dict[str, Any]]], ceil: dict[str, float]
) -> tuple[str, list[str]]:
    def median(source: str, label: str) -> float | None:
        runs = [r["gbps"] for r in results.get((source, label), []) if not r.get("warmup")]
        return statistics.median(runs) if runs else None

    def cell(x: float | None, fmt: str = "{:.2f}") -> str:
        return "–" if x is None else fmt.format(x)

    lines = [
        "| source | variant | fastshard GB/s | ÷ its plain | ÷ ceiling | tensorizer GB/s "
        "| ÷ its plain | fastshard ÷ tensorizer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for source in sorted({s for s, _ in results}):
        fs0, tz0 = median(source, "fastshard:plain"), median(source, "tensorizer:plain")
        for variant in VARIANTS:
            fs, tz = median(source, f"fastshard:{variant}"), median(source, f"tensorizer:{variant}")
            r_fs = fs / fs0 if fs and fs0 else None
            r_tz = tz / tz0 if tz and tz0 else None
            ref = ceil.get(CEILING.get(variant, ""))
            bound = min(fs0, ref) if fs0 and ref else None
            r_ceil = fs / bound if fs and bound else None
            vs_tz = fs / tz if fs and tz else None
            lines.append(
                f"| {source} | {variant} | {cell(fs)} | {cell(r_fs, '{:.2f}×')} "
                f"| {cell(r_ceil, '{:.2f}×')} | {cell(tz)} | {cell(r_tz, '{:.2f}×')} "
                f"| {cell(vs_tz, '{:.2f}×')} |"
            )
            if r_ceil is not None:
                ok = "PASS" if r_ceil >= TARGET else "FAIL"
                verdicts.append(
                    f"{ok}: {source} {variant} = {r_ceil:.2f}× min(plain {fs0:.2f}, "
                    f"{CEILING[variant]} on every core {ref:.2f}) (≥ {TARGET}×)"
                )
            if variant == "encrypted" and vs_tz is not None:
                ok = "PASS" if vs_tz >= OVER_TENSORIZER else "FAIL"
                verdicts.append(
                    f"{ok}: {source} encrypted = {vs_tz:.2f}× tensorizer (≥ {OVER_TENSORIZER}×)"
                )
    return "\n".join(lines), verdicts


def _ceiling_line(rates: dict[str, float]) -> str:
    got = ", ".join(f"{k} {v:.2f} GB/s" for k, v in rates.items()) or "none measured"
    return f"reference code on every core: {got}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", type=size_arg, default="512MiB")
    p.add_argument("--shape", default="llm", choices=SHAPES)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--sources", default="file,s3")
    p.add_argument("--loaders", default="fastshard,tensorizer")
    p.add_argument("--seed", type=int, default=0)
    add_out(p, str(BENCH_DIR / "trust"))


def requires(args: argparse.Namespace) -> list[str]:
    return ["torch"]


def _cases(
    which: set[str], files: dict[str, Path], up: dict[str, Any], loaders: list[str], key: bytes,
    expect: str,
) -> list[measure.Case]:  # fmt: skip
    """Every variant for every loader, from the local files and, when it is
    up, from S3."""
    out = []
    if "file" in which:
        where = {n: {o: {"uri": str(f)} for o, f in files.items()} for n in loaders}
        out += cases(where, "file", key.hex(), expect)
    if "s3" in up:
        s3 = up["s3"]
        uris = {o: s3.upload(f, f"trust/{f.name}") for o, f in files.items()}
        opts = {"fastshard": s3.opts(), "tensorizer": sources.tensorizer_s3_opts(s3)}
        where = {n: {o: {"uri": u, "opts": opts[n]} for o, u in uris.items()} for n in loaders}
        out += cases(where, "s3", key.hex(), expect)
    return out


def run(args: argparse.Namespace) -> int:
    import fastshard

    from .. import workload

    which = set(names(args.sources))
    skipped: dict[str, str] = {}
    loaders = deps.runnable(
        [n for n in names(args.loaders) if n in ("fastshard", "tensorizer")], skipped
    )
    programs = sources.find_servers(which & {"s3"}, skipped)
    if not loaders or not ("file" in which or programs):
        raise deps.MissingDependency(
            f"python -m fastshard_lab --preset trust: nothing to measure ({skipped})"
        )
    scratch = Path(tempfile.mkdtemp(prefix="fastshard-trust-"))
    key = secrets.token_bytes(32)
    try:
        print(f"writing a {args.shape} workload of {args.size / 2**20:.0f} MiB ...", flush=True)
        sd = workload.state_dict(args.shape, args.size, args.seed)
        expect = workload.digest(sd)
        files = {"plain": scratch / "plain.tensors", "encrypted": scratch / "encrypted.tensors"}
        fastshard.save(sd, files["plain"])
        fastshard.save(sd, files["encrypted"], encryption=fastshard.EncryptionKey.from_bytes(key))
        del sd
        rates = ceilings()
        print(_ceiling_line(rates), flush=True)
        with sources.local_servers(scratch, programs) as up:
            all_cases = _cases(which, files, up, loaders, key, expect)
            results = measure.rounds(all_cases, args.repeat, args.seed)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text, verdicts = table(results, rates)
    title = (
        f"{args.shape}, {args.size / 2**20:.0f} MiB, {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{os.cpu_count()} CPUs; {_ceiling_line(rates)}"
    )
    body = f"{title}\n\n{text}\n\n" + "\n".join(verdicts)
    print("\n" + body)
    recs = report.records(results)
    report.write(
        args.out, recs, {"args": vars(args), "skipped": skipped, "ceilings": rates}, body, results
    )
    return report.exit_code(recs)
