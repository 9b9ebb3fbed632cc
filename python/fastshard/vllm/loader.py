"""The vLLM model loader behind ``--load-format fastshard`` (and ``tensorizer``).

The weights are tensorizer files, or safetensors: a Hugging Face checkpoint
(the model directory itself, or its copy under an S3 prefix) opens as one
file (fastshard._layouts.hf) and loads in the ``hf`` layout. Two layouts of weights:

- ``vllm``: one file per rank of a vLLM module's parameters, with a
  ``.vllm_tensorized_marker``. The file of this worker (``ranks.py``) is
  copied into the parameters vLLM created, without replacing them. Files
  fastshard's serializer wrote also carry ``CHECKPOINT_MARKER``: their
  weights are as ``load_weights`` leaves them, so vLLM's post-load
  processing runs in full, as after any checkpoint load. vLLM's own
  ``tensorize_vllm_model`` writes the live, post-processed module: then the
  processing runs in its "weights already processed" mode, so quantisation
  methods and attention layers rebuild their derived state (vLLM's
  tensorizer loader skips this step: its bug #55198) and methods that
  cannot take processed weights fail loudly.
- ``hf``: one unsharded file (or HF checkpoint) of a Hugging Face model (HF
  names, full tensors), fed to ``model.load_weights`` (``hf.py``), whose weight loaders
  take each rank's slice; with ``cooperative`` the TP group fetches the file
  once between its ranks.

``auto`` (the default) picks ``vllm`` for a per-rank set, a packed object or
a file with the marker, ``hf`` otherwise. Missing, unexpected and mis-shaped
weights are errors, raised before any tensor byte is read for ``vllm``.
Each load ends with one summary line on the ``vllm.fastshard`` logger, so
it is printed by vLLM's own logging set-up, in its format.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from vllm.config import ModelConfig, VllmConfig
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.utils import process_weights_after_loading
from vllm.model_executor.utils import weights_already_processed
from vllm.utils.torch_utils import set_default_torch_dtype

import fastshard

from .._core import Budget, LoadStats
from ..errors import InvalidArgumentError, ShardMismatchError
from . import hf
from . import ranks as _ranks
from ._ready import loader_ready
from .config import LoaderConfig, parse_extra_config
from .keyfile import encryption_key
from .names import CHECKPOINT_MARKER, MARKER

# A child of vLLM's logger: vLLM's handler and format print it in every
# process (fastshard's own logger has no handler inside vLLM).
log = logging.getLogger("vllm.fastshard")

_MARKERS = (MARKER, CHECKPOINT_MARKER)


@dataclass(frozen=True)
class Plan:
    """What one worker loads: ``uri`` as given (template, directory or
    file) and the file it resolved to for this rank."""

    uri: str
    file: str
    format: str  # "tensorizer" or "safetensors"
    layout: str  # "vllm" or "hf"
    ranks: _ranks.Ranks
    markers: dict[str, tuple[int, ...]]  # the marker tensors the file has, by name
    per_rank: bool  # a per-rank file or a packed object

    @property
    def processed(self) -> bool:
        """The file holds post-processed weights (vLLM's own serializer)."""
        return self.layout == "vllm" and CHECKPOINT_MARKER not in self.markers


class FastshardModelLoader(BaseModelLoader):
    """Loads tensorizer or safetensors weights with fastshard (see the module doc)."""

    def __init__(self, load_config: LoadConfig) -> None:
        super().__init__(load_config)
        self.config: LoaderConfig = parse_extra_config(load_config.model_loader_extra_config)
        self.config.report_ignored()
        self._planned: Plan | None = None  # load_model's plan, for its load_weights call

    # -- BaseModelLoader -----------------------------------------------------
    def download_model(self, model_config: ModelConfig) -> None:
        """Nothing to download: the weights are read from where they are
        (local disk, S3, HTTP) when they are loaded."""

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        """Fill an existing model in place (also usable to reload weights)."""
        plan = self._planned or self.plan(model_config)
        started = time.perf_counter()
        try:
            if plan.layout == "vllm":
                stats = self._load_vllm(model, plan)
            else:
                stats = self._load_hf(model, model_config, plan)
        finally:
            # The weights are in: the pinned staging slabs kept for the
            # next load are host memory the server has better uses for.
            fastshard.release_staging()
        _summary(plan, stats, time.perf_counter() - started, self.config.cooperative)

    def load_model(
        self, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str = ""
    ) -> nn.Module:
        self._planned = plan = self.plan(model_config)
        try:
            if not plan.processed:
                # Checkpoint-form weights: vLLM's own sequence (create,
                # load_weights, then the full post-load processing).
                model: nn.Module = super().load_model(vllm_config, model_config, prefix)
                return model
            return self._load_processed(vllm_config, model_config, prefix)
        finally:
            self._planned = None

    def _load_processed(
        self, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str
    ) -> nn.Module:
        # Both are resolved to torch types by the time a model is loaded;
        # vLLM's annotations also allow the names it resolves them from.
        load_device: Any = vllm_config.device_config.device
        if vllm_config.load_config.device is not None:
            load_device = vllm_config.load_config.device
        target_device = torch.device(load_device)
        with set_default_torch_dtype(cast(torch.dtype, model_config.dtype)):
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
            markers = {
                i.name.lstrip("."): i.shape for i in f.infos() if i.name.lstrip(".") in _MARKERS
            }
            file, fmt = f.uri, f.format
        layout = self.config.layout
        if layout == "auto":
            layout = "vllm" if per_rank or MARKER in markers else "hf"
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
        return Plan(uri, file, fmt, layout, ranks, markers, per_rank)

    # -- loading ---------------------------------------------------------------
    def _load_vllm(self, model: nn.Module, plan: Plan) -> LoadStats:
        # The markers are meta parameters of the serialized module: give the
        # model them for the strict name check, then drop them (vLLM's
        # deserialize_tensorizer_model deletes its marker too).
        added = [name for name in plan.markers if not hasattr(model, name)]
        for name in added:
            meta = torch.empty(plan.markers[name], dtype=torch.int64, device="meta")
            model.register_parameter(name, nn.Parameter(meta, requires_grad=False))
        try:
            return fastshard.load(
                model,
                plan.uri,
                rank=plan.ranks.file_rank,
                world_size=plan.ranks.file_count,
                **self.open_options(),
            )
        finally:
            for name in added:
                model._parameters.pop(name, None)

    def _load_hf(self, model: nn.Module, model_config: ModelConfig, plan: Plan) -> LoadStats:
        limit = Budget(self.config.open_opts.get("max_host_bytes")).or_default(hf.BATCH_BYTES)
        with fastshard.open(plan.uri, **self.open_options()) as f:
            feed = hf.Feed(f, model, plan.ranks, limit, self.config.cooperative)
            try:
                feed.probe(model)
                # Every vLLM model class has load_weights; nn.Module does not declare it.
                loaded = cast(Any, model).load_weights(feed)
            except BaseException as e:
                feed.stop(e)
                refused = (ValueError, KeyError, AssertionError, RuntimeError)
                if isinstance(e, fastshard.FastshardError) or not isinstance(e, refused):
                    raise
                raise feed.refused(model, e) from e
        hf.check_complete(model, loaded, plan.file, model_config.quantization is not None)
        return feed.stats


def _summary(plan: Plan, stats: LoadStats, seconds: float, cooperative: bool) -> None:
    """The one line a vLLM user sees of a load: where from, the route taken
    and how fast."""
    route = f"{plan.layout} layout"
    if plan.layout == "vllm":
        route += ", checkpoint form" if not plan.processed else ", processed weights"
    elif cooperative and plan.ranks.tp_size > 1:
        route += ", cooperative"
        if stats.exchange:
            route += f" ({stats.exchange} exchange)"
    gbps = stats.bytes_fetched / seconds / 1e9 if seconds > 0 else 0.0
    log.info(
        "fastshard: loaded %s (%s format, %s, file rank %d of %d, TP rank %d of %d): "
        "%d bytes fetched by this rank (%.1f MiB) in %.2f s, %.2f GB/s, %d requests, %d retries, "
        "%d bytes from the node's cache, %d bytes received from the other ranks",
        plan.file,
        plan.format,
        route,
        plan.ranks.file_rank,
        plan.ranks.file_count,
        plan.ranks.tp_rank,
        plan.ranks.tp_size,
        stats.bytes_fetched,
        stats.bytes_fetched / (1 << 20),
        seconds,
        gbps,
        stats.requests,
        stats.retries,
        stats.bytes_from_cache,
        stats.bytes_received,
    )


# Last: a registration that had to wait for this module to be complete
# (fastshard.vllm._register_now) happens now.
loader_ready()
