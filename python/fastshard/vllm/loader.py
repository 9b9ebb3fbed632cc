"""The vLLM model loader behind ``--load-format fastshard`` (and ``tensorizer``).

Two layouts of weights:

- ``vllm``: what vLLM's ``tensorize_vllm_model`` writes (and fastshard's
  serializer): one file per rank of the live, post-processed module, with a
  ``.vllm_tensorized_marker``. The file of this worker (``ranks.py``) is
  copied into the parameters vLLM created, without replacing them, then
  vLLM's post-load processing runs in its "weights already processed" mode,
  so quantisation methods and attention layers rebuild their derived state
  (vLLM's tensorizer loader skips this step: its bug #55198) and methods that
  cannot take processed weights fail loudly.
- ``hf``: one unsharded file of a Hugging Face model (HF names, full
  tensors), fed to ``model.load_weights``, whose weight loaders take each
  rank's slice; with ``cooperative`` the TP group fetches the file once
  between its ranks.

``auto`` (the default) picks ``vllm`` for a per-rank set, a packed object or
a file with the marker, ``hf`` otherwise. Missing, unexpected and mis-shaped
weights are errors, raised before any tensor byte is read for ``vllm``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from vllm.config import ModelConfig, VllmConfig
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.utils import process_weights_after_loading
from vllm.model_executor.utils import weights_already_processed
from vllm.utils.torch_utils import set_default_torch_dtype

import fastshard

from .. import _native
from ..errors import InvalidArgumentError, NotFoundError, ShardMismatchError
from ..reader import source_options
from . import ranks as _ranks
from .config import LoaderConfig, parse_extra_config

log = logging.getLogger("fastshard")

MARKER = "vllm_tensorized_marker"
_HF_BATCH_BYTES = 1 << 30
_KEY_MAX_BYTES = 64


@dataclass(frozen=True)
class Plan:
    """What one worker loads: ``uri`` as given (template, directory or
    file) and the file it resolved to for this rank."""

    uri: str
    file: str
    layout: str  # "vllm" or "hf"
    ranks: _ranks.Ranks
    marker: tuple[int, ...] | None  # the marker's shape when the file has one
    per_rank: bool  # a per-rank file or a packed object


def encryption_key(keyfile: str, opts: dict[str, Any]) -> fastshard.EncryptionKey:
    """vLLM's ``encryption_keyfile``: a local path, or an ``s3://`` /
    ``http(s)://`` object read with the weights' source options."""
    if "://" in keyfile and not keyfile.startswith("file://"):
        raw = _native.read_object(keyfile, max_bytes=_KEY_MAX_BYTES, **source_options(opts))
        if raw is None:
            raise NotFoundError(f"encryption_keyfile {keyfile} does not exist", uri=keyfile)
        return fastshard.EncryptionKey.from_bytes(raw)
    return fastshard.EncryptionKey.from_file(keyfile.removeprefix("file://"))


