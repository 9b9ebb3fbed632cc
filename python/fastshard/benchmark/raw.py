"""The raw client: no format, no tensors, just the objects' bytes. Python
threads each doing one ranged GET ``readinto`` their part of one buffer
(an http(s) URL, or an s3:// object through a presigned URL), or a plain
sequential read of a local file."""

from __future__ import annotations

import http.client
import mmap
import threading
from typing import Any
from urllib.parse import urlsplit

MiB = 1 << 20
STREAMS = 16


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


def _connect(url: str) -> tuple[http.client.HTTPConnection, str]:
    """A new connection to ``url``'s host, and the request target."""
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    https = parts.scheme == "https"
    conn_cls = http.client.HTTPSConnection if https else http.client.HTTPConnection
    return conn_cls(parts.hostname or "127.0.0.1", parts.port, timeout=120), target


def _fetch(url: str, view: memoryview, start: int, end: int) -> None:
    conn, target = _connect(url)
    try:
        conn.request("GET", target, headers={"Range": f"bytes={start}-{end - 1}"})
        resp = conn.getresponse()
        # A server may answer a ranged GET 200 with the Content-Range of
        # exactly the bytes asked for (some S3 gateways do): those bytes, as a 206.
        exact = (resp.getheader("Content-Range") or "").startswith(f"bytes {start}-{end - 1}/")
        if resp.status != 206 and not (resp.status == 200 and exact):
            raise RuntimeError(f"GET {start}-{end - 1}: HTTP {resp.status}")
        pos = start
        while pos < end:
            n = resp.readinto(view[pos:end])
            if not n:
                raise RuntimeError(f"short body at {pos} of {start}-{end - 1}")
            pos += n
    finally:
        conn.close()


def parallel_get(url: str, view: memoryview, ranges: list[tuple[int, int]]) -> None:
    """One thread per range, each one ranged GET ``readinto`` its part of
    ``view`` (object offsets = view offsets)."""
    errors: list[BaseException] = []

    def fetch(start: int, end: int) -> None:
        try:
            _fetch(url, view, start, end)
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
    """The object's size, from a one-byte ranged GET's ``Content-Range``
    (a presigned URL signs GET only, not HEAD)."""
    conn, target = _connect(url)
    try:
        conn.request("GET", target, headers={"Range": "bytes=0-0"})
        resp = conn.getresponse()
        resp.read()
        got, _, total = (resp.getheader("Content-Range") or "").rpartition("/")
        # rclone answers a ranged GET 200 with the Content-Range asked for.
        exact = resp.status == 200 and got == "bytes 0-0"
        if (resp.status != 206 and not exact) or not total.isdigit():
            raise RuntimeError(f"size lookup: HTTP {resp.status}, Content-Range {total!r}")
        return int(total)
    finally:
        conn.close()


def get_url(url: str, streams: int = STREAMS) -> mmap.mmap:
    """The whole object at ``url``, by ``streams`` ranged GETs into new memory."""
    size = object_size(url)
    buf = mmap.mmap(-1, max(size, 1))
    parallel_get(url, memoryview(buf)[:size], split(size, streams))
    return buf


def read_file(path: str) -> mmap.mmap:
    """A plain sequential read of the file into new memory."""
    with open(path, "rb", buffering=0) as f:
        size = f.seek(0, 2)
        f.seek(0)
        buf = mmap.mmap(-1, max(size, 1))
        view = memoryview(buf)
        pos = 0
        while pos < size:
            n = f.readinto(view[pos : min(size, pos + 64 * MiB)])
            if not n:
                raise RuntimeError(f"{path}: short read at {pos}")
            pos += n
    return buf


def presign_s3(uri: str, expires: int = 3600) -> str:
    """A presigned GET URL for ``s3://bucket/key`` (boto3, which reads the
    endpoint, region and credentials from the environment and AWS config)."""
    import boto3
    from botocore.config import Config

    bucket, _, key = uri.removeprefix("s3://").partition("/")
    client: Any = boto3.client(
        "s3", config=Config(signature_version="s3v4", s3={"addressing_style": "path"})
    )
    url = client.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires
    )
    return str(url)
