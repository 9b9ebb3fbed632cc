"""The fault matrix: each fault alone on ~10 % of requests, then all of them
together, on a ~45-part load through S3 and HTTP. A load returns equal data
(the faults retried and counted) or raises a typed error within its
deadline, never a wrong tensor. Plus the real server killed and restarted
mid-load, and eight processes loading one object at once."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from fault_proxy import FaultProxy, Faults
from remote_files import MiB, assert_same, flatten
from servers import Nginx, SeaweedFS, require_binary

import fastshard

DEADLINE = 60.0
ALL = Faults(
    throttle=0.04, reset=0.04, truncate=0.04, stall=0.04, wrong_range=0.04, etag=0.04,
    stall_seconds=0.5,
)  # fmt: skip
# name: (faults, seed, the typed errors allowed besides equal data). A
# changed ETag is pinned when it hits discovery, and every later read then
# fails its If-Match; seed 3 puts it there for "all", seed 5 does not.
FAULTS: dict[str, tuple[Faults, int, set[str]]] = {
    "throttle": (Faults(throttle=0.1), 3, set()),
    "reset": (Faults(reset=0.1), 3, set()),
    "truncate": (Faults(truncate=0.1), 3, set()),
    "stall": (Faults(stall=0.1, stall_seconds=0.5), 3, set()),
    "wrong_range": (Faults(wrong_range=0.1), 3, set()),
    "etag": (Faults(etag=0.1), 3, {"ObjectChangedError"}),
    "all": (ALL, 5, {"ObjectChangedError"}),
    "all, ETag changed at discovery": (ALL, 3, {"ObjectChangedError"}),
}
# Faults a retry recovers from: each one injected costs at least one retry.
RETRIED = ("throttled", "resets", "truncated", "misranged")


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_matrix(through_proxy, corpus, fault: str) -> None:
    faults, seed, typed = FAULTS[fault]
    proxy, uri, opts = through_proxy("tz-big", faults, seed=seed, deadline_seconds=DEADLINE)
    started = time.monotonic()
    try:
        with fastshard.open(uri, part_size_bytes=MiB, concurrency=8, **opts) as f:
            out = f.load_state_dict()
            stats = f.stats
    except fastshard.FastshardError as e:
        outcome = type(e).__name__
        assert outcome in typed, f"{fault}: unexpected {outcome}: {e}"
        assert "tz-big" in str(e), e  # names the object
    else:
        outcome = "equal"
        assert_same(out, corpus["tz-big"].source)
        injected = sum(getattr(proxy.log, k) for k in RETRIED)
        assert stats.retries >= injected, (stats, proxy.log)
        assert injected > 0 or fault in ("stall", "etag"), proxy.log
    elapsed = time.monotonic() - started
    assert elapsed < DEADLINE + 10
    log = proxy.log
    print(
        f"\nfault-matrix {through_proxy.transport} {fault}: {outcome} in {elapsed:.1f} s, "
        f"{log.requests} requests (throttled {log.throttled}, reset {log.resets}, truncated "
        f"{log.truncated}, stalled {log.stalled}, misranged {log.misranged}, etag {log.etags})"
    )
    if outcome == "equal":
        assert log.requests > 40


def _load_while_restarting(uri: str, restart: Any, **opts: Any) -> tuple[Any, Any, bool]:
    """Loads ``uri`` (slowed by a proxy that stalls every response) on a
    worker thread while this thread kills and restarts the server 0.5 s in
    (on this thread: a server dies with the thread that started it); says
    whether the load was still running when the server went down."""
    result: dict[str, Any] = {}

    def load() -> None:
        try:
            with fastshard.open(uri, part_size_bytes=MiB, concurrency=4, **opts) as f:
                result["out"] = f.load_state_dict()
                result["stats"] = f.stats
        except BaseException as e:  # re-raised on the test's thread
            result["error"] = e

    worker = threading.Thread(target=load)
    worker.start()
    time.sleep(0.5)
    mid_load = worker.is_alive()
    restart()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result["out"], result["stats"], mid_load


@pytest.mark.s3
def test_s3_server_killed_and_restarted_mid_load(tmp_path: Path, corpus) -> None:
    weed = require_binary("weed")
    server = SeaweedFS(tmp_path / "weed").start(weed)
    try:
        uri = server.upload(corpus["tz-big"].path, "restart/tz-big.tensors")
        with FaultProxy(server.s3_port, Faults(stall=1.0, stall_seconds=0.2)) as proxy:
            out, stats, mid = _load_while_restarting(
                uri, server.restart, max_attempts=40, deadline_seconds=120,
                **server.opts(s3_endpoint=proxy.endpoint),
            )  # fmt: skip
    finally:
        server.stop()
    assert mid, "the load finished before the server went down; slow it more"
    assert_same(out, corpus["tz-big"].source)
    assert stats.retries > 0


@pytest.mark.http
def test_http_server_killed_and_restarted_mid_load(tmp_path: Path, corpus) -> None:
    server = Nginx(tmp_path / "nginx").start(require_binary("nginx", "/usr/sbin/nginx"))
    try:
        url = server.publish(corpus["tz-big"].path, "tz-big.tensors")
        with FaultProxy(server.port, Faults(stall=1.0, stall_seconds=0.2)) as proxy:
            url = url.replace(f":{server.port}/", f":{proxy.port}/")
            out, stats, mid = _load_while_restarting(
                url, server.restart, max_attempts=40, deadline_seconds=120
            )
    finally:
        server.stop()
    assert mid, "the load finished before the server went down; slow it more"
    assert_same(out, corpus["tz-big"].source)
    assert stats.retries > 0


LOADER = """
import hashlib, sys
import torch
import fastshard
uri, endpoint, key, secret = sys.argv[1:5]
with fastshard.open(uri, s3_endpoint=endpoint, s3_access_key_id=key,
                    s3_secret_access_key=secret, part_size_bytes=1 << 20) as f:
    sd = f.load_state_dict()
h = hashlib.sha256()
for name, t in sd.items():
    h.update(name.encode())
    h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
print(h.hexdigest())
"""


@pytest.mark.s3
def test_eight_processes_load_one_object_at_once(seaweed, s3_corpus) -> None:
    c = s3_corpus["tz-big"]
    want = hashlib.sha256()
    for (name,), t in flatten(c.source).items():
        want.update(name.encode())
        want.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    args = [c.uris["s3"], seaweed.endpoint, seaweed.access_key, seaweed.secret_key]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", LOADER, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    results = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err[-2000:]
        assert seaweed.secret_key not in out + err
    digests = {out.strip() for out, _ in results}
    assert digests == {want.hexdigest()}
