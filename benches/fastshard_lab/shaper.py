"""The shaping proxy (tools/shaper) from Python: an object store's
first-byte latency, per-connection bandwidth and per-request service time,
on loopback, in front of SeaweedFS or nginx, for tests and the network
benchmark. The binary is found, never built (``find_shaper``)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .procs import MissingBinary, loopback, spawn
from .procs import stop as stop_process

# What `make shaper` runs: a crate of its own, built into a target directory
# of its own (target/shaper, or $CARGO_TARGET_DIR/shaper).
BUILD = "cargo build --release --manifest-path tools/shaper/Cargo.toml --target-dir target/shaper"


def _checkout() -> Path | None:
    """The fastshard source tree this package runs from, if it runs from one
    (benches/fastshard_lab/ inside a checkout); None when installed elsewhere."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "tools" / "shaper" / "Cargo.toml").is_file() else None


def find_shaper(release: bool = False) -> str:
    """The shaping proxy's binary: $FASTSHARD_SHAPER, else, when running from
    a checkout, what `make shaper` built (target/shaper/release/shaper, under
    $CARGO_TARGET_DIR when set), then (unless ``release``: a debug proxy
    spends the cores the loaders are measured on) a debug build there. Never
    built here: an installed package has no sources to build, and a
    checkout's build is the developer's call."""
    if env := os.environ.get("FASTSHARD_SHAPER"):
        if os.path.isfile(env) and os.access(env, os.X_OK):
            return env
        raise MissingBinary(f"FASTSHARD_SHAPER={env} is not an executable file")
    root = _checkout()
    if root is not None:
        target = Path(os.environ.get("CARGO_TARGET_DIR") or root / "target") / "shaper"
        for profile in ("release",) if release else ("release", "debug"):
            path = target / profile / "shaper"
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    where = f"in {root}" if root else "in a fastshard checkout"
    raise MissingBinary(
        f"the shaping proxy (tools/shaper) is not built: run `make shaper` (`{BUILD}`) {where}, "
        "or set FASTSHARD_SHAPER to the binary"
    )


@dataclass
class Shaper:
    """``latency_ms`` (+ up to ``jitter_ms``) before each request is
    forwarded; each connection's responses paced to ``rate_mbps`` MB/s
    (0: unlimited). ``service_ms`` is what each request costs the store
    whatever its size, paid before its latency in one of ``service_slots``
    slots that all connections share (0: every request at once), so
    requests beyond the slots queue: a store where many small requests cost
    more than a few large ones. ``node_mbps`` caps all connections together
    (a node's NIC; 0: no cap)."""

    upstream_port: int
    root: Path
    latency_ms: float = 50.0
    jitter_ms: float = 0.0
    rate_mbps: float = 25.0
    service_ms: float = 0.0
    service_slots: int = 1
    node_mbps: float = 0.0
    port: int = 0
    endpoint: str = ""  # http://127.0.0.1:port, once started
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # Counters the proxy rewrites every 100 ms (``stats``).
        self._stats_path = self.root / "shaper-stats.json"

    def start(self, binary: str | None = None) -> Shaper:
        self.root.mkdir(parents=True, exist_ok=True)
        log = self.root / "shaper.log"
        log.write_bytes(b"")
        cmd = [
            binary or find_shaper(),
            "--upstream",
            f"127.0.0.1:{self.upstream_port}",
            "--latency-ms",
            str(self.latency_ms),
            "--jitter-ms",
            str(self.jitter_ms),
            "--rate-mbps",
            str(self.rate_mbps),
            "--service-ms",
            str(self.service_ms),
            "--service-slots",
            str(self.service_slots),
            "--node-mbps",
            str(self.node_mbps),
            "--stats",
            str(self._stats_path),
        ]
        self.proc = spawn(cmd, log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            if text.startswith("listening "):
                self.port = int(text.split()[1].rsplit(":", 1)[1])
                self.endpoint = loopback(self.port)
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"the shaping proxy did not start: {log.read_text(errors='replace')}")

    def stats(self) -> dict[str, Any]:
        """connections, open, max_open, requests, max_waiting (most requests
        waiting for or in service at once), bytes_down, upstream_failures (at
        most 100 ms old)."""
        try:
            return dict(json.loads(self._stats_path.read_text()))
        except (OSError, ValueError):
            return {}

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None
