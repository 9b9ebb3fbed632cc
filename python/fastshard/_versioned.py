"""The JSON documents fastshard writes beside weights (the shard manifest,
vLLM's artifacts index): one object that names its format and version, so
that a reader refuses a document it does not know instead of misreading it.
"""

from __future__ import annotations

import json
from typing import Any


def dumps(form: str, version: int, fields: dict[str, Any]) -> bytes:
    """The document of ``form`` at ``version`` holding ``fields``."""
    doc = {"format": form, "version": version, **fields}
    return (json.dumps(doc, indent=1) + "\n").encode()


def loads(data: bytes, form: str, version: int) -> dict[str, Any]:
    """The fields of a document of ``form`` at ``version``; ValueError for
    anything else (not JSON, not an object, another format or version)."""
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError(f"not a JSON object but {type(doc).__name__}")
    if doc.get("format") != form or doc.get("version") != version:
        raise ValueError(f"format {doc.get('format')!r} version {doc.get('version')!r}")
    return doc
