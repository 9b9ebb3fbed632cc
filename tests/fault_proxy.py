"""A fault-injecting HTTP/1.1 proxy for loopback tests: in front of nginx
or SeaweedFS it answers 503 SlowDown, resets connections, truncates or
stalls bodies, and misstates Content-Range or ETag, on a seeded schedule;
it can also play a store that ignores conditional requests (If-Match and
its kin dropped before forwarding) or one whose multipart-upload answer
has another XML root. It logs every request it saw."""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy_wire import SockReader, body_length, read_head, relay, relay_chunked, reset

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


@dataclass
class Faults:
    """Chances per request, drawn in arrival order from a seeded generator."""

    throttle: float = 0.0  # answer 503 SlowDown without forwarding
    reset: float = 0.0  # reset the connection without answering
    truncate: float = 0.0  # forward the head and half the body, then reset
    stall: float = 0.0  # forward half the body, pause stall_seconds, then the rest
    wrong_range: float = 0.0  # forward, claiming another range in Content-Range
    etag: float = 0.0  # forward with a different ETag (pinned at discovery: 412s follow)
    stall_seconds: float = 1.0
    # Every request: forward without its conditions, as a store that ignores
    # If-Match does (only for unsigned requests or a server that does not
    # check signatures: SigV4 signs these headers).
    ignore_conditions: bool = False
    # Every signed request: forward it with its signature altered, as a
    # wrong secret would have signed it. "query" alters only signatures in
    # the query (presigned requests), "all" those in Authorization too.
    forge_signature: str | None = None
    # CreateMultipartUpload answers (POST ?uploads) with their XML root
    # renamed to this, as a store that names it differently does.
    xml_root: bytes | None = None


# The Range of the probes a network open sends beside its first read.
PROBE_RANGE = "bytes=0-0"


@dataclass
class ProxyLog:
    requests: int = 0
    forwarded: int = 0
    throttled: int = 0
    resets: int = 0
    truncated: int = 0
    stalled: int = 0
    misranged: int = 0
    etags: int = 0
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    @property
    def probes(self) -> int:
        """Requests for an object's first byte alone: the probes a network
        open sends beside its first read (one attempt each, never retried)."""
        return sum(h.get("range") == PROBE_RANGE for _, _, h in self.seen)

    @property
    def reads(self) -> list[tuple[str, str, dict[str, str]]]:
        """Every request but the probes, in order."""
        return [r for r in self.seen if r[2].get("range") != PROBE_RANGE]


