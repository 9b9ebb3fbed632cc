"""The shaping proxy (examples/shaper.rs) from Python: an object store's
first-byte latency and per-connection bandwidth, on loopback, in front of
SeaweedFS or nginx. For tests and benchmarks of a checkout (the binary is
built by ``cargo test`` or ``cargo build --example shaper``)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import servers

REPO = Path(__file__).resolve().parents[3]


def find_shaper(release: bool = False) -> str:
    """$FASTSHARD_SHAPER, else the release build under target/ if there is
    one (a debug proxy on two cores can be what binds), else (unless
    ``release``) the debug one."""
    if env := os.environ.get("FASTSHARD_SHAPER"):
        return env
    for profile in ("release",) if release else ("release", "debug"):
        path = REPO / "target" / profile / "examples" / "shaper"
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    flag = " --release" if release else ""
    raise servers.MissingBinary(
        f"the shaping proxy is not built: cargo build{flag} --no-default-features "
        "--example shaper (cargo test also builds the debug one)"
    )


def ensure_shaper(release: bool = False) -> str:
    """``find_shaper(release)``, building the example first when there is
    none (`cargo test` builds the debug one before pytest in CI; the
    dependencies are usually built already). Benchmarks ask for the
    release proxy: a debug one spends the cores the loaders are measured on."""
    try:
        return find_shaper(release)
    except servers.MissingBinary:
        cmd = ["cargo", "build", "--no-default-features", "--example", "shaper"]
        subprocess.run(cmd + (["--release"] if release else []), cwd=REPO, check=True)
        return find_shaper(release)


@dataclass
class Shaper:
    """``latency_ms`` (+ up to ``jitter_ms``) before each request is
    forwarded; each connection's responses paced to ``rate_mbps`` MB/s
    (0: unlimited)."""

    upstream_port: int
    root: Path
    latency_ms: float = 50.0
    jitter_ms: float = 0.0
    rate_mbps: float = 25.0
    port: int = 0
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def _stats_path(self) -> Path:
        return self.root / "shaper-stats.json"

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
            "--stats",
            str(self._stats_path),
        ]
        self.proc = servers.spawn(cmd, log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            if text.startswith("listening "):
                self.port = int(text.split()[1].rsplit(":", 1)[1])
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"the shaping proxy did not start: {log.read_text(errors='replace')}")

    def stats(self) -> dict[str, Any]:
        """connections, open, max_open, requests, bytes_down, upstream_failures
        (at most 100 ms old)."""
        try:
            return dict(json.loads(self._stats_path.read_text()))
        except (OSError, ValueError):
            return {}

    def stop(self) -> None:
        if self.proc is not None:
            servers.stop(self.proc)
            self.proc = None
