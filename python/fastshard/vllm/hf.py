"""HF-layout weights (one unsharded file or HF checkpoint, Hugging Face
names) fed to vLLM's ``model.load_weights``: in bounded batches,
cooperatively when asked, with the source module's non-persistent buffers
left out and vLLM's refusals turned into fastshard errors that name the
file, the tensor and its bytes. At TP > 1 without ``cooperative``, each
large weight is handed over unread (``lazy.LazyWeight``): the weight
loader's ``narrow`` reads just this rank's part of it. With
``cooperative``, the slices the weight loaders take are found first
(``probe``), the group fetches each batch once (``cooperative.load``, as
``fastshard.load`` does) and each rank receives only its slices, which the
weight loaders' ``narrow`` then get.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

import fastshard

from .. import _core, tp
from .._core import LoadStats
from ..errors import FastshardError, InvalidArgumentError
from . import probe as _probe
from . import ranks as _ranks
from .lazy import LazyWeight

if TYPE_CHECKING:
    from .._core import Key

log = logging.getLogger("vllm.fastshard")

BATCH_BYTES = 1 << 30
# Weights at least this large (and 2-D or more) are read lazily at TP > 1:
# smaller ones (norms, biases) are read whole, batched, where one request
# costs more than the bytes a slice would save.
LAZY_MIN_BYTES = 1 << 20

# Buffers that transformers' modules register with persistent=False: never
# in a checkpoint, but tensorizer's write_module (which the tensorizer docs
# tell users to run on a transformers model) writes them. They are derived
# from the config and vLLM computes its own; vLLM's loader fails on the ones
# its weight mappers do not drop (transformers 5's original_inv_freq).
NON_PERSISTENT_BUFFERS = (
    "rotary_emb.inv_freq",
    "rotary_emb.original_inv_freq",
    "rotary_emb.cos_cached",
    "rotary_emb.sin_cached",
    "rotary_pos_emb.inv_freq",
    "embeddings.position_ids",
    "embeddings.token_type_ids",
)


def is_non_persistent_buffer(name: str) -> bool:
    return any(name == b or name.endswith("." + b) for b in NON_PERSISTENT_BUFFERS)


def skipped_buffers(names: list[str], model: nn.Module) -> set[str]:
    """The names among ``names`` (the file's, with write_module's leading
    "." removed) that are non-persistent buffers of the source module and
    that ``model`` has no parameter or buffer for."""
    own = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    return {n for n in names if is_non_persistent_buffer(n) and n not in own}


def _batches(infos: list[fastshard.TensorInfo], limit: int) -> Iterator[list[fastshard.TensorInfo]]:
    batch: list[fastshard.TensorInfo] = []
    held = 0
    for info in infos:
        if batch and held + info.nbytes > limit:
            yield batch
            batch, held = [], 0
        batch.append(info)
        held += info.nbytes
    if batch:
        yield batch


class Feed:
    """The file's tensors as ``(name, tensor)`` for ``model.load_weights``,
    in batches of at most ``limit`` bytes of the file (a larger tensor
    alone), so host memory stays bounded. With ``cooperative`` the TP ranks
    fetch each batch once between them and each receives only the slices
    its weight loaders take (``probe`` finds them first): every rank walks
    the same batches in the same order, so a rank that stops early must say
    so (``stop``). ``current`` is the tensor being handed over, for errors;
    ``stats`` adds up the batches' loads."""

    def __init__(
        self,
        f: fastshard.TensorFile,
        model: nn.Module,
        ranks: _ranks.Ranks,
        limit: int,
        cooperative: bool,
    ) -> None:
        self.f = f
        self.ranks = ranks
        self.limit = limit
        self.share = cooperative and ranks.tp_size > 1
        self.current: fastshard.TensorInfo | None = None
        self.done = False
        self.stats = LoadStats()
        infos = f.infos()
        skipped = skipped_buffers([i.name.lstrip(".") for i in infos], model)
        if skipped:
            log.info(
                "fastshard: %s: skipping %d non-persistent buffers of the source module that "
                "the model computes itself: %s",
                f.uri,
                len(skipped),
                ", ".join(sorted(skipped)),
            )
        self.infos = [i for i in infos if i.name.lstrip(".") not in skipped]
        # Slices cannot be hash-checked (hashes cover whole tensors) nor
        # read from encrypted files (chunks are sealed whole): read those whole.
        self.sliceable = not (f.verify_hash or f.encrypted)
        self.lazy = ranks.tp_size > 1 and not self.share and self.sliceable
        # Cooperative: each tensor's slices this rank takes (None: whole).
        self.uses: dict[str, list[Key]] = {i.name.lstrip("."): [None] for i in self.infos}

    def probe(self, model: nn.Module) -> None:
        """Cooperative: find the slices this rank's weight loaders take, by
        running ``load_weights`` on probes (``probe.py``), which write
        nothing. A model the probes cannot follow gets every tensor whole."""
        if not (self.share and self.sliceable):
            return
        weights = [(i.name.lstrip("."), tuple(i.shape), i.dtype) for i in self.infos]
        try:
            # Every vLLM model class has load_weights; nn.Module does not declare it.
            self.uses = _probe.probe(cast(Any, model).load_weights, weights)
        except _probe.ProbeFailed as e:
            log.warning(
                "fastshard: %s: cannot tell which slices %s.load_weights takes (%s); "
                "this rank receives every tensor whole",
                self.f.uri,
                type(model).__name__,
                e,
            )

    def _is_lazy(self, info: fastshard.TensorInfo) -> bool:
        return self.lazy and len(info.shape) >= 2 and info.nbytes >= LAZY_MIN_BYTES

    def _read(self, info: fastshard.TensorInfo, sl: tp.Slice | None) -> torch.Tensor:
        """One tensor of the file, whole (``sl`` None) or a slice of it."""
        out = torch.empty(tp.sliced_shape(info.shape, sl), dtype=info.dtype)
        self.stats.add(self.f.fill([self.f.index_of(info.name)], [out], [sl]))
        return out

    def _shared(self, batch: list[fastshard.TensorInfo]) -> dict[tuple[str, Key], torch.Tensor]:
        """The slices this rank takes of ``batch``'s tensors, by (name, key),
        fetched once by the group (``cooperative.load``), each rank
        receiving only its own."""
        wanted: list[tuple[fastshard.TensorInfo, Key]] = []

        def pick() -> _core.Wanted:
            wanted.extend((i, k) for i in batch for k in self.uses.get(i.name.lstrip("."), []))
            return [
                (self.f.index_of(i.name), k, tp.sliced_shape(i.shape, _core.slice_of(k)), i.dtype)
                for i, k in wanted
            ]

        ranks = self.ranks
        got, stats = _core.load_shared(
            self.f.engine, ranks.tp_group, ranks.tp_rank, ranks.tp_size, pick
        )
        self.stats.add(stats)
        return {(i.name, k): t for (i, k), t in zip(wanted, got, strict=True)}

    def _take(
        self,
        info: fastshard.TensorInfo,
        parts: dict[tuple[str, Key], torch.Tensor],
        sl: tp.Slice | None,
    ) -> torch.Tensor:
        """A slice the shared load fetched, or one the probe did not see
        (read alone: not a collective, so it cannot hang the group)."""
        got = parts.get((info.name, _core.key_of(sl)))
        return got if got is not None else self._read(info, sl)

    def _weight(
        self, info: fastshard.TensorInfo, parts: dict[tuple[str, Key], torch.Tensor]
    ) -> torch.Tensor:
        if self.uses.get(info.name.lstrip(".")) == [None]:
            return parts[(info.name, None)]
        return LazyWeight(info.shape, info.dtype, functools.partial(self._take, info, parts))

    def _load(self, batch: list[fastshard.TensorInfo]) -> dict[Any, Any]:
        if not batch:
            return {}
        state = self.f.load_state_dict(names=[i.name for i in batch])
        self.stats.add(self.f.stats)
        if not isinstance(state, dict):
            raise InvalidArgumentError(
                f"{self.f.uri} holds nested tensors, not weights", uri=self.f.uri
            )
        return state

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for batch in _batches(self.infos, self.limit):
            parts = self._shared(batch) if self.share else {}
            state = {} if self.share else self._load([i for i in batch if not self._is_lazy(i)])
            for info in batch:
                self.current = info
                weight: torch.Tensor
                if self.share:
                    weight = self._weight(info, parts)
                elif self._is_lazy(info):
                    weight = LazyWeight(info.shape, info.dtype, functools.partial(self._read, info))
                else:
                    weight = state.pop(info.name)
                # write_module's root tensors are named ".name"
                yield info.name.lstrip("."), weight
        self.current = None
        self.done = True

    def stop(self, error: BaseException) -> None:
        """The model stopped taking tensors (``error``): the other ranks,
        which go on to the next batch's cooperative load, raise instead of
        waiting for this one. A fastshard error from a load has told them
        already."""
        if self.share and not self.done and not isinstance(error, FastshardError):
            _core.abandon(self.ranks.tp_group, self.ranks.tp_rank, error)

    def refused(self, model: nn.Module, error: Exception) -> Exception:
        """vLLM's ``load_weights`` raising ``error`` as a fastshard error
        naming the file, the tensor it was given last and its bytes."""
        info = self.current
        if info is None:
            return InvalidArgumentError(
                f"{self.f.uri}: {type(model).__name__}.load_weights failed: "
                f"{type(error).__name__}: {error}",
                uri=self.f.uri,
            )
        name, span = info.name.lstrip("."), (info.offset, info.offset + info.nbytes)
        return InvalidArgumentError(
            f"{self.f.uri}: {type(model).__name__}.load_weights refused tensor {name!r} "
            f"(bytes {span[0]}-{span[1]}, shape {tuple(info.shape)}): "
            f"{type(error).__name__}: {error}",
            uri=self.f.uri,
            tensor=name,
            byte_range=span,
        )


def check_complete(model: nn.Module, loaded: object, uri: str, quantized: bool) -> None:
    """Every parameter of ``model`` must be among ``loaded`` (what vLLM's
    ``load_weights`` reports; quantized models name theirs differently)."""
    if not isinstance(loaded, set) or quantized:
        return
    missing = sorted(n for n, _ in model.named_parameters() if n not in loaded)
    if missing:
        shown = ", ".join(missing[:20]) + (
            f" (+{len(missing) - 20} more)" if len(missing) > 20 else ""
        )
        raise InvalidArgumentError(
            f"{uri} does not fit the model: {len(missing)} parameters were not loaded: {shown}",
            uri=uri,
        )
