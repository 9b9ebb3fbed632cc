"""The loaders compared by the demo and the benchmarks, and a one-load child process.

Each loader takes the location of a file and returns a state dict whose tensors are
fully materialised in this process's memory (a lazy mmap is not a load). Loaders
take a location string so that remote sources (s3://, http://) slot in later.

Run as a script, this file loads one file once and prints one JSON line:
    python benches/loaders.py --loader fastshard --path .bench/x/model.tensors [--digest]
The benchmark harness runs it in a fresh process per measurement, so that peak RSS
belongs to one loader alone.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable

import torch

StateDict = dict[str, torch.Tensor]


def load_fastshard(uri: str) -> StateDict:
    import fastshard

    return fastshard.load_state_dict(uri)


def load_tensorizer(uri: str) -> StateDict:
    from tensorizer import TensorDeserializer

    # lazy_load=False (the default) reads every tensor in the constructor.
    with TensorDeserializer(uri, device="cpu") as d:
        return {k: d[k] for k in d.keys()}  # noqa: SIM118 (a Mapping, iterating keys is fine)


def load_safetensors(uri: str) -> StateDict:
    from safetensors.torch import load_file

    # load_file maps the file lazily; clone() copies each tensor into process memory.
    return {k: v.clone() for k, v in load_file(uri).items()}


def load_torch(uri: str) -> StateDict:
    return torch.load(uri, weights_only=True)


# name -> (loader, which file format it reads)
LOADERS: dict[str, tuple[Callable[[str], StateDict], str]] = {
    "fastshard": (load_fastshard, "tensors"),
    "tensorizer": (load_tensorizer, "tensors"),
    "safetensors": (load_safetensors, "safetensors"),
    "torch": (load_torch, "torch"),
}


def describe(name: str) -> str:
    return {
        "fastshard": "fastshard.load_state_dict",
        "tensorizer": 'tensorizer TensorDeserializer(device="cpu")',
        "safetensors": "safetensors load_file + clone",
        "torch": "torch.load(weights_only=True)",
    }[name]


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for pkg in ("fastshard", "torch", "tensorizer", "safetensors", "numpy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


# --- one measured load in this process ---------------------------------------------------


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so it measures the load alone."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure(loader: str, path: str, want_digest: bool) -> dict:
    """Time one load in this process; report RSS (bytes) around it."""
    fn, _ = LOADERS[loader]
    gc.collect()
    hwm_before = _status_kib("VmHWM")  # this process's peak so far (the imports)
    rss_before = _status_kib("VmRSS")
    peak_reset = _reset_peak_rss()
    start = time.perf_counter()
    sd = fn(path)
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM") if peak_reset else None
    if peak is None:  # no per-load peak: fall back to the whole process's
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = {
        "loader": loader,
        "path": path,
        "seconds": seconds,
        "bytes": sum(t.nbytes for t in sd.values()),
        "tensors": len(sd),
        "rss_before": (rss_before or 0) * 1024,
        "peak_rss": peak * 1024,
        "peak_is_load_only": peak_reset,
        # Not wait4()'s ru_maxrss: after a vfork+exec, Linux folds the parent's
        # high-water mark into the child's.
        "process_max_rss": max(peak, hwm_before or 0) * 1024,
    }
    if want_digest:
        from workloads import digest  # benches/ is sys.path[0] when run as a script

        result["digest"] = digest(sd)
    return result


def disable_thp() -> None:
    """No transparent huge pages in this process, even where a loader madvises them."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(41, 1, 0, 0, 0) != 0:  # PR_SET_THP_DISABLE
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_THP_DISABLE) failed")


def run_child(loader: str, path: str, want_digest: bool = False, no_thp: bool = False) -> dict:
    """Run ``measure`` in a fresh interpreter (this file as a script); return its result."""
    cmd = [sys.executable, __file__, "--loader", loader, "--path", path]
    if want_digest:
        cmd.append("--digest")
    if no_thp:
        cmd.append("--no-thp")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{loader} on {path} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loader", required=True, choices=sorted(LOADERS))
    p.add_argument("--path", required=True)
    p.add_argument("--digest", action="store_true", help="also print a digest of what loaded")
    p.add_argument("--no-thp", action="store_true", help="disable transparent huge pages")
    args = p.parse_args(argv)
    if args.no_thp:
        disable_thp()
    # Import everything the loader needs before the clock starts.
    if args.loader == "fastshard":
        import fastshard

        fastshard.load_state_dict  # noqa: B018 (resolves the lazily imported reader)
    elif args.loader == "tensorizer":
        import tensorizer  # noqa: F401
    elif args.loader == "safetensors":
        import safetensors.torch  # noqa: F401
    print(json.dumps(measure(args.loader, args.path, args.digest)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
