"""HTTP/1.1 on a raw socket, as the fault proxy (``fault_proxy``) needs it:
buffered reads that keep no extra reference to the descriptor (so a reset
can be forced), a head's lines and headers, bodies relayed by length or in
chunks, and a close that resets instead of finishing."""

from __future__ import annotations

import contextlib
import socket
import struct
from typing import Any


class SockReader:
    """Buffered reads from a socket without ``makefile`` (whose references
    would keep the descriptor open when a reset is wanted)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def _fill(self) -> bool:
        data = self.sock.recv(1 << 16)
        self.buf += data
        return bool(data)

    def readline(self, limit: int = 65537) -> bytes:
        while True:
            i = self.buf.find(b"\n")
            if i >= 0 or len(self.buf) >= limit or not self._fill():
                n = i + 1 if i >= 0 else len(self.buf)
                line = bytes(self.buf[:n])
                del self.buf[:n]
                return line

    def read(self, n: int) -> bytes:
        while len(self.buf) < n and self._fill():
            pass
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def read1(self, n: int) -> bytes:
        if self.buf:
            out = bytes(self.buf[:n])
            del self.buf[:n]
            return out
        return self.sock.recv(n)


def read_head(rf: Any) -> tuple[str, dict[str, str], bytes] | None:
    """Request or status line plus headers (lower-cased names) and raw bytes."""
    first = rf.readline(65537)
    while first in (b"\r\n", b"\n"):
        first = rf.readline(65537)
    if not first:
        return None
    raw = [first]
    headers: dict[str, str] = {}
    while True:
        line = rf.readline(65537)
        if not line:
            return None
        raw.append(line)
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return first.decode("latin-1").rstrip("\r\n"), headers, b"".join(raw)


def body_length(method: str, status: int, headers: dict[str, str]) -> int | None:
    """The length of the body that follows an answer's head (to a request of
    ``method``): None when chunked, -1 until the sender closes."""
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return 0
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return None
    if "content-length" in headers:
        return int(headers["content-length"])
    return -1


def relay(rf: Any, out: socket.socket, length: int | None) -> None:
    left = length
    while left is None or left > 0:
        chunk = rf.read1(1 << 20 if left is None else min(left, 1 << 20))
        if not chunk:
            if left is None:
                return
            raise OSError("upstream closed mid-body")
        out.sendall(chunk)
        if left is not None:
            left -= len(chunk)


def relay_chunked(rf: Any, out: socket.socket) -> None:
    while True:
        size_line = rf.readline(65537)
        out.sendall(size_line)
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while True:  # trailers, then the blank line
                line = rf.readline(65537)
                out.sendall(line)
                if line in (b"\r\n", b"\n", b""):
                    return
        relay(rf, out, size + 2)


def reset(sock: socket.socket) -> None:
    """Close with RST instead of FIN (SO_LINGER 0)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
