"""The one set of loaders every benchmark compares, each run by the child
process (child.py) on a JSON spec and returning (what it loaded, its own
counters). A loader returns a state dict whose tensors are in this
process's memory; a mapped loader (``*-mmap``) touches every page of its
tensors on the clock, since a lazy mmap alone is not a load.

Every loader is labelled by what it returns (``returns``: the one place
that says), and only rows of one kind are compared with each other:
``warm`` (bytes written into private memory that was already written: a
model's existing parameters, a pre-faulted buffer), ``fresh`` (copied into
new private memory, paying its first-touch page faults), ``mapped`` (views
of the file's page cache, copy-on-write), ``device`` (GPU memory), and
``none`` (a raw client that keeps no bytes: curl to /dev/null).

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
    "fastshard-warm": ("fastshard",),
    "fastshard-mmap": ("fastshard",),
    "tensorizer": ("tensorizer", "tensorizer.stream_io"),
    "safetensors": ("safetensors.torch",),
    "safetensors-mmap": ("safetensors.torch",),
    "fastsafetensors": ("fastsafetensors",),
    "runai": ("runai_model_streamer",),
    "torch": (),
    "ceiling": (),
    "ceiling-fresh": (),
    "curl": (),
}
# What each loader returns (module docstring); "ceiling" with ``fresh`` in its
# spec reads into new memory (``returns``).
RETURNS = {
    "fastshard": "fresh",
    "fastshard-warm": "warm",
    "fastshard-mmap": "mapped",
    "tensorizer": "fresh",
    "safetensors": "fresh",
    "safetensors-mmap": "mapped",
    "fastsafetensors": "fresh",
    "runai": "fresh",
    "torch": "fresh",
    "ceiling": "warm",
    "ceiling-fresh": "fresh",
    "curl": "none",
}
# The loaders that read what another one reads (its ``Source.where`` entry).
SAME_SOURCE = {
    "fastshard-warm": "fastshard",
    "fastshard-mmap": "fastshard",
    "safetensors-mmap": "safetensors",
    "ceiling-fresh": "ceiling",
}
# Loaders of local files only (a mapping needs one).
LOCAL_ONLY = frozenset({"fastshard-mmap", "safetensors-mmap"})
PAGE = 4096


def returns(spec: dict[str, Any]) -> str:
    """What the loader of ``spec`` returns: warm, fresh, mapped, device or none."""
    if str(spec.get("device", "cpu")).startswith("cuda"):
        return "device"
    if spec["loader"] == "ceiling" and spec.get("fresh"):
        return "fresh"
    return RETURNS[spec["loader"]]


def touch_pages(sd: dict[str, Any]) -> int:
    """Read one byte of every page of every tensor (a mapped load's pages
    come in only when touched); returns their sum, so nothing is skipped."""
    import torch

    total = 0
    for t in sd.values():
        if t.numel():
            flat = t.reshape(-1).view(torch.uint8)
            total += int(flat[::PAGE].sum()) + int(flat[-1])
    return total


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


def _fastshard_opts(spec: dict[str, Any]) -> dict[str, Any]:
    import fastshard

    opts = dict(spec.get("opts", {}))
    if "key_hex" in spec:  # JSON carries no key object: the raw 32-byte key, as hex
        opts["encryption"] = fastshard.EncryptionKey.from_bytes(bytes.fromhex(spec["key_hex"]))
    if "verify_hash" in spec:
        opts["verify_hash"] = bool(spec["verify_hash"])
    return opts


def _counters(st: Any, discovery: int) -> dict[str, Any]:
    return {
        "requests": st.requests,
        "retries": st.retries,
        "bytes_fetched": st.bytes_fetched,
        "bytes_received": st.bytes_received,
        "exchange": st.exchange,
        "discovery_bytes": discovery,
        "concurrency": st.concurrency,
        "staging_peak_bytes": st.peak_host_bytes,
        "adaptations": list(st.adaptations),
    }


def _fastshard(spec: dict[str, Any], mmap: bool = False) -> Result:
    """``load_state_dict``: new tensors (fresh memory), or with ``mmap``
    views of the mapped file, every page then touched."""
    import fastshard

    opts = _fastshard_opts(spec)
    kwargs = _rank_kwargs(spec)
    if kwargs:  # a per-rank template or packed object picks its file/records at open
        opts.update(rank=kwargs["rank"], world_size=kwargs["world_size"])
    with fastshard.open(spec["uri"], mmap=mmap, **opts) as f:
        sd = f.load_state_dict(**kwargs)
        extra = _counters(f.stats, f.discovery_bytes)
        extra["bytes_mapped"] = f.stats.bytes_mapped
    if mmap:
        assert isinstance(sd, dict)  # the workloads' state dicts are flat
        flat: dict[str, Any] = sd
        extra["bytes_fetched"] = sum(t.nbytes for t in flat.values())  # read by touching
        touch_pages(flat)
    return sd, extra


def warm_model(spec: dict[str, Any]) -> Any:
    """A module whose buffers have the file's names, shapes and dtypes,
    every page written (a pattern, not zeros), made before the clock: what
    ``fastshard.load`` fills in place, as it fills a model's parameters."""
    import torch

    import fastshard

    with fastshard.open(spec["uri"], **_fastshard_opts(spec)) as f:
        infos = f.infos()
    root = torch.nn.Module()
    for info in infos:
        *path, leaf = info.name.split(".")
        mod = root
        for part in path:
            if part not in mod._modules:
                mod.add_module(part, torch.nn.Module())
            mod = mod._modules[part]  # type: ignore[assignment]
        t = torch.empty(info.shape, dtype=info.dtype)
        if t.numel():
            t.reshape(-1).view(torch.uint8).fill_(0x5A)
        mod.register_buffer(leaf, t)
    return root


