"""GB/s per core of the SHA-256, CRC32 and secretbox code fastshard could run, beside Python's
references, in one process: hashlib (OpenSSL), zlib, and libsodium as tensorizer loads it
(libnacl). The Rust candidates are a cdylib (this folder) called through ctypes, which
releases the GIL, so each call runs on the calling thread like hashlib's. Candidates alternate
in shuffled order over ROUNDS rounds; the rate is bytes per second of the thread's CPU time
(wall clock in brackets), so other work on a busy machine counts less. Medians, min-max.

    python benches/crypto_rates/rates.py [--rounds 13] [--buffer-mib 2] [--bytes-mib 128]

--buffer-mib 2 measures in cache, 64 from memory. Builds the cdylib with cargo first.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import random
import statistics
import subprocess
import time
import zlib
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BOX = 2 << 20  # tensorizer's encryption chunk
P, N, U64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64


def build() -> ctypes.CDLL:
    target = ROOT / ".bench" / "crypto_rates"
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--manifest-path", str(HERE / "Cargo.toml")],
        check=True,
        env={**os.environ, "CARGO_TARGET_DIR": str(target)},
    )
    lib = ctypes.CDLL(str(target / "release" / "libcrypto_rates.so"))
    lib.sodium_version.restype = ctypes.c_char_p
    lib.sodium_seal.argtypes = [P, P, P, U64, P, P]
    lib.sodium_open.argtypes = [P, P, P, U64, P, P]
    lib.rustcrypto_open.argtypes = [P, N, P, P, P]
    for name in ("sha2_sha256", "crc32fast_crc32", "crcfast_crc32", "both"):
        getattr(lib, name).restype = ctypes.c_uint32
    return lib


def candidates(lib: ctypes.CDLL, size: int) -> dict[str, Callable[[], object]]:
    data = bytearray(os.urandom(size))
    at = ctypes.addressof((ctypes.c_char * size).from_buffer(data))
    key, nonce = os.urandom(32), os.urandom(24)
    boxes = bytearray(size)
    box_at = ctypes.addressof((ctypes.c_char * size).from_buffer(boxes))
    macs = [ctypes.create_string_buffer(16) for _ in range(0, size, BOX)]
    for j, mac in enumerate(macs):
        lib.sodium_seal(box_at + j * BOX, mac, at + j * BOX, BOX, nonce, key)
    lib.sodium_version()  # sodium_init: picks the vector code before anything is sealed
    out = {
        "sha256 hashlib (OpenSSL)": lambda: hashlib.sha256(data).digest(),
        "sha256 sha2 0.10.9": lambda: lib.sha2_sha256(P(at), N(size)),
        "crc32 zlib": lambda: zlib.crc32(data),
        "crc32 crc32fast 1.5.5": lambda: lib.crc32fast_crc32(P(at), N(size)),
        "crc32 crc-fast 1.10.0": lambda: lib.crcfast_crc32(P(at), N(size)),
        "crc32+sha256 crc32fast+sha2, 256 KiB": lambda: lib.both(P(at), N(size), N(256 << 10)),
    }

    def opener(open_box: Callable[[int, int, bytes], int]) -> Callable[[], None]:
        def run() -> None:
            assert boxes and data  # the raw addresses point into them: keep them alive
            for j, mac in enumerate(macs):
                if open_box(at + j * BOX, box_at + j * BOX, mac.raw):
                    raise RuntimeError("a box did not open")

        return run

    def rustcrypto(m: int, c: int, mac: bytes) -> int:
        ctypes.memmove(m, c, BOX)  # it opens in place
        return int(lib.rustcrypto_open(m, BOX, mac, nonce, key))

    out["open libsodium built by libsodium-sys-stable"] = opener(
        lambda m, c, mac: int(lib.sodium_open(m, c, mac, BOX, nonce, key))
    )
    out["open RustCrypto crypto_secretbox 0.1 (+copy)"] = opener(rustcrypto)
    try:
        from libnacl import nacl  # type: ignore[import-untyped]  # tensorizer's binding

        sys_open = nacl.crypto_secretbox_open_detached
        sys_open.argtypes = [P, P, P, ctypes.c_ulonglong, P, P]
        nacl.sodium_version_string.restype = ctypes.c_char_p
        name = f"open libsodium {nacl.sodium_version_string().decode()} (system, tensorizer's)"
        out[name] = opener(lambda m, c, mac: int(sys_open(m, c, mac, BOX, nonce, key)))
    except (ImportError, OSError):
        pass
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=13)
    p.add_argument("--buffer-mib", type=int, default=2)
    p.add_argument("--bytes-mib", type=int, default=128, help="per sample")
    args = p.parse_args()
    lib = build()
    size = args.buffer_mib << 20
    reps = max(1, args.bytes_mib // args.buffer_mib)
    cands = candidates(lib, size)
    cpu: dict[str, list[float]] = {k: [] for k in cands}
    wall: dict[str, list[float]] = {k: [] for k in cands}
    load = os.getloadavg()
    for _ in range(args.rounds):
        for name in random.sample(list(cands), len(cands)):
            c0, w0 = time.thread_time(), time.perf_counter()
            for _ in range(reps):
                cands[name]()
            c, w = time.thread_time() - c0, time.perf_counter() - w0
            cpu[name].append(size * reps / c / 1e9)
            wall[name].append(size * reps / w / 1e9)
    print(
        f"libsodium {lib.sodium_version().decode()} built; {args.buffer_mib} MiB buffer, "
        f"{args.rounds} rounds; load average {load[0]:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    for name in cands:
        v = sorted(cpu[name])
        print(
            f"{name:52s} {statistics.median(v):6.2f} GB/s per core ({v[0]:.2f}-{v[-1]:.2f}) "
            f"[wall {statistics.median(wall[name]):.2f}]"
        )


if __name__ == "__main__":
    main()
