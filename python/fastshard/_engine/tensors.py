"""torch-side helpers: dtype names, destination tensors and byte views.

The native module only ever sees dtype *names* and raw byte buffers; this file
is where those become torch objects, so it is the one place that knows about
torch dtypes numpy cannot represent (bfloat16, float8, complex32).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence

import numpy as np
import torch

from .. import _native
from ..errors import DeviceError, InvalidArgumentError, UnsupportedError

DeviceLike = str | torch.device
DtypeLike = str | torch.dtype


def dtype_from_name(name: str, *, tensor: str | None = None, uri: str | None = None) -> torch.dtype:
    """``"bfloat16"`` → ``torch.bfloat16``; a name this torch build lacks is an
    UnsupportedError (an old torch reading a file with e.g. float8_e8m0fnu)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        of = f" of tensor {tensor!r}" if tensor is not None else ""
        raise UnsupportedError(
            f"dtype {name!r}{of} is not available in torch {torch.__version__}",
            uri=uri,
            tensor=tensor,
        )
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``"bfloat16"`` (the name the native module takes)."""
    return str(dtype)[len("torch.") :]


# Short names users write for the float dtypes, as torch's own names (half,
# float and double are torch attributes already).
_SHORT = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}
# What a bad name's error offers: the casts dtype= is for, with their other names.
_NAMES = "bfloat16 (bf16), float16 (half, fp16), float32 (float, fp32), float64 (double, fp64)"


def as_dtype(value: DtypeLike) -> torch.dtype:
    """A ``dtype=`` argument as a torch dtype: a torch dtype, its name (with
    or without "torch.") or a short name ("bf16")."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        name = value.removeprefix("torch.").lower()
        dtype = getattr(torch, _SHORT.get(name, name), None)
        if isinstance(dtype, torch.dtype):
            return dtype
        names = [n for n in dir(torch) if isinstance(getattr(torch, n, None), torch.dtype)]
        close = difflib.get_close_matches(name, [*names, *_SHORT], 1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InvalidArgumentError(
            f"dtype {value!r} is not a dtype name{hint}: use {_NAMES}, "
            "or another torch dtype's name"
        )
    raise InvalidArgumentError(f"dtype must be a torch.dtype or its name, not {value!r}")


def is_castable_float(dtype: torch.dtype) -> bool:
    """The dtypes ``dtype=`` may cast: real floating types only. Integers, bool
    and complex keep their type (tensorizer #206 cast complex too and lost the
    imaginary part)."""
    return dtype.is_floating_point


def nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    numel = 1
    for dim in shape:
        numel *= dim
    return numel * dtype.itemsize


def empty(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device="cpu")


# New CPU tensors of at most SMALL_TENSOR bytes are carved out of shared
# blocks of up to SLAB_BYTES, each at a SLAB_ALIGN-aligned offset (enough for
# any dtype's alignment and a cache line): one allocation and one byte view per
# block instead of a torch.empty and a numpy round trip per tensor, which is
# what a load of thousands of small tensors spent its time on. The cap keeps
# what one surviving tensor can pin (its whole block) small. A block holds one
# dtype: torch.save refuses tensors that view one storage as different types.
SMALL_TENSOR = 1 << 20
SLAB_BYTES = 16 << 20
SLAB_ALIGN = 64

_Pending = list[tuple[int, tuple[int, ...], torch.dtype, int, int]]


def empty_many(
    specs: Sequence[tuple[Sequence[int], torch.dtype]],
) -> tuple[list[torch.Tensor], list[memoryview]]:
    """New contiguous CPU tensors of ``specs`` (shape, dtype), and a writable
    byte view of each one's memory (what ``writable_bytes`` would return).
    Small ones share blocks of their dtype (never overlapping); the rest get
    their own."""
    tensors: list[torch.Tensor] = []
    views: list[memoryview] = []
    # The block being filled for each dtype: its tensors and bytes so far.
    open_blocks: dict[torch.dtype, tuple[_Pending, int]] = {}
    for shape, dtype in specs:
        dims = tuple(shape)
        size = math.prod(dims) * dtype.itemsize
        tensors.append(_NO_TENSOR)
        views.append(_NO_VIEW)
        if size > SMALL_TENSOR:
            t = torch.empty(dims, dtype=dtype)
            tensors[-1], views[-1] = t, writable_bytes(t)
            continue
        pending, fill = open_blocks.get(dtype, ([], 0))
        if fill + size > SLAB_BYTES:
            _carve(pending, fill, tensors, views)
            pending, fill = [], 0
        pending.append((len(tensors) - 1, dims, dtype, fill, size))
        open_blocks[dtype] = (pending, fill + -(-size // SLAB_ALIGN) * SLAB_ALIGN)
    for pending, fill in open_blocks.values():
        _carve(pending, fill, tensors, views)
    return tensors, views


_NO_TENSOR = torch.empty(0)
_NO_VIEW = memoryview(b"")


def _carve(
    pending: _Pending,
    fill: int,
    tensors: list[torch.Tensor],
    views: list[memoryview],
) -> None:
    """One block of ``fill`` bytes holding ``pending`` (slot, shape, dtype,
    offset, size; one dtype): each tensor a view of it, each byte view a
    memoryview slice."""
    block = torch.empty(max(fill, SLAB_ALIGN), dtype=torch.uint8)
    raw = block.numpy().data
    whole = block.view(pending[0][2])  # a block holds one dtype
    strides: dict[tuple[int, ...], tuple[int, ...]] = {}
    for slot, dims, dtype, offset, size in pending:
        stride = strides.get(dims)
        if stride is None:
            stride = strides[dims] = _contiguous_strides(dims)
        # One torch call per tensor: as_strided is the cheapest view there is.
        tensors[slot] = whole.as_strided(dims, stride, offset // dtype.itemsize)
        views[slot] = raw[offset : offset + size]


# New tensors a staged load fills on any device are carved at this
# alignment, the staging slabs' own: tensors that follow each other in a
# slab then follow each other in their block too, and a batch of them is
# copied out as one run (``ring.py``).
STAGED_ALIGN: int = _native.STAGE_ALIGN


def empty_on(
    device: torch.device, specs: Sequence[tuple[Sequence[int], torch.dtype]]
) -> tuple[list[torch.Tensor], list[bool]]:
    """New contiguous tensors of ``specs`` (shape, dtype) on ``device``:
    small ones views of shared blocks of their dtype, in order, at
    ``STAGED_ALIGN`` (one allocation a block instead of one a tensor), the
    rest their own; and which were carved (their block's bytes between
    them are padding nobody reads)."""
    out: list[torch.Tensor] = [_NO_TENSOR] * len(specs)
    carved = [False] * len(specs)
    pending: dict[torch.dtype, list[tuple[int, tuple[int, ...], int]]] = {}
    fill: dict[torch.dtype, int] = {}
    strides: dict[tuple[int, ...], tuple[int, ...]] = {}

    def carve(dtype: torch.dtype) -> None:
        items = pending.pop(dtype, [])
        if not items:
            return
        block = torch.empty(
            max(fill.pop(dtype), STAGED_ALIGN) // dtype.itemsize, dtype=dtype, device=device
        )
        for slot, dims, offset in items:
            stride = strides.get(dims)
            if stride is None:
                stride = strides[dims] = _contiguous_strides(dims)
            out[slot] = block.as_strided(dims, stride, offset // dtype.itemsize)
            carved[slot] = True

    for slot, (shape, dtype) in enumerate(specs):
        dims = tuple(shape)
        size = math.prod(dims) * dtype.itemsize
        if size > SMALL_TENSOR:
            out[slot] = torch.empty(dims, dtype=dtype, device=device)
            continue
        at = fill.get(dtype, 0)
        if at + size > SLAB_BYTES:
            carve(dtype)
            at = 0
        pending.setdefault(dtype, []).append((slot, dims, at))
        fill[dtype] = -(-(at + size) // STAGED_ALIGN) * STAGED_ALIGN
    for dtype in list(pending):
        carve(dtype)
    return out, carved


def _contiguous_strides(dims: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    step = 1
    for d in reversed(dims):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


def writable_bytes(tensor: torch.Tensor) -> memoryview:
    """A writable uint8 view of a contiguous CPU tensor's memory.

    Viewing as uint8 in torch *before* going to numpy is what makes bfloat16,
    float8 and complex32 work (numpy has no such dtypes); reshape(-1) first
    gives 0-dim tensors the one dimension a dtype view needs.
    """
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise InvalidArgumentError("destination must be a contiguous CPU tensor")
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0:
        return np.empty(0, dtype=np.uint8).data
    return flat.view(torch.uint8).numpy().data


def readable_bytes(tensor: torch.Tensor) -> tuple[memoryview, torch.Tensor]:
    """Bytes of a tensor to save, and the tensor that owns them (keep it alive
    until the write returns). Meta tensors have no bytes; the caller records
    them as zero-filled."""
    if tensor.is_meta:
        return np.empty(0, dtype=np.uint8).data, tensor
    if tensor.layout != torch.strided or tensor.is_quantized:
        raise InvalidArgumentError(
            f"only dense tensors can be saved, not layout {tensor.layout} / {tensor.dtype}"
        )
    # resolve_conj/neg: lazily conjugated views have no numpy equivalent.
    owner = tensor.detach().resolve_conj().resolve_neg().to("cpu").contiguous()
    flat = owner.reshape(-1)
    if flat.numel() == 0:
        return np.empty(0, dtype=np.uint8).data, owner
    return flat.view(torch.uint8).numpy().data, owner


def as_device(device: DeviceLike | None) -> torch.device:
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidArgumentError(f"invalid device {device!r}: {exc}") from None
    _check_cuda(dev)  # before reading gigabytes, not at the first copy
    return dev


def _check_cuda(device: torch.device) -> None:
    """A CUDA device must exist before gigabytes are read for it."""
    if device.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise DeviceError(f"device {str(device)!r} was requested but CUDA is not available here")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise DeviceError(
            f"device {str(device)!r} was requested but this machine has {count} CUDA device(s)"
        )


def copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)``, on one thread when both are host tensors of one
    dtype and shape: torch spreads a copy over its OpenMP pool, and when
    several ranks share a few cores the pool's threads spin waiting for
    each other (a strided copy ran 5-10x slower with 2 threads than with one
    on 2 busy cores). numpy copies on the calling thread, without the GIL."""
    if (
        dst.device.type == "cpu"
        and src.device.type == "cpu"
        and dst.dtype == src.dtype
        and dst.shape == src.shape
        and dst.dim() > 0
        and dst.stride(-1) == 1
        and src.stride(-1) == 1
    ):
        np.copyto(_bytes_view(dst), _bytes_view(src))
    else:
        dst.copy_(src)


def _bytes_view(t: torch.Tensor) -> np.ndarray:
    """A numpy uint8 view of ``t`` (last dim contiguous), any dtype."""
    return t.detach().view(torch.uint8).numpy()
