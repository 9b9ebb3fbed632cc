"""``fastshard bench URI [URI ...]``, the wheel's benchmark of a user's own
objects: a row per loader (GB/s, seconds, CPU seconds, verified against
fastshard's tensors, or why it was skipped), a plot, on a local file and on
an object in SeaweedFS."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from servers import SeaweedFS

import fastshard
from fastshard.benchmark import command, loaders

ROWS = {"fastshard", "tensorizer", "runai", "safetensors", "raw"}


def model() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    sd = {f"layers.{i}.weight": torch.randn(128, 256, generator=g) for i in range(4)}
    sd["norm"] = torch.randn(256, generator=g).to(torch.bfloat16)
    return sd


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bench-user")
    sd = model()
    fastshard.save(sd, root / "m.tensors")
    save_file(sd, str(root / "m.safetensors"))
    return {"tensors": root / "m.tensors", "safetensors": root / "m.safetensors"}


def bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastshard", "bench", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def rows(stdout: str) -> dict[str, str]:
    """loader → its printed row."""
    out = {}
    for line in stdout.splitlines():
        name = line.split(" ", 1)[0]
        if name in ROWS:
            out[name] = line
    return out


def test_a_local_tensorizer_file_gets_a_row_per_loader_and_a_plot(
    files: dict[str, Path], tmp_path: Path
) -> None:
    png = tmp_path / "bench.png"
    done = bench(str(files["tensors"]), "--repeat", "2", "--plot", str(png))
    assert done.returncode == 0, done.stdout + done.stderr
    got = rows(done.stdout)
    assert set(got) == ROWS, done.stdout
    assert got["fastshard"].endswith("reference")
    for name in ("tensorizer", "raw"):  # both read this file; their bytes must agree
        assert got[name].endswith(" yes"), got[name]
        assert "GB/s" not in got[name] and float(got[name].split()[1]) > 0
    assert "skipped: reads local .safetensors files only" in got["safetensors"]
    assert "skipped" in got["runai"]
    assert png.stat().st_size > 0 and f"plot: {png}" in done.stdout


def test_a_local_safetensors_file_without_matplotlib(files: dict[str, Path]) -> None:
    code = (
        "import sys; sys.modules['matplotlib'] = None; from fastshard.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "bench", str(files["safetensors"])],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    got = rows(done.stdout)
    for name in ("safetensors", "runai", "raw"):
        assert got[name].endswith(" yes"), got[name]
    assert "skipped: reads tensorizer files" in got["tensorizer"]
    assert "plot: skipped, matplotlib is not installed" in done.stdout


@pytest.mark.s3
def test_objects_in_seaweedfs(seaweed: SeaweedFS, files: dict[str, Path]) -> None:
    env = {
        "AWS_ENDPOINT_URL": seaweed.endpoint,
        "AWS_ACCESS_KEY_ID": seaweed.access_key,
        "AWS_SECRET_ACCESS_KEY": seaweed.secret_key,
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    uris = {k: seaweed.upload(p, f"bench-user/{p.name}") for k, p in files.items()}
    done = bench(uris["tensors"], "--no-plot", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    got = rows(done.stdout)
    assert set(got) == ROWS, done.stdout
    assert got["fastshard"].endswith("reference")
    for name in ("tensorizer", "raw"):
        assert got[name].endswith(" yes"), got[name]
    done = bench(uris["safetensors"], "--no-plot", "--loaders", "runai,raw", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    got = rows(done.stdout)
    assert set(got) == {"fastshard", "runai", "raw"}, done.stdout
    for name in ("runai", "raw"):
        assert got[name].endswith(" yes"), got[name]


def test_a_loader_whose_tensors_differ_fails_the_run(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def wrong(uri: str) -> Any:
        def load() -> dict[str, torch.Tensor]:
            sd = model()
            sd["norm"][3] += 1
            return sd

        return load

    monkeypatch.setitem(loaders.PREPARE, "safetensors", wrong)
    args = argparse.Namespace(
        uris=[str(files["safetensors"])], repeat=1, loaders="fastshard,safetensors",
        plot="", no_plot=True, progress=False,
    )  # fmt: skip
    assert command.run(args) == command.EXIT_MISMATCH
    got = rows(capsys.readouterr().out)
    assert got["safetensors"].split("  ")[-1].startswith("NO: ")
    assert "norm" in got["safetensors"]


@pytest.mark.parametrize(
    ("loader", "uri", "why"),
    [
        ("tensorizer", "s3://b/m.tensors", None),
        ("tensorizer", "gs://b/m.tensors", "reads tensorizer files from disk, S3 and HTTP only"),
        ("tensorizer", "/m.safetensors", "reads tensorizer files from disk, S3 and HTTP only"),
        ("runai", "http://h/m.safetensors", "reads .safetensors files from disk, S3 and GCS only"),
        ("runai", "/m.tensors", "reads .safetensors files from disk, S3 and GCS only"),
        ("safetensors", "s3://b/m.safetensors", "reads local .safetensors files only"),
        ("raw", "gs://b/m.tensors", "no raw client for gs:// (give its https:// URL)"),
        ("raw", "https://h/m.tensors", None),
        ("fastshard", "gs://b/m.tensors", None),
    ],
)
def test_which_loader_reads_what(loader: str, uri: str, why: str | None) -> None:
    assert loaders.plan(loader, uri) == why


def test_an_unknown_loader_is_refused(files: dict[str, Path]) -> None:
    done = bench(str(files["tensors"]), "--loaders", "fastshard,curl", "--no-plot")
    assert done.returncode == 2 and "curl" in done.stderr, done.stdout + done.stderr


@pytest.mark.parametrize("preset", [["--preset", "local"], ["--preset=network", "--quick"]])
def test_a_preset_says_where_the_presets_went(preset: list[str]) -> None:
    """The presets left the wheel for the lab in benches/: `fastshard bench
    --preset NAME` says so in one line and exits 2, instead of argparse's
    "unrecognized arguments"."""
    done = bench(*preset)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert "python -m fastshard_lab --preset NAME" in done.stderr, done.stderr
    assert "unrecognized" not in done.stderr


def test_a_preset_hint_leaves_other_commands_alone() -> None:
    assert command.asks_for_a_preset(["bench", "--preset", "tp"])
    assert not command.asks_for_a_preset(["bench", "./model.safetensors"])
    assert not command.asks_for_a_preset(["inspect", "--preset"])
    assert not command.asks_for_a_preset([])
