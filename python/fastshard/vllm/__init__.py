"""fastshard as a vLLM plugin: ``--load-format fastshard``, and
``--load-format tensorizer`` taken over unless FASTSHARD_TAKEOVER_TENSORIZER=0.

vLLM runs the ``vllm.general_plugins`` entry point ``fastshard`` (pyproject)
in every process it starts (the front end, the engine core and each worker,
under mp and Ray), so :func:`register` runs wherever a model is loaded. It
is cheap until called, imports vLLM only when called, and may be called any
number of times.
"""

from __future__ import annotations

import os

FORMAT = "fastshard"
TENSORIZER_FORMAT = "tensorizer"
TAKEOVER_ENV = "FASTSHARD_TAKEOVER_TENSORIZER"

_registered: set[str] = set()


def takes_over_tensorizer() -> bool:
    """Whether ``tensorizer`` is served by fastshard (env, default on)."""
    return os.environ.get(TAKEOVER_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def register() -> None:
    """Register fastshard's loader with vLLM's loader registry."""
    formats = [FORMAT]
    if takes_over_tensorizer():
        formats.append(TENSORIZER_FORMAT)
    todo = [f for f in formats if f not in _registered]
    if not todo:
        return
    from vllm.model_executor.model_loader import register_model_loader

    from .loader import FastshardModelLoader

    for load_format in todo:
        register_model_loader(load_format)(FastshardModelLoader)
        _registered.add(load_format)


__all__ = ["FORMAT", "TAKEOVER_ENV", "TENSORIZER_FORMAT", "register", "takes_over_tensorizer"]
