"""Loads through the shaping proxy (tools/shaper): an object store's
first-byte latency and per-connection bandwidth on loopback. Checks how
many requests a load keeps in flight, that it grows them by itself when
that pays, and that hundreds at once finish with no failed request.

Throughput against a raw client is a benchmark, not a test here
(python -m fastshard_lab --preset network): these assert counts and data, not seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TRANSPORTS, assert_state_equal, transport_server
from servers import require_shaper

import fastshard
from fastshard_lab.shaper import Shaper

KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture(scope="module")
def shaper_binary() -> str:
    return require_shaper()


Shaped = Callable[..., tuple[Shaper, str, dict[str, Any]]]


@pytest.fixture(params=TRANSPORTS)
def shaped(request: pytest.FixtureRequest, shaper_binary: str, tmp_path: Path) -> Iterator[Shaped]:
    """shaped(name, latency_ms, rate_mbps, service_ms, service_slots) ->
    (shaper, uri, opts): the corpus file ``name`` reached through a new
    shaping proxy."""
    transport = request.param
    started: list[Shaper] = []
    server, files, port = transport_server(request, transport)

    def route(
        name: str,
        latency_ms: float = 50,
        rate_mbps: float = 25,
        service_ms: float = 0,
        service_slots: int = 1,
        node_mbps: float = 0,
    ) -> Any:
        root = tmp_path / f"shaper{len(started)}"
        shaper = Shaper(
            port,
            root,
            latency_ms=latency_ms,
            rate_mbps=rate_mbps,
            service_ms=service_ms,
            service_slots=service_slots,
            node_mbps=node_mbps,
        )
        started.append(shaper.start(shaper_binary))
        uri = files[name].uris[transport]
        if transport == "s3":
            return shaper, uri, server.opts(s3_endpoint=shaper.endpoint)
        return shaper, uri.replace(f"127.0.0.1:{port}", f"127.0.0.1:{shaper.port}"), {}

    yield route
    for s in started:
        s.stop()


def _settled(shaper: Shaper, key: str, want: int) -> dict[str, Any]:
    """The proxy's counters once ``key`` reached ``want`` (they are written
    every 100 ms)."""
    deadline = time.monotonic() + 3
    stats = shaper.stats()
    while stats.get(key, 0) < want and time.monotonic() < deadline:
        time.sleep(0.05)
        stats = shaper.stats()
    return stats


def test_the_proxy_really_delays_and_caps(shaped: Shaped) -> None:
    """The shaping itself: a single-connection load of one MiB-sized part
    cannot beat 25 MB/s, and every request waits the first-byte latency."""
    shaper, uri, opts = shaped("tz-big", latency_ms=40, rate_mbps=25)
    with fastshard.open(uri, concurrency=1, part_size_bytes=4 * MiB, **opts) as f:
        f.load_state_dict()
        stats = f.stats
    # 43 MiB at 25 MB/s on one connection: at least 1.8 s, plus 40 ms per request.
    assert stats.seconds >= stats.bytes_fetched / 25e6
    assert stats.seconds >= 0.04 * stats.requests
    assert stats.concurrency == 1


def test_the_node_cap_binds_every_connection_together(shaped: Shaped) -> None:
    """node_mbps: one bandwidth for all connections (a node's NIC). Eight
    connections at 25 MB/s each would move 200 MB/s; under a 20 MB/s node
    cap the load takes at least its bytes at 20 MB/s, and the proxy counts
    every byte that crossed it."""
    shaper, uri, opts = shaped("tz-big", latency_ms=5, rate_mbps=25, node_mbps=20)
    with fastshard.open(uri, concurrency=8, part_size_bytes=2 * MiB, **opts) as f:
        f.load_state_dict()
        stats = f.stats
    assert stats.concurrency > 1
    assert stats.seconds >= stats.bytes_fetched / 20e6
    assert _settled(shaper, "bytes_down", stats.bytes_fetched)["bytes_down"] >= stats.bytes_fetched


def test_the_service_time_delays_each_request_in_its_slot(shaped: Shaped, corpus: Any) -> None:
    """service_ms: each request costs the store 100 ms whatever its size.
    On one slot the requests sent together are served in turn, so a load
    of N requests at once takes at least N x 100 ms (latency and bandwidth
    off); with every request served at once, each still waits its 100 ms."""
    shaper, uri, opts = shaped("tz-big", latency_ms=0, rate_mbps=0, service_ms=100)
    with fastshard.open(uri, concurrency=8, part_size_bytes=8 * MiB, **opts) as f:
        sd = f.load_state_dict()
        stats = f.stats
    assert_state_equal(sd, corpus["tz-big"].source)
    assert stats.requests >= 5 and stats.concurrency >= 5, stats
    assert stats.seconds >= 0.1 * stats.requests, stats
    # The load's requests waited for the one slot together.
    assert _settled(shaper, "max_waiting", 5)["max_waiting"] >= 5

    shaper, uri, opts = shaped("tz-big", latency_ms=0, rate_mbps=0, service_ms=100, service_slots=0)
    with fastshard.open(uri, concurrency=8, part_size_bytes=8 * MiB, **opts) as f:
        f.load_state_dict()
        stats = f.stats
    assert stats.seconds >= 0.1, stats


def test_parts_join_into_fewer_requests_where_each_costs_a_service_time(
    shaped: Shaped, corpus: Any
) -> None:
    """A load that leaves part size and concurrency to fastshard joins its
    queued parts into larger requests once a request's first byte costs
    more than its transfer: through a store that spends 200 ms on every
    request it issues fewer, larger requests than through one without, and
    loads the same bytes. The load starts with two requests
    (throughput_target_gbps) so that parts queue behind the first ones, as
    they do in any load of more parts than the 64 it starts with (over 1 GiB
    by default): parts already in flight are never joined."""
    source = corpus["tz-big"].source

    def load(**shape: float) -> Any:
        shaper, uri, opts = shaped("tz-big", latency_ms=10, rate_mbps=25, **shape)
        with fastshard.open(uri, throughput_target_gbps=0.8, **opts) as f:
            assert_state_equal(f.load_state_dict(), source)
            return f.stats

    plain = load()
    served = load(service_ms=200)
    # 43 MiB in parts of 1 MiB: a 10 ms first byte against ~42 ms of bytes
    # joins nothing; 200 ms (or more, queued) against 42 ms joins several.
    assert plain.requests >= 40 and plain.retries == 0, plain
    assert served.bytes_fetched == plain.bytes_fetched
    assert served.requests <= plain.requests * 2 // 3, (served, plain)


def test_a_store_serving_in_turn_gets_a_few_joined_requests(shaped: Shaped, corpus: Any) -> None:
    """43 MiB with no settings (43 parts of 1 MiB), through a store that
    serves one request at a time for 100 ms each. The open's two probes,
    sent beside discovery's read, are answered a service apart: the load sends
    its first part alone, to measure the rate, then the rest joined into a
    few larger requests. No wave of 43 queues at the store (it would serve
    even the requests cancelled), and no byte is fetched twice."""
    source = corpus["tz-big"].source
    shaper, uri, opts = shaped("tz-big", latency_ms=10, rate_mbps=25, service_ms=100)
    with fastshard.open(uri, **opts) as f:
        assert_state_equal(f.load_state_dict(), source)
        stats = f.stats
    parts = -(-stats.bytes_fetched // MiB)
    assert stats.retries == 0, stats
    assert stats.bytes_fetched < 1.01 * corpus["tz-big"].size, stats
    assert 1 < stats.requests <= parts // 4, stats
    assert "seen when it was opened" in stats.adaptations[0], stats


def test_explicit_settings_keep_their_part_size_behind_a_service_time(
    shaped: Shaped, corpus: Any
) -> None:
    """part_size_bytes or concurrency set: every request is one planned
    part of that size, however much each request costs."""
    source = corpus["tz-big"].source
    for settings in ({"part_size_bytes": 4 * MiB}, {"concurrency": 4}):
        shaper, uri, opts = shaped("tz-big", latency_ms=10, service_ms=50)
        with fastshard.open(uri, **settings, **opts) as f:
            assert_state_equal(f.load_state_dict(), source)
            stats = f.stats
        # The plan's parts (the default part size is 1 MiB for 43 MiB), each
        # fetched by one request of its own.
        size = settings.get("part_size_bytes", MiB)
        expected = -(-stats.bytes_fetched // size)
        assert stats.requests == expected and stats.retries == 0, (settings, stats)


def test_default_settings_put_a_small_load_in_flight_at_once(shaped: Shaped, corpus: Any) -> None:
    """43 MiB with no settings: parts of 1 MiB, all requested at once (one
    round of first-byte latency, not one per few parts); a fixed setting
    still wins and caps the requests in flight."""
    shaper, uri, opts = shaped("tz-big")
    with fastshard.open(uri, **opts) as f:
        sd = f.load_state_dict()
        stats = f.stats
    assert_state_equal(sd, corpus["tz-big"].source)
    assert stats.requests >= 40 and stats.retries == 0
    assert stats.concurrency >= 40, stats
    assert _settled(shaper, "max_open", 40)["max_open"] >= 40

    with fastshard.open(uri, concurrency=4, **opts) as f:
        assert_state_equal(f.load_state_dict(), corpus["tz-big"].source)
        assert 1 <= f.stats.concurrency <= 4


def test_requests_in_flight_grow_past_the_start_while_throughput_rises(
    shaped: Shaped, corpus: Any
) -> None:
    """Small parts (344 of them) and no concurrency set: the load starts at
    64 in flight and doubles after the first round, since each connection
    adds 25 MB/s through the proxy."""
    shaper, uri, opts = shaped("tz-big", latency_ms=50, rate_mbps=25)
    with fastshard.open(uri, part_size_bytes=128 * KiB, **opts) as f:
        sd = f.load_state_dict()
        stats = f.stats
    assert_state_equal(sd, corpus["tz-big"].source)
    assert stats.requests >= 300 and stats.retries == 0
    assert stats.concurrency >= 128, stats
    assert _settled(shaper, "max_open", 128)["max_open"] >= 128


def test_256_requests_in_flight_finish_with_no_failed_request(shaped: Shaped, corpus: Any) -> None:
    """256 at once (aws-sdk-rust users report connect failures past ~200,
    its issue #1136): every request answered, none retried. The proxy's
    latency keeps all 256 open at the same time, which it counts."""
    shaper, uri, opts = shaped("tz-big", latency_ms=150, rate_mbps=0)
    with fastshard.open(uri, concurrency=256, part_size_bytes=128 * KiB, **opts) as f:
        sd = f.load_state_dict()
        stats = f.stats
    assert_state_equal(sd, corpus["tz-big"].source)
    assert stats.retries == 0, stats
    assert stats.concurrency == 256, stats
    counters = _settled(shaper, "max_open", 256)
    assert counters["max_open"] >= 256 and counters["upstream_failures"] == 0, counters


def test_a_throughput_target_sizes_the_start_and_stops_the_growth(
    shaped: Shaped, corpus: Any
) -> None:
    """throughput_target_gbps=0.8 (100 MB/s) asks for 2 requests at the
    start (~70 MB/s each on real S3); through 25 MB/s connections the load
    grows until the target is met or growth stops paying, far short of
    the 64 an untargeted load starts with."""
    shaper, uri, opts = shaped("tz-big", latency_ms=20, rate_mbps=25)
    with fastshard.open(uri, throughput_target_gbps=0.8, **opts) as f:
        sd = f.load_state_dict()
        stats = f.stats
    assert_state_equal(sd, corpus["tz-big"].source)
    assert 2 <= stats.concurrency <= 16, stats
    with pytest.raises(fastshard.InvalidArgumentError, match="throughput_target_gbps"):
        fastshard.load_state_dict(uri, throughput_target_gbps=-1, **opts)


@pytest.mark.parametrize("transport", ["s3", "http"])
def test_a_hostname_endpoint_loads_with_many_connections(
    transport: str, request: pytest.FixtureRequest, corpus: Any
) -> None:
    """``localhost`` rather than an address: both clients resolve names
    through fastshard's cache (one lookup for all the connections of a
    load, addresses in rotation: rust/io/dns.rs), here with 64 in flight.
    (Where ``localhost`` also names ::1, on which nothing listens, the
    connections that start there move on to 127.0.0.1.)"""
    server, files, port = transport_server(request, transport)
    uri = files["tz-big"].uris[transport]
    if transport == "s3":
        opts = server.opts(s3_endpoint=f"http://localhost:{port}")
    else:
        uri, opts = uri.replace("127.0.0.1", "localhost"), {}
    with fastshard.open(uri, concurrency=64, part_size_bytes=256 * KiB, **opts) as f:
        sd = f.load_state_dict()
        stats = f.stats
    assert_state_equal(sd, corpus["tz-big"].source)
    assert stats.retries == 0 and stats.requests >= 150, stats


@pytest.mark.s3
def test_network_preset_sets_the_default_beside_fixed_part_sizes(
    tmp_path: Path, shaper_binary: str
) -> None:
    """`python -m fastshard_lab --preset network`, tiny: the latency case, then the
    service-time case with the default beside a fixed part size and the
    verdict against the best of them (a functional run; numbers mean
    nothing here)."""
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable, "-m", "fastshard_lab", "--out", str(out), "--preset", "network",
            "--size", "8MiB", "--repeat", "1", "--service-ms", "50", "--part-mib", "4",
            "--only", "fastshard-default", "fastshard-4MiB",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "FASTSHARD_SHAPER": shaper_binary},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = json.loads((out / "results.json").read_text())
    got = {(r["source"], r["loader"]) for r in records}
    assert got == {
        ("s3", "raw-64"),
        ("s3", "raw-64-sized"),
        ("s3", "fastshard-default"),
        ("svc", "fastshard-default"),
        ("svc", "fastshard-4MiB"),
    }, got
    raw_rows = ("raw-64", "raw-64-sized")
    assert all(r["verified"] and r["requests"] for r in records if r["loader"] not in raw_rows)
    # The sized raw row paid one request for the size before its 64.
    requests = {r["loader"]: r["requests"] for r in records if r["source"] == "s3"}
    assert requests["raw-64"] == 64 and requests["raw-64-sized"] == 65, requests
    assert "the best fixed part size (fastshard-4MiB)" in done.stdout, done.stdout[-3000:]
