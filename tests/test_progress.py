"""What a user sees of a load: the progress bar (on when asked, or for big
loads on a terminal; off otherwise), the one INFO line on the "fastshard"
logger, and the per-phase timings of LoadStats; none of them may show a
presigned URL's signature."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from servers import Nginx

import fastshard
from fastshard._engine import progress as _progress

MiB = 1 << 20
SECRET = "S3cr3tSignatureValue"


@pytest.fixture
def model_file(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    sd = {f"w{i}": torch.randn(512, 512) for i in range(8)}  # 8 MiB
    path = tmp_path / "progress-model.tensors"
    fastshard.save(sd, path)
    return path, sd


@pytest.fixture
def bars(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every Bar's final state: whether shown, what it counted, its total."""
    seen: list[dict[str, Any]] = []
    exit_ = _progress.Bar.__exit__

    def record(self: _progress.Bar, *exc: Any) -> None:
        exit_(self, *exc)
        bar = self._bar
        seen.append(
            {
                "shown": bar is not None,
                "n": bar.n if bar is not None else None,
                "counted": self.counter.value,
                "total": self.total,
            }
        )

    monkeypatch.setattr(_progress.Bar, "__exit__", record)
    return seen


def test_progress_true_draws_a_bar_that_reaches_the_total(
    model_file: tuple[Path, dict[str, torch.Tensor]],
    bars: list[dict[str, Any]],
    capfd: pytest.CaptureFixture[str],
) -> None:
    path, sd = model_file
    out = fastshard.load_state_dict(path, progress=True, part_size_bytes=1 * MiB)
    assert torch.equal(out["w3"], sd["w3"])
    err = capfd.readouterr().err
    assert "progress-model.tensors" in err and "B/s" in err
    total = sum(t.numel() * 4 for t in sd.values())
    assert bars == [{"shown": True, "n": total, "counted": bars[0]["counted"], "total": total}]
    # The counter saw every byte landed (record headers too).
    assert bars[0]["counted"] >= total


def test_progress_off_and_auto(
    model_file: tuple[Path, dict[str, torch.Tensor]],
    bars: list[dict[str, Any]],
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, _ = model_file
    fastshard.load_state_dict(path, progress=False)
    # Auto: not a terminal (pytest captures stderr), so no bar even when big.
    monkeypatch.setattr(_progress, "AUTO_THRESHOLD", 0)
    fastshard.load_state_dict(path)
    assert "B/s" not in capfd.readouterr().err
    assert [b["shown"] for b in bars] == [False, False]
    # A terminal and a load above the threshold: a bar.
    monkeypatch.setattr(_progress.sys.stderr, "isatty", lambda: True, raising=False)
    model = torch.nn.Module()
    for i in range(8):
        model.register_buffer(f"w{i}", torch.zeros(512, 512, dtype=torch.bfloat16))
    fastshard.load(model, path)
    assert bars[-1]["shown"] and bars[-1]["n"] == bars[-1]["total"] == 8 * 512 * 512 * 4
    with pytest.raises(fastshard.InvalidArgumentError, match="progress"):
        fastshard.open(path, progress="yes")
    with pytest.raises(fastshard.UnsupportedError, match="progress"):
        fastshard.save({"x": torch.zeros(1)}, path.with_name("x.tensors"), progress=True)


def test_one_info_line_per_load_and_phase_timings(
    model_file: tuple[Path, dict[str, torch.Tensor]], caplog: pytest.LogCaptureFixture
) -> None:
    path, sd = model_file
    model = torch.nn.Module()
    for name, t in sd.items():
        model.register_buffer(name, torch.zeros(t.shape, dtype=torch.bfloat16))
    with caplog.at_level(logging.INFO, logger="fastshard"):
        stats = fastshard.load(model, path, max_host_bytes=4 * MiB)
    lines = [r.getMessage() for r in caplog.records if r.name == "fastshard"]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"loaded {path}: {stats.bytes_fetched} bytes in ")
    assert "GB/s" in lines[0] and "0 retries" in lines[0]
    assert stats.discovery_seconds > 0 and stats.fetch_seconds > 0
    assert stats.copy_seconds > 0  # a bf16 model: every tensor staged and cast
    assert 0 <= stats.plan_seconds < stats.seconds
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fastshard"):
        stats = fastshard.load(model.float(), path)
    assert stats.copy_seconds == 0 and stats.bytes_staged == 0  # filled in place


def test_no_secret_in_bar_or_log(
    nginx: Nginx,
    model_file: tuple[Path, dict[str, torch.Tensor]],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    path, sd = model_file
    url = nginx.publish(path, "progress/secret-model.tensors")
    signed = f"{url}?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature={SECRET}"
    with caplog.at_level(logging.DEBUG, logger="fastshard"):
        out = fastshard.load_state_dict(signed, progress=True)
    assert torch.equal(out["w0"], sd["w0"])
    err = capfd.readouterr().err
    assert "secret-model.tensors" in err
    assert SECRET not in err and SECRET not in caplog.text
    assert "AKIAEXAMPLE" not in err and "AKIAEXAMPLE" not in caplog.text
    assert "secret-model.tensors" in caplog.text