def _fastshard_warm(spec: dict[str, Any]) -> Result:
    """``fastshard.load(model, uri)`` into the buffers ``warm_model`` wrote."""
    import fastshard

    model = spec["_model"]
    st = fastshard.load(model, spec["uri"], **_fastshard_opts(spec))
    return dict(model.named_buffers()), _counters(st, 0)


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


def _safetensors_mmap(spec: dict[str, Any]) -> Result:
    """``load_file``'s own mapped tensors, every page touched."""
    from safetensors.torch import load_file

    sd = load_file(spec["path"])
    touch_pages(sd)
    return sd, {"bytes_fetched": sum(t.nbytes for t in sd.values())}


def _fastsafetensors(spec: dict[str, Any]) -> Result:
    from fastsafetensors import fastsafe_open

    # Its CPU path (nogds: no GPUDirect Storage here). The tensors view the
    # loader's buffer, freed when it closes: clone() keeps each, as a
    # model's parameters take it.
    with fastsafe_open(spec["path"], device="cpu", nogds=True) as f:
        sd = {k: f.get_tensor(k).clone() for k in f.keys()}
    return _slices(sd, spec), {}


def _torch(spec: dict[str, Any]) -> Result:
    import torch

    sd = torch.load(spec["path"], map_location="cpu", weights_only=True)
    return _slices(sd, spec), {}


def _ceiling(spec: dict[str, Any]) -> Result:
    return raw.ceiling_file(spec) if "path" in spec else raw.ceiling_remote(spec)


LOADERS: dict[str, Callable[[dict[str, Any]], Result]] = {
    "fastshard": _fastshard,
    "fastshard-warm": _fastshard_warm,
    "fastshard-mmap": lambda spec: _fastshard(spec, mmap=True),
    "tensorizer": _tensorizer,
    "runai": _runai,
    "safetensors": _safetensors,
    "safetensors-mmap": _safetensors_mmap,
    "fastsafetensors": _fastsafetensors,
    "torch": _torch,
    "ceiling": _ceiling,
    "ceiling-fresh": lambda spec: _ceiling({**spec, "fresh": True}),
    "curl": raw.curl,
}
PEERS = ("tensorizer", "runai", "safetensors", "fastsafetensors", "torch")
RAW = ("ceiling", "ceiling-fresh", "curl")  # their results are bytes, not state dicts

DESCRIBE = {
    "fastshard": "fastshard.open(...).load_state_dict() (fresh memory)",
    "fastshard-warm": "fastshard.load(model, uri) into buffers already written",
    "fastshard-mmap": "fastshard load_state_dict(mmap=True), every page touched",
    "tensorizer": 'tensorizer open_stream + TensorDeserializer(device="cpu")',
    "safetensors": "safetensors load_file + clone",
    "safetensors-mmap": "safetensors load_file (mapped), every page touched",
    "fastsafetensors": 'fastsafetensors fastsafe_open(device="cpu", nogds=True) + clone',
    "runai": "Run:ai SafetensorsStreamer + clone",
    "torch": "torch.load(weights_only=True)",
    "ceiling": "raw: ranged GETs (or a file read) into a pre-faulted buffer",
    "ceiling-fresh": "raw: ranged GETs (or a file read) into fresh memory",
    "curl": "raw: curl ranged GETs to /dev/null",
}


def setup(spec: dict[str, Any]) -> None:
    """What a load writes into, made before the clock: the ceiling's
    pre-faulted buffer, the warm loader's written model."""
    if spec["loader"] == "ceiling":
        spec["_buf"] = raw.buffer(spec)
    elif spec["loader"] == "fastshard-warm":
        spec["_model"] = warm_model(spec)


def prepare(loader: str) -> None:
    """Import what ``loader`` needs (and torch), so the clock times the load
    and not the imports."""
    import torch  # noqa: F401

    for module in IMPORTS[loader]:
        importlib.import_module(module)
    if loader.startswith("fastshard"):
        import fastshard

        fastshard.open  # noqa: B018 (resolves the lazily imported reader)
