"""Trust benchmark (issue 8): what verify_hash and encryption cost.

Each variant (plain, verify_hash, encrypted, encrypted + verify_hash) is loaded by fastshard
and by tensorizer from a local file and from S3 (SeaweedFS on loopback), every load in a
fresh process, in rounds whose order alternates (fastshard.bench.measure). The table gives
each variant's throughput as a ratio of the same loader's plain load in the same run; the
target is fastshard >= 0.8x. Also printed: what one core of this machine hashes per second
(SHA-256, CRC32), which bounds a verified load on a machine with few cores.

    python benches/bench_trust.py [--size 512MiB] [--repeat 3] [--sources file,s3]

Writes .bench/trust/results.json and table.md.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import fastshard
from fastshard.bench import measure, servers, sources, workload
from fastshard.bench import report as report_io

REPO = Path(__file__).resolve().parent.parent
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
            if encrypted:
                spec["key_hex"] = key_hex
            if loader == "fastshard":
                spec["opts"] = {**spec.get("opts", {}), "verify_hash": verify}
            else:
                spec["verify_hash"] = verify
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="512MiB")
    p.add_argument("--shape", default="llm", choices=sorted(workload.SHAPES))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--sources", default="file,s3")
    p.add_argument("--loaders", default="fastshard,tensorizer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(REPO / ".bench" / "trust"))
    args = p.parse_args(argv)
    which = set(args.sources.split(","))
    loaders = set(args.loaders.split(","))
    if not sources.installed("tensorizer"):
        loaders.discard("tensorizer")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="fastshard-trust-"))
    key = secrets.token_bytes(32)
    try:
        size = workload.parse_size(args.size)
        print(f"writing a {args.shape} workload of {size / 2**20:.0f} MiB ...", flush=True)
        sd = workload.state_dict(args.shape, size, args.seed)
        expect = workload.digest(sd)
        files = {"plain": scratch / "plain.tensors", "encrypted": scratch / "encrypted.tensors"}
        fastshard.save(sd, files["plain"])
        fastshard.save(sd, files["encrypted"], encryption=fastshard.EncryptionKey.from_bytes(key))
        del sd
        rates = core_rates()
        print("one core: " + ", ".join(f"{k} {v:.2f} GB/s" for k, v in rates.items()), flush=True)
        all_cases: list[measure.Case] = []
        with sources.local_servers(scratch, which & {"s3"}, print) as up:
            if "file" in which:
                where = {name: {o: {"uri": str(f)} for o, f in files.items()} for name in loaders}
                all_cases += cases(where, "file", key.hex(), expect)
            if "s3" in up:
                s3: servers.SeaweedFS = up["s3"]
                uris = {o: s3.upload(f, f"trust/{f.name}") for o, f in files.items()}
                tz_opts = {
                    "s3_access_key_id": s3.access_key,
                    "s3_secret_access_key": s3.secret_key,
                    "s3_endpoint": s3.endpoint,
                    "force_http": True,
                }
                where = {}
                if "fastshard" in loaders:
                    where["fastshard"] = {o: {"uri": u, "opts": s3.opts()} for o, u in uris.items()}
                if "tensorizer" in loaders:
                    where["tensorizer"] = {o: {"uri": u, "opts": tz_opts} for o, u in uris.items()}
                all_cases += cases(where, "s3", key.hex(), expect)
            results = measure.rounds(all_cases, args.repeat, args.seed)
        text, verdicts = table(results)
        title = (
            f"{args.shape}, {size / 2**20:.0f} MiB, {time.strftime('%Y-%m-%d %H:%M')}, "
            f"{os.cpu_count()} CPUs; one core: "
            + ", ".join(f"{k} {v:.2f} GB/s" for k, v in rates.items())
        )
        print(f"\n{title}\n\n{text}\n")
        for v in verdicts:
            print(v)
        body = f"{title}\n\n{text}\n\n" + "\n".join(verdicts) + "\n"
        return report_io.save_runs(out, title, body, results)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
