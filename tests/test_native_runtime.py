"""The native module's runtime behaviour: the GIL is released while loads
wait, Ctrl-C cancels a load, and a forked child (as vLLM's workers are) gets
a working IO runtime of its own."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
import torch

import fastshard._native as native

BIG = 512 * 1024 * 1024


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("rt") / "big.tensors")
    data = np.zeros(BIG, dtype=np.uint8)
    data[::4096] = 7
    native.write_file(path, [("blob", 2, 0, "uint8", [BIG], False)], [data])
    return path


def _load(path: str, **kw: object) -> tuple[torch.Tensor, dict[str, float]]:
    r = native.Reader(path)
    out = torch.empty(BIG, dtype=torch.uint8)
    stats = r.load([0], [out.numpy()], **kw)
    return out, stats


def test_gil_is_released_while_a_load_waits(big_file: str) -> None:
    ticks = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=spin)
    t.start()
    before = ticks
    out, stats = _load(big_file, concurrency=1, part_size_bytes=1 << 20)
    during = ticks - before
    stop.set()
    t.join()
    assert int(out.numpy()[::4096].sum()) == 7 * (BIG // 4096)
    # A thread that needs the GIL kept running during the load.
    assert during > 0, stats


def test_ctrl_c_cancels_a_load(big_file: str) -> None:
    r = native.Reader(big_file)
    out = torch.empty(BIG, dtype=torch.uint8)
    finished = False
    timer = threading.Timer(0.02, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        # Tiny serial parts make the load take far longer than 20 ms.
        r.load([0], [out.numpy()], concurrency=1, part_size_bytes=16 * 1024)
        finished = True
        time.sleep(1)  # let a late signal land here rather than elsewhere
    timer.join()
    assert not finished, "the load ran to completion despite Ctrl-C"
    # The reader is still usable after a cancelled load.
    stats = r.load([0], [out.numpy()])
    assert stats["bytes_fetched"] >= BIG


def test_forked_child_gets_a_fresh_runtime(big_file: str) -> None:
    _load(big_file)  # start the parent's runtime first
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        # Only numpy in the child: torch's OpenMP pool is not fork-safe, and
        # that is torch's limit, not the one under test.
        code = 1
        try:
            out, _ = _load(big_file)
            code = 0 if int(out.numpy()[::4096].sum()) == 7 * (BIG // 4096) else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 120
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.05)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
