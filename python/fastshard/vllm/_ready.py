"""loader.py's signal that its module is complete, for the registration in
``fastshard.vllm`` (``_register_now``), which must wait for it when vLLM's
registry is imported by loader.py itself. A leaf, so that loader.py does
not import the package that imports it."""

from __future__ import annotations

from collections.abc import Callable

_listeners: list[Callable[[], None]] = []


def listen(callback: Callable[[], None]) -> None:
    """Call ``callback`` whenever loader.py reports itself complete."""
    if callback not in _listeners:
        _listeners.append(callback)


def loader_ready() -> None:
    """Called once by loader.py, as its last statement."""
    for callback in tuple(_listeners):
        callback()
