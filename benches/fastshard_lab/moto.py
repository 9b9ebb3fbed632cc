"""moto's S3 server (``moto_server``, PyPI ``moto[server]``): a second S3
implementation beside SeaweedFS for the functional tests, never for
benchmarks (it reads the whole object for every ranged GET).

moto accepts any key and secret unless told to check: with
``INITIAL_NO_AUTH_ACTION_COUNT`` set it serves that many actions unchecked
and verifies every later request's SigV4 signature against the access keys
of its own IAM. The set-up spends exactly those actions on an IAM user, its
key and the buckets, so the tests run against a server that rejects a wrong
secret (``auth=False`` keeps moto's default: anyone may do anything).

Where moto 5.2.5 differs from SeaweedFS, as the tests met it: a ranged GET
answers with the whole object's ETag, and If-Match is honoured (412), as on
SeaweedFS; a multipart object's ETag is the MD5 of the part MD5s with
"-<parts>", as on AWS; with signatures checked, a presigned URL (the query
string form tensorizer's S3 path uses) gets a 500, since moto looks for an
Authorization header only; anonymous requests get 403 even on "public"."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .procs import free_port, spawn, stop, tail, wait_http
from .s3store import BUCKET, PUBLIC_BUCKET, S3Store

_ALLOW_ALL = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
}
# create_user, put_user_policy, create_access_key and one create_bucket per bucket.
_SETUP_ACTIONS = 3 + 2


@dataclass
class MotoS3(S3Store):
    """``moto_server`` on 127.0.0.1 with the buckets "models" and "public";
    its access key and secret are made by its IAM at start."""

    root: Path
    auth: bool = True
    s3_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    access_key: str = "unchecked-key"
    secret_key: str = "unchecked-secret"
    bucket: str = BUCKET
    public_bucket: str = PUBLIC_BUCKET

    @property
    def presigned_urls(self) -> bool:  # type: ignore[override]
        # Its signature check reads the Authorization header only: a
        # presigned GET gets a 500 (KeyError 'HTTP_AUTHORIZATION').
        return not self.auth

    @property
    def log(self) -> Path:
        return self.root / "moto.log"

    def start(self, binary: str) -> MotoS3:
        self.root.mkdir(parents=True, exist_ok=True)
        self.s3_port = free_port()
        env = dict(os.environ)
        if self.auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(_SETUP_ACTIONS)
        cmd = [binary, "-H", "127.0.0.1", "-p", str(self.s3_port)]
        self.proc = spawn(cmd, self.log, cwd=self.root, env=env)
        wait_http(self.proc, self.s3_port, self.log, "moto")
        try:
            self._set_up()
        except Exception as e:
            self.stop()
            raise RuntimeError(
                f"moto started but could not be set up ({e}):\n{tail(self.log)}"
            ) from e
        return self

    def _set_up(self) -> None:
        import boto3

        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
        )
        iam.create_user(UserName="fastshard")
        iam.put_user_policy(
            UserName="fastshard", PolicyName="all", PolicyDocument=json.dumps(_ALLOW_ALL)
        )
        key: dict[str, Any] = iam.create_access_key(UserName="fastshard")["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        client = self.client()
        for bucket in (self.bucket, self.public_bucket):
            client.create_bucket(Bucket=bucket)
        if self.auth:
            # The actions left unchecked are spent: a wrong secret fails now.
            self.check_rejects_a_wrong_secret("moto, after its set-up,")

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, grace=2.0)
