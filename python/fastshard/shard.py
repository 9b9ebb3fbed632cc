"""Per-rank shard files: URI templates, the manifest beside them, and rank → file.

A template names one file per tensor-parallel rank, either in vLLM's printf
form (``model-rank-%03d.tensors``; any ``%d`` / ``%0Nd``) or as ``{rank}``.
Every occurrence is replaced by the rank; in an ``http(s)://`` URL only the
part before ``?`` is looked at, so a presigned query string is never touched.

The manifest is ``fastshard-manifest.json`` in the template's directory: a
fixed name, so that a directory URI (``s3://b/dir/``, ``/models/x/``) can find
its sharded set without knowing the template. The cost is one sharded set
per directory, which is also vLLM's layout (one folder per model and TP size).
Its ``template`` and ``files[].name`` are names relative to that directory,
so the folder can be moved or uploaded as a whole.

Manifests live beside the files, local or on S3 (written by save_sharded),
and are read from http(s):// too, through ``_native.read_object`` /
``write_object`` / ``delete_object`` with the options given to open/load/
save_sharded (Python holds no S3 client: docs/architecture.md, boundary rule 1). Sizes are
checked on every open (a remote file's against the opened Reader's
``file_size``); SHA-256 only with ``verify_manifest_hashes=True``, for local
files. Not read: a manifest beside a presigned URL template (it would need
its own signature), and one the store refuses to show (AuthError; S3 answers
403 for a missing key without ListBucket): the load goes on unchecked, with
a warning.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from . import _native
from ._layouts import location as _location
from ._layouts.location import Uri
from ._layouts.location import display as _shown
from ._native import Location
from .errors import (
    AuthError,
    FastshardError,
    IntegrityError,
    InvalidArgumentError,
    NotFoundError,
    ShardMismatchError,
    UnsupportedError,
)

log = logging.getLogger("fastshard")

MANIFEST_NAME = "fastshard-manifest.json"
MANIFEST_FORMAT = "fastshard-sharded"
MANIFEST_VERSION = 1
# A manifest lists one small entry per rank; anything larger is not one.
MANIFEST_MAX_BYTES = 4 << 20
# What a directory URI without a manifest means (vLLM's tensorizer_dir).
DEFAULT_FILE = "model.tensors"
# What save_sharded writes into a directory URI (vLLM's example name).
DEFAULT_TEMPLATE = "model-rank-%03d.tensors"

# "%d", "%03d", "%3d" (printf) or "{rank}"; "%%" is a literal percent sign.
_SPEC = re.compile(r"%%|%(0?\d*)d|\{rank\}")


def _has_spec(head: str) -> bool:
    return any(m.group(0) != "%%" for m in _SPEC.finditer(head))


def is_template(uri: Uri) -> bool:
    return _has_spec(_location.head(uri))


def _formatted(head: str, rank: int) -> str:
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
    return _formatted(head, rank) + query


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def check_rank_args(rank: Any, world_size: Any) -> None:
    if world_size is not None and (
        isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1
    ):
        raise InvalidArgumentError(f"world_size must be a positive int, not {world_size!r}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise InvalidArgumentError(f"rank must be a non-negative int, not {rank!r}")


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
    return _location.sibling(template_or_dir, MANIFEST_NAME)


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
        raw = json.loads(data)
        if raw.get("format") != MANIFEST_FORMAT or raw.get("version") != MANIFEST_VERSION:
            raise ValueError(f"format {raw.get('format')!r} version {raw.get('version')!r}")
        files = {int(e["rank"]): dict(e) for e in raw["files"]}
        return Manifest(
            shown, int(raw["world_size"]), str(raw["template"]), files, dict(raw.get("created", {}))
        )
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ShardMismatchError(f"unreadable shard manifest {shown}: {e}", uri=shown) from e


def write_manifest(
    template: str,
    sizes: list[int],
    version: str,
    *,
    sha256s: list[str | None] | None = None,
    source_opts: dict[str, Any] | None = None,
) -> str:
    """Write the manifest of a sharded set just saved at ``template`` (local,
    s3:// or gs://); returns its location. ``sizes`` and ``sha256s`` are what the
    save wrote (a local file's hash is taken from disk when not given)."""
    location = manifest_location(template)
    files = []
    for rank, size in enumerate(sizes):
        name = format_rank(template, rank)
        digest = sha256s[rank] if sha256s is not None else None
        file_path = _location.local_path(name)
        if file_path is not None:
            actual = os.path.getsize(file_path)
            if actual != size:  # someone wrote over it between save and now
                raise ShardMismatchError(f"{name}: {actual} bytes on disk, save wrote {size}")
            digest = digest or sha256_file(file_path)
        files.append({"rank": rank, "name": _location.name(name), "size": size, "sha256": digest})
    doc = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "world_size": len(sizes),
        "template": _location.name(template),
        "files": files,
        "created": {
            "by": f"fastshard {version}",
            "utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        },
    }
    # Whole or not at all: a local file is renamed into place, S3 gets one PUT.
    data = (json.dumps(doc, indent=1) + "\n").encode()
    _native.write_object(location, data, **(source_opts or {}))
    return location


def remove_stale_manifest(template: str, source_opts: dict[str, Any] | None = None) -> None:
    """Before a save: a crash half way must leave no manifest rather than
    one that describes the previous set."""
    _native.delete_object(manifest_location(template), **(source_opts or {}))


# -- resolving a load ------------------------------------------------------


@dataclass(frozen=True)
class Resolved:
    uri: str  # the one file to open
    rank: int | None  # None: a single (unsharded) file
    world_size: int | None  # asked for, or the manifest's
    template: str | None
    packed: bool = False  # one packed object holding every rank (packed.py)
    manifest: Manifest | None = None  # the one this rank's file was checked against
    # A directory without a manifest: ``uri`` is its DEFAULT_FILE, and where
    # that is missing the directory may hold an HF checkpoint (_layouts/hf.py).
    directory: str | None = None
    # ``uri`` and ``directory`` parsed: what the open hands on, so that the
    # URI given is parsed once (None: built by hand, parsed when asked).
    location: Location | None = None
    dir_location: Location | None = None

    @property
    def file(self) -> Location:
        return self.location if self.location is not None else Location(self.uri)


def _manifest_beside(
    loc: Location, source_opts: dict[str, Any] | None, *, inside: bool = False
) -> Manifest | None:
    """The manifest beside the template ``loc`` (``inside`` the directory
    ``loc``)."""
    if loc.query:
        # A presigned URL signs one object; the manifest would need its own.
        log.debug("fastshard: no shard manifest check for presigned %s", loc.display)
        return None
    where = loc.child(MANIFEST_NAME) if inside else loc.sibling(MANIFEST_NAME)
    return read_manifest(where, source_opts)


def _rank_file(template: Location, rank: int) -> Location:
    """``template``'s file for ``rank``, derived from the parsed template
    when the rank spec is in its name (the usual case), else parsed anew."""
    head = template.head
    cut = head.rfind("/") + 1
    if _has_spec(head[:cut]):
        return Location(format_rank(template, rank))
    return template.renamed(_formatted(head[cut:], rank))


def resolve(
    uri: Uri,
    rank: int | None,
    world_size: int | None,
    *,
    verify_hashes: bool = False,
    source_opts: dict[str, Any] | None = None,
) -> Resolved:
    """The file that ``rank`` of ``world_size`` reads from ``uri`` (a file,
    a per-rank template, or a directory), checked against the manifest when
    one exists (read with ``source_opts``, those of the tensor files).
    Raises before any tensor byte is read; a remote file's size is checked
    once it is opened (``check_size``)."""
    check_rank_args(rank, world_size)
    loc = _location.parsed(uri)  # the one parse; derived locations from here on
    if verify_hashes and not _location.is_local(loc):
        raise UnsupportedError(
            f"verify_manifest_hashes=True is not supported for remote files ({loc.display})"
        )
    manifest: Manifest | None = None
    directory: Location | None = None
    if loc.is_dir:
        manifest = _manifest_beside(loc, source_opts, inside=True)
        if manifest is None:
            directory = loc
        loc = loc.child(manifest.template if manifest is not None else DEFAULT_FILE)
    uri = _location.text(loc)
    if not is_template(loc):
        if verify_hashes:
            raise InvalidArgumentError(
                f"verify_manifest_hashes=True needs a per-rank template or a directory with "
                f"a {MANIFEST_NAME}; {uri} is a single file"
            )
        # Whether rank and world_size fit a single file depends on its index
        # (a packed object holds every rank): checked after open (packed.view).
        return Resolved(
            uri,
            None,
            world_size,
            None,
            directory=_location.text(directory) if directory is not None else None,
            location=loc,
            dir_location=directory,
        )
    if rank is None:
        raise InvalidArgumentError(
            f"{_shown(uri)} is a per-rank template: pass rank= (and world_size=)"
        )
    if manifest is None:
        manifest = _manifest_beside(loc, source_opts)
    relative = _location.name(loc)
    if manifest is not None and manifest.template != relative:
        log.warning(
            "fastshard: %s describes template %r, not %r; not using it",
            manifest.path,
            manifest.template,
            relative,
        )
        manifest = None
    if manifest is not None:
        if world_size is not None and world_size != manifest.world_size:
            raise ShardMismatchError(
                f"{_shown(uri)}: {manifest.describe()}; asked world_size={world_size}. "
                f"Load with the TP size the files were saved for, or re-save them",
                uri=_shown(uri),
            )
        world_size = manifest.world_size
    if world_size is not None and rank >= world_size:
        where = f"{manifest.describe()}" if manifest is not None else f"world_size={world_size}"
        raise ShardMismatchError(
            f"{_shown(uri)}: rank {rank} does not exist: {where} so ranks are 0..{world_size - 1}",
            uri=_shown(uri),
        )
    file_loc = _rank_file(loc, rank)
    file_uri = _location.text(file_loc)
    if manifest is not None:
        _check_file(manifest, file_loc, rank, verify_hashes)
    elif verify_hashes:
        raise InvalidArgumentError(
            f"verify_manifest_hashes=True but there is no {MANIFEST_NAME} beside {uri}"
        )
    return Resolved(file_uri, rank, world_size, uri, manifest=manifest, location=file_loc)


def check_single(uri: str, rank: int | None, world_size: int | None) -> None:
    """A single file serves any world size: every rank slices it (tp.py)
    or picks its records (a packed object); only the rank must exist."""
    if world_size is not None and rank is not None and rank >= world_size:
        raise ShardMismatchError(
            f"{uri}: rank {rank} does not exist for world_size={world_size} "
            f"(ranks are 0..{world_size - 1})",
            uri=uri,
        )
    if rank not in (None, 0) and world_size is None:
        raise InvalidArgumentError(
            f"rank={rank} for the single file {uri}: pass world_size= to load that rank's "
            "tensor-parallel slices of it, or a per-rank template (model-rank-%03d.tensors "
            "or {rank}) or directory for per-rank files",
            uri=uri,
        )


def _check_file(manifest: Manifest, file_loc: Location, rank: int, verify_hashes: bool) -> None:
    entry = manifest.files.get(rank)
    if entry is None:
        raise ShardMismatchError(f"rank {rank} is not listed in {manifest.describe()}")
    path = file_loc.path
    if path is None:  # remote: the open finds it missing, check_size checks its size
        return
    file_uri = _location.text(file_loc)
    if not os.path.exists(path):
        raise NotFoundError(
            f"rank {rank}: {file_uri} not found, though {manifest.describe()} lists it",
            uri=file_uri,
        )
    _check_size(manifest, file_uri, rank, os.path.getsize(path))
    if verify_hashes:
        digest = sha256_file(path)
        if digest != entry.get("sha256"):
            raise IntegrityError(
                f"rank {rank}: {file_uri} has sha256 {digest}, {manifest.describe()} says "
                f"{entry.get('sha256')}; the file changed since it was saved",
                uri=file_uri,
            )


def _check_size(manifest: Manifest, file_uri: str, rank: int, size: int) -> None:
    expected = manifest.files[rank].get("size")
    if size != expected:
        raise ShardMismatchError(
            f"rank {rank}: {_shown(file_uri)} is {size} bytes, {manifest.describe()} says "
            f"{expected}; the file changed or belongs to another save",
            uri=_shown(file_uri),
        )


def check_size(resolved: Resolved, file_size: int) -> None:
    """After the native open: the opened file's size against the manifest
    (local files were checked before the open, remote ones only now)."""
    if resolved.manifest is not None and resolved.rank is not None:
        _check_size(resolved.manifest, resolved.uri, resolved.rank, file_size)


def name_rank(err: FastshardError, resolved: Resolved) -> FastshardError:
    """A copy of a native open error that also says which rank and template
    the missing file came from (the native message names only the file)."""
    if resolved.rank is None or not isinstance(err, NotFoundError):
        return err
    listed = f", though {resolved.manifest.describe()} lists it" if resolved.manifest else ""
    shown = _shown(resolved.uri)
    return NotFoundError(
        f"rank {resolved.rank} of template {_shown(resolved.template or '')}: {shown} "
        f"not found{listed} ({err})",
        uri=shown,
    )