class FastshardModelLoader(BaseModelLoader):
    """Loads tensorizer-format weights with fastshard (see the module doc)."""

    def __init__(self, load_config: LoadConfig) -> None:
        super().__init__(load_config)
        self.config: LoaderConfig = parse_extra_config(load_config.model_loader_extra_config)
        self.config.report_ignored()

    # -- BaseModelLoader -----------------------------------------------------
    def download_model(self, model_config: ModelConfig) -> None:
        """Nothing to download: the weights are read from where they are
        (local disk, S3, HTTP) when they are loaded."""

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        """Fill an existing model in place (also usable to reload weights)."""
        plan = self.plan(model_config)
        started = time.perf_counter()
        if plan.layout == "vllm":
            self._load_vllm(model, plan)
        else:
            self._load_hf(model, model_config, plan)
        log.info(
            "fastshard: loaded %s (%s layout, file rank %d of %d) in %.2fs",
            plan.file,
            plan.layout,
            plan.ranks.file_rank,
            plan.ranks.file_count,
            time.perf_counter() - started,
        )

    def load_model(
        self, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str = ""
    ) -> nn.Module:
        plan = self.plan(model_config)
        if plan.layout == "hf":
            # Raw weights: vLLM's own sequence (create, load_weights, then the
            # full post-load processing) is the right one.
            return super().load_model(vllm_config, model_config, prefix)
        load_device = vllm_config.device_config.device
        if vllm_config.load_config.device is not None:
            load_device = vllm_config.load_config.device
        target_device = torch.device(load_device)
        with set_default_torch_dtype(model_config.dtype):
            with target_device:
                model = self.create_model(vllm_config, model_config, prefix)
            self.load_weights(model, model_config)
            # The file holds processed weights: rebuild only the derived
            # state (kernels, attention matrices), as vLLM's IPC weight cache
            # loader does for the same kind of tensors.
            with weights_already_processed():
                process_weights_after_loading(model, model_config, target_device)
        return model.eval()

    # -- planning --------------------------------------------------------------
    def open_options(self) -> dict[str, Any]:
        """``fastshard.open`` options, the encryption key read from its file."""
        opts = dict(self.config.open_opts)
        if self.config.encryption_keyfile is not None:
            opts["encryption"] = encryption_key(self.config.encryption_keyfile, opts)
        return opts

    def plan(self, model_config: ModelConfig) -> Plan:
        """Resolve this worker's file and the layout, from the file's index."""
        ranks = _ranks.current()
        uri = self.config.uri or str(model_config.model)
        opts = self.open_options()
        with fastshard.open(uri, rank=ranks.file_rank, world_size=ranks.file_count, **opts) as f:
            per_rank = f.opened.rank is not None or f.opened.packed
            marker = None
            for info in f.infos():
                if info.name.lstrip(".") == MARKER:
                    marker = info.shape
            file = f.uri
        layout = self.config.layout
        if layout == "auto":
            layout = "vllm" if per_rank or marker is not None else "hf"
        if layout == "vllm" and not per_rank and ranks.file_count > 1:
            raise ShardMismatchError(
                f"{file} is one file of vLLM-layout weights, but tensor x pipeline parallel "
                f"= {ranks.tp_size} x {ranks.pp_size} workers need one file each: give a "
                "per-rank template (model-rank-%03d.tensors) or a directory with "
                "fastshard-manifest.json, or an HF-layout file (layout='hf')",
                uri=file,
            )
        if layout == "hf" and per_rank:
            raise InvalidArgumentError(
                f"{file} is a per-rank file; layout='hf' needs one unsharded file", uri=file
            )
        return Plan(uri, file, layout, ranks, marker, per_rank)

    # -- loading ---------------------------------------------------------------
    def _load_vllm(self, model: nn.Module, plan: Plan) -> None:
        # The marker vLLM writes is a meta parameter of the serialized module:
        # give the model one for the strict name check, then drop it (vLLM's
        # deserialize_tensorizer_model deletes it too).
        added = plan.marker is not None and not hasattr(model, MARKER)
        if added:
            assert plan.marker is not None
            meta = torch.empty(plan.marker, dtype=torch.int64, device="meta")
            model.register_parameter(MARKER, nn.Parameter(meta, requires_grad=False))
        try:
            fastshard.load(
                model,
                plan.uri,
                rank=plan.ranks.file_rank,
                world_size=plan.ranks.file_count,
                **self.open_options(),
            )
        finally:
            if added and MARKER in model._parameters:
                del model._parameters[MARKER]

    def _load_hf(self, model: nn.Module, model_config: ModelConfig, plan: Plan) -> None:
        opts = self.open_options()
        with fastshard.open(plan.uri, **opts) as f:
            loaded = model.load_weights(self._hf_weights(f, plan.ranks))
        if isinstance(loaded, set) and model_config.quantization is None:
            missing = sorted(n for n, _ in model.named_parameters() if n not in loaded)
            if missing:
                shown = ", ".join(missing[:20]) + (
                    f" (+{len(missing) - 20} more)" if len(missing) > 20 else ""
                )
                raise InvalidArgumentError(
                    f"{plan.file} does not fit the model: {len(missing)} parameters were "
                    f"not loaded: {shown}",
                    uri=plan.file,
                )

    def _hf_weights(
        self, f: fastshard.TensorFile, ranks: _ranks.Ranks
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The file's tensors, whole, in batches of at most ``max_host_bytes``
        (1 GiB by default; a larger tensor alone), so host memory stays
        bounded while ``model.load_weights`` takes them. With ``cooperative``
        the TP ranks fetch each batch once between them and share it: every
        rank walks the same batches, in the same order."""
        limit = self.config.open_opts.get("max_host_bytes", _HF_BATCH_BYTES)
        share = self.config.cooperative and ranks.tp_size > 1
        for batch in _batches(f.infos(), limit):
            if share:
                state = f.load_state_dict(
                    names=batch,
                    rank=ranks.tp_rank,
                    world_size=ranks.tp_size,
                    shard_specs={"*": None},
                    cooperative=True,
                    group=ranks.tp_group,
                )
            else:
                state = f.load_state_dict(names=batch)
            if not isinstance(state, dict):
                raise InvalidArgumentError(f"{f.uri} holds nested tensors, not weights", uri=f.uri)
            for name in list(state):
                # write_module's root tensors are named ".name"
                yield str(name).lstrip("."), state.pop(name)


def _batches(infos: list[fastshard.TensorInfo], limit: int) -> Iterator[list[str]]:
    batch: list[str] = []
    held = 0
    for info in infos:
        if batch and held + info.nbytes > limit:
            yield batch
            batch, held = [], 0
        batch.append(info.name)
        held += info.nbytes
    if batch:
        yield batch
