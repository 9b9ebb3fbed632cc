"""``fastshard.load``: fill an ``nn.Module``'s parameters and buffers from a file."""

from __future__ import annotations

import bisect
import os
import time
from dataclasses import dataclass
from typing import Any, Unpack

import torch

from . import _core, _gc, tp
from ._options import OpenOptions
from ._types import LoadStats
from .errors import FormatError, InvalidArgumentError
from .reader import TensorFile, opened

_LIST_LIMIT = 20


@dataclass
class _Target:
    """One parameter/buffer name of the model and where it lives."""

    tensor: torch.Tensor
    owner: torch.nn.Module | None  # None: a state_dict entry we can't locate
    attr: str
    is_param: bool
    required: bool


@dataclass(frozen=True)
class _Planned:
    """One matched name: the model's tensor and the load that fills it (into
    a new tensor, for a meta one)."""

    target: _Target
    job: _core.Job


def _targets(model: torch.nn.Module) -> dict[str, _Target]:
    # state_dict decides what is required (it is what users expect strict to
    # mean); the module walk adds owners and the non-persistent buffers that
    # tensorizer's write_module also stores.
    required = {
        k for k, v in model.state_dict(keep_vars=True).items() if isinstance(v, torch.Tensor)
    }
    found: dict[str, _Target] = {}
    for prefix, mod in model.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for attr, p in mod._parameters.items():
            if p is not None:
                name = dot + attr
                found[name] = _Target(p, mod, attr, True, name in required)
        for attr, b in mod._buffers.items():
            if b is not None:
                name = dot + attr
                found[name] = _Target(b, mod, attr, False, name in required)
    for name, value in model.state_dict(keep_vars=True).items():
        if isinstance(value, torch.Tensor) and name not in found:
            found[name] = _Target(value, None, name, False, True)
    return found


def _file_names(f: TensorFile) -> dict[str, int]:
    """File name → index, with write_module's leading "." of root tensors removed."""
    out: dict[str, int] = {}
    for i, name in enumerate(f.keys()):
        key = name[1:] if name.startswith(".") else name
        if key in out:
            raise FormatError(f"{f.uri}: two tensors are both named {key!r}", uri=f.uri, tensor=key)
        out[key] = i
    return out


def _listing(label: str, names: list[str]) -> str:
    shown = ", ".join(names[:_LIST_LIMIT])
    more = f" (+{len(names) - _LIST_LIMIT} more)" if len(names) > _LIST_LIMIT else ""
    return f"{label} ({len(names)}): {shown}{more}"


def _slices(
    f: TensorFile,
    targets: dict[str, _Target],
    in_file: dict[str, int],
    rank: int,
    world_size: int,
    specs: tp.Specs | None,
) -> dict[str, tp.Slice | None]:
    """Each matched name's slice for ``rank``, from the specs or the shapes;
    every name that cannot be sliced is reported at once, before any read."""
    out: dict[str, tp.Slice | None] = {}
    problems: list[str] = []
    for name, t in targets.items():
        if name not in in_file:
            continue
        info = f.info_at(in_file[name])
        try:
            out[name] = tp.plan_slice(
                name, info.shape, tuple(t.tensor.shape), rank, world_size, specs
            )
        except InvalidArgumentError as e:
            problems.append(str(e))
    if problems:
        more = f" (+{len(problems) - _LIST_LIMIT} more)" if len(problems) > _LIST_LIMIT else ""
        raise InvalidArgumentError(
            f"{f.uri}: rank {rank} of {world_size} cannot slice "
            f"{len(problems)} tensors: " + "; ".join(problems[:_LIST_LIMIT]) + more,
            uri=f.uri,
        )
    return out


