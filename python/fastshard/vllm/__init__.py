"""fastshard as a vLLM plugin: ``--load-format fastshard``, and
``--load-format tensorizer`` taken over unless FASTSHARD_TAKEOVER_TENSORIZER=0.

vLLM runs the ``vllm.general_plugins`` entry point ``fastshard`` (pyproject)
in every process it starts (the front end, the engine core and each worker,
under mp and Ray), so :func:`register` runs wherever a model is loaded, and
wherever engine arguments are built (``remote_model.py``: ``vllm serve
s3://...`` with fastshard's formats).

:func:`register` is cheap and may be called any number of times. When vLLM's
loader registry (``vllm.model_executor.model_loader``, seconds to import) is
already imported, the loader is registered at once; otherwise registration
waits for that import, so a process that never loads a model (the API
front end) never pays for it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from . import _ready

FORMAT = "fastshard"
TENSORIZER_FORMAT = "tensorizer"
TAKEOVER_ENV = "FASTSHARD_TAKEOVER_TENSORIZER"
REGISTRY_MODULE = "vllm.model_executor.model_loader"
ARG_UTILS_MODULE = "vllm.engine.arg_utils"  # where EngineArgs lives

_registered: set[str] = set()
_wanted = False  # register() was called: the loader registers itself once importable
LOADER_MODULE = f"{__name__}.loader"


def takes_over_tensorizer() -> bool:
    """Whether ``tensorizer`` is served by fastshard (env, default on)."""
    return os.environ.get(TAKEOVER_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _formats() -> list[str]:
    return [FORMAT, TENSORIZER_FORMAT] if takes_over_tensorizer() else [FORMAT]


def _register_now() -> None:
    if all(f in _registered for f in _formats()):
        return
    loading = sys.modules.get(LOADER_MODULE)
    if loading is not None and not hasattr(loading, "FastshardModelLoader"):
        # loader.py is being executed: its own import of vLLM's registry ran
        # this hook. Importing it again here would fail (a partially
        # initialized module); it calls loader_ready() when it is complete.
        return
    from vllm.model_executor.model_loader import register_model_loader

    # Importing loader.py may itself register (loader_ready), so what is
    # left to do is decided after it.
    from .loader import FastshardModelLoader

    for load_format in _formats():
        if load_format not in _registered:
            register_model_loader(load_format)(FastshardModelLoader)
            _registered.add(load_format)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Registers fastshard's loader right after vLLM's registry module has
    been executed, whoever imports it."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != REGISTRY_MODULE:
            return None
        _remove_hook()
        spec = None
        for finder in sys.meta_path:  # the finders after this one (editable installs too)
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec  # nothing this hook can wrap: register() must run again later
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _register_now()

        loader.exec_module = exec_module
        return spec


def _remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _RegisterOnImport)]


def loader_ready() -> None:
    """Called once loader.py's module is complete (through ``_ready``):
    registration that had to wait for it (see _register_now) happens now."""
    if _wanted and REGISTRY_MODULE in sys.modules:
        _register_now()


_ready.listen(loader_ready)


def register() -> None:
    """Register fastshard's loader with vLLM's loader registry (now, or as
    soon as that registry is imported), and, in a process that builds
    engine arguments, let them take s3:// model paths for
    fastshard's formats (remote_model.py). On a vLLM release not in
    ``versions.TESTED_VERSIONS`` it logs a warning naming both, and
    registers all the same."""
    global _wanted
    _wanted = True
    # An untested vLLM gets one warning per process, never a refusal.
    from .versions import warn_if_untested

    warn_if_untested()
    if REGISTRY_MODULE in sys.modules:
        _remove_hook()
        _register_now()
    elif not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())
    if ARG_UTILS_MODULE in sys.modules:
        from .remote_model import install

        install(_formats)


__all__ = [
    "FORMAT",
    "REGISTRY_MODULE",
    "TAKEOVER_ENV",
    "TENSORIZER_FORMAT",
    "loader_ready",
    "register",
    "takes_over_tensorizer",
]
