"""Plain-HTTP part bodies read from the socket into the tensors (the direct
reader, rust/io/direct): bit-equal through nginx, resumed when the server
closes mid-body, checked as the reqwest path checks (status, Content-Range),
and handed back to reqwest for a chunked answer. Discovery always goes
through reqwest, whose requests carry ``Accept``; the direct reader's do
not, which is how these tests tell the two apart."""

from __future__ import annotations

import contextlib
import http.server
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_proxy import PROBE_RANGE, FaultProxy, Faults
from remote_files import MiB, assert_same

import fastshard

pytestmark = pytest.mark.http


def _ranged_gets(proxy: FaultProxy) -> list[dict[str, str]]:
    """Headers of the part requests (those after discovery's first GET)."""
    gets = [h for method, _, h in proxy.log.reads if method == "GET" and "range" in h]
    return gets[1:]


def _through(nginx: Any, http_corpus: dict[str, Any], faults: Faults | None = None) -> Any:
    proxy = FaultProxy(nginx.port, faults, seed=7)
    uri = http_corpus["tz-big"].uris["http"].replace(f":{nginx.port}/", f":{proxy.port}/")
    return proxy, uri


def test_direct_loads_are_bit_equal_and_bypass_reqwest(nginx, http_corpus, corpus, monkeypatch):
    proxy, uri = _through(nginx, http_corpus)
    with proxy:
        out = fastshard.load_state_dict(uri, part_size_bytes=MiB, concurrency=8)
        assert_same(out, corpus["tz-big"].source)
        parts = _ranged_gets(proxy)
        assert len(parts) > 10
        assert all("accept" not in h for h in parts), parts[:2]
        # Switched off, the same load goes through reqwest.
        monkeypatch.setenv("FASTSHARD_HTTP_DIRECT", "0")
        proxy.reset_log()
        out = fastshard.load_state_dict(uri, part_size_bytes=MiB, concurrency=8)
        assert_same(out, corpus["tz-big"].source)
        assert all("accept" in h for h in _ranged_gets(proxy))


def test_a_body_cut_short_resumes_where_it_stopped(nginx, http_corpus, corpus):
    proxy, uri = _through(nginx, http_corpus)
    with proxy, fastshard.open(uri, part_size_bytes=4 * MiB, concurrency=4) as f:
        # Discovery whole; then a third of the part bodies break off halfway.
        proxy.set_faults(Faults(truncate=0.3))
        out = f.load_state_dict()
        stats = f.stats
    assert_same(out, corpus["tz-big"].source)
    assert proxy.log.truncated > 0
    assert stats.retries >= proxy.log.truncated
    # Each retry asks for what was missing, not for the whole part again.
    resumed = [h["range"] for h in _ranged_gets(proxy)]
    starts = {int(re.match(r"bytes=(\d+)-", r).group(1)) % (4 * MiB) for r in resumed}  # type: ignore[union-attr]
    assert any(s != 0 for s in starts), resumed[:8]


def test_a_wrong_content_range_is_retried_then_typed(nginx, http_corpus):
    proxy, uri = _through(nginx, http_corpus)
    with proxy, fastshard.open(uri, max_attempts=2, part_size_bytes=4 * MiB) as f:
        proxy.set_faults(Faults(wrong_range=1.0))
        with pytest.raises(fastshard.StorageError, match="answered bytes") as info:
            f.load_state_dict()
    assert "tz-big" in str(info.value)
    assert proxy.log.misranged >= 2


class _Answer:
    """How the scripted server answers a ranged GET after the first one."""

    ranged = "ranged"  # 206 with Content-Length
    chunked = "chunked"  # 206, chunked
    whole = "whole"  # 200 with the whole file, as a server that ignores Range
    empty_once = "empty-once"  # one empty 200 (SeaweedFS's, by its code), then ranged
    empty_discovery = "empty-discovery"  # that empty 200 to the first GET, then ranged


