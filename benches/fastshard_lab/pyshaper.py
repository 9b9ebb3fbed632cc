"""A second shaping proxy, in Python and written apart from the Rust one
(tools/shaper, shaper.py): a cross-check that a figure measured
through a shaped link is the link's, not one proxy's quirk.

An HTTP/1.1 proxy on 127.0.0.1 with a thread per client connection
(``http.server.ThreadingHTTPServer``) and one upstream connection per
client connection. Each request waits, before it is forwarded, its service
time in one of ``service_slots`` slots that every connection shares (0: no
slot, every request served at once), then the first-byte latency; each
connection's responses are paced to ``rate_mbps`` MB/s (10^6 bytes per
second; 0: unlimited) on an absolute clock in chunks. A request whose
client hangs up while it waits leaves its slot to the next, as a store
drops a request nobody waits for.

Requests are forwarded with their headers as the client sent them, Host
included: a SigV4 signature covers the Host the client signed (the proxy's
host:port, fastshard's endpoint), and the upstream checks it against the
Host it receives. Hop-by-hop headers are dropped. GET (with Range), HEAD,
and bodies with a Content-Length (PUT, POST) are forwarded; a chunked
request body is refused (501): nothing a load sends has one.

Python moves less than the Rust proxy on two cores (64 connections at
25 MB/s are 1.6 GB/s): a raw client through the same proxy shows where it
binds. ``PyShaper`` starts it in a background thread of this process;
leaving its ``with`` block (or ``stop``) closes it and every connection.
"""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .procs import loopback

CHUNK = 128 * 1024  # bytes relayed per paced step (5 ms at 25 MB/s)
BURST = 0.005  # seconds of credit an idle connection keeps, as a real link has no more
POLL = 0.01  # how often a queued request checks that its client is still there
IDLE_TIMEOUT = 120.0  # a client connection silent this long is closed
# Hop-by-hop headers (RFC 9110 7.6.1): about one connection, never forwarded.
# Expect too: the proxy answers 100-continue itself and forwards the whole body.
HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
    }
)


@dataclass
class Counters:
    """What the proxy saw; ``snapshot`` reads them under the lock."""

    connections: int = 0
    open: int = 0
    max_open: int = 0
    requests: int = 0
    waiting: int = 0  # requests waiting for a slot or in service now
    max_waiting: int = 0
    abandoned: int = 0  # requests whose client hung up before they were forwarded
    bytes_down: int = 0
    upstream_failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, n: int = 1, peak: str | None = None) -> None:
        with self.lock:
            value = getattr(self, name) + n
            setattr(self, name, value)
            if peak is not None:
                setattr(self, peak, max(getattr(self, peak), value))

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {k: v for k, v in vars(self).items() if k != "lock"}


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a handler never keeps the process alive
    # socketserver's listen backlog is 5: a load opening 64 connections at
    # once overflows it, and the dropped SYNs come back after 1 s, 3 s...
    # (a 64-way load ran 10x slower through this proxy than through the Rust one).
    request_queue_size = 1024
    shaper: PyShaper

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client or upstream that hangs up mid-answer is part of the job
        # (a load cancelling a slow read); anything else is worth a line.
        import sys

        err = sys.exc_info()[1]
        if not isinstance(err, (ConnectionError, TimeoutError, OSError)):
            print(f"pyshaper: {type(err).__name__}: {err}", file=sys.stderr)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients expect
    timeout = IDLE_TIMEOUT
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.upstream: http.client.HTTPConnection | None = None
        self.next_send = 0.0  # the pacing clock of this connection
        shaper = self.server.shaper
        shaper.track(self.connection, True)
        shaper.counters.add("connections")
        shaper.counters.add("open", peak="max_open")

    def finish(self) -> None:
        shaper = self.server.shaper
        shaper.counters.add("open", -1)
        shaper.track(self.connection, False)
        if self.upstream is not None:
            self.upstream.close()
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        pass  # thousands of ranged GETs per load: no line each

    def do_GET(self) -> None:
        self._forward()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    # -- one request -----------------------------------------------------

    def _forward(self) -> None:
        shaper = self.server.shaper
        shaper.counters.add("requests")
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.send_error(501, "chunked request bodies are not forwarded")
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        if not shaper.wait_turn(self.connection):
            shaper.counters.add("abandoned")
            self.close_connection = True
            return
        try:
            resp = self._send_upstream(body)
        except (OSError, http.client.HTTPException) as e:
            shaper.counters.add("upstream_failures")
            if self.upstream is not None:  # in no state to take the next request
                self.upstream.close()
                self.upstream = None
            self.send_error(502, f"upstream: {e}")
            self.close_connection = True
            return
        self._answer(resp)

    def _send_upstream(self, body: bytes | None) -> http.client.HTTPResponse:
        """The request on this connection's upstream connection, opened again
        once if the upstream closed it while idle (keep-alive's race)."""
        for attempt in (0, 1):
            if self.upstream is None:
                host, port = self.server.shaper.upstream
                self.upstream = http.client.HTTPConnection(host, port, timeout=IDLE_TIMEOUT)
            conn = self.upstream
            try:
                # Host and Accept-Encoding only as the client sent them: the
                # signature covers the Host it signed.
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in HOP:
                        conn.putheader(name, value)
                conn.endheaders(body)
                return conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                conn.close()
                self.upstream = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _answer(self, resp: http.client.HTTPResponse) -> None:
        """The upstream's status and headers, then its body paced; a body of
        unknown length (chunked or until close) goes on chunked."""
        self.send_response_only(resp.status, resp.reason)
        for name, value in resp.getheaders():
            if name.lower() not in HOP:
                self.send_header(name, value)
        bodyless = self.command == "HEAD" or resp.status in (204, 304) or resp.status < 200
        chunked = not bodyless and resp.getheader("Content-Length") is None
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        if resp.will_close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if bodyless:
            resp.read()  # marks it done, or the upstream connection takes no next request
        else:
            self._relay(resp, chunked)
        if resp.will_close and self.upstream is not None:
            self.upstream.close()
            self.upstream = None

    def _relay(self, resp: http.client.HTTPResponse, chunked: bool) -> None:
        shaper = self.server.shaper
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        try:
            while n := resp.readinto(buf):
                self._pace(n, shaper.rate)
                # Counted before the client can have them: a client that has
                # read every byte finds them counted (a test reads the
                # counters right after its last read).
                shaper.counters.add("bytes_down", n)
                if chunked:
                    self.wfile.write(b"%x\r\n" % n + view[:n] + b"\r\n")
                else:
                    self.wfile.write(view[:n])
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
        except OSError:
            # Either side gone mid-body: this connection's upstream is in an
            # unknown state, and the client's too.
            if self.upstream is not None:
                self.upstream.close()
                self.upstream = None
            self.close_connection = True

    def _pace(self, n: int, rate: float) -> None:
        """Wait until ``n`` more bytes fit the connection's rate: an absolute
        clock, so a sleep that overshoots is paid back by the next chunks."""
        if rate <= 0:
            return
        now = time.monotonic()
        self.next_send = max(self.next_send, now - BURST) + n / rate
        if self.next_send > now:
            time.sleep(self.next_send - now)


