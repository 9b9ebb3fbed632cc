"""CUDA pieces of a staged load: pinning Rust-owned slabs, and copying
each batch out of its slab into device memory on a side stream, with an
event as its ticket.

Kept thin and free of policy: the native engine decides what goes where,
``ring.py`` when a slab may be reused; this file only knows how to do it on
a GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..errors import StorageError

if TYPE_CHECKING:
    from .places import ByteOp, ItemOp, Places

_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every CUDA context, as torch pins


def pin(t: torch.Tensor) -> None:
    """Page-lock a slab so copies from it are asynchronous DMA."""
    cudart = torch.cuda.cudart()
    err = int(cudart.cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), _PORTABLE))
    if err != 0:
        raise StorageError(
            f"could not pin {t.numel() * t.element_size()} bytes of staging memory "
            f"(cudaHostRegister error {err}); lower max_host_bytes or raise the memlock limit"
        )


def unpin(t: torch.Tensor) -> None:
    # Copies from this slab have completed (the ring waited on their
    # events); an error here would only hide the load's own outcome.
    torch.cuda.cudart().cudaHostUnregister(t.data_ptr())


class Events:
    def __init__(self, events: list[torch.cuda.Event]) -> None:
        self._events = events

    def done(self) -> bool:
        return all(e.query() for e in self._events)

    def wait(self) -> None:
        for e in self._events:
            e.synchronize()


class CudaCopier:
    """One batch at a time into GPU memory, on one side stream per device
    so the caller's stream stays free: plain bytes straight from the
    pinned slab into the destination's memory (a few large copies a
    batch), and the items copied through their views (casts, small
    tensors, strided slices) from a device copy of the slab's used bytes,
    placed by one batched ``_foreach_copy_``: a copy and a kernel a batch,
    none per tensor. Casts run on the GPU. Destinations on the CPU are
    copied synchronously."""

    def __init__(self, places: Places, depth: int) -> None:
        self.places = places
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._used: set[torch.device] = set()
        # Per device, the device copy of each slab (allocated when first used).
        self._staging: dict[torch.device, list[torch.Tensor | None]] = {}
        self._depth = depth

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        stream = self._streams.get(device)
        if stream is None:
            stream = torch.cuda.Stream(device)
            # Work the caller queued on the destinations (their
            # initialisation) happens before our writes.
            stream.wait_stream(torch.cuda.current_stream(device))
            self._streams[device] = stream
        self._used.add(device)
        return stream

    def _on_device(self, device: torch.device) -> bool:
        """Whether ``device`` is one this copier copies to asynchronously
        (a test copier on the CPU says yes to the CPU)."""
        return device.type == "cuda"

    def _device_slab(self, device: torch.device, slot: int, nbytes: int) -> torch.Tensor:
        slots = self._staging.setdefault(device, [None] * self._depth)
        got = slots[slot]
        if got is None:
            got = slots[slot] = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return got

    def copy(
        self, slab: torch.Tensor, slot: int, bytes_ops: list[ByteOp], item_ops: list[ItemOp]
    ) -> None:
        with torch.no_grad():
            for device, pairs in self._by_device(bytes_ops, slab).items():
                if not self._on_device(device):
                    for dst, src in pairs:
                        dst.copy_(src)
                    continue
                # One stream context a batch: entering one costs as much
                # as the copy call it wraps.
                with torch.cuda.stream(self._stream(device)):
                    for dst, src in pairs:
                        dst.copy_(src, non_blocking=True)
            by_device: dict[torch.device, list[ItemOp]] = {}
            for item_op in item_ops:
                dest = self.places.items[item_op[0]].dest
                by_device.setdefault(dest.device, []).append(item_op)
            for device, ops in by_device.items():
                self._items(slab, slot, device, ops)

    def _by_device(
        self, ops: list[ByteOp], slab: torch.Tensor
    ) -> dict[torch.device, list[tuple[torch.Tensor, torch.Tensor]]]:
        out: dict[torch.device, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for op in ops:
            dst, src = self.places.bytes_pair(op, slab)
            out.setdefault(dst.device, []).append((dst, src))
        return out

    def _items(
        self, slab: torch.Tensor, slot: int, device: torch.device, ops: list[ItemOp]
    ) -> None:
        if not self._on_device(device):
            pairs = [self.places.item_pair(op, slab) for op in ops]
            torch._foreach_copy_([d for d, _ in pairs], [s for _, s in pairs])
            for dest, temp in self.places.finals(ops):
                dest.copy_(temp)
            return
        lo = min(op[1] for op in ops)
        hi = max(op[1] + (op[4] - 1) * op[5] + op[3] for op in ops)
        with torch.cuda.stream(self._stream(device)):
            staged = self._device_slab(device, slot, slab.numel())
            staged[lo:hi].copy_(slab[lo:hi], non_blocking=True)
            pairs = [self.places.item_pair(op, staged) for op in ops]
            torch._foreach_copy_([d for d, _ in pairs], [s for _, s in pairs])
            for dest, temp in self.places.finals(ops):
                dest.copy_(temp)

    def ticket(self) -> Events:
        events = []
        for device in self._used:
            event = torch.cuda.Event()
            event.record(self._streams[device])
            events.append(event)
        self._used.clear()
        return Events(events)

    def finish(self) -> None:
        for device, stream in self._streams.items():
            torch.cuda.current_stream(device).wait_stream(stream)
