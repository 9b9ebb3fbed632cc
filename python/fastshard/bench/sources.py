"""Where the benchmark's objects live: local files, a SeaweedFS S3 server
and nginx started on loopback (stopped by PID afterwards), or the user's
own object; and which loaders can read each."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import servers


@dataclass
class Source:
    name: str  # "file" | "s3" | "http"
    # loader → what it reads: {"uri"/"path"/"url": ..., "opts": {...}}
    where: dict[str, dict[str, Any]] = field(default_factory=dict)
    env: dict[str, dict[str, str]] = field(default_factory=dict)  # loader → environment
    note: str = ""


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def file_source(objects: dict[str, Path]) -> Source:
    src = Source("file")
    src.where["ceiling"] = {"path": str(objects["fastshard"])}
    src.where["fastshard"] = {"uri": str(objects["fastshard"])}
    if "tensorizer" in objects and installed("tensorizer"):
        src.where["tensorizer"] = {"uri": str(objects["tensorizer"])}
    if "safetensors" in objects:
        if installed("safetensors"):
            src.where["safetensors"] = {"path": str(objects["safetensors"])}
        if installed("runai_model_streamer"):
            src.where["runai"] = {"uri": str(objects["safetensors"])}
    src.where["torch"] = {"path": str(objects["torch"])}
    return src


def s3_source(s3: servers.SeaweedFS, objects: dict[str, Path], prefix: str) -> Source:
    src = Source("s3")
    uris = {fmt: s3.upload(path, f"{prefix}/{path.name}") for fmt, path in objects.items()}
    # Valid for the whole run: a 1 GiB run on 2 cores outlasts the default 10 minutes.
    src.where["ceiling"] = {"url": s3.presign(uris["fastshard"], expires=12 * 3600)}
    src.where["fastshard"] = {"uri": uris["fastshard"], "opts": s3.opts()}
    if "tensorizer" in uris and installed("tensorizer"):
        src.where["tensorizer"] = {
            "uri": uris["tensorizer"],
            "opts": {
                "s3_access_key_id": s3.access_key,
                "s3_secret_access_key": s3.secret_key,
                "s3_endpoint": s3.endpoint,
                "force_http": True,  # else tensorizer refuses an http:// endpoint
            },
        }
    if "safetensors" in uris and installed("runai_model_streamer"):
        src.where["runai"] = {"uri": uris["safetensors"]}
        src.env["runai"] = {
            "AWS_ENDPOINT_URL": s3.endpoint,
            "AWS_ACCESS_KEY_ID": s3.access_key,
            "AWS_SECRET_ACCESS_KEY": s3.secret_key,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_REGION": "us-east-1",
            "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
        }
    return src


def http_source(web: servers.Nginx, objects: dict[str, Path], prefix: str) -> Source:
    src = Source("http")
    urls = {fmt: web.publish(path, f"{prefix}/{path.name}") for fmt, path in objects.items()}
    src.where["ceiling"] = {"url": urls["fastshard"]}
    src.where["fastshard"] = {"uri": urls["fastshard"]}
    if "tensorizer" in urls and installed("tensorizer"):
        # tensorizer streams plain HTTP only with force_http (else it tries S3).
        src.where["tensorizer"] = {"uri": urls["tensorizer"], "opts": {"force_http": True}}
    return src


@contextlib.contextmanager
def local_servers(root: Path, which: set[str], log: Any = print) -> Iterator[dict[str, Any]]:
    """SeaweedFS and/or nginx on 127.0.0.1; missing programs are reported
    and their source left out."""
    started: dict[str, Any] = {}
    try:
        if "s3" in which:
            try:
                weed = servers.find_binary("weed")
                if not installed("boto3"):
                    raise servers.MissingBinary("boto3 is not installed (uploads use it)")
                started["s3"] = servers.SeaweedFS(root / "seaweedfs").start(weed)
                log(f"SeaweedFS on {started['s3'].endpoint}")
            except servers.MissingBinary as e:
                log(f"skipping s3: {e}")
        if "http" in which:
            try:
                nginx = servers.find_binary("nginx", "/usr/sbin/nginx")
                started["http"] = servers.Nginx(root / "nginx").start(nginx)
                log(f"nginx on {started['http'].url()}")
            except servers.MissingBinary as e:
                log(f"skipping http: {e}")
        yield started
    finally:
        for server in started.values():
            server.stop()
