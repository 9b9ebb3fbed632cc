"""The one way down: what ``reader.py``, ``module.py`` and ``vllm/`` need of
the rooms below them (``_engine``, the load engine; ``_coop``, the
cooperative load; ``_layouts``, what a URI names for a rank), and nothing
deeper. scripts/check_layers.py holds vllm/ to this module and public names.

Importing it stays light (no torch): vllm/'s configuration and ``fastshard
serve`` use its location and object helpers. What runs the engine, which
imports torch, imports it on its first call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, Union

from . import _versioned as versioned
from ._budget import Budget
from ._layouts import location
from ._layouts.manifest import rank_file
from ._layouts.source import Source, open_source
from ._native import SOURCE_OPTIONS, Location, Reader, read_object, write_object
from ._options import (
    OpenOptions,
    OpenSettings,
    StoreOptions,
    open_settings,
    save_settings,
    source_options,
)
from ._types import LoadStats, TensorInfo
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    import torch

    from . import tp

    # Types for annotations above the facade (``X as X``: re-exported).
    from ._coop.peers import Link as Link
    from ._coop.plan import Key as Key
    from ._engine.dispatch import Job as Job
    from ._engine.engine import Engine as Engine

__all__ = [
    "SOURCE_OPTIONS",
    "Budget",
    "DeviceLike",
    "DtypeLike",
    "LoadStats",
    "Location",
    "OpenOptions",
    "OpenSettings",
    "Reader",
    "Source",
    "StoreOptions",
    "TensorInfo",
    "Wanted",
    "abandon",
    "as_device",
    "engine",
    "float_cast",
    "job",
    "key_of",
    "load_fresh",
    "load_jobs",
    "load_mapped",
    "load_shared",
    "location",
    "open_settings",
    "open_source",
    "rank_file",
    "read_object",
    "save_settings",
    "slice_of",
    "source_options",
    "versioned",
    "write_object",
]

# device= and dtype= as a load takes them (``_engine.tensors``' own): torch's
# types as forward references, resolved where the public signatures name them,
# so that importing this module stays torch-free.
DeviceLike: TypeAlias = Union[str, "torch.device"]  # noqa: UP007
DtypeLike: TypeAlias = Union[str, "torch.dtype"]  # noqa: UP007

# What a shared load asks for: (tensor index, the slice's key, its shape,
# its dtype), one per piece this rank takes.
Wanted = Sequence[tuple[int, "Key", tuple[int, ...], "torch.dtype"]]


def engine(
    reader: Reader,
    settings: OpenSettings,
    infos: list[TensorInfo],
    native_index: list[int],
    discovery_seconds: float,
) -> Engine:
    """What loads an opened file's tensors (native loads, progress, stats)."""
    from ._engine.engine import Engine

    return Engine(reader, settings, infos, native_index, discovery_seconds)


def job(
    index: int,
    sl: tp.Slice | None,
    shape: tuple[int, ...],
    dest: torch.Tensor,
    in_place: bool,
) -> Job:
    """One tensor to load (``_engine.dispatch.Job``)."""
    from ._engine.dispatch import Job

    return Job(index, sl, shape, dest, in_place)


def load_jobs(
    engine: Engine,
    plan: Callable[[Link | None], list[Job]],
    *,
    cooperative: bool,
    group: Any,
    sliced: bool,
    rank: int | None,
    world_size: int | None,
) -> tuple[list[Job], LoadStats]:
    """The one way a load runs: the jobs ``plan`` makes (given the group a
    sliced, cooperative load shares its fetch with, or None), fetched.
    ``plan`` runs inside the group's planning, so a rank whose plan fails
    makes every rank raise instead of waiting for it."""
    from ._engine import dispatch

    link = dispatch.group_for(cooperative, group, sliced, rank, world_size)
    with dispatch.planning(link):
        jobs = plan(link)
    return jobs, dispatch.load(engine, jobs, link)


def load_shared(
    engine: Engine,
    group: Any,
    rank: int,
    world_size: int,
    pick: Callable[[], Wanted],
) -> tuple[list[torch.Tensor], LoadStats]:
    """The pieces ``pick`` names, fetched once by the ranks of ``group``
    (each byte by one of them) and exchanged, each rank receiving its own."""
    import torch

    def plan(link: Link | None) -> list[Job]:
        # Where the exchange runs (a GPU's for NCCL): no copy on arrival.
        device = link.device if link else None
        return [
            job(i, slice_of(key), shape, torch.empty(shape, dtype=dtype, device=device), True)
            for i, key, shape, dtype in pick()
        ]

    jobs, stats = load_jobs(
        engine, plan, cooperative=True, group=group, sliced=True, rank=rank, world_size=world_size
    )
    return [j.dest for j in jobs], stats


def load_fresh(
    engine: Engine,
    pick: Callable[[], tuple[Sequence[int], Sequence[tp.Slice | None]]],
    device: torch.device,
    cast: torch.dtype | None,
    **share: Any,
) -> tuple[list[torch.Tensor], LoadStats]:
    """The tensors ``pick`` names (and their slices), in new tensors on
    ``device`` (cast to ``cast``); ``share``: ``load_jobs``' group."""
    from ._engine import dispatch

    def plan(_: Link | None) -> list[Job]:
        return dispatch.fresh(engine.infos, *pick(), device, cast)

    jobs, stats = load_jobs(engine, plan, **share)
    return [j.dest for j in jobs], stats


def load_mapped(
    engine: Engine,
    device: torch.device,
    cast: torch.dtype | None,
    shared: bool,
    pick: Callable[[], tuple[Sequence[int], Sequence[tp.Slice | None]]],
) -> tuple[list[torch.Tensor], LoadStats]:
    """Tensors that view the mapped file (``mmap=True``): those ``pick``
    names (and their slices), once the mapping is known to serve
    (``_engine.mapped``)."""
    from ._engine import mapped

    mapped.check(engine.uri, device, cast, shared)
    return mapped.load(engine, *pick())


def as_device(device: DeviceLike | None) -> torch.device:
    from ._engine.tensors import as_device

    return as_device(device)


def float_cast(dtype: DtypeLike | None) -> torch.dtype | None:
    """The dtype= of a load: a floating dtype, or None."""
    if dtype is None:
        return None
    from ._engine.tensors import as_dtype, is_castable_float

    cast = as_dtype(dtype)
    if not is_castable_float(cast):
        raise InvalidArgumentError(f"dtype= must be a floating dtype, not {cast}")
    return cast


def key_of(sl: tp.Slice | None) -> Key:
    """The exchange's key of a slice (``_coop.plan``)."""
    from ._coop import plan

    return plan.key_of(sl)


def slice_of(key: Key) -> tp.Slice | None:
    from ._coop import plan

    return plan.slice_of(key)


def abandon(group: Any, rank: int, error: BaseException) -> None:
    """Tell the group's next cooperative load that this rank will not come."""
    from ._coop import peers

    peers.abandon(group, rank, error)
