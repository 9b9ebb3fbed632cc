"""No secret reaches anything a user or a log collector sees: every surface
(exceptions with their tracebacks, reprs, log records at DEBUG, the progress
bar, CLI output) of loads that succeed and loads that fail is collected and
grepped for every secret: an S3 secret key, a presigned URL's signature, an
encryption passphrase and a raw key (as bytes, hex and base64)."""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import random_tensor

import fastshard

pytestmark = pytest.mark.s3

PASSPHRASE = "pass-phrase-Secret-8Kq"
RAW_KEY = bytes(range(100, 132))
S3_WRONG = "wrong-s3-Secret-Mz4"
TOOLS = ("botocore", "boto3", "s3transfer", "urllib3")


def _exc_text(err: BaseException) -> str:
    return "".join(traceback.format_exception(err)) + repr(err) + repr(vars(err))


def test_no_secret_on_any_surface(
    seaweed: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, fastshard's and the libraries'
    sd = {f"w{i}": random_tensor(torch.float32, (64, 64), i) for i in range(4)}
    by_pass = fastshard.EncryptionKey.from_passphrase(PASSPHRASE, opslimit=1, memlimit=8192)
    by_key = fastshard.EncryptionKey.from_bytes(RAW_KEY)
    seen: list[str] = [repr(by_pass), repr(by_key), str(by_pass), str(by_key)]

    uris = {}
    for name, key in (("pass", by_pass), ("key", by_key)):
        uris[name] = f"s3://{seaweed.bucket}/secrets/{name}.tensors"
        fastshard.save(sd, uris[name], encryption=key, **seaweed.opts())

    # Loads that work, with a progress bar and the INFO line.
    for name, key in (("pass", by_pass), ("key", by_key)):
        opts = seaweed.opts(encryption=key, progress=True, verify_hash=True)
        with fastshard.open(uris[name], **opts) as f:
            seen.append(repr(f))
            f.load_state_dict()
            seen += [repr(f.stats), str(f.stats)]
    url = seaweed.presign(uris["key"])
    signature = url.split("X-Amz-Signature=")[1].split("&")[0]
    with fastshard.open(url, encryption=by_key, progress=True) as f:
        seen.append(repr(f))
        f.load_state_dict()

    # Loads that fail: wrong passphrase, wrong raw key, wrong S3 secret,
    # a presigned URL to a missing object.
    failures = [
        lambda: fastshard.load_state_dict(
            uris["pass"],
            encryption=fastshard.EncryptionKey.from_passphrase("not-" + PASSPHRASE),
            **seaweed.opts(),
        ),
        lambda: fastshard.load_state_dict(
            uris["key"],
            encryption=fastshard.EncryptionKey.from_bytes(RAW_KEY[::-1]),
            **seaweed.opts(),
        ),  # fmt: skip
        lambda: fastshard.open(uris["key"], **seaweed.opts(s3_secret_access_key=S3_WRONG)),
        lambda: fastshard.open(url.replace("/key.tensors", "/missing.tensors")),
    ]
    for fail in failures:
        with pytest.raises(fastshard.FastshardError) as info:
            fail()
        seen.append(_exc_text(info.value))

    # The CLI, with the key from a file and the passphrase from a variable.
    keyfile = tmp_path / "key.bin"
    keyfile.write_bytes(RAW_KEY)
    local = tmp_path / "local.tensors"
    fastshard.save(sd, local, encryption=by_pass)
    env = {**os.environ, "FS_TEST_PASS": PASSPHRASE}
    for args in (
        ["verify", str(local), "--passphrase-env", "FS_TEST_PASS"],
        ["verify", str(local), "--key-file", str(keyfile)],  # the wrong key for this file
        ["verify", url, "--key-file", str(keyfile), "--progress"],
    ):
        out = subprocess.run(
            [sys.executable, "-m", "fastshard", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        seen += [out.stdout, out.stderr]

    captured = capfd.readouterr()
    # Every log record but those of boto3, which this test uses to upload
    # and presign (botocore logs the signature it computes at DEBUG).
    ours = [r for r in caplog.records if not r.name.startswith(TOOLS)]
    seen += [captured.out, captured.err]
    seen += [logging.Formatter().format(r) + repr(r.args) for r in ours]
    text = "\n".join(seen)
    assert any(r.name == "fastshard" for r in ours)  # the INFO lines reached the grep
    assert len(text) > 2000
    secrets = {
        "passphrase": PASSPHRASE,
        "raw key (hex)": RAW_KEY.hex(),
        "raw key (base64)": base64.b64encode(RAW_KEY).decode(),
        "raw key (repr)": repr(RAW_KEY)[2:-1],
        "S3 secret": seaweed.secret_key,
        "wrong S3 secret": S3_WRONG,
        "presigned signature": signature,
    }
    leaked = [what for what, s in secrets.items() if s in text]
    assert not leaked, f"secrets in user-visible output: {leaked}"
