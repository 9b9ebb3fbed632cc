"""HTTP servers for tests and benchmarks: nginx (sendfile; HTTPS with a
throwaway CA when openssl is given) and a Python server that ignores Range."""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from .procs import free_port, loopback, spawn, stop, wait_http


@dataclass
class Nginx:
    """nginx serving ``root`` over HTTP on 127.0.0.1 with sendfile; one
    process (no master/workers), so its PID is the whole server."""

    base: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    tls_port: int = 0  # HTTPS too, when started with openssl
    ca_bundle: Path | None = None  # the CA that signed its certificate
    _cmd: list[str] = field(default_factory=list, repr=False)

    @property
    def root(self) -> Path:
        return self.base / "www"

    def url(self, name: str = "") -> str:
        return f"{loopback(self.port)}/{name}"

    def tls_url(self, name: str = "") -> str:
        return f"https://127.0.0.1:{self.tls_port}/{name}"

    def start(self, nginx: str, openssl: str | None = None) -> Nginx:
        self.base = self.base.resolve()  # nginx's -p and config take absolute paths
        self.root.mkdir(parents=True, exist_ok=True)
        for d in ("logs", "tmp"):
            (self.base / d).mkdir(exist_ok=True)
        self.port = free_port()
        b = self.base
        tls = ""
        if openssl:
            cert, key = self._certificates(openssl)
            self.tls_port = free_port()
            tls = f"""    server {{
        listen 127.0.0.1:{self.tls_port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        root {self.root};
        location / {{ }}
    }}
"""
        conf = b / "nginx.conf"
        conf.write_text(
            f"""daemon off;
master_process off;
worker_processes 1;
pid {b}/nginx.pid;
error_log {b}/logs/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log {b}/logs/access.log;
    client_body_temp_path {b}/tmp/body;
    proxy_temp_path {b}/tmp/proxy;
    fastcgi_temp_path {b}/tmp/fastcgi;
    uwsgi_temp_path {b}/tmp/uwsgi;
    scgi_temp_path {b}/tmp/scgi;
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    server {{
        listen 127.0.0.1:{self.port};
        root {self.root};
        location / {{ }}
    }}
{tls}}}
"""
        )
        self._cmd = [nginx, "-p", str(b), "-c", str(conf), "-e", str(b / "logs" / "error.log")]
        self.proc = spawn(self._cmd, b / "logs" / "stdout.log")
        wait_http(self.proc, self.port, b / "logs" / "error.log", "nginx", timeout=20)
        return self

    def restart(self) -> None:
        """Kill nginx (SIGKILL) and start it again on the same ports; the new
        process dies with the calling thread (see ``spawn``)."""
        assert self.proc is not None, "not started"
        stop(self.proc, signal.SIGKILL)
        self.proc = spawn(self._cmd, self.base / "logs" / "stdout.log")
        wait_http(self.proc, self.port, self.base / "logs" / "error.log", "nginx", timeout=20)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, signal.SIGQUIT)

    def _certificates(self, openssl: str) -> tuple[Path, Path]:
        """A throwaway CA and a server certificate for 127.0.0.1 it signs."""
        d = self.base / "tls"
        d.mkdir(exist_ok=True)
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]

        def run(*args: str) -> None:
            subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True)

        ca = ["-subj", "/CN=fastshard test CA", "-addext", "basicConstraints=critical,CA:TRUE"]
        run("req", "-x509", *ec, *ca, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2")
        run("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
        (d / "ext.cnf").write_text(
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        )
        sign = ["-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-extfile", "ext.cnf"]
        run("x509", "-req", "-in", "server.csr", *sign, "-out", "server.pem", "-days", "2")
        self.ca_bundle = d / "ca.pem"
        return d / "server.pem", d / "server.key"

    def publish(self, path: Path, name: str) -> str:
        """Copy a file into the served folder atomically; returns its URL."""
        dest = self.root / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        shutil.copyfile(path, tmp)
        os.replace(tmp, dest)
        return self.url(name)


@contextlib.contextmanager
def no_range_server(root: Path) -> Iterator[str]:
    """``http.server``: answers every GET with 200 and the whole file."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(root)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
