"""The plan of a cooperative load, the same on every rank: which pieces of
the object each rank fetches, in which rounds, and which bytes of each
piece every other rank needs (its tensor-parallel slices of it, or the
whole piece when it is replicated).

Pure bookkeeping over the index and the ranks' slices (``Schedule``: every
owner's batches and what each rank sends or receives of them), plus the two copies
either side of the exchange: the sender cuts a rank's part out of a fetched
piece (``extract``), the receiver puts it where its slice goes
(``deposit``). Both sides size every part with ``part_bytes``, so the
exchange needs no sizes on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import tp
from .._budget import COOPERATIVE_ROUND
from .._engine.tensors import copy
from .._types import TensorSource
from ..errors import InvalidArgumentError

ALIGN = 64  # part offsets in a buffer, so every dtype view is aligned

# A slice as a dict key: (dim, ((start, length), ...)), None for whole.
Key = tuple[int, tuple[tuple[int, int], ...]] | None
# Per rank: file index -> the distinct slices it loads of that tensor.
Wants = dict[int, list[Key]]


@dataclass(frozen=True)
class Piece:
    index: int
    row0: int  # first row (dim 0) of the file tensor in this piece
    rows: int  # rows in this piece (1 for a 0-d tensor)
    nbytes: int


def key_of(sl: tp.Slice | None) -> Key:
    if sl is None:
        return None
    dim, ranges = sl
    return dim, tuple((int(a), int(n)) for a, n in ranges)


def slice_of(key: Key) -> tp.Slice | None:
    return None if key is None else (key[0], list(key[1]))


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def pieces(f: TensorSource, indices: list[int], cap: int) -> list[Piece]:
    """The tensors as pieces of at most ``cap`` bytes (blocks of rows)."""
    out: list[Piece] = []
    for i in indices:
        info = f.info_at(i)
        rows = info.shape[0] if info.shape else 1
        if not info.shape or info.nbytes <= cap or rows <= 1:
            out.append(Piece(i, 0, rows, info.nbytes))
            continue
        row_bytes = info.nbytes // rows
        if row_bytes > cap:
            raise InvalidArgumentError(
                f"{info.name}: one row is {row_bytes} bytes, more than a cooperative batch "
                f"({cap} bytes: max_host_bytes / (world_size + 3), at most "
                f"{COOPERATIVE_ROUND >> 20} MiB); "
                "raise max_host_bytes",
                uri=f.uri,
                tensor=info.name,
            )
        per = cap // row_bytes
        for r0 in range(0, rows, per):
            n = min(per, rows - r0)
            out.append(Piece(i, r0, n, n * row_bytes))
    return out


def owners(all_pieces: list[Piece], world_size: int) -> list[list[Piece]]:
    """Contiguous runs of pieces of about equal bytes, one per rank, so each
    rank's reads are sequential in the object."""
    total = sum(p.nbytes for p in all_pieces) or 1
    owned: list[list[Piece]] = [[] for _ in range(world_size)]
    seen = 0
    for p in all_pieces:
        mid = seen + p.nbytes / 2
        owned[min(world_size - 1, int(mid * world_size / total))].append(p)
        seen += p.nbytes
    return owned


def batches(owned: list[Piece], cap: int) -> list[list[Piece]]:
    """One rank's pieces in batches of at most ``cap`` bytes."""
    out: list[list[Piece]] = []
    size = 0
    for p in owned:
        if out and size + aligned(p.nbytes) <= cap:
            out[-1].append(p)
            size += aligned(p.nbytes)
        else:
            out.append([p])
            size = aligned(p.nbytes)
    return out


def layout(batch: list[Piece]) -> tuple[list[int], int]:
    offsets, at = [], 0
    for p in batch:
        offsets.append(at)
        at += aligned(p.nbytes)
    return offsets, at


def sends(batch: list[Piece], want: Wants) -> list[tuple[Piece, Key]]:
    """What one receiver (its ``want``) gets from a batch, replicated
    tensors included, in the order both sides lay it out."""
    return [(p, k) for p in batch for k in want.get(p.index, [])]


def part_bytes(f: TensorSource, piece: Piece, key: Key) -> int:
    """Bytes of a rank's slice ``key`` within ``piece``."""
    if key is None:
        return piece.nbytes
    info = f.info_at(piece.index)
    dim, ranges = key
    row_bytes = piece.nbytes // piece.rows
    if dim == 0:
        return sum(len(_rows(piece, a, n)) for a, n in ranges) * row_bytes
    return piece.nbytes * sum(n for _, n in ranges) // info.shape[dim]


def _rows(piece: Piece, start: int, length: int) -> range:
    """The file rows of ``start:start+length`` that lie in ``piece``."""
    return range(max(start, piece.row0), min(start + length, piece.row0 + piece.rows))


