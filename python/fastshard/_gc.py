"""The garbage collector paused while a load makes thousands of small
objects (a tensor, a view and a job per tensor): every few hundred new
objects start a collection, and the older generations' passes walk every
object the program holds (a serving process holds millions), which cost a
load of 10,000 small tensors a quarter of its time. Nothing a load makes is
cyclic garbage, so nothing is lost by collecting later.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def paused() -> Iterator[None]:
    """No automatic collection inside; the caller's setting is restored on
    the way out (a nested or concurrent pause leaves it to the outermost)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def pausing(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run inside ``paused()``."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with paused():
            return fn(*args, **kwargs)

    return wrapper
