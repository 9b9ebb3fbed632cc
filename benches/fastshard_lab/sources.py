"""Where the benchmark's objects live: local files, a SeaweedFS S3 server
and nginx started on loopback (stopped by PID afterwards), or the user's own
object; and what each loader reads there."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .deps import EXTRA, installed, peer_missing
from .procs import MissingBinary, find_binary
from .servers import SeaweedFS
from .web import Nginx

Objects = Any  # workload.Objects (format → path); typed loosely to keep this module torch-free


@dataclass
class Source:
    name: str  # "file" | "s3" | "http"
    # loader → what it reads: {"uri"/"path"/"url": ..., "opts": {...}}
    where: dict[str, dict[str, Any]] = field(default_factory=dict)
    env: dict[str, dict[str, str]] = field(default_factory=dict)  # loader → environment
    server_pid: int | None = None


def _usable(loader: str, fmt: str, objects: Objects) -> bool:
    return fmt in objects and peer_missing(loader) is None


def file_source(objects: Objects) -> Source:
    src = Source("file")
    size = objects["fastshard"].stat().st_size
    src.where["ceiling"] = {"path": str(objects["fastshard"]), "size": size}
    src.where["fastshard"] = {"uri": str(objects["fastshard"])}
    if _usable("tensorizer", "tensorizer", objects):
        src.where["tensorizer"] = {"uri": str(objects["tensorizer"])}
    if _usable("safetensors", "safetensors", objects):
        src.where["safetensors"] = {"path": str(objects["safetensors"])}
    if _usable("fastsafetensors", "safetensors", objects):
        src.where["fastsafetensors"] = {"path": str(objects["safetensors"])}
    if _usable("runai", "safetensors", objects):
        src.where["runai"] = {"uri": str(objects["safetensors"])}
    if "torch" in objects:
        src.where["torch"] = {"path": str(objects["torch"])}
    return src


def tensorizer_s3_opts(s3: SeaweedFS, endpoint: str | None = None) -> dict[str, Any]:
    """tensorizer's ``open_stream`` options for this server (or a proxy in front of it)."""
    return {
        "s3_access_key_id": s3.access_key,
        "s3_secret_access_key": s3.secret_key,
        "s3_endpoint": endpoint or s3.endpoint,
        "force_http": True,  # else tensorizer refuses an http:// endpoint
    }


def runai_env(s3: SeaweedFS, endpoint: str | None = None) -> dict[str, str]:
    """Run:ai Model Streamer's S3 settings (its CRT client reads the environment)."""
    return {
        "AWS_ENDPOINT_URL": endpoint or s3.endpoint,
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
    }


def s3_source(s3: SeaweedFS, objects: Objects, prefix: str) -> Source:
    src = Source("s3", server_pid=s3.proc.pid if s3.proc else None)
    uris = {fmt: s3.upload(path, f"{prefix}/{path.name}") for fmt, path in objects.paths.items()}
    size = objects["fastshard"].stat().st_size
    # Valid for the whole run: a 1 GiB run on 2 cores outlasts the default 10 minutes.
    url = s3.presign(uris["fastshard"], expires=12 * 3600)
    src.where["ceiling"] = {"url": url, "size": size}
    src.where["fastshard"] = {"uri": uris["fastshard"], "opts": s3.opts()}
    if _usable("tensorizer", "tensorizer", objects):
        src.where["tensorizer"] = {"uri": uris["tensorizer"], "opts": tensorizer_s3_opts(s3)}
    if _usable("runai", "safetensors", objects):
        src.where["runai"] = {"uri": uris["safetensors"]}
        src.env["runai"] = runai_env(s3)
    return src


def http_source(web: Nginx, objects: Objects, prefix: str) -> Source:
    src = Source("http", server_pid=web.proc.pid if web.proc else None)
    urls = {fmt: web.publish(path, f"{prefix}/{path.name}") for fmt, path in objects.paths.items()}
    size = objects["fastshard"].stat().st_size
    src.where["ceiling"] = {"url": urls["fastshard"], "size": size}
    src.where["fastshard"] = {"uri": urls["fastshard"]}
    if _usable("tensorizer", "tensorizer", objects):
        # tensorizer streams plain HTTP only with force_http (else it tries S3).
        src.where["tensorizer"] = {"uri": urls["tensorizer"], "opts": {"force_http": True}}
    return src


def find_servers(
    which: set[str], skipped: dict[str, str], log: Callable[[str], None] = print
) -> dict[str, str]:
    """Source → the server program to start it with, for each of ``which``
    (s3, http) that is installed; the others are logged and recorded in
    ``skipped``."""
    found: dict[str, str] = {}
    for source in sorted(which - {"file"}):
        try:
            if source == "s3":
                if not installed("boto3"):
                    raise MissingBinary(f"boto3 is not installed (uploads use it; {EXTRA})")
                found[source] = find_binary("weed")
            elif source == "http":
                found[source] = find_binary("nginx", "/usr/sbin/nginx")
        except MissingBinary as e:
            skipped[source] = str(e)
            log(f"skipping {source}: {e}")
    return found


@contextlib.contextmanager
def local_servers(
    root: Path, programs: dict[str, str], log: Callable[[str], None] = print
) -> Iterator[dict[str, Any]]:
    """SeaweedFS (``programs["s3"]``) and/or nginx (``programs["http"]``) on
    127.0.0.1, stopped on the way out."""
    started: dict[str, Any] = {}
    try:
        if "s3" in programs:
            started["s3"] = SeaweedFS(root / "seaweedfs").start(programs["s3"])
            log(f"SeaweedFS on {started['s3'].endpoint}")
        if "http" in programs:
            started["http"] = Nginx(root / "nginx").start(programs["http"])
            log(f"nginx on {started['http'].url()}")
        yield started
    finally:
        for server in started.values():
            server.stop()
