"""One-call GPU check of fastshard's CUDA path (issue 5): correctness against
the CPU path, the raw pinned host-to-device rate, and fastshard's load rate
from a local file into one GPU, including a 10+ GiB load, and a cooperative
load over NCCL, one process per GPU (gpu_nccl.py). Prints a short
table last and writes gpu_check.json to --out. Needs only torch and a
fastshard wheel (no network, no installs beyond the wheel), under 5 minutes.

Build the wheel here and carry it (see docs/benchmarks/index.md, "GPU check and GPU benchmark"):
    make wheel            # target/wheels/fastshard-*-cp311-abi3-*.whl → .whl/
then on the GPU machine:
    pip install --no-index --no-deps --target /tmp/site .whl/fastshard-*.whl
    PYTHONPATH=/tmp/site python benches/gpu_check.py --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gpu_nccl
import torch

import fastshard

GiB, MiB = 1 << 30, 1 << 20
DTYPES = [
    "float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64",
    "uint8", "bool", "complex64", "float8_e4m3fn", "float8_e5m2",
]  # fmt: skip


def random_bits(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    n = 1
    for d in shape:
        n *= d
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    raw = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def poison(t: torch.Tensor) -> None:
    """0xFF in every byte: a destination byte the load never wrote shows."""
    t.detach().reshape(-1).view(torch.uint8).fill_(0xFF)


def correctness(tmp: Path, device: torch.device, seed: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(), (0, 3), (7,), (33, 65), (4096, 1031)]  # the last: ~17-33 MB, row-split
    sd: dict[str, torch.Tensor] = {}
    for name in DTYPES:
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            continue
        for i, shape in enumerate(shapes):
            sd[f"{name}_{i}"] = random_bits(dtype, shape, gen)
    path = tmp / "dtypes.tensors"
    fastshard.save(sd, path)
    checks: dict[str, bool] = {}
    cpu = fastshard.load_state_dict(path)
    checks["cpu path equals the saved tensors"] = all(same_bytes(cpu[n], t) for n, t in sd.items())
    for budget in (None, 8 * MiB):
        opts = {} if budget is None else {"max_host_bytes": budget}
        gpu = fastshard.load_state_dict(path, device=device, **opts)
        ok = all(gpu[n].device == device and same_bytes(gpu[n], cpu[n]) for n in sd)
        checks[f"load_state_dict cuda == cpu (max_host_bytes={budget})"] = ok
    # Into an existing model's CUDA parameters, poisoned first.
    model = torch.nn.Module()
    for n, t in sd.items():
        p = torch.empty(t.shape, dtype=t.dtype, device=device)
        poison(p)
        model.register_buffer(n, p)
    stats = fastshard.load(model, path, max_host_bytes=16 * MiB)
    bufs = dict(model.named_buffers())
    checks["load(model) into poisoned cuda buffers"] = all(
        same_bytes(bufs[n], t) for n, t in sd.items()
    )
    checks["peak_host_bytes <= max_host_bytes"] = 0 < stats.peak_host_bytes <= 16 * MiB
    # Meta parameters materialised on the GPU, with a cast.
    floats = {n: t for n, t in sd.items() if t.dtype in (torch.float32, torch.float64)}
    with torch.device("meta"):
        meta = torch.nn.Module()
        for n, t in floats.items():
            meta.register_parameter(
                n, torch.nn.Parameter(torch.empty(t.shape, dtype=torch.bfloat16))
            )
    fastshard.load(meta, path, device=device, strict=False)
    params = dict(meta.named_parameters())
    # Against a cast on the same device: CUDA's cast gives NaNs another bit
    # pattern than the CPU's.
    checks["meta model, bf16 cast, materialised on cuda"] = all(
        params[n].device == device and same_bytes(params[n], t.to(device).to(torch.bfloat16))
        for n, t in floats.items()
    )
    # Tensor-parallel slices of one unsharded file, rank 1 of 2.
    big = {n: t for n, t in sd.items() if t.dim() == 2 and t.shape[0] % 2 == 0 and t.numel()}
    specs = {n: fastshard.ShardSpec(dim=0) for n in big}
    tp_cpu = fastshard.load_state_dict(path, names=list(big), rank=1, world_size=2,
                                       shard_specs=specs)  # fmt: skip
    tp_cpu_rows = tp_cpu
    tp_gpu = fastshard.load_state_dict(path, names=list(big), rank=1, world_size=2,
                                       shard_specs=specs, device=device)  # fmt: skip
    checks["tp slice rank 1/2 cuda == cpu"] = all(same_bytes(tp_gpu[n], tp_cpu[n]) for n in big)
    cols = {n: fastshard.ShardSpec(dim=1) for n in big if sd[n].shape[1] % 2 == 0}
    if cols:
        tp_cpu = fastshard.load_state_dict(path, names=list(cols), rank=1, world_size=2,
                                           shard_specs=cols)  # fmt: skip
        tp_gpu = fastshard.load_state_dict(path, names=list(cols), rank=1, world_size=2,
                                           shard_specs=cols, device=device)  # fmt: skip
        checks["tp slice dim 1 rank 1/2 cuda == cpu"] = all(
            same_bytes(tp_gpu[n], tp_cpu[n]) for n in cols
        )
    verified = fastshard.load_state_dict(path, device=device, verify_hash=True)
    checks["verify_hash into cuda == cpu"] = all(same_bytes(verified[n], cpu[n]) for n in sd)
    # Encrypted: into CUDA whole, cast on the GPU, and as rank slices.
    key = fastshard.EncryptionKey.from_bytes(bytes(range(32)))
    enc = tmp / "dtypes-enc.tensors"
    fastshard.save(sd, enc, encryption=key)
    got = fastshard.load_state_dict(enc, device=device, encryption=key, verify_hash=True)
    checks["encrypted into cuda == cpu"] = all(same_bytes(got[n], cpu[n]) for n in sd)
    got = fastshard.load_state_dict(enc, device=device, encryption=key, dtype=torch.float32)
    checks["encrypted, cast to fp32 on cuda"] = all(
        same_bytes(got[n], cpu[n].to(device).to(torch.float32)) for n in floats
    )
    got = fastshard.load_state_dict(enc, names=list(big), rank=1, world_size=2,
                                    shard_specs=specs, device=device, encryption=key)  # fmt: skip
    checks["encrypted tp slice rank 1/2 cuda == cpu"] = all(
        same_bytes(got[n], tp_cpu_rows[n]) for n in big
    )
    return {"tensors": len(sd), "checks": checks, "ok": all(checks.values())}


def raw_h2d(device: torch.device, nbytes: int, repeat: int = 5) -> float:
    """GB/s of a plain torch copy from one pinned buffer (the ceiling)."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    src.fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(device)
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(device)
        best = max(best, nbytes / (time.perf_counter() - t0) / 1e9)
    return best


