"""The raw clients that set each source's ceiling: no format, no tensors,
just the object's bytes. Python threads doing ranged GETs ``readinto`` one
buffer (pre-faulted: the transfer alone; or fresh memory, whose page faults a
loader returning new tensors pays too), ``curl`` processes writing to
/dev/null, and a plain sequential read of a local file."""

from __future__ import annotations

import mmap
import subprocess
import threading
from typing import Any
from urllib.parse import urlsplit

MiB = 1 << 20
Result = tuple[Any, dict[str, Any]]


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


def _connect(url: str) -> tuple[Any, str]:
    """A new connection to ``url``'s host, and the request target."""
    import http.client

    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    https = parts.scheme == "https"
    conn_cls = http.client.HTTPSConnection if https else http.client.HTTPConnection
    return conn_cls(parts.hostname or "127.0.0.1", parts.port, timeout=120), target


def parallel_get(url: str, view: memoryview, ranges: list[tuple[int, int]]) -> None:
    """One thread per range, each one ranged GET ``readinto`` its part of
    ``view`` (object offsets = view offsets)."""
    errors: list[BaseException] = []

    def fetch(start: int, end: int) -> None:
        try:
            conn, target = _connect(url)
            conn.request("GET", target, headers={"Range": f"bytes={start}-{end - 1}"})
            resp = conn.getresponse()
            # rclone serve s3 answers a ranged GET 200 with the Content-Range
            # of exactly the bytes asked for (rclone.py): those bytes, as a 206.
            exact = (resp.getheader("Content-Range") or "").startswith(f"bytes {start}-{end - 1}/")
            if resp.status != 206 and not (resp.status == 200 and exact):
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


def object_size(url: str) -> int:
    """The object's size, from a one-byte ranged GET's ``Content-Range``: the
    round trip a client that is not told the size pays before its ranged GETs
    (s5cmd and the AWS CLI send a HEAD; a presigned URL signs GET only)."""
    conn, target = _connect(url)
    try:
        conn.request("GET", target, headers={"Range": "bytes=0-0"})
        resp = conn.getresponse()
        resp.read()
        total = (resp.getheader("Content-Range") or "").rpartition("/")[2]
        if resp.status != 206 or not total.isdigit():
            raise RuntimeError(f"size lookup: HTTP {resp.status}, Content-Range {total!r}")
        return int(total)
    finally:
        conn.close()


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
