"""The loaders ``fastshard bench`` compares, each over one URI at a time.

``plan(loader, uri)`` says whether a loader can read that URI here (None,
or why not: the package is missing, the format or the store is one it does
not read) and, when it can, ``prepare`` does what must not be timed
(imports, a presigned URL) and returns the load itself: a function that
returns a flat state dict of tensors in this process's memory, or, for the
raw client, the object's bytes.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from collections.abc import Callable
from typing import Any

from . import raw

LOADERS = ("fastshard", "tensorizer", "runai", "safetensors", "raw")
DESCRIBE = {
    "fastshard": "fastshard.open(uri).load_state_dict()",
    "tensorizer": 'tensorizer open_stream + TensorDeserializer(device="cpu")',
    "runai": "Run:ai Model Streamer SafetensorsStreamer + clone",
    "safetensors": "safetensors.torch.load_file + clone (local files)",
    "raw": f"raw client: {raw.STREAMS} ranged GETs into one buffer, or a file read",
}
# loader → (module it needs, the package that has it)
PACKAGES = {
    "tensorizer": ("tensorizer", "tensorizer"),
    "runai": ("runai_model_streamer", "runai-model-streamer"),
    "safetensors": ("safetensors", "safetensors"),
}
Load = Callable[[], Any]


def scheme(uri: str) -> str:
    for prefix in ("s3", "gs", "http", "https"):
        if uri.startswith(prefix + "://"):
            return prefix
    return "file"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def plan(loader: str, uri: str) -> str | None:
    """None when ``loader`` can read ``uri`` here, else why not (one line)."""
    where, is_st = scheme(uri), uri.endswith(".safetensors")
    if loader in PACKAGES and not _installed(PACKAGES[loader][0]):
        return f"not installed (pip install {PACKAGES[loader][1]})"
    if loader == "tensorizer" and (is_st or where == "gs"):
        return "reads tensorizer files from disk, S3 and HTTP only"
    if loader == "runai":
        if not is_st or where in ("http", "https"):
            return "reads .safetensors files from disk, S3 and GCS only"
        backend = {"s3": "s3", "gs": "gcs"}.get(where)
        if backend and not _installed(f"runai_model_streamer_{backend}"):
            return f"not installed for {where}:// (pip install runai-model-streamer-{backend})"
    if loader == "safetensors" and (not is_st or where != "file"):
        return "reads local .safetensors files only"
    if loader == "raw":
        if where == "gs":
            return "no raw client for gs:// (give its https:// URL)"
        if where == "s3" and not _installed("boto3"):
            return "needs boto3 for S3 (pip install boto3)"
    return None


def _flat(sd: Any, prefix: str = "") -> dict[str, Any]:
    """A nested state dict's tensors under dotted names."""
    out: dict[str, Any] = {}
    for key, value in sd.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _fastshard(uri: str) -> Load:
    import fastshard

    def load() -> Any:
        with fastshard.open(uri) as f:
            return _flat(f.load_state_dict())

    return load


def _env(*names: str) -> str | None:
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


def tensorizer_s3_opts() -> dict[str, Any]:
    """tensorizer's ``open_stream`` options from the AWS environment
    variables fastshard reads too (tensorizer's own default endpoint is not
    AWS's)."""
    endpoint = _env("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") or "https://s3.amazonaws.com"
    opts: dict[str, Any] = {"s3_endpoint": endpoint}
    if endpoint.startswith("http://"):
        opts["force_http"] = True  # else tensorizer refuses an http:// endpoint
    if key := _env("AWS_ACCESS_KEY_ID"):
        opts["s3_access_key_id"] = key
        opts["s3_secret_access_key"] = _env("AWS_SECRET_ACCESS_KEY")
    return opts


def _tensorizer(uri: str) -> Load:
    from tensorizer import TensorDeserializer
    from tensorizer.stream_io import open_stream

    opts = tensorizer_s3_opts() if scheme(uri) == "s3" else {}

    def load() -> Any:
        stream = open_stream(uri, "rb", **opts)
        with TensorDeserializer(stream, device="cpu") as d:
            sd = {k: d[k] for k in d.keys()}  # noqa: SIM118 (a Mapping)
        with contextlib.suppress(Exception):
            stream.close()
        return sd

    return load


def _runai(uri: str) -> Load:
    from runai_model_streamer import SafetensorsStreamer

    if _env("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        # A custom endpoint (MinIO, SeaweedFS, ...) takes path-style requests;
        # its CRT client addresses buckets as virtual hosts unless told.
        os.environ.setdefault("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "0")

    def load() -> Any:
        sd = {}
        with SafetensorsStreamer() as streamer:
            streamer.stream_file(uri)
            for name, tensor in streamer.get_tensors():
                sd[name] = tensor.clone()  # as vLLM's loader does: the buffer is reused
        return sd

    return load


def _safetensors(uri: str) -> Load:
    from safetensors.torch import load_file

    # load_file maps the file lazily; clone() copies each tensor into memory.
    return lambda: {k: v.clone() for k, v in load_file(uri).items()}


def _raw(uri: str) -> Load:
    where = scheme(uri)
    if where == "file":
        return lambda: raw.read_file(uri)
    url = raw.presign_s3(uri) if where == "s3" else uri
    return lambda: raw.get_url(url)


PREPARE: dict[str, Callable[[str], Load]] = {
    "fastshard": _fastshard,
    "tensorizer": _tensorizer,
    "runai": _runai,
    "safetensors": _safetensors,
    "raw": _raw,
}


def prepare(loader: str, uri: str) -> Load:
    """Imports and set-up, off the clock; returns the load."""
    importlib.import_module("torch")
    return PREPARE[loader](uri)
