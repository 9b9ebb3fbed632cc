"""Where a URI points: every classification, split and redaction of one,
in one place (a leaf: it imports nothing of fastshard).

A URI is a local path (or ``file://path``), ``s3://bucket/key``, or an
``http(s)://`` URL. Only a URL has a query string (a presigned URL's
signature, a credential); in a local path or an S3 key ``?`` is an ordinary
character. Each function takes the URI as a string and answers one question
about it, as the native ``Location`` type answers it: ``kind`` (``.kind``),
``display`` (``.display``), ``local_path`` (``.path`` of a file),
``head``/``query`` (``.head``/``.query``), ``is_dir`` (``.is_dir``) and
``sibling`` (``.sibling(name)``). Templates, manifests and directory
layouts are policy above this (shard.py).
"""

from __future__ import annotations

import os
from typing import Literal

Kind = Literal["file", "s3", "http"]

_FILE = "file://"
_URLS = ("http://", "https://")


def kind(uri: str) -> Kind:
    """``"file"`` for a path or ``file://``, ``"s3"``, or ``"http"`` for
    http(s) URLs and any other scheme (which the native layer refuses)."""
    if uri.startswith("s3://"):
        return "s3"
    if uri.startswith(_FILE) or "://" not in uri:
        return "file"
    return "http"


def local_path(uri: str) -> str | None:
    """The file system path of a local URI; None for s3:// and URLs."""
    if uri.startswith(_FILE):
        return uri[len(_FILE) :]
    return None if "://" in uri else uri


def is_local(uri: str) -> bool:
    return local_path(uri) is not None


def split(uri: str) -> tuple[str, str]:
    """(``head``, ``query``): a URL without and with only its ``?…`` part;
    any other URI whole, and ``""``."""
    if uri.startswith(_URLS):
        head, sep, tail = uri.partition("?")
        return head, sep + tail
    return uri, ""


def head(uri: str) -> str:
    return split(uri)[0]


def query(uri: str) -> str:
    """``"?…"`` of a URL (a presigned URL's signature among it), else ``""``."""
    return split(uri)[1]


def display(uri: str) -> str:
    """``uri`` safe to show: a URL loses its query string (a presigned
    URL's signature is a credential), fragment and user info; local paths
    and S3 URIs carry none and are shown as they are."""
    if "://" not in uri or uri.startswith("s3://"):
        return uri
    scheme, rest = uri.split("://", 1)
    rest, found, _ = rest.partition("?")
    rest = rest.split("#", 1)[0]
    host, slash, path = rest.partition("/")
    host = host.rpartition("@")[2]
    return f"{scheme}://{host}{slash}{path}" + ("?…" if found else "")


def is_dir(uri: str) -> bool:
    """A directory or prefix: the path ends in ``/``, or names a local
    directory."""
    if head(uri).endswith("/"):
        return True
    path = local_path(uri)
    return path is not None and os.path.isdir(path)


def directory(uri: str) -> str:
    """``uri`` up to and including its last ``/``: the folder or prefix it
    is in (a URL's query string stays out: it signs the object, not the
    folder)."""
    h = head(uri)
    return h[: h.rfind("/") + 1]


def name(uri: str) -> str:
    """The last component of the path (empty for a directory URI)."""
    return head(uri)[len(directory(uri)) :]


def sibling(uri: str, other: str) -> str:
    """The object called ``other`` in the folder ``uri`` is in."""
    return directory(uri) + other


def child(uri: str, other: str) -> str:
    """``other`` inside the directory or prefix ``uri`` (which may lack its
    trailing ``/``); a URL keeps its query string."""
    h, q = split(uri)
    return (h if h.endswith("/") else h + "/") + other + q


def as_directory(uri: str) -> str:
    """``uri`` as a directory or prefix: with one trailing ``/``."""
    return uri if uri.endswith("/") else uri + "/"
