"""Where a URI points, as the Python layer asks it: thin questions over the
native ``Location`` (rust/location.rs), where a URI is parsed and its
scheme classified, once, for Python and Rust alike.

A URI is a local path (or ``file://path``), ``s3://bucket/key``,
``gs://bucket/key``, or an ``http(s)://`` URL. Only a URL has a query string (a presigned URL's
signature, a credential); in a local path or an S3 key ``?`` is an ordinary
character. An unknown scheme is an ``UnsupportedError``. What is built from
the parts here (folders, children, siblings) is string work on the
``head`` the native type returns; templates, manifests and directory
layouts are policy above this (shard.py).
"""

from __future__ import annotations

from typing import Literal

from .._native import Location
from ..errors import FastshardError

Kind = Literal["file", "s3", "gs", "http"]


def kind(uri: str) -> Kind:
    return Location(uri).kind


def local_path(uri: str) -> str | None:
    """The file system path of a local URI; None for s3:// and URLs."""
    return Location(uri).path


def is_local(uri: str) -> bool:
    return local_path(uri) is not None


def split(uri: str) -> tuple[str, str]:
    """(``head``, ``query``): a URL without and with only its ``?…`` part;
    any other URI whole, and ``""``."""
    loc = Location(uri)
    return loc.head, loc.query


def head(uri: str) -> str:
    return Location(uri).head


def query(uri: str) -> str:
    """``"?…"`` of a URL (a presigned URL's signature among it), else ``""``."""
    return Location(uri).query


def display(uri: str) -> str:
    """``uri`` safe to show: no user info, fragment or query string. A URI
    the native type refuses is shown as its error shows it (redacted the
    same way), so a message about a bad URI never leaks one either."""
    try:
        return Location(uri).display
    except FastshardError as e:
        return e.uri or "<unparsable URI>"


def is_dir(uri: str) -> bool:
    """A directory or prefix: the path ends in ``/``, or names a local
    directory."""
    return Location(uri).is_dir


def directory(uri: str) -> str:
    """``uri`` up to and including its last ``/``: the folder or prefix it
    is in (a URL's query string stays out: it signs the object, not the
    folder)."""
    h = head(uri)
    return h[: h.rfind("/") + 1]


def name(uri: str) -> str:
    """The last component of the path (empty for a directory URI)."""
    h = head(uri)
    return h[h.rfind("/") + 1 :]


def sibling(uri: str, other: str) -> str:
    """The object called ``other`` in the folder ``uri`` is in."""
    return Location(uri).sibling(other).head


def child(uri: str, other: str) -> str:
    """``other`` inside the directory or prefix ``uri`` (which may lack its
    trailing ``/``); a URL keeps its query string."""
    h, q = split(uri)
    return (h if h.endswith("/") else h + "/") + other + q


def as_directory(uri: str) -> str:
    """``uri`` as a directory or prefix: with one trailing ``/``."""
    return uri if uri.endswith("/") else uri + "/"
