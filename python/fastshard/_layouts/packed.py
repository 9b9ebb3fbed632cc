"""One packed object for all ranks: the encoding of rank r's tensor as
``@rank{r}/{name}``, how a packed file is detected, and what one opened for
a rank shows. The account of the layout is ``fastshard.packed``'s
docstring, which re-exports these names. Torch-free: the CLI uses it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import FormatError, ShardMismatchError, UnsupportedError
from .resolve import Resolved, check_rank_args, check_single

PathPart = str | int
# (name, path, tensor_type, dtype, shape, header_offset, data_offset, data_length)
Entry = tuple[str, list[PathPart] | None, int, str, list[int], int, int, int]

_PREFIX = re.compile(r"@rank(0|[1-9][0-9]*)/")


def prefix(rank: int) -> str:
    return f"@rank{rank}/"


def rank_of(name: str) -> int | None:
    """The rank a stored (display) name belongs to, None if unprefixed."""
    m = _PREFIX.match(name)
    return int(m.group(1)) if m else None


def prefixed(rank: int, name: str | list[PathPart], *, uri: str) -> str | list[PathPart]:
    """The stored name of rank ``rank``'s tensor ``name`` (plain or path)."""
    if isinstance(name, str):
        return prefix(rank) + name
    if not name or not isinstance(name[0], str):
        raise UnsupportedError(
            f"{uri}: packed=True cannot store rank {rank}'s tensor at {name}: a state dict "
            "whose top level is a list has no key to carry the @rank prefix; "
            "use a dict at the top level, or per-rank files",
            uri=uri,
        )
    return [prefix(rank) + name[0], *name[1:]]


@dataclass(frozen=True)
class PackedIndex:
    world_size: int
    ranks: tuple[int, ...]  # rank of each index entry, in file order

    def counts(self) -> list[int]:
        return [self.ranks.count(r) for r in range(self.world_size)]


def detect(names: Sequence[str], *, uri: str) -> PackedIndex | None:
    """The packed layout of a file with these (display) names, in index
    order; None when no name is prefixed (an ordinary file)."""
    ranks = [rank_of(n) for n in names]
    plain = [n for n, r in zip(names, ranks, strict=True) if r is None]
    if len(plain) == len(names):
        return None
    if plain:
        first = next(n for n, r in zip(names, ranks, strict=True) if r is not None)
        raise FormatError(
            f"{uri} mixes packed (@rank<r>/) and plain tensor names, e.g. {first!r} and "
            f"{plain[0]!r} ({len(plain)} of {len(names)} plain): a packed object prefixes "
            "every name",
            uri=uri,
            tensor=plain[0],
        )
    present = sorted(set(r for r in ranks if r is not None))
    if present != list(range(len(present))):
        missing = sorted(set(range(present[-1] + 1)) - set(present))
        raise FormatError(
            f"{uri}: packed ranks must be 0..W-1, found {_span(present)} "
            f"(no tensors for rank {_span(missing)})",
            uri=uri,
        )
    return PackedIndex(len(present), tuple(r for r in ranks if r is not None))


def _span(ranks: list[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:10])
    return shown + (f", … ({len(ranks)} ranks)" if len(ranks) > 10 else "")


def check(index: PackedIndex, rank: int | None, world_size: int | None, *, uri: str) -> None:
    w = index.world_size
    if world_size is not None and world_size != w:
        raise ShardMismatchError(
            f"{uri}: packed object holds {w} rank{'s' if w > 1 else ''} "
            f"(@rank0/ … @rank{w - 1}/); asked world_size={world_size}. Load with the TP size "
            "it was saved for, or re-save it",
            uri=uri,
        )
    if rank is not None and rank >= w:
        raise ShardMismatchError(
            f"{uri}: rank {rank} does not exist: the packed object holds {w} "
            f"rank{'s' if w > 1 else ''}, so ranks are 0..{w - 1}",
            uri=uri,
        )


def _strip(entry: Entry, pre: str) -> Entry:
    name, path, *rest = entry
    if path is not None:
        # The display name joins the path with ".", and the prefix has no
        # "." in it, so a prefixed display name means a prefixed first key.
        first = path[0]
        assert isinstance(first, str) and first.startswith(pre)
        path = [first[len(pre) :], *path[1:]]
    return (name[len(pre) :], path, *rest)  # type: ignore[return-value]


def view(
    entries: list[Entry],
    opened: Resolved,
    rank: int | None,
    world_size: int | None,
    *,
    uri: str,
) -> tuple[Resolved, list[Entry], list[int]]:
    """What a file opened for ``rank`` of ``world_size`` shows: (how it was
    opened, the visible entries, the index entry of each). An ordinary
    single file must fit rank 0 of world size 1; a packed one shows rank's
    tensors unprefixed, or all of them as stored when ``rank`` is None."""
    index = detect([e[0] for e in entries], uri=uri)
    everything = list(range(len(entries)))
    if index is None:
        if opened.rank is None:
            check_single(uri, rank, world_size)
        return opened, entries, everything
    if opened.template is not None:
        raise ShardMismatchError(
            f"{uri}, rank {opened.rank}'s file of template {opened.template}, is a packed "
            f"object of {index.world_size} ranks: open the packed object by its own URI",
            uri=uri,
        )
    check(index, rank, world_size, uri=uri)
    resolved = replace(opened, rank=rank, world_size=index.world_size, packed=True)
    if rank is None:
        return resolved, entries, everything
    pre = prefix(rank)
    chosen = [i for i, r in enumerate(index.ranks) if r == rank]
    return resolved, [_strip(entries[i], pre) for i in chosen], chosen


def check_all_ranks(opened: Resolved, rank: int | None, world_size: int | None) -> None:
    """A load from a packed file opened without a rank (every tensor, as
    stored) cannot pick a rank afterwards: the rank is chosen at open."""
    if world_size is not None and world_size != opened.world_size:
        raise ShardMismatchError(
            f"{opened.uri}: packed object holds {opened.world_size} ranks; asked "
            f"world_size={world_size}",
            uri=opened.uri,
        )
    if rank is not None:
        raise ShardMismatchError(
            f"{opened.uri} is a packed object opened with rank=None (every rank's tensors, "
            f"@rank-prefixed); pass rank={rank} to open()/load_state_dict(uri, ...) to load "
            "one rank",
            uri=opened.uri,
        )


def describe(index: PackedIndex) -> str:
    """One line for ``fastshard inspect``."""
    counts = index.counts()
    return (
        f"packed: world_size {index.world_size} (tensors named @rank<r>/<name>; "
        f"per rank: {', '.join(str(c) for c in counts)} tensors)"
    )


def summary(index: PackedIndex | None) -> dict[str, Any] | None:
    if index is None:
        return None
    return {"world_size": index.world_size, "tensors_per_rank": index.counts()}


def check_rank(rank: int | None, world_size: int | None, opened: Resolved | None = None) -> None:
    """A load's rank and world size must be those the file was opened for
    (a per-rank file), or fit a single file (rank 0, world size 1)."""
    check_rank_args(rank, world_size)
    if opened is not None and opened.packed and opened.rank is None:
        check_all_ranks(opened, rank, world_size)
        return
    if opened is None or opened.rank is None:
        check_single(opened.uri if opened else "this file", rank, world_size)
        return
    if (rank is not None and rank != opened.rank) or (
        world_size is not None and opened.world_size not in (None, world_size)
    ):
        raise ShardMismatchError(
            f"{opened.uri} was opened as rank {opened.rank} of world_size "
            f"{opened.world_size}; asked rank={rank}, world_size={world_size}",
            uri=opened.uri,
        )
