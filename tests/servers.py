"""The test servers (SeaweedFS, nginx, a Range-ignoring server) live in the
benchmark lab (fastshard_lab, in benches/), whose presets use them too;
tests import them from here, with a pytest-flavoured ``require_binary``."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from fastshard_lab.servers import (  # noqa: F401 (re-exported for the tests)
    ACCESS_KEY,
    BUCKET,
    PUBLIC_BUCKET,
    SECRET_KEY,
    FakeGcs,
    MissingBinary,
    MotoS3,
    Nginx,
    RcloneS3,
    S3Store,
    SeaweedFS,
    find_binary,
    find_fake_gcs,
    free_port,
    no_range_server,
    spawn,
    stop,
    wait_http,
)
from fastshard_lab.shaper import find_shaper


def require_binary(name: str, *candidates: str) -> str:
    """Path of a server binary. Missing: a failure under CI (CI=true), since
    CI must run these tests; a skip on a developer machine."""
    return _required(lambda: find_binary(name, *candidates))


def require_fake_gcs() -> str:
    """The GCS emulator's binary; missing, as ``require_binary``."""
    return _required(find_fake_gcs)


def require_shaper() -> str:
    """The shaping proxy's binary (``make test`` runs ``make shaper`` before
    pytest); missing, as ``require_binary``."""
    return _required(find_shaper)


def _required(find: Callable[[], str]) -> str:
    try:
        return find()
    except MissingBinary as e:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(str(e), pytrace=False)
        pytest.skip(str(e))
