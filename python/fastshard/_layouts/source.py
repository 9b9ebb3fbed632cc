"""What one open reads: the URI parsed once, resolved for the rank through
the layouts (a single file, a per-rank file of a template or directory
checked against its manifest, a Hugging Face checkpoint's shards), and the
native reader opened on the parsed location that resolution derived. No
layer below parses the URI again: each asks the ``Location`` it is handed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .._native import Location, Reader
from . import hf
from . import location as _location
from .resolve import Resolved, resolve


@dataclass(frozen=True)
class Source:
    resolved: Resolved  # this rank's file, and the layout it came from
    reader: Reader
    checkpoint: hf.Checkpoint | None  # the HF index, when the open found one


def open_source(
    uri: str | os.PathLike[str] | Location,
    rank: int | None,
    world_size: int | None,
    *,
    verify_hashes: bool,
    source_opts: dict[str, Any],
) -> Source:
    """Open what ``uri`` names for ``rank`` of ``world_size``: a template or
    directory becomes this rank's file, checked against the manifest before
    the native open (resolve.py); a directory may hold an HF checkpoint."""
    resolved = resolve(
        _location.parsed(uri),
        rank,
        world_size,
        verify_hashes=verify_hashes,
        source_opts=source_opts,
    )
    reader, checkpoint = hf.open_reader(resolved, source_opts)
    return Source(resolved, reader, checkpoint)
