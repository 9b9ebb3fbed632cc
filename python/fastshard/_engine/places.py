"""What a staged batch's ops mean: the items a load places, where each
op's bytes come from in the slab and go to (``Places``), and the copiers
that carry them out (``CpuCopier`` here; ``cuda.CudaCopier`` for a GPU).
The ring (ring.py) drives them one batch at a time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from .. import tp
from . import tensors as _tensors


@dataclass(frozen=True)
class Item:
    """One tensor to load: file index, the slice of it to read (None: all),
    its loaded shape, and where it goes (any device or dtype, this shape)."""

    index: int
    slice: tp.Slice | None
    shape: tuple[int, ...]
    dest: torch.Tensor
    # ``dest`` was cut from a block of ours at the slabs' alignment: the
    # block's bytes around it are padding a copy may run over.
    carved: bool = False


ByteOp = tuple[int, int, int, int]  # target, src, dst, len
ItemOp = tuple[int, int, int, int, int, int, int, bool]


class Ticket(Protocol):
    def done(self) -> bool: ...
    def wait(self) -> None: ...


class Done:
    """The ticket of a copy that completed before ``copy`` returned."""

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None


class Copier(Protocol):
    """Copies one batch out of its slab (``slot``: which of the slabs);
    ``ticket`` covers the copies issued since the previous ticket;
    ``finish`` orders the caller after all of them."""

    def copy(
        self, slab: torch.Tensor, slot: int, bytes_ops: list[ByteOp], item_ops: list[ItemOp]
    ) -> None: ...
    def ticket(self) -> Ticket: ...
    def finish(self) -> None: ...


class Places:
    """Where ops write: the byte targets (uint8 views of whole storages)
    and each item's view, through a contiguous temporary for an item whose
    destination is not contiguous (copied into it after its last op)."""

    def __init__(
        self, items: Sequence[Item], dtypes: Sequence[torch.dtype], targets: list[torch.Tensor]
    ) -> None:
        self.items = items
        self.dtypes = dtypes
        self.targets = targets
        self._flat: dict[int, torch.Tensor] = {}
        self._typed: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def bytes_pair(self, op: ByteOp, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        target, s, d, n = op
        return self.targets[target][d : d + n], src[s : s + n]

    def item_pair(self, op: ItemOp, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, s, d, width, height, sp, dp, _ = op
        dest = self.items[k].dest
        # Without a cast the bytes are copied as bytes: a copy of floats
        # may quiet a signalling NaN (CUDA's batched copy does), and a
        # loader must give back every bit it read.
        stored = self.dtypes[k]
        dtype = stored if dest.dtype != stored else torch.uint8
        size = dtype.itemsize
        whole = width == dest.numel() * stored.itemsize  # in the file's bytes
        if height == 1 and d == 0 and whole and dest.is_contiguous():
            # A whole item in one op (most small tensors): its destination,
            # and one view of the slab; no slicing.
            out = dest if dtype != torch.uint8 else self.as_bytes(dest)
            return out, self.typed(src, dtype).as_strided(out.shape, out.stride(), s // size)
        flat = self.flat(k, dtype == torch.uint8)
        if height == 1:
            return flat[d // size : (d + width) // size], src[s : s + width].view(dtype)
        rows = src.as_strided((height, width), (sp, 1), src.storage_offset() + s).view(dtype)
        out = flat.as_strided(
            (height, width // size), (dp // size, 1), flat.storage_offset() + d // size
        )
        return out, rows

    def typed(self, src: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``src`` (a whole slab or its device copy, uint8) as ``dtype``."""
        key = (src.data_ptr(), dtype)
        got = self._typed.get(key)
        if got is None:
            got = self._typed[key] = src.view(dtype)
        return got

    @staticmethod
    def as_bytes(t: torch.Tensor) -> torch.Tensor:
        """A contiguous tensor's bytes, in its shape (the last dim widened)."""
        t = t.detach()
        return (t if t.dim() else t.reshape(1)).view(torch.uint8)

    def flat(self, k: int, as_bytes: bool) -> torch.Tensor:
        """Item ``k``'s destination, or its temporary, as one dimension of
        its dtype or of bytes."""
        got = self._flat.get(k)
        if got is None:
            dest = self.items[k].dest
            base = (
                dest
                if dest.is_contiguous()
                else torch.empty(dest.shape, dtype=dest.dtype, device=dest.device)
            )
            got = self._flat[k] = base.detach().reshape(-1)
        return self.as_bytes(got) if as_bytes else got

    def finals(self, ops: list[ItemOp]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(destination, temporary)`` of each non-contiguous item whose
        last op is in ``ops``."""
        out = []
        for op in ops:
            dest = self.items[op[0]].dest
            if op[7] and not dest.is_contiguous():
                out.append((dest, self._flat.pop(op[0]).view(dest.shape)))
        return out


class CpuCopier:
    """Synchronous copies on the calling thread: plain bytes without
    torch's thread pool (``_tensors.copy``), item views batched in one
    ``_foreach_copy_`` (casts included)."""

    def __init__(self, places: Places) -> None:
        self.places = places

    def copy(
        self, slab: torch.Tensor, slot: int, bytes_ops: list[ByteOp], item_ops: list[ItemOp]
    ) -> None:
        with torch.no_grad():
            for op in bytes_ops:
                _tensors.copy(*self.places.bytes_pair(op, slab))
            pairs = [self.places.item_pair(op, slab) for op in item_ops]
            if pairs:
                torch._foreach_copy_([d for d, _ in pairs], [s for _, s in pairs])
            for dest, temp in self.places.finals(item_ops):
                dest.copy_(temp)

    def ticket(self) -> Ticket:
        return Done()

    def finish(self) -> None:
        return None