def _gone(sock: socket.socket, seconds: float) -> bool:
    """Waits up to ``seconds`` (0: a look, no wait); True as soon as the
    client has hung up (its socket reads end-of-stream). HTTP/1.1 clients
    do not pipeline, so a readable socket during the wait means a hang-up
    or a reset."""
    deadline = time.monotonic() + seconds
    while True:
        left = max(0.0, deadline - time.monotonic())
        readable, _, _ = select.select([sock], [], [], left)
        if not readable:
            return False  # waited it out
        try:
            if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                return True
        except BlockingIOError:
            pass
        except OSError:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, POLL))  # bytes, not a hang-up: wait out the rest


@dataclass
class PyShaper:
    """The proxy in front of ``upstream_port`` on 127.0.0.1; ``endpoint`` is
    its URL once started. Use as a context manager, or start()/stop()."""

    upstream_port: int
    latency_ms: float = 50.0
    rate_mbps: float = 25.0
    service_ms: float = 0.0
    service_slots: int = 1
    port: int = 0
    endpoint: str = ""
    counters: Counters = field(default_factory=Counters, repr=False)
    _server: _Server | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _clients: set[socket.socket] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.upstream = ("127.0.0.1", self.upstream_port)
        self.rate = self.rate_mbps * 1e6
        slots = self.service_slots
        self._slots = threading.Semaphore(slots) if slots > 0 else None

    def start(self) -> PyShaper:
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.shaper = self
        self._server = server
        self.port = server.server_address[1]
        self.endpoint = loopback(self.port)
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, then close every client connection so each
        handler thread ends (a client's process may outlive the proxy)."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            clients = list(self._clients)
        for sock in clients:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(5)
        self._server = None

    def __enter__(self) -> PyShaper:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> dict[str, int]:
        """connections, open, max_open, requests, waiting, max_waiting,
        abandoned, bytes_down, upstream_failures."""
        return self.counters.snapshot()

    def track(self, sock: socket.socket, open_: bool) -> None:
        with self._lock:
            (self._clients.add if open_ else self._clients.discard)(sock)

    def wait_turn(self, client: socket.socket) -> bool:
        """A request's wait before it is forwarded: its service time in a
        free slot, then the first-byte latency. False once its client has
        hung up meanwhile (its slot goes to the next)."""
        if self.service_ms > 0:
            self.counters.add("waiting", peak="max_waiting")
            try:
                with self._slot(client) as held:
                    if not held or _gone(client, self.service_ms / 1e3):
                        return False
            finally:
                self.counters.add("waiting", -1)
        return not _gone(client, self.latency_ms / 1e3)

    @contextlib.contextmanager
    def _slot(self, client: socket.socket) -> Iterator[bool]:
        """A service slot (always, with no slots), or False once the client
        has gone while it queued."""
        if self._slots is None:
            yield True
            return
        while not self._slots.acquire(timeout=POLL):
            if _gone(client, 0):
                yield False
                return
        try:
            yield True
        finally:
            self._slots.release()
