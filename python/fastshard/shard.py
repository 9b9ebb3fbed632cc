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

The native layer has no call that reads or writes an object that is not a
tensorizer file, and Python must not hold an S3 client or build HTTP requests
(DESIGN, boundary rule 1). So manifests are written and checked for local
paths only; remote tensor files load, with the manifest check skipped and a
logged warning.
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

from .errors import (
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
# What a directory URI without a manifest means (vLLM's tensorizer_dir).
DEFAULT_FILE = "model.tensors"
# What save_sharded writes into a directory URI (vLLM's example name).
DEFAULT_TEMPLATE = "model-rank-%03d.tensors"

# "%d", "%03d", "%3d" (printf) or "{rank}"; "%%" is a literal percent sign.
_SPEC = re.compile(r"%%|%(0?\d*)d|\{rank\}")


def _split_query(uri: str) -> tuple[str, str]:
    """(path part, "?query…" or ""): only http(s) URLs have query strings;
    in a local path or an S3 key "?" is an ordinary character."""
    if uri.startswith(("http://", "https://")):
        head, sep, tail = uri.partition("?")
        return head, sep + tail
    return uri, ""


def is_template(uri: str) -> bool:
    head, _ = _split_query(uri)
    return any(m.group(0) != "%%" for m in _SPEC.finditer(head))


def format_rank(template: str, rank: int) -> str:
    """The file of ``rank``: every rank spec in the path part replaced."""
    head, query = _split_query(template)

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "%%":
            return "%%"  # left alone: only vLLM's %0Nd is a spec, not printf escaping
        if m.group(0) == "{rank}":
            return str(rank)
        width = m.group(1) or ""
        return f"{rank:{width}d}" if width else str(rank)

    return _SPEC.sub(one, head) + query


def local_path(uri: str) -> str | None:
    """The file system path of a local URI, None for s3:// and http(s)://."""
    if uri.startswith("file://"):
        return uri[len("file://") :]
    return None if "://" in uri else uri


def _dirname(uri: str) -> str:
    """``uri`` up to and including its last "/" (the query string of a URL
    stays out: it belongs to the file, not to the directory)."""
    head, _ = _split_query(uri)
    return head[: head.rfind("/") + 1] if "/" in head else ""


def is_directory(uri: str) -> bool:
    head, _ = _split_query(uri)
    if head.endswith("/"):
        return True
    path = local_path(uri)
    return path is not None and os.path.isdir(path)


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
    path: str  # where it was read from (local)
    world_size: int
    template: str  # relative to the manifest's directory
    files: dict[int, dict[str, Any]]  # rank → {"name", "size", "sha256"}
    created: dict[str, Any]

    def describe(self) -> str:
        by = self.created.get("by", "?")
        utc = self.created.get("utc", "?")
        return f"manifest {self.path} says world_size={self.world_size} (written by {by} at {utc})"


def manifest_location(template_or_dir: str) -> str:
    return _dirname(template_or_dir) + MANIFEST_NAME


def read_manifest(location: str) -> Manifest | None:
    """The manifest at a local ``location``, None if there is none. One that
    is there but unreadable is a ShardMismatchError: the set it describes
    cannot be checked, and silently skipping the check would hide that."""
    path = local_path(location)
    if path is None or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        if raw.get("format") != MANIFEST_FORMAT or raw.get("version") != MANIFEST_VERSION:
            raise ValueError(f"format {raw.get('format')!r} version {raw.get('version')!r}")
        files = {int(e["rank"]): dict(e) for e in raw["files"]}
        return Manifest(
            path, int(raw["world_size"]), str(raw["template"]), files, dict(raw.get("created", {}))
        )
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ShardMismatchError(f"unreadable shard manifest {path}: {e}", uri=path) from e


def write_manifest(template: str, sizes: list[int], version: str) -> str | None:
    """Write the manifest of a sharded set just saved at a local ``template``
    (sizes and hashes from the files themselves); None for remote templates."""
    location = manifest_location(template)
    path = local_path(location)
    if path is None:
        log.warning(
            "fastshard: no shard manifest written for remote template %s: the native layer "
            "cannot write non-tensorizer objects yet; loads will skip the manifest check",
            template,
        )
        return None
    files = []
    for rank, size in enumerate(sizes):
        name = format_rank(template, rank)
        file_path = local_path(name)
        assert file_path is not None
        actual = os.path.getsize(file_path)
        if actual != size:  # someone wrote over it between save and now
            raise ShardMismatchError(f"{name}: {actual} bytes on disk, save wrote {size}")
        files.append(
            {
                "rank": rank,
                "name": name[len(_dirname(template)) :],
                "size": size,
                "sha256": sha256_file(file_path),
            }
        )
    doc = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "world_size": len(sizes),
        "template": template[len(_dirname(template)) :],
        "files": files,
        "created": {
            "by": f"fastshard {version}",
            "utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        },
    }
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)  # readers never see half a manifest
    return path


