"""The loaders and ceilings benches/gpu_bench.py times on one GPU: fastshard
beside safetensors >= 0.9 (``prefetch``), InstantTensor, fastsafetensors,
tensorizer and safetensors ``load_file``, each into the GPU's memory, and
the ceilings of the machine (pinned host-to-device copy, threaded reads
into pinned memory, SHA-256 and secretbox on every core).

Every loader returns ``{name: tensor on the device}`` once the tensors are
usable (the caller synchronizes the device before stopping its clock); a
loader whose package is missing raises ImportError and is skipped.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

import fastshard

MiB = 1 << 20
Tensors = dict[str, torch.Tensor]
# (file, device, plan) -> tensors; plan: {name: (row0, rows) or None} or None for all.
Plan = dict[str, tuple[int, int] | None] | None
Loader = Callable[[Path, torch.device, Plan], Tensors]


def threads() -> int:
    return os.cpu_count() or 8


# -- fastshard --------------------------------------------------------------
# The stats of the last fastshard load that returned tensors (gpu_harness
# records them beside its figures).
LAST_STATS: list[fastshard.LoadStats] = []


def fastshard_sd(path: Path, device: torch.device, plan: Plan, **opts: Any) -> Tensors:
    """``load_state_dict(device=...)``; with a plan, its rows as one rank's
    dim-0 slices (every planned slice is rank ``r0 // rows`` of
    ``shape[0] // rows``, as gpu_bench plans them)."""
    with fastshard.open(path, **opts) as f:
        if plan is None:
            out = f.load_state_dict(device=device)
        else:
            rank, world = 0, 1
            for name, rows in plan.items():
                if rows is not None:
                    rank, world = rows[0] // rows[1], f.info(name).shape[0] // rows[1]
                    break
            specs: dict[str, int | None] = {n: (None if p is None else 0) for n, p in plan.items()}
            out = f.load_state_dict(
                device=device, names=list(plan), rank=rank, world_size=world, shard_specs=specs
            )
        LAST_STATS[:] = [f.stats]
    return dict(out)


def fastshard_model(path: Path, model: torch.nn.Module, **opts: Any) -> fastshard.LoadStats:
    """``load`` into a model's existing CUDA parameters, as vLLM does."""
    return fastshard.load(model, path, strict=False, **opts)


# -- peers ------------------------------------------------------------------
def st_prefetch(path: Path, device: torch.device, plan: Plan) -> Tensors:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device=str(device)) as f:
        if not hasattr(f, "prefetch"):
            raise ImportError("safetensors < 0.9 has no prefetch")
        spec = (
            None
            if plan is None
            else {n: (None if p is None else slice(p[0], p[0] + p[1])) for n, p in plan.items()}
        )
        with f.prefetch(spec, threads=threads()) as loader:
            return dict(loader)


def instanttensor(path: Path, device: torch.device, plan: Plan) -> Tensors:
    from instanttensor import safe_open

    if plan is not None:
        raise ImportError("InstantTensor loads whole tensors only")
    with safe_open(str(path), framework="pt", device=device) as f:
        return dict(f.tensors())


def fastsafetensors(path: Path, device: torch.device, plan: Plan) -> Tensors:
    from fastsafetensors import fastsafe_open

    if plan is not None:
        raise ImportError("not timed with slices")
    with fastsafe_open(str(path), device=str(device), nogds=True) as f:
        return {k: f.get_tensor(k).clone() for k in f.keys()}


def tensorizer(path: Path, device: torch.device, plan: Plan) -> Tensors:
    from tensorizer import TensorDeserializer

    if plan is not None:
        raise ImportError("tensorizer reads whole tensors only")
    with TensorDeserializer(str(path), device=str(device)) as d:
        return dict(d.items())


def st_load_file(path: Path, device: torch.device, plan: Plan) -> Tensors:
    from safetensors.torch import load_file

    if plan is not None:
        raise ImportError("load_file reads whole tensors only")
    return load_file(str(path), device=str(device))


def st_slices(path: Path, device: torch.device, plan: Plan) -> Tensors:
    """safetensors' own slicing (``get_slice``), the plan's rows."""
    from safetensors import safe_open

    assert plan is not None
    out: Tensors = {}
    with safe_open(str(path), framework="pt", device=str(device)) as f:
        for n, p in plan.items():
            out[n] = f.get_tensor(n) if p is None else f.get_slice(n)[p[0] : p[0] + p[1]]
    return out


PEERS: dict[str, tuple[str, Loader]] = {  # name: (file format, loader)
    "safetensors prefetch": ("safetensors", st_prefetch),
    "InstantTensor": ("safetensors", instanttensor),
    "fastsafetensors": ("safetensors", fastsafetensors),
    "tensorizer": ("tensorizer", tensorizer),
    "safetensors load_file": ("safetensors", st_load_file),
}


def version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as v

    try:
        return v(module)
    except PackageNotFoundError:
        return "-"