def write_big(path: Path, total: int, device: torch.device) -> dict[str, torch.Tensor]:
    """~total bytes of bf16 in 256 MiB tensors plus a tail of small ones,
    generated on the GPU (fast) and saved; returns a few to check against."""
    n_big = max(1, total // (256 * MiB))
    gen = torch.Generator(device=device).manual_seed(secrets.randbits(31))
    sd: dict[str, torch.Tensor] = {}
    for i in range(n_big):
        sd[f"layer{i}_weight"] = torch.randn(8192, 16384, dtype=torch.bfloat16, device=device,
                                             generator=gen).cpu()  # fmt: skip
    for i in range(256):
        sd[f"norm{i}"] = torch.randn(8192, dtype=torch.bfloat16, device=device, generator=gen).cpu()
    fastshard.save(sd, path)
    return {n: sd[n] for n in (next(iter(sd)), f"layer{n_big - 1}_weight", "norm255")}


def fastshard_load(path: Path, device: torch.device, repeat: int) -> tuple[list[float], Any]:
    """GB/s of fastshard.load into preallocated CUDA buffers (model memory
    allocated beforehand, as vLLM does), from a file in the page cache."""
    with fastshard.open(path) as f:
        infos = f.infos()
    model = torch.nn.Module()
    for info in infos:
        model.register_buffer(info.name, torch.empty(info.shape, dtype=info.dtype, device=device))
    rates, stats = [], None
    for _ in range(repeat):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        stats = fastshard.load(model, path)
        torch.cuda.synchronize(device)
        rates.append(stats.bytes_fetched / (time.perf_counter() - t0) / 1e9)
    return rates, (model, stats)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="gpu_check_out", help="folder for gpu_check.json")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--size-gib", type=float, default=10.0, help="the big load (default 10 GiB)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tmp", default=None, help="where files go (default /dev/shm if big enough)")
    ap.add_argument(
        "--nccl-world",
        type=int,
        default=None,
        help="processes of the cooperative NCCL check, one per GPU (default: every GPU)",
    )
    ap.add_argument("--nccl-only", action="store_true", help="run the NCCL check alone")
    args = ap.parse_args()
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    if not torch.cuda.is_available():
        print("gpu_check: CUDA is not available here", file=sys.stderr)
        return 2
    torch.cuda.set_device(device)
    world = gpu_nccl.world_size(args.nccl_world, torch.cuda.device_count())
    if args.nccl_only:
        nccl = gpu_nccl.check(world)
        (out / "gpu_check.json").write_text(json.dumps({"nccl": nccl}, indent=1, default=str))
        print(json.dumps(nccl, indent=1, default=str))
        return 0 if nccl["ok"] else 1
    total = int(args.size_gib * GiB)
    base = args.tmp
    if base is None:
        base = "/dev/shm" if shutil.disk_usage("/dev/shm").free > 2.5 * total else None
    tmp = Path(tempfile.mkdtemp(prefix="fastshard-gpu-", dir=base))
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "fastshard": fastshard.__version__,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "tmp": str(tmp),
    }
    try:
        seed = secrets.randbits(31)
        result["seed"] = seed
        result["correctness"] = correctness(tmp, device, seed)
        print("correctness:", json.dumps(result["correctness"], indent=1), flush=True)
        result["nccl"] = gpu_nccl.check(world)
        print("nccl:", json.dumps(result["nccl"], indent=1, default=str), flush=True)
        result["raw_pinned_h2d_gbps"] = raw_h2d(device, 1 * GiB)
        print(f"raw pinned H2D: {result['raw_pinned_h2d_gbps']:.1f} GB/s", flush=True)
        big = tmp / "big.tensors"
        t0 = time.perf_counter()
        sample = write_big(big, total, device)
        result["big_file_bytes"] = big.stat().st_size
        result["write_seconds"] = time.perf_counter() - t0
        rates, (model, stats) = fastshard_load(big, device, args.repeat)
        bufs = dict(model.named_buffers())
        result["big_load_gbps"] = rates
        result["big_load_stats"] = vars(stats)
        result["big_load_equal"] = all(same_bytes(bufs[n], t) for n, t in sample.items())
        del model, bufs
        torch.cuda.empty_cache()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        result["seconds"] = time.perf_counter() - started
        (out / "gpu_check.json").write_text(json.dumps(result, indent=1, default=str))
    raw = result["raw_pinned_h2d_gbps"]
    best = max(result["big_load_gbps"])
    peak = result["big_load_stats"]["peak_host_bytes"]
    rows = [
        ("correctness (all dtypes, cuda == cpu)", verdict(result["correctness"]["ok"])),
        (f"cooperative over NCCL, {world} ranks ({result['nccl']['checks']})",
         verdict(result["nccl"]["ok"])),
        ("raw pinned H2D, 1 GiB torch copy", f"{raw:.1f} GB/s"),
        (f"fastshard.load {result['big_file_bytes'] / GiB:.1f} GiB file -> {device}",
         f"{best:.1f} GB/s (runs: {', '.join(f'{r:.1f}' for r in result['big_load_gbps'])})"),
        ("fastshard / raw pinned", f"{best / raw:.2f}x  (target >= 0.9x and >= 45 GB/s)"),
        ("big load equal (sampled tensors)", verdict(result["big_load_equal"])),
        ("peak_host_bytes of the big load", f"{peak / MiB:.0f} MiB"),
        ("GPU / torch / python", f"{result['gpu']} / {result['torch']} / {result['python']}"),
        ("total seconds", f"{result['seconds']:.0f}"),
    ]  # fmt: skip
    width = max(len(r[0]) for r in rows)
    print()
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    ok = result["correctness"]["ok"] and result["big_load_equal"] and result["nccl"]["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
