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

from ._layouts.manifest import MANIFEST_FORMAT as MANIFEST_FORMAT
from ._layouts.manifest import MANIFEST_MAX_BYTES as MANIFEST_MAX_BYTES
from ._layouts.manifest import MANIFEST_NAME as MANIFEST_NAME
from ._layouts.manifest import MANIFEST_VERSION as MANIFEST_VERSION
from ._layouts.manifest import Manifest as Manifest
from ._layouts.manifest import format_rank as format_rank
from ._layouts.manifest import is_template as is_template
from ._layouts.manifest import manifest_location as manifest_location
from ._layouts.manifest import read_manifest as read_manifest
from ._layouts.manifest import remove_stale_manifest as remove_stale_manifest
from ._layouts.manifest import sha256_file as sha256_file
from ._layouts.manifest import write_manifest as write_manifest
from ._layouts.resolve import DEFAULT_FILE as DEFAULT_FILE
from ._layouts.resolve import DEFAULT_TEMPLATE as DEFAULT_TEMPLATE
from ._layouts.resolve import Resolved as Resolved
from ._layouts.resolve import check_rank_args as check_rank_args
from ._layouts.resolve import check_single as check_single
from ._layouts.resolve import check_size as check_size
from ._layouts.resolve import log as log
from ._layouts.resolve import name_rank as name_rank
from ._layouts.resolve import resolve as resolve

__all__ = [
    "DEFAULT_FILE",
    "DEFAULT_TEMPLATE",
    "MANIFEST_FORMAT",
    "MANIFEST_MAX_BYTES",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "Manifest",
    "Resolved",
    "check_rank_args",
    "check_single",
    "check_size",
    "format_rank",
    "is_template",
    "manifest_location",
    "name_rank",
    "read_manifest",
    "remove_stale_manifest",
    "resolve",
    "sha256_file",
    "write_manifest",
]
