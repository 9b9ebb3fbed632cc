"""CUDA pieces of the staging ring: pinning Rust-owned slabs, and copying
them into device memory on side streams with events as tickets.

Kept thin and free of policy: ``_ring`` decides what goes where and when a
slab may be reused; this file only knows how to do it on a GPU.
"""

from __future__ import annotations

import torch

from .errors import DeviceError, StorageError

_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every CUDA context, as torch pins


def check(device: torch.device) -> None:
    """A CUDA device must exist before gigabytes are read for it."""
    if device.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise DeviceError(f"device {str(device)!r} was requested but CUDA is not available here")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise DeviceError(
            f"device {str(device)!r} was requested but this machine has {count} CUDA device(s)"
        )


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
    """Host-to-device copies on side streams, two per device, alternating
    per batch, so a batch's copy overlaps the next fill and the caller's
    stream stays free. Destinations on the CPU are copied synchronously."""

    STREAMS = 2

    def __init__(self) -> None:
        self._streams: dict[torch.device, list[torch.cuda.Stream]] = {}
        self._used: dict[torch.device, torch.cuda.Stream] = {}
        self._turn = 0

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        streams = self._streams.get(device)
        if streams is None:
            caller = torch.cuda.current_stream(device)
            streams = [torch.cuda.Stream(device) for _ in range(self.STREAMS)]
            for s in streams:
                # Work the caller queued on the destinations (their
                # initialisation) happens before our writes.
                s.wait_stream(caller)
            self._streams[device] = streams
        return streams[self._turn % len(streams)]

    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        with torch.no_grad():
            if dst.device.type != "cuda":
                dst.copy_(src)
                return
            stream = self._stream(dst.device)
            self._used[dst.device] = stream
            with torch.cuda.stream(stream):
                if dst.dtype == src.dtype:
                    dst.copy_(src, non_blocking=True)
                else:
                    # Cast on the GPU: copy_ across devices with a dtype
                    # change would cast on the CPU into pageable memory
                    # first and copy synchronously from there.
                    dst.copy_(src.to(dst.device, non_blocking=True))

    def ticket(self) -> Events:
        events = []
        for stream in self._used.values():
            event = torch.cuda.Event()
            event.record(stream)
            events.append(event)
        self._used.clear()
        self._turn += 1
        return Events(events)

    def finish(self) -> None:
        for device, streams in self._streams.items():
            current = torch.cuda.current_stream(device)
            for s in streams:
                current.wait_stream(s)
