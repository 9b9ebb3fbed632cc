"""Hugging Face checkpoints: a directory or prefix holding
``model.safetensors.index.json`` (many shard files) or ``model.safetensors``
opens as one state dict.

Policy over the native reader: this module finds the files; the native
``Reader(uri, members=[...])`` reads their headers concurrently, lists
every file's tensors as one index and loads any selection of them with one
plan (each file its own source). The index's ``weight_map`` is checked
against the headers once they are read: every tensor it names must be in
the shard it names; a shard it names that is not there is a
``NotFoundError`` naming the index; two shards holding one tensor is a
``FormatError`` (native). Tensors a shard holds that the map leaves out
load too, as transformers loads every tensor of the shards it opens.

A directory without a ``fastshard-manifest.json`` (resolve.py) is tried in
this order: ``model.tensors`` (fastshard's default name, first so that a
directory that has one loads as before), the HF index, ``model.safetensors``.
A URI naming an index file directly opens its shards.

Torch-free: the CLI uses it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .. import _native
from .._native import Location
from ..errors import FormatError, NotFoundError
from . import location as _location
from .location import display as _shown
from .manifest import MANIFEST_NAME
from .resolve import DEFAULT_FILE, Resolved, name_rank

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
INDEX_SUFFIX = ".safetensors.index.json"
# Index files of the largest public models are a few MB.
INDEX_MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class Checkpoint:
    """A sharded checkpoint: its index file and the shard files it names,
    derived from the index's parsed location (a shard is never parsed)."""

    location: Location  # where the index was read from
    members: tuple[Location, ...]  # the shards, sorted by name
    weight_map: dict[str, str]  # tensor name → shard file name (relative)

    @property
    def index(self) -> str:
        """The index's URI as given."""
        return _location.text(self.location)

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(m.head for m in self.members)

    @property
    def shown(self) -> str:
        return self.location.display


def is_index(uri: _location.Uri) -> bool:
    return _location.name(uri).endswith(INDEX_SUFFIX)


def _shard_name(name: Any, index: str) -> str:
    """A shard's name from the weight map: a path relative to the index,
    never out of its directory."""
    parts = name.split("/") if isinstance(name, str) else []
    if not parts or any(p in ("", ".", "..") for p in parts) or "\\" in name or ":" in name:
        raise FormatError(
            f"{_shown(index)}: weight_map names shard {name!r}: not a file name "
            "relative to the index",
            uri=_shown(index),
        )
    return str(name)


def read_index(location: _location.Uri, source_opts: dict[str, Any]) -> Checkpoint | None:
    """The checkpoint an index file describes; None if there is no file."""
    loc = _location.parsed(location)
    data = _native.read_object(loc, max_bytes=INDEX_MAX_BYTES, **source_opts)
    if data is None:
        return None
    shown = loc.display
    try:
        doc = json.loads(data)
        weight_map = doc["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(k, str) for k in weight_map):
            raise TypeError("weight_map is not an object")
    except (ValueError, KeyError, TypeError) as e:
        raise FormatError(
            f"{shown}: not a safetensors index (a JSON object with a weight_map): {e}",
            uri=shown,
        ) from e
    names = sorted({_shard_name(n, shown) for n in weight_map.values()})
    if not names:
        raise FormatError(f"{shown}: the weight_map names no shard files", uri=shown)
    return Checkpoint(loc, tuple(loc.sibling(n) for n in names), dict(weight_map))


def open_reader(
    resolved: Resolved, source_opts: dict[str, Any]
) -> tuple[_native.Reader, Checkpoint | None]:
    """The native reader of what ``resolve`` found: one file, or the
    files of the HF checkpoint a directory (or index URI) holds."""
    loc = resolved.location
    if resolved.rank is None and is_index(loc):
        ckpt = read_index(loc, source_opts)
        if ckpt is None:
            raise NotFoundError(f"{loc.display} not found", uri=loc.display)
        return _open_checkpoint(ckpt, source_opts), ckpt
    try:
        return _native.Reader(loc, **source_opts), None
    except NotFoundError as e:
        if resolved.directory is None:
            raise name_rank(e, resolved) from e
        missing = e
    directory = resolved.directory
    ckpt = read_index(directory.child(INDEX_NAME), source_opts)
    if ckpt is not None:
        return _open_checkpoint(ckpt, source_opts), ckpt
    try:
        return _native.Reader(directory.child(SINGLE_NAME), **source_opts), None
    except NotFoundError:
        shown = directory.display
        raise NotFoundError(
            f"{shown} holds no weights fastshard knows: no {MANIFEST_NAME}, "
            f"{DEFAULT_FILE}, {INDEX_NAME} or {SINGLE_NAME}",
            uri=shown,
        ) from missing


def _open_checkpoint(ckpt: Checkpoint, source_opts: dict[str, Any]) -> _native.Reader:
    # The set is named by the index's folder (a URL's query signs the index,
    # not the folder).
    directory = ckpt.location.sibling("")
    try:
        reader = _native.Reader(directory, members=list(ckpt.members), **source_opts)
    except NotFoundError as e:
        raise NotFoundError(
            f"{ckpt.shown} names shard {e.uri or '?'}, which is not there ({e})",
            uri=e.uri or ckpt.shown,
        ) from e
    check_weight_map(ckpt, reader)
    return reader


def check_weight_map(ckpt: Checkpoint, reader: _native.Reader) -> None:
    """Every tensor the index names must be in the shard it names."""
    holder: dict[str, str] = {}
    entries = iter(reader.entries())
    for uri, _size, count in reader.members():
        for _ in range(count):
            holder[next(entries)[0]] = uri
    # Each named shard as the reader shows it, derived once per file.
    named = {f: ckpt.location.sibling(f).display for f in set(ckpt.weight_map.values())}
    wrong = [
        (tensor, holder.get(tensor))
        for tensor, file in ckpt.weight_map.items()
        if named[file] != holder.get(tensor)
    ]
    if wrong:
        shown = ", ".join(f"{t!r} (in {where or 'no shard'})" for t, where in wrong[:10])
        more = f" (+{len(wrong) - 10} more)" if len(wrong) > 10 else ""
        raise FormatError(
            f"{ckpt.shown}: {len(wrong)} tensors of the weight_map are not in the shard it "
            f"names: {shown}{more}",
            uri=ckpt.shown,
            tensor=wrong[0][0],
        )
