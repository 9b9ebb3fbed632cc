"""The raw ranged-GET client the benchmarks measure ceilings with
(fastshard.benchmark.raw) against a server that answers ranged GETs the
way rclone serve s3 does: status 200 with the Content-Range asked for."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from fastshard.benchmark.raw import get_url, object_size

DATA = bytes(range(256)) * 1000


@contextlib.contextmanager
def _server(honours_range: bool) -> Iterator[str]:
    """A server of DATA answering every GET 200: with the Content-Range of
    the bytes asked for (``honours_range``), or the whole object."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def do_GET(self) -> None:  # noqa: N802
            first, last = map(int, self.headers["Range"].removeprefix("bytes=").split("-"))
            body = DATA[first : last + 1] if honours_range else DATA
            self.send_response(200)
            if honours_range:
                self.send_header("Content-Range", f"bytes {first}-{last}/{len(DATA)}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/object"
    finally:
        server.shutdown()
        server.server_close()


def test_a_200_naming_the_bytes_asked_for_is_a_ranged_answer() -> None:
    with _server(honours_range=True) as url:
        assert object_size(url) == len(DATA)
        got = get_url(url, streams=7)
        assert bytes(got[: len(DATA)]) == DATA


def test_a_200_of_the_whole_object_tells_no_size() -> None:
    with _server(honours_range=False) as url, pytest.raises(RuntimeError, match="HTTP 200"):
        object_size(url)
