"""A served model's non-weight files (config, generation config, tokenizer,
``*.py``): copied beside the weights when serializing, listed in
``fastshard-artifacts.json`` there, and fetched back into a local cache by
``fastshard serve`` (vLLM needs them on local disk; object stores cannot be
listed through fastshard, so the index says what to fetch; a Hugging Face
repo copied as it is has no index, and its well-known file names are tried).

The cache is per node: one directory per prefix under ``cache_root()``,
filled under a file lock, and a file already there with the listed size and
SHA-256 is not fetched again, so the processes of one node (and later
starts) fetch each artifact once.

Imports neither torch nor vLLM: ``fastshard serve`` runs before vLLM starts.
"""

from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .. import _core
from .._core import location as _location
from ..errors import IntegrityError, InvalidArgumentError, NotFoundError
from ..shard import MANIFEST_NAME

INDEX_NAME = "fastshard-artifacts.json"
INDEX_FORMAT = "fastshard-artifacts"
INDEX_VERSION = 1
MAX_ARTIFACT_BYTES = 256 << 20  # tokenizers are tens of MB at most
CACHE_ENV = "FASTSHARD_CACHE_DIR"

# The non-weight files of a Hugging Face model repo that vLLM may read
# (config, generation config, every tokenizer flavour, chat templates,
# processors): what a repo without fastshard's index is fetched for.
HF_ARTIFACTS = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
)

# What vLLM's serialize_extra_artifacts leaves out, plus weights of any kind
# and fastshard's own files: everything else at the top of the model
# directory is an artifact vLLM may need to serve the model.
_NOT_ARTIFACTS = (
    "*.pt",
    "*.pth",
    "*.safetensors",
    "*.bin",
    "*.tensors",
    "*.cache",
    "*.gitattributes",
    "*.md",
    "*.lock",
    MANIFEST_NAME,
    INDEX_NAME,
)


def artifact_names(names: list[str]) -> list[str]:
    """The file names among ``names`` that are artifacts (not weights)."""
    return sorted(n for n in names if not any(fnmatch.fnmatch(n, p) for p in _NOT_ARTIFACTS))


def model_directory(model: str, revision: str | None = None) -> Path:
    """The local directory of vLLM's ``--model``: itself, or its snapshot in
    the Hugging Face cache (already there: vLLM loaded the model from it)."""
    if os.path.isdir(model):
        return Path(model)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model, revision=revision, local_files_only=True))


def copy_artifacts(source: Path, dest_dir: str, opts: dict[str, Any]) -> list[str]:
    """Copy the artifacts at the top of ``source`` into ``dest_dir`` (a local
    directory or a prefix fastshard can write to, ending in "/") and write the index
    listing them; returns their names."""
    dest = _location.parsed(dest_dir)
    names = artifact_names([p.name for p in source.iterdir() if p.is_file()])
    files = []
    for name in names:
        data = (source / name).read_bytes()
        _core.write_object(dest.child(name), data, **opts)
        files.append({"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    index = _core.versioned.dumps(INDEX_FORMAT, INDEX_VERSION, {"files": files})
    _core.write_object(dest.child(INDEX_NAME), index, **opts)
    return names


def safe_name(name: object) -> str:
    """``name`` if it is a plain file name that stays inside a directory."""
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\0" in name
        or os.path.isabs(name)
    ):
        raise InvalidArgumentError(f"artifact name {name!r} would escape the cache directory")
    return name


def cache_root() -> Path:
    """$FASTSHARD_CACHE_DIR, else $XDG_CACHE_HOME/fastshard (~/.cache/fastshard)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fastshard"


def cache_dir_for(uri: str, root: Path | None = None) -> Path:
    """One cache directory per prefix, named after it."""
    digest = hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:16]
    return (root or cache_root()) / "serve" / digest


@contextmanager
def _locked(cache_dir: Path) -> Iterator[None]:
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(cache_dir.parent / f".{cache_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _matches(path: Path, size: int, digest: str) -> bool:
    try:
        if path.stat().st_size != size:
            return False
        return hashlib.sha256(path.read_bytes()).hexdigest() == digest
    except OSError:
        return False


def _read_index(prefix: str, opts: dict[str, Any]) -> list[tuple[str, int, str]] | None:
    """``(name, size, sha256)`` of every artifact ``prefix``'s index lists,
    every name checked to stay inside a directory; None without an index."""
    raw = _core.read_object(prefix + INDEX_NAME, max_bytes=4 << 20, **opts)
    if raw is None:
        return None
    try:
        index = _core.versioned.loads(raw, INDEX_FORMAT, INDEX_VERSION)
        entries = [(e["name"], int(e["size"]), str(e["sha256"])) for e in index["files"]]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise InvalidArgumentError(f"unreadable {prefix}{INDEX_NAME}: {e}") from e
    return [(safe_name(name), size, digest) for name, size, digest in entries]


def _fetch_hf_files(prefix: str, cache_dir: Path, opts: dict[str, Any]) -> list[Path]:
    """A Hugging Face repo copied to the store as it is has no index: fetch
    the files such a repo holds besides its weights (HF_ARTIFACTS; those
    missing skipped, config.json required). With nothing to check them
    against, they are fetched again on every start (they are small)."""
    with _locked(cache_dir):
        cache_dir.mkdir(exist_ok=True)
        out = []
        for name in HF_ARTIFACTS:
            data = _core.read_object(prefix + name, max_bytes=MAX_ARTIFACT_BYTES, **opts)
            if data is None:
                if name == "config.json":
                    raise NotFoundError(
                        f"{prefix} has neither {INDEX_NAME} (serialize the model with "
                        "fastshard, which writes it) nor config.json (a Hugging Face repo)",
                        uri=prefix + INDEX_NAME,
                    )
                continue
            target = cache_dir / name
            tmp = target.with_name(f".{name}.part")
            tmp.write_bytes(data)
            os.replace(tmp, target)
            out.append(target)
        return out


def fetch_artifacts(prefix: str, cache_dir: Path, opts: dict[str, Any]) -> list[Path]:
    """Fetch the artifacts listed in ``prefix``'s index into ``cache_dir``
    (under its lock), each checked against its size and SHA-256, skipping
    those already there; returns their paths. Every name is checked before
    anything is written. A prefix without an index that holds a Hugging
    Face repo gets its known non-weight files."""
    prefix = _location.as_directory(prefix)
    entries = _read_index(prefix, opts)
    if entries is None:
        return _fetch_hf_files(prefix, cache_dir, opts)
    with _locked(cache_dir):
        cache_dir.mkdir(exist_ok=True)
        root = cache_dir.resolve()
        out = []
        for name, size, digest in entries:
            target = (root / name).resolve()
            if target.parent != root:  # a symlink planted in the cache, for one
                raise InvalidArgumentError(f"artifact {name!r} would escape {root}")
            if not _matches(target, size, digest):
                _fetch_one(prefix, name, target, size, digest, opts)
            out.append(target)
        return out


def _fetch_one(
    prefix: str, name: str, target: Path, size: int, digest: str, opts: dict[str, Any]
) -> None:
    data = _core.read_object(prefix + name, max_bytes=MAX_ARTIFACT_BYTES, **opts)
    if data is None:
        raise NotFoundError(f"{prefix}{name} is listed but missing", uri=prefix + name)
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        raise IntegrityError(f"{prefix}{name} differs from its entry in {INDEX_NAME}")
    tmp = target.with_name(f".{name}.part")
    tmp.write_bytes(data)
    os.replace(tmp, target)
