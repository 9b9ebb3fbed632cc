"""Tensor-parallel slices of an unsharded file: which part of each full
tensor a rank loads.

A rank's parameter is a slice of the file's full tensor along one dim: rows
of a column-parallel weight (dim 0), columns of a row-parallel one (dim 1).
A fused parameter (qkv, gate_up) is several tensors stacked along that dim;
each part is split across the ranks on its own and the rank's pieces are
concatenated, as vLLM's ``QKVParallelLinear`` and
``MergedColumnParallelLinear`` lay them out.

How a tensor is split comes from a shard spec when one matches its name,
else from the shapes: a model parameter whose shape equals the file's is
replicated (read whole by every rank); one that is ``world_size`` times
smaller along exactly one dim is split evenly along it. Anything else is an
error that asks for a spec. The native planner turns the slices into byte
ranges (``rust/plan/slice.rs``): a dim-0 slice is one range per fused part;
later dims become one run per outer row, coalesced with bounded read
amplification that ``LoadStats`` reports.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .errors import InvalidArgumentError

# (dim, [(start, length), ...]) along dim, in the order they land locally.
Slice = tuple[int, list[tuple[int, int]]]


@dataclass(frozen=True)
class ShardSpec:
    """How one parameter is split across tensor-parallel ranks.

    ``dim``: the split dimension (negative counts from the end).
    ``parts``: for a fused parameter, the sizes of its parts along ``dim`` in
    the file's full tensor (e.g. ``(q, k, v)`` rows of a qkv weight); each is
    split evenly across ranks. None: one part, the whole dim.
    ``replicated=True``: every rank reads the whole tensor."""

    dim: int = 0
    parts: tuple[int, ...] | None = None
    replicated: bool = False


REPLICATED = ShardSpec(replicated=True)

SpecLike = ShardSpec | int | None
Specs = Mapping[str, SpecLike]


def as_spec(value: SpecLike) -> ShardSpec:
    """A spec from its short forms: an int is a dim, None means replicated."""
    if value is None:
        return REPLICATED
    if isinstance(value, ShardSpec):
        parts = value.parts
        if parts is not None and (
            not isinstance(parts, (tuple, list))
            or not all(isinstance(p, int) and not isinstance(p, bool) for p in parts)
        ):
            raise InvalidArgumentError(
                f"ShardSpec.parts is the sizes of a fused tensor's parts along dim "
                f"(a tuple of ints, e.g. (q, k, v) rows), not {parts!r}; the number of "
                "ranks comes from world_size"
            )
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return ShardSpec(dim=value)
    raise InvalidArgumentError(
        f"a shard spec is a fastshard.ShardSpec, a dim (int) or None, not {value!r}"
    )


def find_spec(specs: Specs | None, name: str) -> ShardSpec | None:
    """The spec for ``name``: an exact key first, else the first glob
    pattern (``fnmatch``: ``*.qkv_proj.weight``) that matches."""
    if not specs:
        return None
    if name in specs:
        return as_spec(specs[name])
    for pattern, value in specs.items():
        if any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(name, pattern):
            return as_spec(value)
    return None


def rank_slice(
    name: str,
    file_shape: Sequence[int],
    spec: ShardSpec,
    rank: int,
    world_size: int,
) -> Slice | None:
    """The slice of ``rank`` under ``spec``; None when replicated."""
    if spec.replicated or world_size == 1:
        return None
    ndim = len(file_shape)
    dim = spec.dim + ndim if spec.dim < 0 else spec.dim
    if not 0 <= dim < ndim:
        raise InvalidArgumentError(
            f"{name}: shard spec dim {spec.dim} is out of range for its {ndim}-d tensor "
            f"{tuple(file_shape)}",
            tensor=name,
        )
    size = file_shape[dim]
    parts = spec.parts if spec.parts is not None else (size,)
    if sum(parts) != size or any(p < 0 for p in parts):
        raise InvalidArgumentError(
            f"{name}: fused part sizes {tuple(parts)} do not add up to dim {dim} of "
            f"{tuple(file_shape)}",
            tensor=name,
        )
    ranges: list[tuple[int, int]] = []
    start = 0
    for part in parts:
        if part % world_size:
            raise InvalidArgumentError(
                f"{name}: dim {dim} part of size {part} does not split evenly over "
                f"world_size={world_size}",
                tensor=name,
            )
        chunk = part // world_size
        ranges.append((start + rank * chunk, chunk))
        start += part
    return dim, ranges


def sliced_shape(file_shape: Sequence[int], sl: Slice | None) -> tuple[int, ...]:
    shape = list(file_shape)
    if sl is not None:
        dim, ranges = sl
        shape[dim] = sum(n for _, n in ranges)
    return tuple(shape)


def infer_spec(
    name: str, file_shape: Sequence[int], local_shape: Sequence[int], world_size: int
) -> ShardSpec:
    """The spec the shapes imply: equal shapes are replicated; a single dim
    ``world_size`` times smaller is split evenly along it."""
    file_shape, local_shape = tuple(file_shape), tuple(local_shape)
    if file_shape == local_shape:
        return REPLICATED
    dims = []
    if len(file_shape) == len(local_shape):
        for d, (f, m) in enumerate(zip(file_shape, local_shape, strict=True)):
            others = all(
                a == b
                for i, (a, b) in enumerate(zip(file_shape, local_shape, strict=True))
                if i != d
            )
            if others and f == m * world_size:
                dims.append(d)
    if len(dims) != 1:
        raise InvalidArgumentError(
            f"{name}: cannot infer how the file's {file_shape} splits into the model's "
            f"{local_shape} over world_size={world_size}; pass "
            f"shard_specs={{{name!r}: fastshard.ShardSpec(dim=..., parts=...)}}",
            tensor=name,
        )
    return ShardSpec(dim=dims[0])


def plan_slice(
    name: str,
    file_shape: Sequence[int],
    local_shape: Sequence[int] | None,
    rank: int,
    world_size: int,
    specs: Specs | None,
) -> Slice | None:
    """The slice ``rank`` loads for tensor ``name``, checked against the
    model's local shape when there is one (None: read it whole)."""
    spec = find_spec(specs, name)
    if spec is None:
        if local_shape is None:
            return None  # a state dict without specs: full tensors
        spec = infer_spec(name, file_shape, local_shape, world_size)
    sl = rank_slice(name, file_shape, spec, rank, world_size)
    if local_shape is not None and sliced_shape(file_shape, sl) != tuple(local_shape):
        raise InvalidArgumentError(
            f"{name}: rank {rank} of {world_size} gets {sliced_shape(file_shape, sl)} from the "
            f"file's {tuple(file_shape)} under {spec}, but the model has {tuple(local_shape)}",
            tensor=name,
        )
    return sl
