"""``fastshard.save``: tensorizer-compatible files from a module or state dict."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Unpack

import torch

from . import _native, _options
from ._engine import tensors as _tensors
from ._layouts import location as _location
from ._layouts.manifest import is_template, rank_file, remove_stale_manifest, write_manifest
from ._layouts.packed import prefixed
from ._layouts.resolve import DEFAULT_FILE, DEFAULT_TEMPLATE
from ._native import Location
from ._options import SaveOptions
from .errors import InvalidArgumentError

PathPart = str | int
_Spec = tuple[str | list[PathPart], int, int, torch.Tensor]  # name, type, module idx

PARAM, BUFFER, STATE_DICT = 0, 1, 2


def _module_specs(module: torch.nn.Module) -> Iterator[_Spec]:
    # Mirrors TensorSerializer.write_module (2.12.1): modules in named_modules()
    # order (deduplicated), each module's own parameters then buffers, root
    # tensors named ".name", non-persistent buffers included.
    for idx, (module_name, mod) in enumerate(module.named_modules()):
        for name, param in mod.named_parameters(recurse=False):
            yield f"{module_name}.{name}", PARAM, idx, param
        for name, buf in mod.named_buffers(recurse=False):
            yield f"{module_name}.{name}", BUFFER, idx, buf


def _state_dict_specs(obj: Any, prefix: tuple[PathPart, ...] = ()) -> Iterator[_Spec]:
    # Mirrors tensorizer's flatten_structure: depth first, in mapping/sequence
    # order; a path of one string is stored as that plain name.
    if isinstance(obj, Mapping):
        items: Sequence[tuple[PathPart, Any]] = list(obj.items())
        for key, _ in items:
            if not isinstance(key, str):
                raise InvalidArgumentError(
                    f"state dict keys must be str, not {type(key).__name__} ({key!r}) "
                    f"at {list(prefix)}"
                )
    elif isinstance(obj, Sequence) and not isinstance(obj, (str, bytes, bytearray)):
        items = list(enumerate(obj))
    else:
        raise InvalidArgumentError(
            f"cannot save {type(obj).__name__} at {list(prefix)}: "
            "leaves must be tensors inside dicts, lists or tuples"
        )
    for key, value in items:
        path = (*prefix, key)
        if isinstance(value, torch.Tensor):
            name: str | list[PathPart] = (
                path[0] if len(path) == 1 and isinstance(path[0], str) else list(path)
            )
            yield name, STATE_DICT, 0, value
        else:
            yield from _state_dict_specs(value, path)


def save(
    state_dict_or_module: torch.nn.Module | Mapping[str, Any] | Sequence[Any],
    uri: str | os.PathLike[str] | Location,
    *,
    exact_index: bool | None = None,
    **opts: Unpack[SaveOptions],
) -> int:
    """Write a tensorizer file; returns its size in bytes.

    A module is written exactly like ``TensorSerializer.write_module`` and a
    (possibly nested) dict/list/tuple like ``write_state_dict``; the bytes are
    identical to tensorizer 2.12.1's. ``exact_index=None`` keeps tensorizer's
    fixed 256 KiB index and, when the names do not fit in it (a few thousand
    tensors), writes an exact-size index instead (tensorizer reads both; only
    its writer has the limit). ``True``/``False`` force one or the other.

    ``uri`` is a local path (written to a temporary sibling, then renamed) or
    ``s3://bucket/key`` (a streamed multipart upload, completed only once
    the whole file is sent; nothing is staged on local disk) or
    ``gs://bucket/key`` (a resumable upload through Google's client, the
    same way). ``opts`` are
    the source options of ``fastshard.open`` (``s3_endpoint``, credentials,
    ``s3_region``, ``max_attempts``, ...) but the node cache's
    (``cache_dir`` and ``cache_max_bytes`` are load options: a save writes
    to the store alone, and raises ``InvalidArgumentError`` on them), and
    ``encryption`` (a
    ``fastshard.EncryptionKey``: every tensor with data is encrypted as
    tensorizer's ``TensorSerializer(encryption=...)`` does; tensorizer reads
    the file with the same key or passphrase), and ``align`` (a power of
    two up to 4096: every tensor's data starts at a multiple of this many
    bytes, padded inside its record header, which tensorizer reads; the
    bytes then differ from tensorizer's. ``load_state_dict(mmap=True)``
    views a tensor in place only when its data is aligned to its element
    size, which tensorizer's own layout leaves to chance: 64 makes every
    tensor a view. Not with ``encryption``).
    """
    native_opts = _options.save_settings(opts)
    entries = _entries(state_dict_or_module)
    if not entries:
        raise InvalidArgumentError("nothing to save: no tensors (such a file cannot be read)")
    return _write(
        uri if isinstance(uri, Location) else os.fspath(uri), entries, exact_index, native_opts
    )[0]


def _entries(obj: torch.nn.Module | Mapping[str, Any] | Sequence[Any]) -> list[_Spec]:
    if isinstance(obj, torch.nn.Module):
        return list(_module_specs(obj))
    return list(_state_dict_specs(obj))


def _write(
    path: str | Location,
    entries: list[_Spec],
    exact_index: bool | None,
    native_opts: dict[str, Any],
    *,
    sha256: bool = False,
) -> tuple[int, str | None]:
    """(size, the whole file's SHA-256 when asked: hashed natively from the
    bytes as they are written or uploaded, nothing is read back)."""
    specs: list[tuple[Any, int, int, str, list[int], bool]] = []
    buffers: list[memoryview] = []
    owners: list[torch.Tensor] = []  # keep contiguous copies alive during the write
    for name, ttype, idx, tensor in entries:
        if tensor.is_meta and tensor.dim() == 0:
            # tensorizer 2.12.1 cannot read a 0-dim meta record (it sizes it
            # with numpy.prod(()) == 1.0, a float); a real zero scalar loads
            # the same everywhere.
            tensor = torch.zeros((), dtype=tensor.dtype)
        data, owner = _tensors.readable_bytes(tensor)
        specs.append(
            (
                name,
                ttype,
                idx,
                _tensors.dtype_name(tensor.dtype),
                list(tensor.shape),
                tensor.is_meta,
            )
        )
        buffers.append(data)
        owners.append(owner)

    def write(exact: bool) -> tuple[int, str | None]:
        out = _native.write_file(
            path, specs, buffers, exact_index=exact, sha256=sha256, **native_opts
        )
        return out if isinstance(out, tuple) else (out, None)

    if exact_index is not None:
        return write(exact_index)
    try:
        return write(False)
    except InvalidArgumentError as e:
        # tensorizer's fixed index overflowed (found while planning, before
        # any byte is written or uploaded); other problems raise as they are.
        if e.reason != "index_too_small":
            raise
        return write(True)


def save_sharded(
    state_dicts: Sequence[torch.nn.Module | Mapping[str, Any] | Sequence[Any]],
    uri: str | os.PathLike[str] | Location,
    *,
    exact_index: bool | None = None,
    packed: bool = False,
    **opts: Unpack[SaveOptions],
) -> list[str]:
    """Write one file per rank (or, ``packed=True``, one object holding
    every rank); returns their URIs in rank order.

    ``uri`` is a per-rank template (``model-rank-%03d.tensors``, any
    ``%0Nd``/``%d``, or ``{rank}``) or a directory (``…/``, written as
    ``model-rank-%03d.tensors`` inside it). ``state_dicts[r]`` is written by
    ``fastshard.save`` to rank r's name, then ``fastshard-manifest.json``
    (world size, file names, sizes, SHA-256 of each file as written) beside
    them, locally or on S3; a manifest left by an earlier save is deleted
    first. Options as ``fastshard.save`` (they reach the manifest too).

    ``packed=True`` writes ONE tensorizer file (``uri``: a file, or a
    directory to write ``model.tensors`` into; returned as a one-item list)
    in which rank r's tensors are named ``@rank{r}/{name}``, rank by rank,
    so each rank's records are contiguous (encoding: ``fastshard.packed``).
    ``load(model, uri, rank=r)`` then reads only rank r's byte ranges. The
    real tensorizer reads the file (names keep their prefix). A directory's
    stale ``fastshard-manifest.json`` is removed, so the directory means the
    packed object from now on.
    """
    from . import __version__

    if isinstance(state_dicts, (Mapping, torch.nn.Module)) or not isinstance(state_dicts, Sequence):
        raise InvalidArgumentError(
            "save_sharded needs a list with one state dict (or module) per rank, "
            f"not {type(state_dicts).__name__}"
        )
    if not state_dicts:
        raise InvalidArgumentError("save_sharded needs at least one rank's state dict")
    # Parsed once: the template, each rank's file and the manifest are
    # derived from it.
    loc = _location.parsed(uri)
    if packed:
        return [_save_packed(state_dicts, loc, exact_index, opts)]
    if loc.is_dir:
        loc = loc.child(DEFAULT_TEMPLATE)
    template = _location.text(loc)
    if not is_template(loc):
        raise InvalidArgumentError(
            f"{template!r} is not a per-rank template: use e.g. model-rank-%03d.tensors or "
            "model-{rank}.tensors, or a directory ending in '/'"
        )
    files = [rank_file(loc, rank) for rank in range(len(state_dicts))]
    uris = [_location.text(f) for f in files]
    if len(set(uris)) != len(uris):  # e.g. a "%%d" that is no rank spec
        raise InvalidArgumentError(f"{template!r} gives the same name to several ranks")
    native_opts = _options.save_settings(opts)
    remove_stale_manifest(loc, _options.without_key(native_opts))
    # An uploaded file's hash is taken natively as it streams out (reading it
    # back would download it); a local file's from disk afterwards, which
    # measured cheaper here (OpenSSL's SHA-256 is ~2x the sha2 crate's).
    remote = loc.path is None
    written = []
    for state, target in zip(state_dicts, files, strict=True):
        entries = _entries(state)
        if not entries:
            raise InvalidArgumentError(
                f"nothing to save for {_location.text(target)}: no tensors "
                "(such a file cannot be read)"
            )
        written.append(_write(target, entries, exact_index, native_opts, sha256=remote))
    write_manifest(
        loc,
        [size for size, _ in written],
        __version__,
        sha256s=[digest for _, digest in written],
        source_opts=_options.without_key(native_opts),
    )
    return uris


def _save_packed(
    state_dicts: Sequence[torch.nn.Module | Mapping[str, Any] | Sequence[Any]],
    loc: Location,
    exact_index: bool | None,
    opts: SaveOptions,
) -> str:
    native_opts = _options.save_settings(opts)
    directory = loc.is_dir
    if directory:
        loc = loc.child(DEFAULT_FILE)
    uri = _location.text(loc)
    if not directory and is_template(loc):
        raise InvalidArgumentError(
            f"{uri!r} is a per-rank template, but packed=True writes one object: "
            "give its file name (or a directory ending in '/')"
        )
    entries: list[_Spec] = []
    for rank, state in enumerate(state_dicts):
        own = _entries(state)
        if not own:
            # A rank without tensors would vanish from the index, and the
            # object would read back with a smaller world size.
            raise InvalidArgumentError(f"packed=True: rank {rank}'s state dict has no tensors")
        for name, ttype, idx, tensor in own:
            entries.append((prefixed(rank, name, uri=uri), ttype, idx, tensor))
    if directory:
        remove_stale_manifest(loc, _options.without_key(native_opts))
    _write(loc, entries, exact_index, native_opts)
    return uri
