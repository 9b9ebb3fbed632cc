"""A `vllm serve` (or `fastshard serve`) process group started here, for the
time-to-ready benchmark and the serving tests: its port, its output, its
OpenAI-compatible API, and a stop by its own process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .procs import free_port

BIN = Path(sys.executable).parent  # the venv's vllm and fastshard commands


def engine_env(endpoint: str, access_key: str, secret_key: str, cache: Path) -> dict[str, str]:
    """The environment a vLLM engine runs with here: the CPU engine, offline,
    a small KV cache, vLLM's and fastshard's caches under ``cache`` (one per
    session: the first engine starts cold, the others warm), S3 settings as
    tensorizer and vLLM users set them, and this venv's commands first."""
    return {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_WAIT_POLICY": "PASSIVE",  # generation crawls on 2 shared cores otherwise
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "FASTSHARD_CACHE_DIR": str(cache / "fastshard"),
        # That root also turns on the node's cache of weights; these engines
        # are here to measure and check loads from the store, so a cap of 0
        # keeps every object out of it.
        "FASTSHARD_CACHE_MAX_BYTES": "0",
        "S3_ENDPOINT_URL": endpoint,
        "S3_ACCESS_KEY_ID": access_key,
        "S3_SECRET_ACCESS_KEY": secret_key,
        "AWS_EC2_METADATA_DISABLED": "true",
        "PATH": os.pathsep.join((str(BIN), os.environ.get("PATH", ""))),
    }


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
