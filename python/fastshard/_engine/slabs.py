"""Staging slabs: Rust-owned page-aligned buffers (``_native.Slab``),
pinned for CUDA and then kept between loads. Page-locking is the costly part
of a slab (``cudaHostRegister`` walks and locks every page: tens of
milliseconds per 256 MiB), so a process that loads several times (a
checkpoint's files, a benchmark's rounds) pays it once. ``release()``
gives every kept slab back (vLLM's loader calls it once the weights are
in); ``FASTSHARD_KEEP_STAGING=0`` keeps none.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import torch

from .. import _native
from . import cuda as _cuda

# Slabs kept for the next load at most, pinned or not.
KEEP_BYTES = 1 << 30


@dataclass(eq=False)  # one slab is itself only
class Slab:
    native: _native.Slab
    view: torch.Tensor  # uint8, all of it
    pinned: bool

    @property
    def nbytes(self) -> int:
        return self.view.numel()


_lock = threading.Lock()
_kept: list[Slab] = []
_pid = os.getpid()


def _keeping() -> bool:
    return os.environ.get("FASTSHARD_KEEP_STAGING", "1") != "0"


def take(count: int, nbytes: int, pin: bool) -> list[Slab]:
    """``count`` slabs of at least ``nbytes``, pinned when ``pin``: kept
    ones first (the smallest that fit), new ones for the rest."""
    out: list[Slab] = []
    with _lock:
        _forget_after_fork()
        fits = sorted((s for s in _kept if s.pinned == pin and s.nbytes >= nbytes), key=_size)
        for s in fits[:count]:
            _kept.remove(s)
            out.append(s)
    try:
        while len(out) < count:
            native = _native.Slab(nbytes)
            slab = Slab(native, torch.frombuffer(native, dtype=torch.uint8), False)
            if pin:
                _cuda.pin(slab.view)
                slab.pinned = True
            out.append(slab)
    except BaseException:
        give(out)
        raise
    return out


def give(slabs: list[Slab]) -> None:
    """Back to the pool, within ``KEEP_BYTES`` (the largest kept first);
    the rest are unpinned and freed. Only pinned slabs are kept: an
    unpinned one costs nothing to make again but its pages."""
    with _lock:
        _forget_after_fork()
        keep = _keeping()
        pool = sorted([*_kept, *slabs], key=_size, reverse=True)
        _kept.clear()
        kept = 0
        for s in pool:
            if keep and s.pinned and kept + s.nbytes <= KEEP_BYTES:
                _kept.append(s)
                kept += s.nbytes
            else:
                _free(s)


def release() -> None:
    """Unpins and frees every kept slab."""
    with _lock:
        _forget_after_fork()
        while _kept:
            _free(_kept.pop())


def kept_bytes() -> int:
    with _lock:
        return sum(s.nbytes for s in _kept)


def _free(s: Slab) -> None:
    if s.pinned:
        _cuda.unpin(s.view)
        s.pinned = False


def _size(s: Slab) -> int:
    return s.nbytes


def _forget_after_fork() -> None:
    """A forked child owns copies of the parent's slabs but not their
    registration with the driver: forget them, never unpin them."""
    global _pid
    if os.getpid() != _pid:
        _kept.clear()
        _pid = os.getpid()