def block(f: TensorSource, piece: Piece, raw: torch.Tensor) -> torch.Tensor:
    info = f.info_at(piece.index)
    if not info.shape:
        return raw.view(info.dtype).reshape(())
    return raw.view(info.dtype).reshape((piece.rows, *info.shape[1:]))


def extract(f: TensorSource, piece: Piece, raw: torch.Tensor, key: Key, out: torch.Tensor) -> None:
    """Copy a rank's slice ``key`` of one fetched piece (its bytes ``raw``)
    into ``out`` (``part_bytes`` bytes), in the order ``deposit`` reads."""
    if key is None:
        copy(out, raw)
        return
    src = block(f, piece, raw)
    dim, ranges = key
    if dim == 0:
        at = 0
        dest = out.view(src.dtype)
        for a, n in ranges:
            r = _rows(piece, a, n)
            if len(r):
                part = src[r.start - piece.row0 : r.stop - piece.row0]
                copy(dest[at : at + part.numel()].view(part.shape), part)
                at += part.numel()
        return
    # Later dims: the rank's local block of these rows, its ranges side by side.
    shape = list(src.shape)
    shape[dim] = sum(n for _, n in ranges)
    dest = out.view(src.dtype).view(shape)
    local = 0
    for a, n in ranges:
        copy(dest.narrow(dim, local, n), src.narrow(dim, a, n))
        local += n


def deposit(f: TensorSource, piece: Piece, raw: torch.Tensor, key: Key, out: torch.Tensor) -> None:
    """Copy a received part (``extract``'s layout) into the rank's
    destination ``out`` (its whole slice of the tensor)."""
    info = f.info_at(piece.index)
    if not info.shape:
        copy(out, raw.view(info.dtype).reshape(()))
        return
    r0, r1 = piece.row0, piece.row0 + piece.rows
    if key is None:
        copy(out[r0:r1], block(f, piece, raw))
        return
    dim, ranges = key
    data = raw.view(info.dtype)
    if dim == 0:
        row = info.nbytes // info.shape[0] // info.dtype.itemsize
        at = local = 0
        for a, n in ranges:
            r = _rows(piece, a, n)
            if len(r):
                got = data[at : at + len(r) * row].view((len(r), *info.shape[1:]))
                copy(out[local + r.start - a : local + r.stop - a], got)
                at += len(r) * row
            local += n
        return
    local_shape = list(out.shape)
    local_shape[0] = piece.rows
    copy(out[r0:r1], data.view(local_shape))


def place(f: TensorSource, piece: Piece, raw: torch.Tensor, key: Key, out: torch.Tensor) -> None:
    """Copy a rank's slice ``key`` of a whole fetched piece (its bytes
    ``raw``) straight into the rank's destination ``out``."""
    info = f.info_at(piece.index)
    if not info.shape:
        copy(out, raw.view(info.dtype).reshape(()))
        return
    src = block(f, piece, raw)
    r0, r1 = piece.row0, piece.row0 + piece.rows
    if key is None:
        copy(out[r0:r1], src)
        return
    dim, ranges = key
    local = 0
    for start, length in ranges:
        if dim == 0:
            r = _rows(piece, start, length)
            if len(r):
                copy(
                    out[local + r.start - start : local + r.stop - start],
                    src[r.start - r0 : r.stop - r0],
                )
        else:
            copy(out[r0:r1].narrow(dim, local, length), src.narrow(dim, start, length))
        local += length


class Schedule:
    """The buffer sizes of every owner's batches and every part each rank
    sends or receives, the same on every rank."""

    def __init__(self, f: TensorSource, wants: list[Wants], cap: int, rank: int) -> None:
        self.f, self.wants, self.rank = f, wants, rank
        ws = len(wants)
        wanted = {i for w in wants for i, keys in w.items() if keys}
        all_pieces = pieces(f, sorted(wanted), cap)
        self.rounds = [batches(o, cap) for o in owners(all_pieces, ws)]
        self.count = max(len(r) for r in self.rounds)

    def batch(self, owner: int, k: int) -> list[Piece]:
        return self.rounds[owner][k] if k < len(self.rounds[owner]) else []

    def size(self, owner: int, k: int) -> int:
        return layout(self.batch(owner, k))[1]

    def area(self, owner: int) -> int:
        """The largest of ``owner``'s batches."""
        return max((self.size(owner, k) for k in range(self.count)), default=0)

    def parts(self, owner: int, receiver: int, k: int) -> list[tuple[Piece, Key]]:
        if owner == receiver:
            return []
        return sends(self.batch(owner, k), self.wants[receiver])

    def split(self, owner: int, receiver: int, k: int) -> int:
        parts = self.parts(owner, receiver, k)
        return sum(aligned(part_bytes(self.f, p, key)) for p, key in parts)

    def send_bytes(self, k: int) -> int:
        return sum(self.split(self.rank, r, k) for r in range(len(self.wants)))

    def recv_bytes(self, k: int) -> int:
        return sum(self.split(o, self.rank, k) for o in range(len(self.wants)))
