"""What a URI names for one rank: a single file, a per-rank file of a
template or directory checked against the manifest beside it, or a
directory that may hold a Hugging Face checkpoint (hf.py). The account of
templates and manifests is ``fastshard.shard``'s docstring; this is the
policy that the open (source.py) runs, and ``fastshard.shard`` re-exports
its names."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from .._native import Location
from ..errors import (
    FastshardError,
    IntegrityError,
    InvalidArgumentError,
    NotFoundError,
    ShardMismatchError,
    UnsupportedError,
)
from . import location as _location
from .location import Uri
from .location import display as _shown
from .manifest import (
    MANIFEST_NAME,
    Manifest,
    is_template,
    rank_file,
    read_manifest,
    sha256_file,
)

log = logging.getLogger("fastshard")

# What a directory URI without a manifest means (vLLM's tensorizer_dir).
DEFAULT_FILE = "model.tensors"
# What save_sharded writes into a directory URI (vLLM's example name).
DEFAULT_TEMPLATE = "model-rank-%03d.tensors"


def check_rank_args(rank: Any, world_size: Any) -> None:
    if world_size is not None and (
        isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1
    ):
        raise InvalidArgumentError(f"world_size must be a positive int, not {world_size!r}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise InvalidArgumentError(f"rank must be a non-negative int, not {rank!r}")


# -- resolving a load ------------------------------------------------------


@dataclass(frozen=True)
class Resolved:
    # The one file to open, derived from the URI given (parsed once): what
    # the open hands on, so that no layer below parses it again.
    location: Location
    rank: int | None  # None: a single (unsharded) file
    world_size: int | None  # asked for, or the manifest's
    template: str | None
    packed: bool = False  # one packed object holding every rank (packed.py)
    manifest: Manifest | None = None  # the one this rank's file was checked against
    # A directory without a manifest: ``location`` is its DEFAULT_FILE, and
    # where that is missing the directory may hold an HF checkpoint (hf.py).
    directory: Location | None = None

    @property
    def uri(self) -> str:
        """The file's URI as given (a URL's query string included)."""
        return _location.text(self.location)


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
        return Resolved(loc, None, world_size, None, directory=directory)
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
    file_loc = rank_file(loc, rank)
    if manifest is not None:
        _check_file(manifest, file_loc, rank, verify_hashes)
    elif verify_hashes:
        raise InvalidArgumentError(
            f"verify_manifest_hashes=True but there is no {MANIFEST_NAME} beside {uri}"
        )
    return Resolved(file_loc, rank, world_size, uri, manifest=manifest)


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
    _check_size(manifest, file_loc, rank, os.path.getsize(path))
    if verify_hashes:
        digest = sha256_file(path)
        if digest != entry.get("sha256"):
            raise IntegrityError(
                f"rank {rank}: {file_uri} has sha256 {digest}, {manifest.describe()} says "
                f"{entry.get('sha256')}; the file changed since it was saved",
                uri=file_uri,
            )


def _check_size(manifest: Manifest, file: Location, rank: int, size: int) -> None:
    expected = manifest.files[rank].get("size")
    if size != expected:
        raise ShardMismatchError(
            f"rank {rank}: {file.display} is {size} bytes, {manifest.describe()} says "
            f"{expected}; the file changed or belongs to another save",
            uri=file.display,
        )


def check_size(resolved: Resolved, file_size: int) -> None:
    """After the native open: the opened file's size against the manifest
    (local files were checked before the open, remote ones only now)."""
    if resolved.manifest is not None and resolved.rank is not None:
        _check_size(resolved.manifest, resolved.location, resolved.rank, file_size)


def name_rank(err: FastshardError, resolved: Resolved) -> FastshardError:
    """A copy of a native open error that also says which rank and template
    the missing file came from (the native message names only the file)."""
    if resolved.rank is None or not isinstance(err, NotFoundError):
        return err
    listed = f", though {resolved.manifest.describe()} lists it" if resolved.manifest else ""
    shown = resolved.location.display
    return NotFoundError(
        f"rank {resolved.rank} of template {_shown(resolved.template or '')}: {shown} "
        f"not found{listed} ({err})",
        uri=shown,
    )