class FaultProxy:
    """A threaded HTTP/1.1 proxy on 127.0.0.1 in front of ``upstream``.

    Requests are forwarded byte for byte (Host, Range, If-Match and the
    SigV4 Authorization untouched, so signatures stay valid), over one
    upstream connection per client connection. ``faults`` decides each
    request's fate on a seeded schedule; it can be changed while running.
    """

    def __init__(self, upstream_port: int, faults: Faults | None = None, seed: int = 0) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.faults = faults or Faults()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.log = ProxyLog()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.port: int = self._sock.getsockname()[1]
        self._closing = False
        self._conns: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_faults(self, faults: Faults) -> None:
        with self._lock:
            self.faults = faults

    def reset_log(self) -> ProxyLog:
        with self._lock:
            old, self.log = self.log, ProxyLog()
        return old

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --
    def _fate(self, method: str, target: str, headers: dict[str, str]) -> str:
        with self._lock:
            self.log.requests += 1
            self.log.seen.append((method, target, headers))
            r = self._rng.random()
            f = self.faults
            if r < f.throttle:
                self.log.throttled += 1
                return "throttle"
            r -= f.throttle
            if r < f.reset:
                self.log.resets += 1
                return "reset"
            r -= f.reset
            if r < f.truncate:
                self.log.truncated += 1
                return "truncate"
            r -= f.truncate
            for fate, chance, counter in (
                ("stall", f.stall, "stalled"),
                ("wrong_range", f.wrong_range, "misranged"),
                ("etag", f.etag, "etags"),
            ):
                if r < chance:
                    setattr(self.log, counter, getattr(self.log, counter) + 1)
                    return fate
                r -= chance
            self.log.forwarded += 1
            return "forward"

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _request(
        self, raw: bytes, target: str, headers: dict[str, str], fate: str
    ) -> tuple[bytes, bool]:
        """The request head as the faults send it upstream, and whether its
        Range was shifted."""
        # Unsigned requests really get other bytes (their honest
        # Content-Range is the only tell); a SigV4 request signs its
        # Range, so there the answer only claims another range.
        signed = "authorization" in headers or _QUERY_SIGNATURE in target.lower()
        shift_request = fate == "wrong_range" and "range" in headers and not signed
        if shift_request:
            raw = _rewrite_header(raw, b"range", _shifted_request_range)
        if self.faults.forge_signature and _QUERY_SIGNATURE in target.lower():
            raw = _forged_query(raw)
        if self.faults.forge_signature == "all" and "authorization" in headers:
            raw = _rewrite_header(raw, b"authorization", _forged_authorization)
        if self.faults.ignore_conditions:
            raw = _drop_headers(raw, CONDITIONS)
        return raw, shift_request

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            crf = SockReader(client)
            urf = None
            while True:
                head = read_head(crf)
                if head is None:
                    return
                line, headers, raw = head
                method, target = line.split(" ", 2)[:2]
                body = crf.read(int(headers.get("content-length", "0") or 0))
                fate = self._fate(method, target, headers)
                if fate == "throttle":
                    client.sendall(
                        b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                        b"Content-Length: %d\r\nRetry-After: 0\r\n\r\n%s"
                        % (len(SLOW_DOWN), SLOW_DOWN)
                    )
                    continue
                if fate == "reset":
                    reset(client)
                    return
                if upstream is None:
                    upstream = socket.create_connection(self.upstream, timeout=60)
                    urf = SockReader(upstream)
                assert urf is not None
                raw, shift_request = self._request(raw, target, headers, fate)
                upstream.sendall(raw + body)
                resp = read_head(urf)
                if resp is None:
                    reset(client)
                    return
                status_line, rheaders, rraw = resp
                length = body_length(method, int(status_line.split(" ", 2)[1]), rheaders)
                if fate == "truncate" and length and length > 1:
                    client.sendall(rraw)
                    relay(urf, client, length // 2)
                    reset(client)
                    return
                if self.faults.xml_root and method == "POST" and "?uploads" in target:
                    assert length is not None and length >= 0, "a sized answer"
                    answer = urf.read(length).replace(
                        b"InitiateMultipartUploadResult", self.faults.xml_root
                    )
                    size = b"%d" % len(answer)
                    rraw = _rewrite_header(rraw, b"content-length", lambda v, n=size: n)
                    client.sendall(rraw + answer)
                    continue
                if fate == "wrong_range" and not shift_request:
                    rraw = _rewrite_header(rraw, b"content-range", _shifted_range)
                elif fate == "etag":
                    rraw = _rewrite_header(rraw, b"etag", lambda v: b'"0badc0ffee"')
                elif fate == "stall" and length and length > 1:
                    client.sendall(rraw)
                    relay(urf, client, length // 2)
                    time.sleep(self.faults.stall_seconds)
                    relay(urf, client, length - length // 2)
                    continue
                client.sendall(rraw)
                if length is None:
                    relay_chunked(urf, client)
                elif length < 0:
                    relay(urf, client, None)
                    client.close()
                    return
                else:
                    relay(urf, client, length)
                if rheaders.get("connection", "").lower() == "close":
                    client.close()
                    return
        except OSError:
            return
        finally:
            with self._lock:
                self._conns.discard(client)
            with contextlib.suppress(OSError):
                client.close()
            if upstream is not None:
                with contextlib.suppress(OSError):
                    upstream.close()


CONDITIONS = (b"if-match", b"if-none-match", b"if-unmodified-since", b"if-modified-since")


_QUERY_SIGNATURE = "x-amz-signature="


def _forged_at(text: bytes, marker: bytes) -> bytes:
    """``text`` with the first hex digit after ``marker`` changed."""
    at = text.lower().index(marker) + len(marker)
    digit = b"1" if text[at : at + 1] == b"0" else b"0"
    return text[:at] + digit + text[at + 1 :]


def _forged_query(raw: bytes) -> bytes:
    line, sep, rest = raw.partition(b"\r\n")
    return _forged_at(line, _QUERY_SIGNATURE.encode()) + sep + rest


def _forged_authorization(value: bytes) -> bytes:
    return _forged_at(value, b"signature=")


def _drop_headers(raw: bytes, names: tuple[bytes, ...]) -> bytes:
    lines = raw.split(b"\r\n")
    kept = [line for line in lines if line.partition(b":")[0].strip().lower() not in names]
    return b"\r\n".join(kept)


def _rewrite_header(raw: bytes, name: bytes, new: Callable[[bytes], bytes]) -> bytes:
    lines = raw.split(b"\r\n")
    for i, line in enumerate(lines):
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            lines[i] = key + b": " + new(value.strip())
    return b"\r\n".join(lines)


def _shifted_range(value: bytes) -> bytes:
    """``bytes a-b/t`` moved by one byte, within the object when possible."""
    unit, _, rest = value.partition(b" ")
    span, _, total = rest.partition(b"/")
    first, _, last = span.partition(b"-")
    a, b = int(first), int(last)
    step = 1 if total == b"*" or b + 1 < int(total) else -1
    if a + step < 0:  # a one-byte object: nothing else to claim; say "*" instead
        return unit + b" */" + total
    return b"%s %d-%d/%s" % (unit, a + step, b + step, total)


def _shifted_request_range(value: bytes) -> bytes:
    """``bytes=a-b`` moved one byte later."""
    unit, _, span = value.partition(b"=")
    first, _, last = span.partition(b"-")
    return b"%s=%d-%d" % (unit, int(first) + 1, int(last) + 1)
