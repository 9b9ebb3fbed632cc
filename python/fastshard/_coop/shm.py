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
all. A rank makes its segment before the group agrees on the plan, so its
first batch is fetched meanwhile (``Own``); segments are unlinked as soon as
every rank has tried to map them (three gathers after they are made: the
plan's, then ``attach``'s two), so a rank that dies later leaves nothing in
``/dev/shm``; the memory goes when the last rank unmaps it. One killed
during those gathers leaves its segment, which the next cooperative load on
the host removes (``_sweep``).

A round's area is reused ``AREAS`` rounds later. The agreement on round
k+1 is a collective every rank enters only after placing round k, so an
owner that starts refilling round k's area after it cannot overwrite what a
peer still reads.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from pathlib import Path

import torch

from .peers import Link

ENV = "FASTSHARD_COOP_EXCHANGE"
AREAS = 3  # batch areas per rank, used round-robin
_DIR = Path("/dev/shm")
_PREFIX = "fastshard-coop-"
# A segment lives for its load's set-up (three gathers); one this old whose
# maker is gone was left by a rank killed during them.
_STALE_SECONDS = 60.0


class Own:
    """This rank's segment, made before the group has agreed on anything so
    that its first batch is fetched while the ranks exchange their plans:
    area 0 is reserved at once, the others by ``reserve``."""

    def __init__(self, path: Path, area_bytes: int) -> None:
        self.path, self.area_bytes = path, area_bytes
        self.map = torch.from_file(
            str(path), shared=True, size=AREAS * area_bytes, dtype=torch.uint8
        )

    def area(self, k: int) -> torch.Tensor:
        return _area(self.map, self.area_bytes, k)

    def reserve(self) -> bool:
        """Reserve the pages of the other areas; False when ``/dev/shm``
        cannot hold them (then the segment is not to be used past area 0)."""
        return _reserve(self.path, self.area_bytes, AREAS * self.area_bytes)

    def unlink(self) -> None:
        _unlink(self.path)


class Segments:
    """Every rank's ``AREAS`` batch areas, mapped in this rank."""

    def __init__(self, maps: list[torch.Tensor], area_bytes: list[int]) -> None:
        self._maps, self._area = maps, area_bytes

    def area(self, owner: int, k: int) -> torch.Tensor:
        """Where ``owner`` fetches its batch of round ``k``."""
        return _area(self._maps[owner], self._area[owner], k)


def _area(segment: torch.Tensor, area_bytes: int, k: int) -> torch.Tensor:
    """Round ``k``'s area of a segment: the areas are used round-robin."""
    at = (k % AREAS) * area_bytes
    return segment[at : at + area_bytes]


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def wanted(link: Link) -> bool:
    """Whether this rank offers a segment: a host (gloo) group, and not told
    to use the collective. A rank that offers none still joins ``attach``'s
    gathers, and so every rank falls back with it."""
    return link.device.type == "cpu" and os.environ.get(ENV, "auto") != "collective"


def create(area_bytes: int) -> Own | None:
    """This rank's segment of ``AREAS`` areas of ``area_bytes`` (at least 1)
    bytes, area 0 reserved (a full ``/dev/shm`` fails here rather than with
    SIGBUS mid-load); None when it cannot be made."""
    area_bytes = max(1, area_bytes)
    if not hasattr(os, "posix_fallocate"):  # macOS: no reservation, so no segment
        return None
    _sweep()
    path = _DIR / f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError:
        return None
    try:
        try:
            os.ftruncate(fd, AREAS * area_bytes)
        finally:
            os.close(fd)
        if _reserve(path, 0, area_bytes):
            return Own(path, area_bytes)
    except (OSError, RuntimeError):  # RuntimeError: torch could not map it
        pass
    _unlink(path)
    return None


def _sweep() -> None:
    """Removes this user's segments whose maker is no longer running and
    that are older than a set-up could be. Both, because a process of
    another PID namespace sharing ``/dev/shm`` looks gone from here: its
    segment, removed while young, would only send that load to the
    collective (its peers could not map it)."""
    try:
        entries = list(os.scandir(_DIR))
    except OSError:
        return
    now = time.time()
    for entry in entries:
        pid = _maker(entry.name)
        if pid is None or _running(pid):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid == os.getuid() and now - st.st_mtime > _STALE_SECONDS:
            _unlink(Path(entry.path))


def _maker(name: str) -> int | None:
    """The PID in a segment's name, or None for another file."""
    if not name.startswith(_PREFIX):
        return None
    pid, _, rest = name.removeprefix(_PREFIX).partition("-")
    return int(pid) if rest and pid.isdigit() else None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: running
        pass
    return True


def _reserve(path: Path, start: int, end: int) -> bool:
    if end <= start:
        return True
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        os.posix_fallocate(fd, start, end - start)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def attach(link: Link, own: Own | None, needed: list[int]) -> Segments | None:
    """Every rank's segment mapped in this rank, where every rank offered
    one (``own``; None offers none) at least ``needed[owner]`` bytes an area
    and every rank mapped every one; None (on every rank alike) otherwise:
    the group exchanges through its collective. Each segment is unlinked
    once every rank has tried to map it."""
    mine = f"{own.path}\n{own.area_bytes}" if own is not None else ""
    maps: list[torch.Tensor] | None = None
    area_bytes: list[int] = []
    try:
        offers = [o.decode().split("\n") for o in link.gather(mine.encode())]
        if all(len(o) == 2 for o in offers):
            area_bytes = [int(o[1]) for o in offers]
            if all(a >= n for a, n in zip(area_bytes, needed, strict=True)):
                maps = _map_all(link.rank, own, [o[0] for o in offers], area_bytes)
        # Every rank has tried every segment before any is unlinked.
        mapped = link.gather(b"1" if maps is not None else b"")
    finally:
        if own is not None:
            own.unlink()
    if maps is None or not all(mapped):
        return None
    return Segments(maps, area_bytes)


def _map_all(
    rank: int, own: Own | None, names: list[str], area_bytes: list[int]
) -> list[torch.Tensor] | None:
    """Every rank's segment, mapped shared (this rank's as made); None if
    one cannot be (another host's, or gone)."""
    maps = []
    for owner, (name, area) in enumerate(zip(names, area_bytes, strict=True)):
        if owner == rank and own is not None:
            maps.append(own.map)
            continue
        path, size = Path(name), AREAS * area
        if path.parent != _DIR or not path.name.startswith(_PREFIX):
            return None
        try:
            if os.stat(path).st_size != size:
                return None
            maps.append(torch.from_file(name, shared=True, size=size, dtype=torch.uint8))
        except (OSError, RuntimeError):
            return None
    return maps
