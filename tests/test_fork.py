"""A forked child (vLLM and torch.multiprocessing start workers so) must not
use the IO runtime, S3 clients or connection pools it inherited from its
parent: their threads and connection tasks do not exist there. It builds its
own on first use and loads the same bytes, through a Reader opened before the
fork as well as through a new one."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import fastshard._native as native

SIZE = 8 << 20  # eight 1 MiB parts: several connections in the parent's pool


def _load(reader: native.Reader) -> np.ndarray:
    out = np.zeros(SIZE, dtype=np.uint8)
    reader.load([0], [out])
    return out


def _wait(pid: int, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung (it used what it inherited?)")
        time.sleep(0.05)


def test_a_forked_child_loads_from_s3_again(seaweed) -> None:
    data = np.random.default_rng(7).integers(0, 256, size=SIZE, dtype=np.uint8)
    uri = f"s3://{seaweed.bucket}/fork/model.tensors"
    native.write_file(uri, [("blob", 2, 0, "uint8", [SIZE], False)], [data], **seaweed.opts())
    reader = native.Reader(uri, **seaweed.opts())
    # The parent now has a runtime, a cached S3 client and idle pooled
    # connections, all of which the child inherits.
    assert np.array_equal(_load(reader), data)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        # Only numpy here: torch's OpenMP pool is not fork-safe, and that is
        # torch's limit, not the one under test.
        code = 1
        try:
            inherited = _load(reader)
            fresh = _load(native.Reader(uri, **seaweed.opts()))
            code = 0 if np.array_equal(inherited, data) and np.array_equal(fresh, data) else 2
        finally:
            os._exit(code)
    status = _wait(pid, 120)
    assert os.WIFEXITED(status), status
    assert os.WEXITSTATUS(status) == 0, "the child loaded different bytes"
    # The parent's own runtime and client are untouched by the child's.
    assert np.array_equal(_load(reader), data)
