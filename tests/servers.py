"""The test servers (SeaweedFS, nginx, a Range-ignoring server) live in the
package, where ``fastshard bench`` uses them too; tests import them from
here, with a pytest-flavoured ``require_binary``."""

from __future__ import annotations

import os

import pytest

from fastshard.bench.servers import (  # noqa: F401 (re-exported for the tests)
    ACCESS_KEY,
    BUCKET,
    PUBLIC_BUCKET,
    SECRET_KEY,
    MissingBinary,
    Nginx,
    SeaweedFS,
    find_binary,
    free_port,
    no_range_server,
    spawn,
    stop,
    wait_http,
)


def require_binary(name: str, *candidates: str) -> str:
    """Path of a server binary. Missing: a failure under CI (CI=true), since
    CI must run these tests; a skip on a developer machine."""
    try:
        return find_binary(name, *candidates)
    except MissingBinary as e:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(str(e), pytrace=False)
        pytest.skip(str(e))
