"""Where a URI points, as the Python layer asks it: thin questions over the
native ``Location`` (rust/location.rs), where a URI is parsed and its
scheme classified, once, for Python and Rust alike.

A URI is a local path (or ``file://path``), ``s3://bucket/key``,
``gs://bucket/key``, or an ``http(s)://`` URL. Only a URL has a query string (a presigned URL's
signature, a credential); in a local path or an S3 key ``?`` is an ordinary
character. An unknown scheme is an ``UnsupportedError``. Children and
siblings are derived by the native type (``Location.child``, ``.sibling``,
``.renamed``), never joined here; templates, manifests and directory
layouts are policy above this (resolve.py).

Every question takes a ``Location`` as well as a string: an open parses its
URI once (``parsed``) and asks the parsed form from there on.
"""

from __future__ import annotations

import os
from typing import Literal

from .._native import Location
from ..errors import FastshardError

Kind = Literal["file", "s3", "gs", "http"]
Uri = str | Location


def parsed(uri: Uri | os.PathLike[str]) -> Location:
    """``uri`` parsed, or as it is when it was parsed already."""
    return uri if isinstance(uri, Location) else Location(uri)


def text(loc: Location) -> str:
    """The URI as given (a URL's query string, a secret, included): for the
    places that keep a string."""
    return loc.head + loc.query


def kind(uri: Uri) -> Kind:
    return parsed(uri).kind


def local_path(uri: Uri) -> str | None:
    """The file system path of a local URI; None for s3:// and URLs."""
    return parsed(uri).path


def is_local(uri: Uri) -> bool:
    return local_path(uri) is not None


def split(uri: Uri) -> tuple[str, str]:
    """(``head``, ``query``): a URL without and with only its ``?…`` part;
    any other URI whole, and ``""``."""
    loc = parsed(uri)
    return loc.head, loc.query


def head(uri: Uri) -> str:
    return parsed(uri).head


def display(uri: Uri) -> str:
    """``uri`` safe to show: no user info, fragment or query string. A URI
    the native type refuses is shown as its error shows it (redacted the
    same way), so a message about a bad URI never leaks one either."""
    try:
        return parsed(uri).display
    except FastshardError as e:
        return e.uri or "<unparsable URI>"


def directory(uri: Uri) -> str:
    """``uri`` up to and including its last ``/``: the folder or prefix it
    is in (a URL's query string stays out: it signs the object, not the
    folder)."""
    h = head(uri)
    return h[: h.rfind("/") + 1]


def name(uri: Uri) -> str:
    """The last component of the path (empty for a directory URI)."""
    h = head(uri)
    return h[h.rfind("/") + 1 :]


def sibling(uri: Uri, other: str) -> str:
    """The object called ``other`` in the folder ``uri`` is in."""
    return parsed(uri).sibling(other).head


def as_directory(uri: str) -> str:
    """``uri`` as a directory or prefix: with one trailing ``/``."""
    return uri if uri.endswith("/") else uri + "/"
