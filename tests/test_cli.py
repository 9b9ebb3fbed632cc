"""``python -m fastshard inspect|verify`` as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import random_tensor
from tensorizer_files import layout, patch

SD = {
    "embed.weight": random_tensor(torch.float32, (8, 4), 1),
    "layers.0.bias": random_tensor(torch.bfloat16, (4,), 2),
    "steps": torch.tensor(5, dtype=torch.int64),
    "ünï": torch.zeros(0, 3),
    "mask": torch.tensor([True, False, True]),
}


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "fastshard", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def good(tz_write):
    return tz_write(SD, "good.tensors")


def test_inspect_json(good):
    out = run("inspect", good, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["uri"] == str(good)
    assert doc["version"] == 2
    assert doc["file_size"] == good.stat().st_size
    assert doc["count"] == len(SD)
    assert doc["encrypted"] is False
    assert [t["name"] for t in doc["tensors"]] == list(SD)
    by_name = {t["name"]: t for t in doc["tensors"]}
    assert by_name["embed.weight"]["dtype"] == "float32"
    assert by_name["embed.weight"]["shape"] == [8, 4]
    assert by_name["embed.weight"]["nbytes"] == 128
    assert by_name["layers.0.bias"]["dtype"] == "bfloat16"
    assert by_name["steps"]["shape"] == []
    assert by_name["ünï"]["nbytes"] == 0
    assert by_name["mask"]["tensor_type"] == "state_dict"
    offsets = [e["data_offset"] for e in layout(good)]
    assert [t["offset"] for t in doc["tensors"]] == offsets
    assert doc["tensor_bytes"] == sum(t.numel() * t.element_size() for t in SD.values())


def test_inspect_table(good):
    out = run("inspect", good)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "version 2" in lines[0] and f"{len(SD)} tensors" in lines[0]
    assert lines[1].split() == ["name", "dtype", "shape", "bytes", "offset"]
    row = next(line for line in lines if line.startswith("embed.weight"))
    assert row.split() == [
        "embed.weight",
        "float32",
        "(8,",
        "4)",
        "128",
        str(layout(good)[0]["data_offset"]),
    ]
    assert any(line.startswith("ünï") for line in lines)


def test_verify_good(good):
    out = run("verify", good)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OK")


def test_verify_corrupted_reports_every_bad_tensor(good):
    entries = layout(good)
    patch(good, entries[0]["data_offset"] + 5, b"\x01\x02")
    patch(good, entries[4]["data_offset"], b"\x07")
    # Small batches: every tensor in its own, plus the default single batch.
    for extra in ([], ["--batch-bytes", "16"]):
        out = run("verify", good, *extra)
        assert out.returncode == 1, out.stdout + out.stderr
        assert "embed.weight" in out.stderr and "mask" in out.stderr
        assert "layers.0.bias" not in out.stderr
        assert "2 of 5" in out.stdout


def test_verify_on_a_safetensors_file_checks_structure_and_bounds(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "m.safetensors"
    save_file({"w": torch.ones(3)}, str(path))
    out = run("verify", path)
    assert out.returncode == 0, out.stderr
    assert "safetensors files store no hashes, so structure and bounds were checked" in out.stdout
    assert "verify_hash" not in out.stdout + out.stderr  # a keyword the CLI user never typed


def test_errors_exit_2(tmp_path, good):
    out = run("verify", tmp_path / "missing.tensors")
    assert out.returncode == 2
    assert "NotFoundError" in out.stderr
    junk = tmp_path / "junk.tensors"
    junk.write_bytes(b"not a tensorizer file at all" * 10)
    for cmd in ("inspect", "verify"):
        out = run(cmd, junk)
        assert out.returncode == 2
        assert "FormatError" in out.stderr
    assert run().returncode == 2  # argparse usage error


def test_inspect_into_a_closed_pipe_exits_quietly(tmp_path):
    import fastshard

    # Enough tensors that the table overflows the pipe's buffer.
    path = tmp_path / "many.tensors"
    fastshard.save({f"t{i:05d}": torch.zeros(1) for i in range(3000)}, path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastshard", "inspect", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(100)  # like `| head -c 100`
    proc.stdout.close()
    rc = proc.wait(timeout=120)
    err = proc.stderr.read().decode()
    assert rc == 0, err
    assert "BrokenPipe" not in err


def test_verify_encrypted_with_a_key_file_or_a_passphrase_variable(tmp_path):
    """Keys reach the CLI only through a file or an environment variable (a
    command-line value would show in the process list), and never its output."""
    import os

    from tensorizer import EncryptionParams, TensorSerializer

    sd = {k: v for k, v in SD.items() if v.numel()}  # tensorizer cannot encrypt empty tensors
    key = bytes(range(32))
    keyfile = tmp_path / "key.bin"
    keyfile.write_bytes(key)
    by_key = tmp_path / "by-key.tensors"
    ser = TensorSerializer(str(by_key), encryption=EncryptionParams(key=key))
    ser.write_state_dict(sd)
    ser.close()
    by_pass = tmp_path / "by-pass.tensors"
    phrase = "cli-passphrase-Zq9"
    enc = EncryptionParams.from_string(phrase, opslimit=1, memlimit=8192)
    ser = TensorSerializer(str(by_pass), encryption=enc)
    ser.write_state_dict(sd)
    ser.close()

    out = run("verify", by_key, "--key-file", keyfile)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OK") and f"{len(sd)} tensors" in out.stdout

    os.environ["FASTSHARD_TEST_PASSPHRASE"] = phrase
    try:
        out = run("verify", by_pass, "--passphrase-env", "FASTSHARD_TEST_PASSPHRASE")
        assert out.returncode == 0, out.stderr
        os.environ["FASTSHARD_TEST_PASSPHRASE"] = "not-the-passphrase-Kx2"
        wrong = run("verify", by_pass, "--passphrase-env", "FASTSHARD_TEST_PASSPHRASE")
    finally:
        del os.environ["FASTSHARD_TEST_PASSPHRASE"]
    assert wrong.returncode != 0 and not wrong.stdout.startswith("OK")
    assert "not-the-passphrase-Kx2" not in wrong.stdout + wrong.stderr
    assert phrase not in out.stdout + out.stderr

    nokey = run("verify", by_key)
    assert nokey.returncode == 2 and "encrypt" in nokey.stderr.lower()
    unset = run("verify", by_key, "--passphrase-env", "FASTSHARD_NO_SUCH_VARIABLE")
    assert unset.returncode == 2 and "FASTSHARD_NO_SUCH_VARIABLE" in unset.stderr
    both = run("verify", by_key, "--key-file", keyfile, "--passphrase-env", "X")
    assert both.returncode == 2  # argparse: one key source at most
