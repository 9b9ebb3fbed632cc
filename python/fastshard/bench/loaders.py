"""The one set of loaders every benchmark compares, each run by the child
process (child.py) on a JSON spec and returning (what it loaded, its own
counters). A loader returns a state dict whose tensors are materialised in
this process's memory: a lazy mmap is not a load.

Spec fields: ``uri`` (a path, ``s3://`` or ``http(s)://``; for per-rank
files a ``%03d`` template; for fastshard also an HF checkpoint's directory
or prefix), ``uris`` (Run:ai: a checkpoint's files), ``path``/``url`` (the raw clients), ``opts``
(keyword arguments of the loader's open call), ``rank``/``world_size`` with
``shard_specs`` (name → dim) for one rank's share, ``cooperative``,
``verify_hash``, ``key_hex`` (the raw 32-byte key of an encrypted file), and
``num_readers`` and ``per_rank`` (tensorizer: ``uri`` is a template).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from typing import Any

from . import raw

Result = tuple[Any, dict[str, Any]]
# loader → the modules it needs, imported before the clock starts.
IMPORTS = {
    "fastshard": ("fastshard",),
    "tensorizer": ("tensorizer", "tensorizer.stream_io"),
    "safetensors": ("safetensors.torch",),
    "runai": ("runai_model_streamer",),
    "torch": (),
    "ceiling": (),
    "curl": (),
}


def _rank_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    ws = spec.get("world_size", 1)
    if ws <= 1:
        return {}
    out: dict[str, Any] = {"rank": spec["rank"], "world_size": ws}
    if spec.get("shard_specs") is not None:
        out["shard_specs"] = spec["shard_specs"]
    if spec.get("cooperative"):
        out["cooperative"] = True
    return out


def _slices(sd: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """A rank's slices of a whole state dict (peers that cannot read slices)."""
    specs, ws = spec.get("shard_specs"), spec.get("world_size", 1)
    if ws <= 1 or specs is None:
        return sd
    return {
        n: (t if specs.get(n) is None else t.chunk(ws, specs[n])[spec["rank"]]).contiguous()
        for n, t in sd.items()
    }


def _fastshard(spec: dict[str, Any]) -> Result:
    import fastshard

    opts = dict(spec.get("opts", {}))
    if "key_hex" in spec:  # JSON carries no key object: the raw 32-byte key, as hex
        opts["encryption"] = fastshard.EncryptionKey.from_bytes(bytes.fromhex(spec["key_hex"]))
    if "verify_hash" in spec:
        opts["verify_hash"] = bool(spec["verify_hash"])
    kwargs = _rank_kwargs(spec)
    if kwargs:  # a per-rank template or packed object picks its file/records at open
        opts.update(rank=kwargs["rank"], world_size=kwargs["world_size"])
    with fastshard.open(spec["uri"], **opts) as f:
        sd = f.load_state_dict(**kwargs)
        st = f.stats
        discovery = f.discovery_bytes
    return sd, {
        "requests": st.requests,
        "retries": st.retries,
        "bytes_fetched": st.bytes_fetched,
        "discovery_bytes": discovery,
        "concurrency": st.concurrency,
        "staging_peak_bytes": st.peak_host_bytes,
    }


def _tensorizer(spec: dict[str, Any]) -> Result:
    """``open_stream`` + ``TensorDeserializer(device="cpu")``; a rank reads the
    whole object (or its own per-rank file) and keeps its slices, as vLLM's
    loader does."""
    from tensorizer import TensorDeserializer
    from tensorizer.stream_io import open_stream

    uri = spec["uri"] % spec["rank"] if spec.get("per_rank") else spec["uri"]
    stream = open_stream(uri, "rb", **spec.get("opts", {}))
    kwargs: dict[str, Any] = {"verify_hash": bool(spec.get("verify_hash", False))}
    if spec.get("num_readers") is not None:
        kwargs["num_readers"] = spec["num_readers"]
    if "key_hex" in spec:
        from tensorizer import DecryptionParams

        kwargs["encryption"] = DecryptionParams.from_key(bytes.fromhex(spec["key_hex"]))
    with TensorDeserializer(stream, device="cpu", **kwargs) as d:
        sd = {k: d[k] for k in d.keys()}  # noqa: SIM118 (a Mapping)
        readers = getattr(d, "_num_readers", None)
    with contextlib.suppress(Exception):
        stream.close()
    fetched = spec.get("object_bytes") or sum(t.nbytes for t in sd.values())
    return _slices(sd, spec), {"num_readers": readers, "bytes_fetched": fetched}


def _runai(spec: dict[str, Any]) -> Result:
    from runai_model_streamer import SafetensorsStreamer

    sd = {}
    with SafetensorsStreamer() as streamer:
        if "uris" in spec:  # the files of a checkpoint, streamed as one
            streamer.stream_files(spec["uris"])
        else:
            streamer.stream_file(spec["uri"])
        for name, tensor in streamer.get_tensors():
            sd[name] = tensor.clone()  # as vLLM's loader does: the streamer reuses its buffer
    # It streams every tensor whole, whatever share of them a rank keeps.
    return _slices(sd, spec), {"bytes_fetched": sum(t.nbytes for t in sd.values())}


def _safetensors(spec: dict[str, Any]) -> Result:
    from safetensors.torch import load_file

    # load_file maps the file lazily; clone() copies each tensor into process
    # memory, as a model's parameters take it.
    return _slices({k: v.clone() for k, v in load_file(spec["path"]).items()}, spec), {}


def _torch(spec: dict[str, Any]) -> Result:
    import torch

    sd = torch.load(spec["path"], map_location="cpu", weights_only=True)
    return _slices(sd, spec), {}


def _ceiling(spec: dict[str, Any]) -> Result:
    return raw.ceiling_file(spec) if "path" in spec else raw.ceiling_remote(spec)


LOADERS: dict[str, Callable[[dict[str, Any]], Result]] = {
    "fastshard": _fastshard,
    "tensorizer": _tensorizer,
    "runai": _runai,
    "safetensors": _safetensors,
    "torch": _torch,
    "ceiling": _ceiling,
    "curl": raw.curl,
}
PEERS = ("tensorizer", "runai", "safetensors", "torch")
RAW = ("ceiling", "curl")  # their results are bytes, not state dicts

DESCRIBE = {
    "fastshard": "fastshard.open(...).load_state_dict()",
    "tensorizer": 'tensorizer open_stream + TensorDeserializer(device="cpu")',
    "safetensors": "safetensors load_file + clone",
    "runai": "Run:ai SafetensorsStreamer + clone",
    "torch": "torch.load(weights_only=True)",
    "ceiling": "raw: ranged GETs (or a file read) into a pre-faulted buffer",
    "curl": "raw: curl ranged GETs to /dev/null",
}


def prepare(loader: str) -> None:
    """Import what ``loader`` needs (and torch), so the clock times the load
    and not the imports."""
    import torch  # noqa: F401

    for module in IMPORTS[loader]:
        importlib.import_module(module)
    if loader == "fastshard":
        import fastshard

        fastshard.open  # noqa: B018 (resolves the lazily imported reader)