# -- ceilings ---------------------------------------------------------------
def pinned_h2d(device: torch.device, nbytes: int, repeat: int = 5) -> float:
    """GB/s of one torch copy from a pinned buffer (best of ``repeat``)."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    src.fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    best = 0.0
    for _ in range(repeat + 1):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(device)
        best = max(best, nbytes / (time.perf_counter() - t0) / 1e9)
    return best


def threaded_read(path: Path, workers: int, buf: torch.Tensor, chunk: int = 8 * MiB) -> float:
    """GB/s of ``workers`` threads ``preadv``-ing the file's first
    ``len(buf)`` bytes into the pinned ``buf`` (chunks of ``chunk``), as a
    loader's readers would."""
    size = min(path.stat().st_size, buf.numel())
    view = memoryview(buf.numpy())
    fd = os.open(path, os.O_RDONLY)
    try:

        def read(off: int) -> None:
            os.preadv(fd, [view[off : min(off + chunk, size)]], off)

        with ThreadPoolExecutor(workers) as pool:
            t0 = time.perf_counter()
            list(pool.map(read, range(0, size, chunk)))
            return size / (time.perf_counter() - t0) / 1e9
    finally:
        os.close(fd)


def sha256_rate(path: Path, workers: int, chunk: int = 64 * MiB) -> float:
    """GB/s of SHA-256 over the file's bytes on ``workers`` threads
    (hashlib releases the GIL for large inputs)."""
    data = memoryview(path.read_bytes())

    def digest(off: int) -> bytes:
        return hashlib.sha256(data[off : off + chunk]).digest()

    with ThreadPoolExecutor(workers) as pool:
        t0 = time.perf_counter()
        list(pool.map(digest, range(0, len(data), chunk)))
        return len(data) / (time.perf_counter() - t0) / 1e9


def secretbox_rate(nbytes: int, workers: int, chunk: int = 2 * MiB) -> float:
    """GB/s of libsodium's ``crypto_secretbox_open_detached`` over 2 MiB
    chunks on ``workers`` threads: the cipher's ceiling. Through the
    ``benches/crypto_rates`` cdylib (the libsodium build fastshard links;
    ``make peer-wheels`` puts it in .whl/), called by ctypes without the
    GIL; else PyNaCl, whose per-call copies make it a floor, not a ceiling."""
    lib_path = Path(os.environ.get("FASTSHARD_CRYPTO_RATES", ".whl/libcrypto_rates.so"))
    if not lib_path.exists():
        lib_path = Path(__file__).resolve().parent.parent / ".whl" / "libcrypto_rates.so"
    if lib_path.exists():
        return _sodium_rate(ctypes.CDLL(str(lib_path)), nbytes, workers, chunk)
    from nacl.bindings import crypto_secretbox, crypto_secretbox_open

    key, nonce = bytes(32), bytes(24)
    box = crypto_secretbox(os.urandom(chunk), nonce, key)
    count = max(1, nbytes // chunk)

    def open_one(_: int) -> None:
        crypto_secretbox_open(box, nonce, key)

    with ThreadPoolExecutor(workers) as pool:
        t0 = time.perf_counter()
        list(pool.map(open_one, range(count)))
        return count * chunk / (time.perf_counter() - t0) / 1e9


def _sodium_rate(lib: ctypes.CDLL, nbytes: int, workers: int, chunk: int) -> float:
    p, u64 = ctypes.c_void_p, ctypes.c_uint64
    lib.sodium_version.restype = ctypes.c_char_p
    lib.sodium_seal.argtypes = [p, p, p, u64, p, p]
    lib.sodium_open.argtypes = [p, p, p, u64, p, p]
    lib.sodium_version()  # sodium_init: picks the vector code first
    key, nonce = os.urandom(32), os.urandom(24)
    count = max(workers, nbytes // chunk)
    plain = ctypes.create_string_buffer(os.urandom(chunk), chunk)
    boxes = [ctypes.create_string_buffer(chunk) for _ in range(workers)]
    macs = [ctypes.create_string_buffer(16) for _ in range(workers)]
    for box, mac in zip(boxes, macs, strict=True):
        lib.sodium_seal(box, mac, plain, chunk, nonce, key)
    outs = [ctypes.create_string_buffer(chunk) for _ in range(workers)]

    def open_some(w: int) -> None:
        for _ in range(count // workers):
            lib.sodium_open(outs[w], boxes[w], macs[w], chunk, nonce, key)

    with ThreadPoolExecutor(workers) as pool:
        t0 = time.perf_counter()
        list(pool.map(open_some, range(workers)))
        return (count // workers) * workers * chunk / (time.perf_counter() - t0) / 1e9


def drop_caches() -> bool:
    """Drops the page cache (root only); False where it cannot."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def dd_rate(path: Path) -> float:
    """GB/s of ``dd`` reading the file with a cold cache: the disk's rate."""
    drop_caches()
    t0 = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M"], check=True, capture_output=True)
    return path.stat().st_size / (time.perf_counter() - t0) / 1e9
