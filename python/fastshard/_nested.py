"""Rebuilding the nested dicts and lists of a state dict from tensor paths."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .errors import FormatError

PathPart = str | int
StateDict = dict[str, torch.Tensor] | dict[Any, Any] | list[Any]


def restructure(
    flat: Sequence[tuple[tuple[PathPart, ...], torch.Tensor]], *, uri: str | None = None
) -> StateDict:
    """Rebuild the dicts and lists ``write_state_dict`` flattened into paths.

    A level whose keys are ints becomes a list ordered by key (as tensorizer's
    ``tree()`` does); mixing int and str keys on one level, or a name that is
    both a tensor and a prefix, is a FormatError.
    """
    root: dict[PathPart, Any] = {}
    for path, tensor in flat:
        if not path:
            raise FormatError("empty tensor path", uri=uri)
        node = root
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise FormatError(f"tensor path {list(path)} conflicts with a tensor", uri=uri)
            node = child
        if path[-1] in node:
            raise FormatError(f"tensor path {list(path)} conflicts with another", uri=uri)
        node[path[-1]] = tensor
    return _retype(root, uri)


def _retype(node: dict[PathPart, Any], uri: str | None) -> StateDict:
    for key, value in node.items():
        if isinstance(value, dict):
            node[key] = _retype(value, uri)
    kinds = {isinstance(k, int) for k in node}
    if kinds == {True}:
        return [node[k] for k in sorted(node)]
    if len(kinds) > 1:
        raise FormatError("tensor paths mix list indices and names on one level", uri=uri)
    return node