def _check(
    f: TensorFile,
    targets: dict[str, _Target],
    in_file: dict[str, int],
    strict: bool,
    slices: dict[str, tp.Slice | None],
) -> None:
    # A shared submodule is stored once by write_module (named_modules()
    # dedups), so a name whose tensor is filled under another name is fine.
    filled = {id(t.tensor) for n, t in targets.items() if n in in_file}
    missing = [
        n
        for n, t in targets.items()
        if t.required and n not in in_file and id(t.tensor) not in filled
    ]
    unexpected = [n for n in in_file if n not in targets]
    mismatched = [
        f"{n} (model {tuple(t.tensor.shape)}, file {f.info_at(in_file[n]).shape})"
        for n, t in targets.items()
        if n in in_file
        and tuple(t.tensor.shape) != tp.sliced_shape(f.info_at(in_file[n]).shape, slices.get(n))
    ]
    problems = []
    if strict and missing:
        problems.append(_listing("missing from the file", missing))
    if strict and unexpected:
        problems.append(_listing("not in the model", unexpected))
    # Like torch's load_state_dict, a shape mismatch is an error even when
    # not strict: there is nothing sensible to copy.
    if mismatched:
        problems.append(_listing("shape mismatch", mismatched))
    if problems:
        raise InvalidArgumentError(
            f"{f.uri} does not fit the model: " + "; ".join(problems), uri=f.uri
        )


def _plan(
    f: TensorFile,
    targets: dict[str, _Target],
    in_file: dict[str, int],
    slices: dict[str, tp.Slice | None],
    device: torch.device,
) -> list[_Planned]:
    """One job per matched name; meta tensors get memory on ``device``."""
    jobs: list[_Planned] = []
    replaced: dict[int, torch.Tensor] = {}  # id(meta tensor) → its new CPU tensor
    claimed = _Claims()  # memory ranges already filled in place
    order = sorted((in_file[n], n) for n in targets if n in in_file)
    for index, name in order:
        t = targets[name]
        info = f.info_at(index)
        sl = slices.get(name)
        shape = tp.sliced_shape(info.shape, sl)
        dest: torch.Tensor = t.tensor
        if dest.is_meta:
            if t.owner is None:
                raise InvalidArgumentError(f"cannot allocate meta tensor {name!r}: owner unknown")
            if id(dest) not in replaced:
                replaced[id(dest)] = torch.empty(shape, dtype=dest.dtype, device=device)
            dest = replaced[id(dest)]
        in_place = _in_place_ok(dest, info.dtype, claimed)
        jobs.append(_Planned(t, _core.job(index, sl, shape, dest, in_place)))
    return jobs