@contextlib.contextmanager
def _scripted(path: Path, mode: str) -> Iterator[tuple[str, list[str]]]:
    """A server for ``path`` that answers the first GET (discovery) as a
    ranged server would and the rest as ``mode`` says; yields its URL and
    the request lines it saw."""
    data = path.read_bytes()
    seen: list[str] = []
    empties: list[str] = []
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def do_GET(self) -> None:  # noqa: N802
            if self.headers["Range"] == PROBE_RANGE:
                # The open's probes (timed beside discovery, their byte unread):
                # answered plainly, outside the script.
                self.send_response(206 if data else 416)
                self.send_header("Content-Range", f"bytes 0-0/{len(data)}")
                self.send_header("Content-Length", str(min(len(data), 1)))
                self.end_headers()
                self.wfile.write(data[:1])
                return
            seen.append(self.requestline)
            first, last = map(int, self.headers["Range"].removeprefix("bytes=").split("-"))
            last = min(last, len(data) - 1)
            body = data[first : last + 1]
            mode_now = _Answer.ranged if len(seen) == 1 else mode
            if mode == _Answer.empty_discovery:
                mode_now = _Answer.empty_once if len(seen) == 1 else _Answer.ranged
            elif not data:  # an empty object: the whole of it, no bytes
                mode_now = _Answer.whole
            if mode_now == _Answer.empty_once:
                with lock:  # the first data GET only, however the threads run
                    mode_now = _Answer.ranged if empties else mode_now
                    empties.append(self.requestline)
            if mode_now == _Answer.empty_once:
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if mode_now == _Answer.whole:
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                # The client hangs up once it has seen the status.
                with contextlib.suppress(OSError):
                    self.wfile.write(data)
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
            if mode_now == _Answer.chunked:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for at in range(0, len(body), 65536):
                    chunk = body[at : at + 65536]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def do_HEAD(self) -> None:  # noqa: N802
            seen.append(self.requestline)
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{path.name}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_an_empty_answer_to_the_first_read_is_retried(corpus):
    """The same bare 200 to discovery's read: a HEAD says the object is not
    empty, so it is a broken answer, retried."""
    c = corpus["tz-big"]
    with _scripted(c.path, _Answer.empty_discovery) as (url, seen):
        out = fastshard.load_state_dict(url)
    assert_same(out, c.source)
    assert [line.split()[0] for line in seen[:3]] == ["GET", "HEAD", "GET"], seen[:3]


def test_an_empty_object_is_a_format_error_at_once(tmp_path):
    empty = tmp_path / "empty.tensors"
    empty.write_bytes(b"")
    with _scripted(empty, _Answer.ranged) as (url, seen):
        with pytest.raises(fastshard.FormatError) as info:
            fastshard.open(url)
    assert [line.split()[0] for line in seen] == ["GET", "HEAD"], seen
    assert empty.name in str(info.value)


def test_a_chunked_answer_goes_back_to_reqwest(corpus):
    c = corpus["tz-big"]
    with _scripted(c.path, _Answer.chunked) as (url, seen):
        out = fastshard.load_state_dict(url, part_size_bytes=4 * MiB, concurrency=4)
    assert_same(out, c.source)
    assert len(seen) > 3


def test_a_full_answer_to_a_ranged_read_is_unsupported(corpus):
    c = corpus["tz-big"]
    with _scripted(c.path, _Answer.whole) as (url, _):
        with pytest.raises(fastshard.UnsupportedError, match="ignores Range") as info:
            fastshard.load_state_dict(url, part_size_bytes=4 * MiB, concurrency=4)
    assert c.path.name in str(info.value)


def test_an_empty_full_answer_to_a_ranged_read_is_retried(corpus):
    """A 200 with fewer bytes than the read asked for is not a server that
    ignores Range (which sends the whole object) but a broken answer."""
    c = corpus["tz-big"]
    with _scripted(c.path, _Answer.empty_once) as (url, seen):
        with fastshard.open(url, part_size_bytes=4 * MiB, concurrency=4) as f:
            out = f.load_state_dict()
            stats = f.stats
    assert_same(out, c.source)
    assert stats.retries == 1, stats
    assert len(seen) > 3
