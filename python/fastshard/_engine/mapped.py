"""Loads that map a local file instead of copying it (``mmap=True``): the
tensors ``load_state_dict`` returns view the file mapped copy-on-write
(``MAP_PRIVATE``), as safetensors' ``load_file`` does. Pages come from the
page cache when first touched and are shared with it until written; a write
to a tensor copies that page into this process's memory and never reaches
the file.

The mapping is native (``_native.Mapping``, made by ``Reader.map`` after it
has checked every selected record header against the index and the file's
bounds, and with ``verify_hash`` the hashes, over the mapped pages). Each
tensor is ``torch.frombuffer`` of it, which holds a reference to it: the
file stays mapped while any tensor from it lives, closed file or not, and
is unmapped once the last one is collected.

What is a view and what is a copy (decided here only):
- a whole tensor is a view, unless its bytes are not aligned to its element
  size in the file (tensorizer does not align tensor data; torch's kernels
  assume natural alignment, so a misaligned pointer is never handed out):
  that tensor is copied out of the mapping into private memory;
- a tensor-parallel slice that is one range along its dim is a view: a
  contiguous one along dim 0, a strided (non-contiguous) one along a later
  dim (``.contiguous()`` copies it when a consumer needs that); a fused
  parameter's slice (several ranges) is concatenated into private memory;
- meta tensors (no bytes stored) are new zero tensors.
``LoadStats.bytes_mapped`` counts the bytes returned as views.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import _native, tp
from .._types import LoadStats, TensorInfo
from ..errors import InvalidArgumentError
from .engine import Engine


def check(uri: str, device: torch.device, cast: torch.dtype | None, shared: bool) -> None:
    """Refuse what a mapped load cannot return; the native map refuses
    remote and encrypted files itself."""
    why = None
    if device.type != "cpu":
        why = f"device={device} (a mapping is CPU memory; load to {device} without mmap)"
    elif cast is not None:
        why = f"dtype={cast} (a cast is a copy: load without mmap, or cast the views)"
    elif shared:
        why = "a cooperative load (each rank maps its own pages; nothing to exchange)"
    if why is not None:
        raise InvalidArgumentError(f"{uri}: mmap=True returns views of the file; not with {why}")


def load(
    engine: Engine, indices: Sequence[int], slices: Sequence[tp.Slice | None]
) -> tuple[list[torch.Tensor], LoadStats]:
    """The tensors ``indices`` (``slices[i]`` of them, when set) from the
    mapped file, and the load's stats."""
    mapping = engine.map(indices)
    stats = LoadStats()
    out: list[torch.Tensor] = []
    for index, sl in zip(indices, slices, strict=True):
        info = engine.info_at(index)
        tensor, viewed = _tensor(mapping, info, sl)
        if viewed:
            stats.bytes_mapped += tensor.numel() * tensor.element_size()
        out.append(tensor)
    return out, stats


def _tensor(
    mapping: _native.Mapping, info: TensorInfo, sl: tp.Slice | None
) -> tuple[torch.Tensor, bool]:
    """One tensor (or its slice), and whether it views the mapping."""
    shape = tp.sliced_shape(info.shape, sl)
    if info.meta:
        return torch.zeros(shape, dtype=info.dtype), False
    if info.nbytes == 0:
        return torch.empty(shape, dtype=info.dtype), False
    size = info.dtype.itemsize
    if info.offset % size == 0:
        whole = torch.frombuffer(
            mapping, dtype=info.dtype, count=info.nbytes // size, offset=info.offset
        )
        return _take(whole.view(info.shape), sl)
    # Misaligned: the bytes as uint8 (any address will do), the last dim
    # counted in bytes, sliced there, then copied into aligned memory.
    dims = info.shape or (1,)
    raw = torch.frombuffer(mapping, dtype=torch.uint8, count=info.nbytes, offset=info.offset)
    part, _ = _take(raw.view(*dims[:-1], dims[-1] * size), _in_bytes(sl, len(dims), size))
    copy = torch.empty(shape, dtype=info.dtype)
    copy.view(shape or (1,)).view(torch.uint8).copy_(part)
    return copy, False


def _take(whole: torch.Tensor, sl: tp.Slice | None) -> tuple[torch.Tensor, bool]:
    """``sl`` of ``whole``: a view for one range, a concatenated copy for several."""
    if sl is None:
        return whole, True
    dim, ranges = sl
    parts = [whole.narrow(dim, start, length) for start, length in ranges]
    if len(parts) == 1:
        return parts[0], True
    return torch.cat(parts, dim=dim), False


def _in_bytes(sl: tp.Slice | None, ndim: int, size: int) -> tp.Slice | None:
    """``sl`` over a tensor's bytes whose last dim is counted in bytes."""
    if sl is None or sl[0] != ndim - 1:
        return sl
    dim, ranges = sl
    return dim, [(start * size, length * size) for start, length in ranges]
