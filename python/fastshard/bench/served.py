"""A `vllm serve` (or `fastshard serve`) process group started here, for the
time-to-ready benchmark and the serving tests: its port, its output, its
OpenAI-compatible API, and a stop by its own process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .servers import free_port


def get_json(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def post_json(url: str, body: dict[str, Any], timeout: float = 120) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Served:
    """``argv`` (a serve command, without --host/--port) started in a session
    of its own, its output in ``log``."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.log = log
        self.started = time.monotonic()
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [*argv, "--host", "127.0.0.1", "--port", str(self.port)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float) -> bool:
        """True once /v1/models answers; False when the process exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                get_json(f"{self.url}/v1/models")
                return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.25)
        raise TimeoutError(f"not ready after {timeout:.0f} s:\n{self.output[-4000:]}")

    def model(self) -> str:
        """The name the server serves its model under."""
        return str(get_json(f"{self.url}/v1/models")["data"][0]["id"])

    def complete(self, prompt: str, max_tokens: int, model: str | None = None) -> str:
        body = {
            "model": model or self.model(),
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        return str(post_json(f"{self.url}/v1/completions", body)["choices"][0]["text"])

    def stop(self) -> None:
        """SIGTERM to the group (vLLM shuts its engine and workers down), then
        SIGKILL to whatever of it is left."""
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
        self._signal(signal.SIGKILL)
        self.proc.wait(10)

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass  # the whole group has exited

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
