"""Encrypted files over S3 (SeaweedFS), both libraries. Kept apart from
test_encryption.py so it sorts after test_remote_credentials.py: that file
uploads to the "public" bucket, which SeaweedFS refused (InternalError on
PutObject) when other uploads had reached the server first."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from conftest import assert_bit_equal, random_tensor
from test_encryption import (
    FAST,
    MIB,
    SECRETS,
    _assert_sd,
    _state_dict,
    _tz_params,
    _tz_read,
    _tz_write,
)

import fastshard
from fastshard import EncryptionKey


@pytest.mark.s3
def test_s3_round_trip_both_libraries(seaweed, tmp_path):
    sd = _state_dict()
    key = EncryptionKey.from_passphrase("s3 secret", **FAST)
    uri = f"s3://{seaweed.bucket}/enc/fs.tensors"
    fastshard.save(sd, uri, encryption=key, **seaweed.opts())
    out = fastshard.load_state_dict(uri, encryption=key, verify_hash=True, **seaweed.opts())
    _assert_sd(out, sd)
    local = tmp_path / "copy.tensors"
    local.write_bytes(seaweed.get(uri))
    _assert_sd(_tz_read(local, _tz_params("passphrase", "s3 secret")[1]), sd)
    # And a tensorizer-written file uploaded to S3.
    tz = _tz_write(sd, tmp_path / "tz.tensors", _tz_params("key", SECRETS["key"])[0])
    uri2 = seaweed.upload(tz, "enc/tz.tensors")
    out = fastshard.load_state_dict(
        uri2, encryption=EncryptionKey.from_bytes(SECRETS["key"]), **seaweed.opts()
    )
    _assert_sd(out, sd)


@pytest.mark.s3
def test_s3_sharded_manifest_hashes_the_encrypted_bytes(seaweed):
    """save_sharded to S3 hashes each file while uploading it: for an
    encrypted file that must be the sealed bytes, not the plaintext."""
    key = EncryptionKey.random()
    states = [{"w": random_tensor(torch.float32, (MIB // 2 + 3,), r)} for r in range(2)]
    template = f"s3://{seaweed.bucket}/enc-sharded/model-rank-%03d.tensors"
    uris = fastshard.save_sharded(states, template, encryption=key, **seaweed.opts())
    doc = json.loads(seaweed.get(f"s3://{seaweed.bucket}/enc-sharded/fastshard-manifest.json"))
    for entry, uri, state in zip(doc["files"], uris, states, strict=True):
        assert entry["sha256"] == hashlib.sha256(seaweed.get(uri)).hexdigest()
        out = fastshard.load_state_dict(uri, encryption=key, verify_hash=True, **seaweed.opts())
        assert_bit_equal(out["w"], state["w"])
