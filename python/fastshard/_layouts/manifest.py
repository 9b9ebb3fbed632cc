"""The names of a sharded set: per-rank templates (vLLM's printf form or
``{rank}``; in an ``http(s)://`` URL only the part before ``?`` is looked
at) and the manifest written beside them (``fastshard-manifest.json``),
read and written through the native object calls with the tensor files'
options. ``fastshard.shard`` re-exports the public names; what each means
for a load is said there."""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from .. import _native
from .. import _versioned as versioned
from .._native import Location
from ..errors import AuthError, InvalidArgumentError, ShardMismatchError
from . import location as _location
from .location import Uri
from .location import display as _shown

log = logging.getLogger("fastshard")

MANIFEST_NAME = "fastshard-manifest.json"
MANIFEST_FORMAT = "fastshard-sharded"
MANIFEST_VERSION = 1
# A manifest lists one small entry per rank; anything larger is not one.
MANIFEST_MAX_BYTES = 4 << 20

# "%d", "%03d", "%3d" (printf) or "{rank}"; "%%" is a literal percent sign.
_SPEC = re.compile(r"%%|%(0?\d*)d|\{rank\}")


def has_spec(head: str) -> bool:
    return any(m.group(0) != "%%" for m in _SPEC.finditer(head))


def is_template(uri: Uri) -> bool:
    return has_spec(_location.head(uri))


def formatted(head: str, rank: int) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "%%":
            return "%%"  # left alone: only vLLM's %0Nd is a spec, not printf escaping
        if m.group(0) == "{rank}":
            return str(rank)
        width = m.group(1) or ""
        return f"{rank:{width}d}" if width else str(rank)

    return _SPEC.sub(one, head)


def format_rank(template: Uri, rank: int) -> str:
    """The file of ``rank``: every rank spec in the path part replaced."""
    head, query = _location.split(template)
    return formatted(head, rank) + query


def rank_file(template: Location, rank: int) -> Location:
    """``template``'s file for ``rank``, derived from the parsed template
    when the rank spec is in its name (the usual case), else parsed anew:
    a spec in a folder's name changes more than the last component."""
    head = template.head
    cut = head.rfind("/") + 1
    if has_spec(head[:cut]):
        return Location(format_rank(template, rank))
    return template.renamed(formatted(head[cut:], rank))


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# -- manifest --------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    path: str  # where it was read from (as shown in messages)
    world_size: int
    template: str  # relative to the manifest's directory
    files: dict[int, dict[str, Any]]  # rank → {"name", "size", "sha256"}
    created: dict[str, Any]

    def describe(self) -> str:
        by = self.created.get("by", "?")
        utc = self.created.get("utc", "?")
        return f"manifest {self.path} says world_size={self.world_size} (written by {by} at {utc})"


def manifest_location(template_or_dir: Uri) -> str:
    return _location.text(_beside(template_or_dir))


def _beside(template: Uri) -> Location:
    return _location.parsed(template).sibling(MANIFEST_NAME)


def read_manifest(location: Uri, source_opts: dict[str, Any] | None = None) -> Manifest | None:
    """The manifest at ``location`` (local, s3://, gs:// or http(s)://), None if
    there is none. One that is there but unreadable is a ShardMismatchError:
    the set it describes cannot be checked, and silently skipping the check
    would hide that."""
    shown = _shown(location)
    try:
        data = _native.read_object(location, max_bytes=MANIFEST_MAX_BYTES, **(source_opts or {}))
    except AuthError as e:
        if _location.is_local(location):
            raise
        log.warning(
            "fastshard: shard manifest %s cannot be read (%s); loading without its checks",
            shown,
            e,
        )
        return None
    except InvalidArgumentError as e:  # a directory, or too large to be a manifest
        raise ShardMismatchError(f"unreadable shard manifest {shown}: {e}", uri=shown) from e
    if data is None:
        return None
    try:
        raw = versioned.loads(data, MANIFEST_FORMAT, MANIFEST_VERSION)
        files = {int(e["rank"]): dict(e) for e in raw["files"]}
        return Manifest(
            shown, int(raw["world_size"]), str(raw["template"]), files, dict(raw.get("created", {}))
        )
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ShardMismatchError(f"unreadable shard manifest {shown}: {e}", uri=shown) from e


def write_manifest(
    template: Uri,
    sizes: list[int],
    version: str,
    *,
    sha256s: list[str | None] | None = None,
    source_opts: dict[str, Any] | None = None,
) -> str:
    """Write the manifest of a sharded set just saved at ``template`` (local,
    s3:// or gs://); returns its location. ``sizes`` and ``sha256s`` are what the
    save wrote (a local file's hash is taken from disk when not given)."""
    loc = _location.parsed(template)
    files = []
    for rank, size in enumerate(sizes):
        file = rank_file(loc, rank)
        digest = sha256s[rank] if sha256s is not None else None
        if file.path is not None:
            actual = os.path.getsize(file.path)
            if actual != size:  # someone wrote over it between save and now
                raise ShardMismatchError(
                    f"{_location.text(file)}: {actual} bytes on disk, save wrote {size}"
                )
            digest = digest or sha256_file(file.path)
        files.append({"rank": rank, "name": _location.name(file), "size": size, "sha256": digest})
    fields = {
        "world_size": len(sizes),
        "template": _location.name(loc),
        "files": files,
        "created": {
            "by": f"fastshard {version}",
            "utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        },
    }
    # Whole or not at all: a local file is renamed into place, S3 gets one PUT.
    data = versioned.dumps(MANIFEST_FORMAT, MANIFEST_VERSION, fields)
    where = _beside(loc)
    _native.write_object(where, data, **(source_opts or {}))
    return _location.text(where)


def remove_stale_manifest(template: Uri, source_opts: dict[str, Any] | None = None) -> None:
    """Before a save: a crash half way must leave no manifest rather than
    one that describes the previous set."""
    _native.delete_object(_beside(template), **(source_opts or {}))
