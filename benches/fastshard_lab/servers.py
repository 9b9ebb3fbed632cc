"""Real servers for the S3 and HTTP tests and benchmarks: SeaweedFS
(``weed server -s3``, here; moto's and rclone's S3 servers are in moto.py and
rclone.py), nginx (HTTP and HTTPS) and a Python HTTP server that ignores Range
(web.py); the fault-injecting proxy is in tests/fault_proxy.py. Every server
binds 127.0.0.1 only, lives in a temporary folder, is stopped by its PID, and
dies with the process that started it (procs.py). The helpers are re-exported
here, where the tests import them from."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .gcs import FakeGcs, find_fake_gcs
from .moto import MotoS3
from .procs import (
    MissingBinary,
    find_binary,
    free_port,
    http_status,
    loopback,
    spawn,
    stop,
    tail,
    wait_http,
)
from .rclone import RcloneS3
from .s3store import ACCESS_KEY, BUCKET, PUBLIC_BUCKET, SECRET_KEY, S3Store
from .web import Nginx, no_range_server

# The helpers are re-exported: the tests and benchmarks import them from here.
__all__ = [
    "ACCESS_KEY",
    "BUCKET",
    "PUBLIC_BUCKET",
    "SECRET_KEY",
    "FakeGcs",
    "MissingBinary",
    "MotoS3",
    "Nginx",
    "RcloneS3",
    "S3Store",
    "SeaweedFS",
    "find_binary",
    "find_fake_gcs",
    "free_port",
    "http_status",
    "loopback",
    "no_range_server",
    "spawn",
    "stop",
    "tail",
    "wait_http",
]


@dataclass
class SeaweedFS(S3Store):
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
    def log(self) -> Path:
        return self.root / "weed.log"

    def start(self, weed: str) -> SeaweedFS:
        self.root = self.root.resolve()  # weed runs in it, and is given paths under it
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
                except (
                    client.exceptions.BucketAlreadyExists,
                    client.exceptions.BucketAlreadyOwnedByYou,
                ):
                    break
                except Exception as e:
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
                f"{free / 2**30:.1f} GiB free under {self.root}:\n{tail(self.log)}"
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
