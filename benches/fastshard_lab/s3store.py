"""What every S3 server of the tests and benchmarks shares (SeaweedFS in
servers.py, moto in moto.py, rclone in rclone.py): its endpoint, the
fastshard options and the boto3 client that reach it with its keys, and
uploads, reads and presigned URLs through that client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .procs import loopback

ACCESS_KEY = "fastshard-test-key"
SECRET_KEY = "fastshard-test-secret-Zq8vR2"  # distinctive: tests grep errors for it
BUCKET = "models"
PUBLIC_BUCKET = "public"  # anonymous identity may read and list it


class S3Store:
    """Mixed into a server's dataclass, which sets these fields."""

    s3_port: int
    access_key: str
    secret_key: str
    bucket: str
    # Whether a presigned URL (query-string SigV4, tensorizer's S3 path) works.
    presigned_urls: bool = True

    @property
    def endpoint(self) -> str:
        return loopback(self.s3_port)

    def opts(self, **extra: Any) -> dict[str, Any]:
        """fastshard options reaching this server with its keys."""
        return {
            "s3_endpoint": self.endpoint,
            "s3_access_key_id": self.access_key,
            "s3_secret_access_key": self.secret_key,
            **extra,
        }

    def check_rejects_a_wrong_secret(self, what: str) -> None:
        """A request signed with a wrong secret must fail: the server
        checks signatures, as the auth tests assume."""
        from botocore.exceptions import ClientError

        right = self.secret_key
        self.secret_key = right[::-1]
        try:
            self.client().head_bucket(Bucket=self.bucket)
        except ClientError:
            return
        finally:
            self.secret_key = right
        raise RuntimeError(f"{what} accepted a wrong secret")

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
        return bytes(self.client().get_object(Bucket=bucket, Key=key)["Body"].read())

    def presign(self, uri: str, endpoint: str | None = None, expires: int = 600) -> str:
        bucket, key = uri.removeprefix("s3://").split("/", 1)
        client = self.client(endpoint, signature_version="s3v4")
        return str(
            client.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires
            )
        )