def remove_stale_manifest(template: str) -> None:
    """Before a save: a crash half way must leave no manifest rather than
    one that describes the previous set."""
    path = local_path(manifest_location(template))
    if path is not None and os.path.isfile(path):
        os.remove(path)


# -- resolving a load ------------------------------------------------------


@dataclass(frozen=True)
class Resolved:
    uri: str  # the one file to open
    rank: int | None  # None: a single (unsharded) file
    world_size: int | None  # asked for, or the manifest's
    template: str | None
    packed: bool = False  # one packed object holding every rank (packed.py)


def resolve(
    uri: str, rank: int | None, world_size: int | None, *, verify_hashes: bool = False
) -> Resolved:
    """The file that ``rank`` of ``world_size`` reads from ``uri`` (a file,
    a per-rank template, or a directory), checked against the manifest when
    one exists. Raises before any tensor byte is read."""
    check_rank_args(rank, world_size)
    manifest: Manifest | None = None
    if is_directory(uri):
        base = uri if _split_query(uri)[0].endswith("/") else uri + "/"
        if local_path(base) is None:
            log.warning(
                "fastshard: %s is a remote directory; its shard manifest cannot be read "
                "by this build, so it resolves to %s",
                base,
                DEFAULT_FILE,
            )
        manifest = read_manifest(base + MANIFEST_NAME)
        uri = base + (manifest.template if manifest is not None else DEFAULT_FILE)
    if not is_template(uri):
        if verify_hashes:
            raise InvalidArgumentError(
                f"verify_manifest_hashes=True needs a per-rank template or a directory with "
                f"a {MANIFEST_NAME}; {uri} is a single file"
            )
        # Whether rank and world_size fit a single file depends on its index
        # (a packed object holds every rank): checked after open (packed.view).
        return Resolved(uri, None, world_size, None)
    if rank is None:
        raise InvalidArgumentError(f"{uri} is a per-rank template: pass rank= (and world_size=)")
    if manifest is None:
        location = manifest_location(uri)
        manifest = read_manifest(location)
        if manifest is None and local_path(location) is None:
            log.warning(
                "fastshard: shard manifest check skipped for remote template %s "
                "(not supported by this build)",
                uri,
            )
    if manifest is not None and manifest.template != uri[len(_dirname(uri)) :]:
        log.warning(
            "fastshard: %s describes template %r, not %r; not using it",
            manifest.path,
            manifest.template,
            uri[len(_dirname(uri)) :],
        )
        manifest = None
    if manifest is not None:
        if world_size is not None and world_size != manifest.world_size:
            raise ShardMismatchError(
                f"{uri}: {manifest.describe()}; asked world_size={world_size}. "
                f"Load with the TP size the files were saved for, or re-save them",
                uri=uri,
            )
        world_size = manifest.world_size
    if world_size is not None and rank >= world_size:
        where = f"{manifest.describe()}" if manifest is not None else f"world_size={world_size}"
        raise ShardMismatchError(
            f"{uri}: rank {rank} does not exist: {where} so ranks are 0..{world_size - 1}", uri=uri
        )
    file_uri = format_rank(uri, rank)
    if manifest is not None:
        _check_file(manifest, file_uri, rank, verify_hashes)
    elif verify_hashes:
        if local_path(file_uri) is None:
            raise UnsupportedError(
                f"verify_manifest_hashes=True is not supported for remote files ({file_uri})"
            )
        raise InvalidArgumentError(
            f"verify_manifest_hashes=True but there is no {MANIFEST_NAME} beside {uri}"
        )
    return Resolved(file_uri, rank, world_size, uri)


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


def _check_file(manifest: Manifest, file_uri: str, rank: int, verify_hashes: bool) -> None:
    entry = manifest.files.get(rank)
    if entry is None:
        raise ShardMismatchError(f"rank {rank} is not listed in {manifest.describe()}")
    path = local_path(file_uri)
    if path is None:  # a local manifest of remote files cannot happen (same directory)
        return
    if not os.path.exists(path):
        raise NotFoundError(
            f"rank {rank}: {file_uri} not found, though {manifest.describe()} lists it",
            uri=file_uri,
        )
    size = os.path.getsize(path)
    if size != entry.get("size"):
        raise ShardMismatchError(
            f"rank {rank}: {file_uri} is {size} bytes, {manifest.describe()} says "
            f"{entry.get('size')}; the file changed or belongs to another save",
            uri=file_uri,
        )
    if verify_hashes:
        digest = sha256_file(path)
        if digest != entry.get("sha256"):
            raise IntegrityError(
                f"rank {rank}: {file_uri} has sha256 {digest}, {manifest.describe()} says "
                f"{entry.get('sha256')}; the file changed since it was saved",
                uri=file_uri,
            )


def name_rank(err: FastshardError, resolved: Resolved) -> FastshardError:
    """A copy of a native open error that also says which rank and template
    the missing file came from (the native message names only the file)."""
    if resolved.rank is None or not isinstance(err, NotFoundError):
        return err
    return NotFoundError(
        f"rank {resolved.rank} of template {resolved.template}: {resolved.uri} not found ({err})",
        uri=resolved.uri,
    )
