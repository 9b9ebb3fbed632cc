"""The test servers' own contract: a missing server binary fails the run
under CI (CI=true) instead of silently skipping the S3/HTTP tests."""

from __future__ import annotations

import pytest
from servers import require_binary


def test_missing_binary_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="not installed"):
        require_binary("fastshard-no-such-server", "/nonexistent/bin/server")


def test_missing_binary_skips_elsewhere(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        require_binary("fastshard-no-such-server")


def test_present_binary_is_found(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert require_binary("sh").endswith("sh")
