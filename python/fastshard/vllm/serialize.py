"""Writing a running vLLM model as fastshard per-rank files.

Each worker writes its own rank, in checkpoint form (``checkpoint.py``: the
parameters as ``load_weights`` leaves them, not the engine's post-processed
module, which may not load again), with vLLM's ``vllm_tensorized_marker``
and fastshard's ``CHECKPOINT_MARKER``, to ``template`` formatted with its
file rank (``ranks.py``: PP stages included), through a worker extension
method that the driver calls by name with ``collective_rpc`` (no pickled
closures): start vLLM with ``worker_extension_cls=WORKER_EXTENSION``. The
driver then writes ``fastshard-manifest.json`` and copies the model's
non-weight files (config, generation config, tokenizer, ``*.py``;
``artifacts.py``) beside the weights, so the directory or S3 prefix serves
with ``--load-format fastshard`` or ``tensorizer``.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Unpack

import torch

from .. import __version__, shard, writer
from .._core import Location, StoreOptions, rank_file, save_settings, source_options
from .._core import location as _location
from ..errors import InvalidArgumentError
from . import ranks as _ranks
from .artifacts import copy_artifacts, model_directory
from .checkpoint import check_loadable, checkpoint_form
from .keyfile import encryption_key
from .names import CHECKPOINT_MARKER, MARKER, SAVE_METHOD, WORKER_EXTENSION

log = logging.getLogger("fastshard")


def _template(uri: str) -> Location:
    """The per-rank template for ``uri``, parsed once and handed on parsed; a
    local directory is created."""
    loc = _location.parsed(uri)
    if loc.is_dir:
        loc = loc.child(shard.DEFAULT_TEMPLATE)
    if not shard.is_template(loc):
        raise InvalidArgumentError(
            f"{loc.display!r} is neither a directory nor a per-rank template "
            "(model-rank-%03d.tensors)"
        )
    if loc.path is not None and os.path.dirname(loc.path):
        os.makedirs(os.path.dirname(loc.path), exist_ok=True)
    return loc


def save_rank(
    model: torch.nn.Module,
    uri: str,
    *,
    encryption_keyfile: str | None = None,
    processed: bool = False,
    **opts: Unpack[StoreOptions],
) -> dict[str, Any]:
    """Write this worker's rank of ``model`` to ``uri`` (a template or a
    directory); returns ``{"rank", "world_size", "uri", "size", "sha256"}``.
    ``model`` must be in checkpoint form (``checkpoint.checkpoint_form``):
    the loader runs vLLM's post-load processing on it in full. With
    ``processed`` its weights were read processed and are marked as such
    (no ``CHECKPOINT_MARKER``)."""
    check_loadable(model)
    ranks = _ranks.current()
    target = rank_file(_template(uri), ranks.file_rank)
    native: dict[str, Any] = dict(opts)
    if encryption_keyfile is not None:
        native["encryption"] = encryption_key(encryption_keyfile, opts)
    markers = (MARKER,) if processed else (MARKER, CHECKPOINT_MARKER)
    added = [name for name in markers if not hasattr(model, name)]
    for name in added:
        marker = torch.tensor((1,), device="meta")
        model.register_parameter(name, torch.nn.Parameter(marker, requires_grad=False))
    try:
        size, digest = writer._write(
            target, writer._entries(model), None, save_settings(native), sha256=True
        )
    finally:
        for name in added:
            model._parameters.pop(name, None)
    return {
        "rank": ranks.file_rank,
        "world_size": ranks.file_count,
        "uri": _location.text(target),
        "size": size,
        "sha256": digest,
    }


class FastshardWorkerExtension:
    """vLLM worker extension (``worker_extension_cls=WORKER_EXTENSION``)."""

    def fastshard_checkpoint_model(self) -> tuple[torch.nn.Module, bool]:
        """This worker's rank of the model in checkpoint form, and whether its
        weights are processed all the same (checkpoint.checkpoint_form)."""
        return checkpoint_form(self.vllm_config)  # type: ignore[attr-defined]

    def fastshard_save_rank(self, uri: str, options: dict[str, Any]) -> dict[str, Any]:
        model, processed = self.fastshard_checkpoint_model()
        return save_rank(model, uri, processed=processed, **options)


def serialize(
    llm: Any,
    uri: str,
    *,
    encryption_keyfile: str | None = None,
    artifacts: bool = True,
    **opts: Unpack[StoreOptions],
) -> str:
    """Write every rank of ``llm`` (a ``vllm.LLM`` started with
    ``worker_extension_cls=WORKER_EXTENSION``) to ``uri`` (a directory or
    template, local or ``s3://``), then the manifest and, with
    ``artifacts``, the model's non-weight files; returns the manifest's
    location. ``opts`` are fastshard's source options (S3 endpoint,
    credentials...)."""
    template = _template(uri)
    source_opts = source_options(opts)
    shard.remove_stale_manifest(template, source_opts)
    options: dict[str, Any] = dict(opts)
    if encryption_keyfile is not None:
        options["encryption_keyfile"] = encryption_keyfile
    # Workers are other processes: the template crosses as its text.
    sent = {"uri": _location.text(template), "options": options}
    results = llm.collective_rpc(SAVE_METHOD, kwargs=sent)
    by_rank = {r["rank"]: r for r in results}
    world = {r["world_size"] for r in results}
    if len(world) != 1 or sorted(by_rank) != list(range(next(iter(world)))):
        raise InvalidArgumentError(
            f"workers wrote ranks {sorted(by_rank)} of world sizes {sorted(world)}: "
            "expected each rank once"
        )
    ordered = [by_rank[r] for r in sorted(by_rank)]
    location = shard.write_manifest(
        template,
        [r["size"] for r in ordered],
        __version__,
        sha256s=[r["sha256"] for r in ordered],
        source_opts=source_opts,
    )
    if artifacts:
        model_config = llm.llm_engine.model_config
        source = model_directory(str(model_config.model), model_config.revision)
        dest_dir = _location.directory(template)
        copied = copy_artifacts(source, dest_dir, source_opts)
        log.info("fastshard: copied %d artifacts to %s: %s", len(copied), dest_dir, copied)
    return location


__all__ = ["SAVE_METHOD", "WORKER_EXTENSION", "FastshardWorkerExtension", "save_rank", "serialize"]
