"""A worker's rank of the model in checkpoint form: its parameters as
``load_weights`` leaves them, before post-load processing rewrites them.

A running engine's module is not a checkpoint: vLLM's CPU backend repacks
every linear weight for its GEMM and leaves the parameter empty (shape
(0,)), and quantisation methods on GPUs transpose, pad or quantize weights
after loading. Written as they are, such weights cannot be loaded again. So
the serializer builds a second module of the same rank on the CPU, fills it
through the engine's own loader from the checkpoint the engine was started
from, and writes that. Loading the file then runs vLLM's post-load
processing in full, as after any checkpoint load, so every method that
processes weights after loading is covered. Online quantisation (weights
quantized while they load) has no checkpoint form and is refused. An engine
that loaded processed weights (a file vLLM's own serializer wrote) has none
either: those are written as processed weights, as they were read.

The second module costs host memory: one rank's weights, for the time of
the write.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..errors import InvalidArgumentError

# What vLLM layers register themselves in at construction, by prefix; a
# second module of the same model would collide with the first ("Duplicate
# layer name"), so it is built against empty ones, which are put back after.
_REGISTRIES = ("static_forward_context", "static_all_moe_layers")


@contextmanager
def _own_registries(compilation_config: Any) -> Iterator[None]:
    saved = {name: getattr(compilation_config, name) for name in _REGISTRIES}
    for name, value in saved.items():
        setattr(compilation_config, name, type(value)())
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(compilation_config, name, value)


def _online_quantized(model: nn.Module) -> bool:
    """vLLM's own test (base_loader._has_online_quant): a quant method that
    creates its weights on the meta device and quantizes them as they load."""
    return any(
        getattr(getattr(m, "quant_method", None), "uses_meta_device", False)
        for m in model.modules()
    )


def checkpoint_form(vllm_config: Any) -> tuple[nn.Module, bool]:
    """This worker's rank of the model (``vllm_config``: the worker's),
    built on the CPU and filled by the engine's loader, unprocessed; and
    whether those weights are processed all the same: the engine loaded a
    file of processed weights (vLLM's own serializer wrote it), which has
    no checkpoint form to go back to, so it is written as it was read."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.utils.torch_utils import set_default_torch_dtype

    model_config = vllm_config.model_config
    loader = get_model_loader(vllm_config.load_config)
    # collective_rpc runs outside the worker's config context; the loaders
    # read it (the expert-parallel weight filter, for one).
    with set_current_vllm_config(vllm_config):
        with _own_registries(vllm_config.compilation_config):
            with set_default_torch_dtype(model_config.dtype), torch.device("cpu"):
                model = loader.create_model(vllm_config=vllm_config, model_config=model_config)
        if _online_quantized(model):
            raise InvalidArgumentError(
                f"{model_config.model}: the engine quantizes its weights while loading them "
                f"(quantization={model_config.quantization!r}), so they have no checkpoint "
                "form to write: serialize the engine without --quantization and pass it "
                "when serving"
            )
        loader.load_weights(model, model_config)
    return model, _reads_processed(loader, model_config)


def _reads_processed(loader: Any, model_config: Any) -> bool:
    from .loader import FastshardModelLoader

    return isinstance(loader, FastshardModelLoader) and loader.plan(model_config).processed


def check_loadable(model: nn.Module) -> None:
    """Refuse before writing what could not be loaded again: an empty
    parameter is what post-load processing leaves behind (vLLM's CPU GEMM
    repacking), never a checkpoint's weight."""
    empty = [n for n, p in model.named_parameters() if p.numel() == 0 and p.device.type != "meta"]
    if empty:
        shown = ", ".join(empty[:8]) + (f" (+{len(empty) - 8} more)" if len(empty) > 8 else "")
        raise InvalidArgumentError(
            f"{len(empty)} parameters are empty, as vLLM's post-load processing leaves them "
            f"(the CPU backend repacks linear weights): {shown}. Written as they are they "
            "could not be loaded again; serialize through the worker extension "
            "(fastshard.vllm.serialize), which writes the weights in checkpoint form"
        )