class _Claims:
    """Memory ranges already filled in place, kept sorted and disjoint so
    that checking one more destination is a binary search (a model may have
    tens of thousands of parameters)."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def claim(self, start: int, end: int) -> bool:
        """Claim ``[start, end)`` unless it overlaps a range already claimed."""
        i = bisect.bisect_right(self._starts, start)
        if i > 0 and self._ends[i - 1] > start:
            return False
        if i < len(self._starts) and self._starts[i] < end:
            return False
        self._starts.insert(i, start)
        self._ends.insert(i, end)
        return True


def _in_place_ok(dest: torch.Tensor, dtype: torch.dtype, claimed: _Claims) -> bool:
    """The native load may write into ``dest`` itself: same dtype, contiguous
    CPU memory that no other in-place destination overlaps (tied or aliased
    weights are filled once, the other names go through a copy)."""
    if dest.device.type != "cpu" or dest.dtype != dtype or not dest.is_contiguous():
        return False
    if dest.numel() == 0:
        return True
    start = dest.data_ptr()
    return claimed.claim(start, start + dest.numel() * dest.element_size())


def _apply(jobs: list[_Planned]) -> None:
    """After a successful read (temporaries already copied): install new
    tensors in place of meta ones, keeping Parameter-ness, requires_grad and
    attributes."""
    installed: dict[int, torch.Tensor] = {}
    for job in jobs:
        t = job.target
        if not t.tensor.is_meta:
            continue
        new = job.job.dest
        if id(t.tensor) not in installed:
            if t.is_param:
                param = torch.nn.Parameter(new, requires_grad=t.tensor.requires_grad)
                param.__dict__.update(t.tensor.__dict__)
                installed[id(t.tensor)] = param
            else:
                installed[id(t.tensor)] = new
        value = installed[id(t.tensor)]
        assert t.owner is not None  # _plan refused meta tensors without owner
        if t.is_param:
            t.owner.register_parameter(t.attr, value)  # type: ignore[arg-type]
        else:
            t.owner.register_buffer(
                t.attr, value, persistent=t.attr not in t.owner._non_persistent_buffers_set
            )


@_gc.pausing
def load(
    model: torch.nn.Module,
    uri: str | os.PathLike[str],
    rank: int | None = 0,
    world_size: int | None = None,
    *,
    strict: bool = True,
    shard_specs: tp.Specs | None = None,
    cooperative: bool = False,
    group: Any = None,
    device: _core.DeviceLike | None = None,
    verify_manifest_hashes: bool = False,
    **opts: Unpack[OpenOptions],
) -> LoadStats:
    """Copy a file's tensors into ``model``'s parameters and buffers.

    Names are matched against ``model.state_dict()`` (plus non-persistent
    buffers, which tensorizer's ``write_module`` also stores, but which may be
    absent); root-module names written as ".name" match "name". With
    ``strict`` every state_dict name must be in the file and every file name
    in the model; shapes must always match. All of that is checked before any
    tensor byte is read, so a mismatch leaves the model untouched.

    CPU parameters of the file's dtype are filled in place; the others
    (CUDA, another dtype) are staged through a few reusable host slabs
    (pinned for CUDA, copied on side streams while the next slabs are
    fetched; the caller's stream waits for the copies before ``load``
    returns), all within ``max_host_bytes`` (a large tensor goes in blocks
    of rows). Meta parameters and buffers are replaced by tensors on
    ``device`` (default CPU) holding the loaded values. If the read itself
    fails, the error is raised and destinations may hold partial data.

    ``uri`` may be a per-rank template (``model-rank-%03d.tensors`` or
    ``{rank}``) or a directory: ``rank``'s file is loaded, checked against
    the manifest beside it when there is one. A packed object
    (``save_sharded(..., packed=True)``) gives ``rank``'s tensors and reads
    only their bytes. Any other single file with
    ``world_size > 1`` is sliced: each parameter is ``rank``'s tensor-parallel
    slice of the file's full tensor, the split inferred from the shapes or
    given by ``shard_specs`` (name or glob → ``fastshard.ShardSpec(dim,
    parts)``, a dim, or None for replicated), and only those bytes are read.

    ``cooperative=True`` (or a ``group``): the ranks of that torch.distributed
    group (default: the world) share the fetch of a single file, each byte
    once per group, and exchange pieces over the group; every rank must call
    ``load`` with the same model and options. Options are those of
    ``fastshard.open`` (but ``mmap``: ``load`` copies into the model).
    """
    started = time.perf_counter()
    if not isinstance(model, torch.nn.Module):
        raise InvalidArgumentError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if opts.get("mmap"):
        raise InvalidArgumentError(
            "mmap=True returns tensors that view the file (load_state_dict); fastshard.load "
            "copies into the model's parameters"
        )
    target = _core.as_device(device)
    with opened(uri, rank, world_size, verify_manifest_hashes, opts) as f:
        # Per-rank files and packed objects need no slicing and no sharing:
        # each rank's tensors are its own. Another single file with
        # world_size > 1 is sliced per rank.
        slicing = f.opened.rank is None and not f.opened.packed and (world_size or 1) > 1
        planned: list[_Planned] = []

        def plan(_: object) -> list[_core.Job]:
            targets = _targets(model)
            in_file = _file_names(f)
            slices = (
                _slices(f, targets, in_file, rank or 0, world_size or 1, shard_specs)
                if slicing
                else {}
            )
            _check(f, targets, in_file, strict, slices)
            planned.extend(_plan(f, targets, in_file, slices, target))
            return [p.job for p in planned]

        _, stats = _core.load_jobs(
            f.engine,
            plan,
            cooperative=cooperative,
            group=group,
            sliced=slicing,
            rank=rank,
            world_size=world_size,
        )
        _apply(planned)
        return f.engine.finish(stats, started)
