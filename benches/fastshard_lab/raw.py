"""The raw clients that set each source's ceiling: no format, no tensors,
just the object's bytes. Python threads doing ranged GETs ``readinto`` one
buffer (pre-faulted: the transfer alone; or fresh memory, whose page faults a
loader returning new tensors pays too), ``curl`` processes writing to
/dev/null, and a plain sequential read of a local file. The ranged-GET
client itself (split, parallel_get, object_size) is the wheel's, which
``fastshard bench URI`` measures with too (fastshard.benchmark.raw)."""

from __future__ import annotations

import mmap
import subprocess
from typing import Any

from fastshard.benchmark.raw import object_size, parallel_get, split

MiB = 1 << 20
Result = tuple[Any, dict[str, Any]]


def buffer(spec: dict[str, Any]) -> Any:
    """The destination, made before the clock starts: zero-filled (so its
    pages are faulted in) unless ``fresh``, when it is made on the clock."""
    return None if spec.get("fresh") else bytearray(spec["size"])


def ceiling_remote(spec: dict[str, Any]) -> Result:
    """``streams`` ranged GETs into one buffer (``spec["_buf"]``, or a fresh
    anonymous mapping made here, on the clock); with ``size_lookup``, after
    learning the object's size as a client that is not told it must."""
    lookups = 0
    if spec.get("size_lookup"):
        size, lookups = object_size(spec["url"]), 1
        if size != spec["size"]:
            raise RuntimeError(f"size lookup: {size} bytes, expected {spec['size']}")
    buf = spec.get("_buf") or mmap.mmap(-1, spec["size"])
    ranges = split(spec["size"], spec.get("streams", 16))
    parallel_get(spec["url"], memoryview(buf), ranges)
    return buf, {"requests": len(ranges) + lookups, "bytes_fetched": spec["size"]}


def ceiling_file(spec: dict[str, Any]) -> Result:
    """A plain sequential read of the file into one pre-faulted buffer."""
    buf = spec.get("_buf") or mmap.mmap(-1, spec["size"])
    view = memoryview(buf)
    with open(spec["path"], "rb", buffering=0) as f:
        pos = 0
        while pos < len(buf):
            n = f.readinto(view[pos : pos + 64 * MiB])
            if not n:
                raise RuntimeError(f"short read at {pos}")
            pos += n
    return buf, {"bytes_fetched": len(buf)}


def curl(spec: dict[str, Any]) -> Result:
    """``streams`` curl processes, one ranged GET each, into /dev/null (their
    CPU counts: the child's usage includes reaped children). Checked by
    status and length; there are no bytes to digest."""
    fmt = "%{http_code} %{size_download}"
    ranges = split(spec["size"], spec.get("streams", 16))
    procs = [
        subprocess.Popen(
            ["curl", "-sS", "-o", "/dev/null", "-r", f"{a}-{b - 1}", "-w", fmt, spec["url"]],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for a, b in ranges
    ]
    got = 0
    for (a, b), p in zip(ranges, procs, strict=True):
        out, err = p.communicate()
        code, _, n = out.decode().partition(" ")
        if p.returncode != 0 or code != "206" or int(float(n or 0)) != b - a:
            raise RuntimeError(f"curl -r {a}-{b - 1}: rc {p.returncode}, {out!r} {err[-300:]!r}")
        got += int(float(n))
    return got, {"requests": len(procs), "bytes_fetched": got}
