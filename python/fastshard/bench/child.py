"""One measured load in a fresh process: ``python -m fastshard.bench.child
SPEC_JSON`` prints one JSON line (seconds, bytes, peak RSS, what the loader
returned as a digest, the loader's own counters).

Everything the loader imports is imported before the clock starts; the
digest is computed after it stops.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

MiB = 1 << 20


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def split(size: int, n: int) -> list[tuple[int, int]]:
    """``n`` contiguous [start, end) ranges covering ``size`` bytes, as equal as possible."""
    n = max(1, min(n, size))
    step, extra = divmod(size, n)
    out, start = [], 0
    for i in range(n):
        end = start + step + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def parallel_get(url: str, view: memoryview, ranges: list[tuple[int, int]]) -> None:
    """One thread per range, each one ranged GET ``readinto`` its part of
    ``view`` (object offsets = view offsets)."""
    import http.client

    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    https = parts.scheme == "https"
    conn_cls = http.client.HTTPSConnection if https else http.client.HTTPConnection
    errors: list[BaseException] = []

    def fetch(start: int, end: int) -> None:
        try:
            conn = conn_cls(parts.hostname or "127.0.0.1", parts.port, timeout=120)
            conn.request("GET", target, headers={"Range": f"bytes={start}-{end - 1}"})
            resp = conn.getresponse()
            if resp.status != 206:
                raise RuntimeError(f"GET {start}-{end - 1}: HTTP {resp.status}")
            pos = start
            while pos < end:
                n = resp.readinto(view[pos:end])
                if not n:
                    raise RuntimeError(f"short body at {pos} of {start}-{end - 1}")
                pos += n
            conn.close()
        except BaseException as e:  # noqa: BLE001 (raised below, in the main thread)
            errors.append(e)

    threads = [threading.Thread(target=fetch, args=r) for r in ranges]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _ceiling_remote(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``streams`` ranged GETs into one pre-faulted buffer: the transfer
    alone, no tensors, no page faults."""
    buf = spec["_buf"]
    ranges = split(spec["size"], spec.get("streams", 16))
    parallel_get(spec["url"], memoryview(buf), ranges)
    return buf, {"requests": len(ranges), "bytes_fetched": spec["size"]}


def _ceiling_file(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A plain sequential read of the file into one pre-faulted buffer."""
    buf = spec["_buf"]
    view = memoryview(buf)
    with open(spec["path"], "rb", buffering=0) as f:
        pos = 0
        while pos < len(buf):
            n = f.readinto(view[pos : pos + 64 * MiB])
            if not n:
                raise RuntimeError(f"short read at {pos}")
            pos += n
    return buf, {"bytes_fetched": len(buf)}


def _fastshard(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    import fastshard

    ws = spec.get("world_size", 1)
    opts = dict(spec.get("opts", {}))
    if "key_hex" in spec:  # JSON carries no key object: the raw 32-byte key, as hex
        opts["encryption"] = fastshard.EncryptionKey.from_bytes(bytes.fromhex(spec["key_hex"]))
    with fastshard.open(spec["uri"], **opts) as f:
        kwargs: dict[str, Any] = {}
        if ws > 1:  # rank's dim-0 slice of every 2-D tensor that splits evenly
            specs = {i.name: (0 if len(i.shape) == 2 and i.shape[0] % ws == 0 else None)
                     for i in f.infos()}  # fmt: skip
            kwargs = {"rank": spec["rank"], "world_size": ws, "shard_specs": specs}
        sd = f.load_state_dict(**kwargs)
        st = f.stats
    return sd, {
        "requests": st.requests,
        "retries": st.retries,
        "bytes_fetched": st.bytes_fetched,
        "concurrency": st.concurrency,
        "staging_peak_bytes": st.peak_host_bytes,
    }


def _tensorizer(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from tensorizer import TensorDeserializer
    from tensorizer.stream_io import open_stream

    stream = open_stream(spec["uri"], "rb", **spec.get("opts", {}))
    kwargs: dict[str, Any] = {"verify_hash": bool(spec.get("verify_hash", False))}
    if "key_hex" in spec:
        from tensorizer import DecryptionParams

        kwargs["encryption"] = DecryptionParams.from_key(bytes.fromhex(spec["key_hex"]))
    with TensorDeserializer(stream, device="cpu", **kwargs) as d:
        sd = {k: d[k] for k in d.keys()}  # noqa: SIM118 (a Mapping)
    with contextlib.suppress(Exception):
        stream.close()
    return sd, {}


def _runai(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from runai_model_streamer import SafetensorsStreamer

    sd = {}
    with SafetensorsStreamer() as streamer:
        streamer.stream_file(spec["uri"])
        for name, tensor in streamer.get_tensors():
            sd[name] = tensor.clone()  # as vLLM's loader does: the streamer reuses its buffer
    return sd, {}


def _safetensors(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    import torch
    from safetensors.torch import load_file

    sd = load_file(spec["path"])
    for t in sd.values():  # materialise: touch every page of every tensor
        flat = t.reshape(-1).view(torch.uint8)
        if flat.numel():
            flat[::4096].sum()
    return sd, {}


def _torch(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    import torch

    return torch.load(spec["path"], map_location="cpu", weights_only=True), {}


LOADERS: dict[str, Callable[[dict[str, Any]], tuple[Any, dict[str, Any]]]] = {
    "fastshard": _fastshard,
    "tensorizer": _tensorizer,
    "runai": _runai,
    "safetensors": _safetensors,
    "torch": _torch,
}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    loader = spec["loader"]
    import torch  # noqa: F401 (imported before the clock, like every loader's modules)

    if loader == "ceiling":
        size = spec["size"]
        spec["_buf"] = bytearray(size)  # zero-filled: pre-faulted
        fn = _ceiling_file if spec["source"] == "file" else _ceiling_remote
    else:
        fn = LOADERS[loader]
        with contextlib.suppress(ImportError):
            if loader == "fastshard":
                import fastshard

                fastshard.open  # noqa: B018 (resolves the lazily imported reader)
            elif loader == "tensorizer":
                import tensorizer.stream_io  # noqa: F401
            elif loader == "runai":
                import runai_model_streamer  # noqa: F401
            elif loader == "safetensors":
                import safetensors.torch  # noqa: F401
    gc.collect()
    base = _status_bytes("VmRSS")
    cpu = os.times()
    start = time.perf_counter()
    result, extra = fn(spec)
    seconds = time.perf_counter() - start
    cpu_end = os.times()
    out: dict[str, Any] = {
        "seconds": seconds,
        "start": start,
        # This process's CPU over the load (all threads): on a shared host the
        # client's cost per byte decides what is left for the server.
        "cpu_seconds": (cpu_end.user - cpu.user) + (cpu_end.system - cpu.system),
        "rss_before_bytes": base,
        "peak_rss_bytes": _status_bytes("VmHWM"),
        **extra,
    }
    if loader == "ceiling":
        out["bytes"] = len(result)
        out["digest"] = hashlib.sha256(result).hexdigest()
    else:
        from .workload import digest

        out["bytes"] = sum(t.nbytes for t in result.values())
        out["digest"] = digest(result)
    out.setdefault("bytes_fetched", out["bytes"])
    return out


def main() -> int:
    spec = json.loads(sys.argv[1])
    print(json.dumps(run(spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
