"""Which part of each weight this rank's ``load_weights`` takes, found
before any byte is read.

A cooperative load must know every rank's slices before it fetches, but
only the model's weight loaders know them, and they see a full tensor. So
``load_weights`` first runs on ``Probe`` stand-ins: tensors with the
file's shapes and no data (meta) that note each ``narrow`` taken of them
(as ``lazy.LazyWeight`` serves it) and any other use as "the whole
tensor", and that make every write into a real tensor a no-op, so the
model's parameters are left as they were. The second, real run then gets
exactly the slices the first one took.

A use the probe cannot follow (a value read from the data, a mix with real
tensors that meta cannot compute) ends the probe run: this rank then asks
for every tensor whole, which is correct, only not the cheapest.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from .lazy import StandIn

if TYPE_CHECKING:
    from .._core import Key

# Uses that need values, answered with zeros after noting a whole use.
_VALUES = {torch.Tensor.item, torch.Tensor.tolist}
# Moves between devices: a probe stays on meta, whatever device is asked.
_MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.pin_memory}


class ProbeFailed(Exception):  # noqa: N818 - never leaves the Feed, which falls back
    """The model used a probe in a way it cannot follow."""


class Probe(StandIn):
    """A weight of the file without data (see the module doc). ``uses`` is
    shared by the probe handed to the model and every tensor derived from
    it; only uses of the one handed over are noted."""

    uses: list[Key]
    root: bool

    @staticmethod
    def __new__(cls: type[Probe], meta: torch.Tensor, uses: list[Key], root: bool) -> Probe:
        self = torch.Tensor._make_subclass(cls, meta)
        self.uses, self.root = uses, root
        return self

    def note(self, key: Key) -> None:
        if self.root and key not in self.uses:
            self.uses.append(key)

    def _narrow(self, dim: int, start: int, length: int) -> Probe:
        with torch._C.DisableTorchFunctionSubclass():
            dim = dim + self.dim() if dim < 0 else dim
            start = int(start)
            size = self.shape[dim]
            if 0 <= start and start + length <= size:
                self.note((dim, ((start, int(length)),)))
            else:
                self.note(None)  # LazyWeight reads the whole tensor for this
            narrowed = self.as_subclass(torch.Tensor).narrow(dim, start, length)
            return Probe(narrowed, self.uses, False)

    @classmethod
    def _use(cls, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            probes = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, Probe)]
            for p in probes:
                p.note(None)
            if _writes_into_real(func, args):
                return args[0]
            if not probes:
                return func(*args, **kwargs)
            if func in _VALUES:
                return func(torch.zeros(args[0].shape, dtype=args[0].dtype))
            return _on_meta(func, args, kwargs, probes[0].uses)


def _writes_into_real(func: Any, args: tuple[Any, ...]) -> bool:
    """An in-place op on a real tensor (a parameter) from a probe."""
    if not args or isinstance(args[0], Probe) or not isinstance(args[0], torch.Tensor):
        return False
    name = getattr(func, "__name__", "")
    return name in ("__setitem__", "__set__") or (name.endswith("_") and not name.endswith("__"))


def _on_meta(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], uses: list[Key]) -> Any:
    def bare(x: Any) -> Any:
        return x.as_subclass(torch.Tensor) if isinstance(x, Probe) else x

    args, kwargs = tree_map(bare, args), tree_map(bare, kwargs)
    if func in _MOVES:
        args = tuple(a for a in args if not isinstance(a, (torch.device, str)))
        kwargs = {k: v for k, v in kwargs.items() if k not in ("device", "non_blocking")}
        func = torch.Tensor.to if len(args) > 1 or kwargs else torch.Tensor.clone
    try:
        out = func(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - meta cannot compute it: stop probing
        raise ProbeFailed(f"{getattr(func, '__name__', func)} on a probe: {e}") from e

    def wrap(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == "meta":
            return Probe(x, uses, False)
        return x

    return tree_map(wrap, out)


def probe(
    load_weights: Any, weights: Iterable[tuple[str, tuple[int, ...], torch.dtype]]
) -> dict[str, list[Key]]:
    """Run ``load_weights`` on probes of ``weights`` (name, shape, dtype):
    each name's slices, in the order the model took them (an empty list:
    the model did not use it). Raises ``ProbeFailed``."""
    uses: dict[str, list[Key]] = {}

    def feed() -> Iterable[tuple[str, torch.Tensor]]:
        for name, shape, dtype in weights:
            uses[name] = []
            yield name, Probe(torch.empty(shape, dtype=dtype, device="meta"), uses[name], True)

    try:
        load_weights(feed())
    except ProbeFailed:
        raise
    except Exception as e:  # noqa: BLE001 - a check that values would have passed
        raise ProbeFailed(f"load_weights on probes: {type(e).__name__}: {e}") from e
    return uses
