"""Weights that read themselves when vLLM's weight loader takes its part.

vLLM's ``load_weights`` hands each full (HF) tensor to a parameter's weight
loader, which takes this rank's part with ``narrow`` (the rows of a
column-parallel weight, the columns of a row-parallel one, the rank's vocab
rows of an embedding) and copies it into the parameter. A ``LazyWeight``
has the tensor's shape and dtype and no data: ``narrow`` reads exactly that
part (one native load of a tensor-parallel slice), and any other use reads
the whole tensor first, so a loader that does something else still gets
the right bytes. At TP > 1 each rank thereby reads its share of the sliced
weights and the replicated ones whole, without fastshard knowing how a
model splits its weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

from .. import tp

# Reads one tensor of the file: whole (None) or a slice, as a new CPU tensor.
Reader = Callable[["tp.Slice | None"], torch.Tensor]

# What a weight loader asks of a tensor without needing its bytes.
METADATA = {
    torch.Tensor.size,
    torch.Tensor.dim,
    torch.Tensor.numel,
    torch.Tensor.element_size,
    torch.Tensor.__len__,
    torch.Tensor.shape.__get__,  # type: ignore[attr-defined]
    torch.Tensor.dtype.__get__,  # type: ignore[attr-defined]
    torch.Tensor.ndim.__get__,  # type: ignore[attr-defined]
    torch.Tensor.is_floating_point,
}
DEVICE_QUERY = torch.Tensor.device.__get__


class StandIn(torch.Tensor):
    """A weight without its data yet (LazyWeight, the probe's Probe): on the
    CPU (where it is read into), its metadata its own, ``narrow`` its own
    (``_narrow``); any other use is the subclass's ``_use``."""

    def _narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def _use(cls, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    @classmethod
    def __torch_function__(
        cls,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func == DEVICE_QUERY:
            return torch.device("cpu")
        if func in METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        if func is torch.Tensor.narrow and isinstance(args[0], cls) and not kwargs:
            return args[0]._narrow(*args[1:])
        return cls._use(func, args, kwargs)


class LazyWeight(StandIn):
    """A file's tensor, read on first use (see the module doc)."""

    _read: Reader
    _whole: torch.Tensor | None

    @staticmethod
    def __new__(
        cls: type[LazyWeight], shape: tuple[int, ...], dtype: torch.dtype, read: Reader
    ) -> LazyWeight:
        meta = torch.empty(shape, dtype=dtype, device="meta")
        self = torch.Tensor._make_subclass(cls, meta)
        self._read, self._whole = read, None
        return self

    def materialize(self) -> torch.Tensor:
        if self._whole is None:
            self._whole = self._read(None)
        return self._whole

    def _narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        with torch._C.DisableTorchFunctionSubclass():
            ndim = self.dim()
            size = self.shape[dim]
        if isinstance(start, torch.Tensor):
            start = int(start)
        dim = dim + ndim if dim < 0 else dim
        if self._whole is not None or not (0 <= start and start + length <= size):
            return self.materialize().narrow(dim, start, length)
        return self._read((dim, [(start, length)]))

    @classmethod
    def _use(cls, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        def real(x: Any) -> Any:
            return x.materialize() if isinstance(x, LazyWeight) else x

        with torch._C.DisableTorchFunctionSubclass():
            return func(*tree_map(real, args), **tree_map(real, kwargs))

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return f"LazyWeight(shape={tuple(self.shape)}, dtype={self.dtype})"
