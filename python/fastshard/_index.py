"""The tensors an opened file shows: their ``TensorInfo``, lookup by name
or nested path, and the state dict a load returns."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

from ._engine import tensors as _tensors
from ._layouts.packed import Entry
from ._nested import StateDict, restructure
from ._types import NameOrPath, PathPart, TensorInfo
from .errors import InvalidArgumentError


def _info(entry: Entry, uri: str, dtypes: dict[str, torch.dtype]) -> TensorInfo:
    """``dtypes``: the names already resolved in this index (a file has a
    handful of dtypes and may have thousands of tensors)."""
    name, path, ttype, dtype, shape, _hoff, doff, dlen = entry
    tdtype = dtypes.get(dtype)
    if tdtype is None:
        tdtype = dtypes[dtype] = _tensors.dtype_from_name(dtype, tensor=name, uri=uri)
    tpath = tuple(path) if path is not None else None
    nbytes = math.prod(shape) * tdtype.itemsize
    return TensorInfo(name, tdtype, tuple(shape), nbytes, doff, tpath, ttype, dlen == 0 < nbytes)


class Index:
    """The visible entries of a file, in file order."""

    def __init__(self, entries: Sequence[Entry], uri: str) -> None:
        self.uri = uri
        dtypes: dict[str, torch.dtype] = {}
        self.infos = [_info(e, uri, dtypes) for e in entries]
        self._by_name: dict[str, int] = {}
        self._by_path: dict[tuple[PathPart, ...], int] = {}
        ambiguous: set[str] = set()
        for i, info in enumerate(self.infos):
            if info.name in self._by_name:
                ambiguous.add(info.name)
            self._by_name[info.name] = i
            self._by_path[info.path if info.path is not None else (info.name,)] = i
        # ["a.b"] and ["a", "b"] both display as "a.b": only the path selects.
        for name in ambiguous:
            self._by_name[name] = -1
        self.nested = any(info.path is not None for info in self.infos)

    def __len__(self) -> int:
        return len(self.infos)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._by_name

    def index_of(self, name: NameOrPath) -> int:
        if isinstance(name, str):
            i = self._by_name.get(name)
            if i == -1:
                raise InvalidArgumentError(
                    f"{name!r} names several nested tensors; select it by its path tuple",
                    uri=self.uri,
                    tensor=name,
                )
        else:
            i = self._by_path.get(tuple(name))
        if i is None:
            raise KeyError(name)
        return i

    def select(self, names: Iterable[NameOrPath] | None) -> list[int]:
        """The indices of ``names`` (None: every tensor), in file order, which
        reads sequentially; every unknown name is reported at once."""
        if names is None:
            return list(range(len(self.infos)))
        if isinstance(names, (str, bytes)):
            raise InvalidArgumentError("names= must be a collection of names, not one string")
        wanted: set[int] = set()
        unknown: list[NameOrPath] = []
        for name in names:
            try:
                wanted.add(self.index_of(name))
            except KeyError:
                unknown.append(name)
        if unknown:
            raise InvalidArgumentError(f"{self.uri}: no tensors named {unknown[:20]}", uri=self.uri)
        return sorted(wanted)

    def state_dict(self, indices: Sequence[int], tensors: Sequence[torch.Tensor]) -> StateDict:
        """``{name: tensor}`` when every name is plain, else the nested dicts
        and lists ``write_state_dict`` flattened."""
        if not self.nested:
            return {self.infos[i].name: t for i, t in zip(indices, tensors, strict=True)}
        flat: list[tuple[tuple[PathPart, ...], torch.Tensor]] = []
        for i, t in zip(indices, tensors, strict=True):
            info = self.infos[i]
            flat.append((info.path if info.path is not None else (info.name,), t))
        return restructure(flat, uri=self.uri)
