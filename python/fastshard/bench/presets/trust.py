"""What verify_hash and encryption cost.

Each variant (plain, verify_hash, encrypted, encrypted + verify_hash) is loaded by fastshard
and by tensorizer from a local file and from S3 (SeaweedFS on loopback), every load in a
fresh process, in rounds whose order alternates (fastshard.bench.measure). The table gives
each variant's throughput as a ratio of the same loader's plain load in the same run; the
target is fastshard >= 0.8x. Also printed: what one core of this machine hashes per second
(SHA-256, CRC32), which bounds a verified load on a machine with few cores.

    fastshard bench --preset trust [--size 512MiB] [--repeat 3] [--sources file,s3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import shutil
import statistics
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from .. import deps, measure, report, sources
from ..params import BENCH_DIR, SHAPES, add_out, names, size_arg

TARGET = 0.8
VARIANTS = {  # name -> (verify_hash, encrypted)
    "plain": (False, False),
    "verify_hash": (True, False),
    "encrypted": (False, True),
    "encrypted+verify_hash": (True, True),
}


def core_rates(size: int = 256 << 20) -> dict[str, float]:
    """Single-core GB/s of the checks a verified load runs (OpenSSL's SHA-256 and zlib's
    CRC32, which are at least as fast as the Rust crates fastshard uses)."""
    buf = os.urandom(1 << 20) * (size >> 20)
    out = {}
    for name, fn in (("sha256", lambda b: hashlib.sha256(b).digest()), ("crc32", zlib.crc32)):
        start = time.perf_counter()
        fn(buf)
        out[name] = size / (time.perf_counter() - start) / 1e9
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


def table(results: dict[tuple[str, str], list[dict[str, Any]]]) -> tuple[str, list[str]]:
    def median(source: str, label: str) -> float | None:
        runs = [r["gbps"] for r in results.get((source, label), []) if not r.get("warmup")]
        return statistics.median(runs) if runs else None

    lines = [
        "| source | variant | fastshard GB/s | ÷ its plain | tensorizer GB/s | ÷ its plain "
        "| fastshard ÷ tensorizer |",
        "|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for source in sorted({s for s, _ in results}):
        for variant in VARIANTS:
            fs, tz = median(source, f"fastshard:{variant}"), median(source, f"tensorizer:{variant}")
            fs0, tz0 = median(source, "fastshard:plain"), median(source, "tensorizer:plain")

            def cell(x: float | None, fmt: str = "{:.2f}") -> str:
                return "–" if x is None else fmt.format(x)

            r_fs = fs / fs0 if fs and fs0 else None
            r_tz = tz / tz0 if tz and tz0 else None
            lines.append(
                f"| {source} | {variant} | {cell(fs)} | {cell(r_fs, '{:.2f}×')} | {cell(tz)} "
                f"| {cell(r_tz, '{:.2f}×')} | {cell(fs / tz if fs and tz else None, '{:.2f}×')} |"
            )
            if variant != "plain" and r_fs is not None:
                ok = "PASS" if r_fs >= TARGET else "FAIL"
                verdicts.append(f"{ok}: {source} {variant} = {r_fs:.2f}× plain (≥ {TARGET}×)")
    return "\n".join(lines), verdicts


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
            f"fastshard bench --preset trust: nothing to measure ({skipped})"
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
        rates = core_rates()
        print("one core: " + ", ".join(f"{k} {v:.2f} GB/s" for k, v in rates.items()), flush=True)
        with sources.local_servers(scratch, programs) as up:
            all_cases = _cases(which, files, up, loaders, key, expect)
            results = measure.rounds(all_cases, args.repeat, args.seed)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text, verdicts = table(results)
    title = (
        f"{args.shape}, {args.size / 2**20:.0f} MiB, {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{os.cpu_count()} CPUs; one core: "
        + ", ".join(f"{k} {v:.2f} GB/s" for k, v in rates.items())
    )
    body = f"{title}\n\n{text}\n\n" + "\n".join(verdicts)
    print("\n" + body)
    recs = report.records(results)
    report.write(
        args.out, recs, {"args": vars(args), "skipped": skipped, "core": rates}, body, results
    )
    return report.exit_code(recs)
