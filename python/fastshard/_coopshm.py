"""Same-host exchange for a cooperative load: when every rank of the group
can map the others' memory, each rank fetches its batches into a segment of
shared memory (``/dev/shm``) and every rank copies its slices straight out
of the owners' segments into its destinations.

Through the group's collective (gloo) a byte a rank keeps is copied five
times: from the socket into the owner's batch, into the part it sends, into
the transport, into the receiver's buffer, into the destination; and the
four ranks of a node share its cores for all of it. Here it is copied
twice (socket to segment, segment to destination) and nothing is sent.

Whether the group shares memory is found, not assumed: every rank creates
its segment and tries to map every other's; only when every rank mapped
every segment is it used, else the load exchanges through the collective
as before (ranks on several hosts, a ``/dev/shm`` too small, as in a
container with the default 64 MB, or none at all).
``FASTSHARD_COOP_EXCHANGE=collective`` in any rank forces the collective on
all. Segments are unlinked as soon as every rank has tried to map them (two
gathers after they are made), so a rank that dies later leaves nothing in
``/dev/shm``; the memory goes when the last rank unmaps it.

A round's area is reused ``AREAS`` rounds later. The agreement on round
k+1 is a collective every rank enters only after placing round k, so an
owner that starts refilling round k's area after it cannot overwrite what a
peer still reads.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

import torch

from ._peers import Link

ENV = "FASTSHARD_COOP_EXCHANGE"
AREAS = 3  # batch areas per rank, used round-robin
_DIR = Path("/dev/shm")


class Segments:
    """Every rank's ``AREAS`` batch areas, mapped in this rank."""

    def __init__(self, maps: list[torch.Tensor], area_bytes: list[int]) -> None:
        self._maps, self._area = maps, area_bytes

    def area(self, owner: int, k: int) -> torch.Tensor:
        """Where ``owner`` fetches its batch of round ``k``."""
        n = self._area[owner]
        at = (k % AREAS) * n
        return self._maps[owner][at : at + n]


def attach(link: Link, area_bytes: list[int]) -> Segments | None:
    """Each rank's ``AREAS`` areas of ``area_bytes[rank]`` bytes in shared memory,
    mapped by every rank; None (on every rank alike) when the group cannot
    share memory and must exchange through its collective."""
    if link.device.type != "cpu":  # a device group (NCCL): the same on every rank
        return None
    sizes = [max(1, AREAS * n) for n in area_bytes]
    # A rank told to use the collective makes no segment: it joins the
    # gathers all the same, and so every rank falls back with it.
    wanted = os.environ.get(ENV, "auto") != "collective"
    path = _create(sizes[link.rank]) if wanted else None
    maps: list[torch.Tensor] | None = None
    try:
        names = [n.decode() for n in link.gather(str(path or "").encode())]
        if all(names):
            maps = _map_all(names, sizes)
        # Every rank has tried every segment before any is unlinked.
        mapped = link.gather(b"1" if maps is not None else b"")
    finally:
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()
    if maps is None or not all(mapped):
        return None
    return Segments(maps, area_bytes)


def _create(size: int) -> Path | None:
    """A new segment of ``size`` bytes, its pages reserved (a full
    ``/dev/shm`` fails here rather than with SIGBUS mid-load); None when
    it cannot be made."""
    if not hasattr(os, "posix_fallocate"):  # macOS: no reservation, so no segment
        return None
    path = _DIR / f"fastshard-coop-{os.getpid()}-{uuid.uuid4().hex}"
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError:
        return None
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    os.close(fd)
    return path


def _map_all(names: list[str], sizes: list[int]) -> list[torch.Tensor] | None:
    """Every rank's segment, mapped shared; None if one cannot be (another
    host's, or gone)."""
    maps = []
    for name, size in zip(names, sizes, strict=True):
        path = Path(name)
        if path.parent != _DIR or not path.name.startswith("fastshard-coop-"):
            return None
        try:
            if os.stat(path).st_size != size:
                return None
            maps.append(torch.from_file(name, shared=True, size=size, dtype=torch.uint8))
        except (OSError, RuntimeError):
            return None
    return maps
