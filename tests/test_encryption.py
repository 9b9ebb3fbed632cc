"""Encrypted files, both ways against the real tensorizer 2.12.1: raw keys,
passphrases (Argon2id), key files, wrong keys, tampering, hashes, S3."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_bit_equal, random_tensor, small_net
from tensorizer_files import layout, patch

import fastshard
from fastshard import EncryptionKey

# Cheap Argon2id costs (libsodium's MIN/INTERACTIVE presets are 1/8 KiB and
# 2/64 MiB): the file stores them, so reading needs no parameters.
FAST = {"opslimit": 2, "memlimit": 64 << 10}
MIB = 1 << 20


def _tz_params(kind: str, secret: Any) -> tuple[Any, Any]:
    from tensorizer import DecryptionParams, EncryptionParams

    if kind == "key":
        return EncryptionParams(key=secret), DecryptionParams.from_key(secret)
    enc = EncryptionParams.from_string(secret, opslimit=FAST["opslimit"], memlimit=FAST["memlimit"])
    return enc, DecryptionParams.from_string(secret)


def _fs_key(kind: str, secret: Any) -> EncryptionKey:
    if kind == "key":
        return EncryptionKey.from_bytes(secret)
    return EncryptionKey.from_passphrase(secret, **FAST)


SECRETS = {"key": bytes(range(32)), "passphrase": "correct horse battery staple"}


def _state_dict() -> dict[str, torch.Tensor]:
    return {
        # 5 MiB + 3 bytes: three 2 MiB chunks, the last one short.
        "big": random_tensor(torch.uint8, (5 * MIB + 3,), 1),
        "exact": random_tensor(torch.float32, (2 * MIB // 4,), 2),  # one full chunk
        "bf16": random_tensor(torch.bfloat16, (3, 5), 3),
        "scalar": torch.tensor(2.5),
        "meta": torch.empty(4, 2, device="meta"),
    }


def _tz_write(sd: dict[str, Any], path: Path, enc: Any) -> Path:
    from tensorizer import TensorSerializer

    ser = TensorSerializer(str(path), encryption=enc)
    ser.write_state_dict(sd)
    ser.close()
    return path


def _tz_read(path: Path, dec: Any, **kw: Any) -> dict[str, torch.Tensor]:
    from tensorizer import TensorDeserializer

    with TensorDeserializer(str(path), device="cpu", encryption=dec, verify_hash=True, **kw) as d:
        return {k: v.detach().clone() for k, v in d.items()}


def _assert_sd(out: dict[str, torch.Tensor], sd: dict[str, torch.Tensor]) -> None:
    assert list(out) == list(sd)
    for k, v in sd.items():
        if v.is_meta:
            assert torch.equal(out[k], torch.zeros(v.shape, dtype=v.dtype))
        else:
            assert_bit_equal(out[k], v)


@pytest.mark.parametrize("kind", ["key", "passphrase"])
@pytest.mark.parametrize("verify_hash", [False, True])
def test_tensorizer_encrypted_loads_bit_equal(tmp_path, kind, verify_hash):
    sd = _state_dict()
    enc, _ = _tz_params(kind, SECRETS[kind])
    path = _tz_write(sd, tmp_path / "tz.tensors", enc)
    key = _fs_key(kind, SECRETS[kind])
    with fastshard.open(path, encryption=key, verify_hash=verify_hash) as f:
        assert f.encrypted
        _assert_sd(f.load_state_dict(), sd)
        # A selection decrypts only what it reads.
        assert_bit_equal(f.load_state_dict(names=["bf16"])["bf16"], sd["bf16"])


def test_tensorizer_key_file_and_derived_key(tmp_path):
    """vLLM's encryption_keyfile holds EncryptionParams.key; the key a
    passphrase derives also opens a passphrase file, as in tensorizer."""
    from tensorizer import EncryptionParams

    sd = {"w": random_tensor(torch.float16, (300, 7), 4)}
    enc = EncryptionParams.from_string("pw", **FAST)
    path = _tz_write(sd, tmp_path / "tz.tensors", enc)
    keyfile = tmp_path / "model.key"
    keyfile.write_bytes(enc.key)
    for key in (EncryptionKey.from_file(keyfile), EncryptionKey.from_bytes(enc.key)):
        assert_bit_equal(fastshard.load_state_dict(path, encryption=key)["w"], sd["w"])


@pytest.mark.parametrize("kind", ["key", "passphrase"])
def test_fastshard_encrypted_loads_in_tensorizer(tmp_path, kind):
    sd = _state_dict()
    sd["empty"] = torch.empty(0, 3)  # tensorizer 2.12.1 cannot write this encrypted
    key = _fs_key(kind, SECRETS[kind])
    path = tmp_path / "fs.tensors"
    fastshard.save(sd, path, encryption=key)
    _, dec = _tz_params(kind, SECRETS[kind])
    _assert_sd(_tz_read(path, dec), sd)
    _assert_sd(fastshard.load_state_dict(path, encryption=key, verify_hash=True), sd)
    # The source tensors were not encrypted in place.
    assert_bit_equal(sd["big"], random_tensor(torch.uint8, (5 * MIB + 3,), 1))


def test_layout_matches_tensorizer(tmp_path):
    """Version, flags and header sizes as tensorizer writes them (ciphertext
    differs: nonces are random)."""
    sd = {"a": random_tensor(torch.float32, (3 * MIB // 4,), 5), "m": torch.empty(2, device="meta")}
    key = bytes(range(32))
    tz = _tz_write(sd, tmp_path / "tz.tensors", _tz_params("key", key)[0])
    fs = tmp_path / "fs.tensors"
    fastshard.save(sd, fs, encryption=EncryptionKey.from_bytes(key))
    a, b = tz.read_bytes(), fs.read_bytes()
    assert len(a) == len(b)
    assert a[:0x49] == b[:0x49]  # version 4, encrypted flag, sizes, counts
    assert layout(tz) == layout(fs)


def test_module_round_trip_and_fastshard_load(tmp_path):
    src, dst = small_net(1), small_net(2)
    key = EncryptionKey.random()
    path = tmp_path / "net.tensors"
    fastshard.save(src, path, encryption=key)
    fastshard.load(dst, path, encryption=key, verify_hash=True)
    for (n, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items(), strict=True):
        assert_bit_equal(b, a), n


def test_wrong_key_is_typed_and_leaks_nothing(tmp_path):
    sd = {"w": random_tensor(torch.float32, (MIB,), 6), "b": random_tensor(torch.int8, (10,), 7)}
    path = tmp_path / "fs.tensors"
    fastshard.save(sd, path, encryption=EncryptionKey.from_passphrase("Right-7f3a", **FAST))
    for wrong in (
        EncryptionKey.from_passphrase("Wrong-c41d"),
        EncryptionKey.from_bytes(b"\1" * 32),
    ):
        with pytest.raises(fastshard.IntegrityError) as e:
            fastshard.load_state_dict(path, encryption=wrong)
        assert e.value.uri == str(path) and e.value.tensor in sd and e.value.byte_range
        assert "7f3a" not in str(e.value) and "c41d" not in str(e.value)
    # Into a model's own parameters: every tensor of a failed encrypted load
    # is zeroed, the one whose MAC failed and the one whose check the
    # failure cancelled alike (which one fails first varies from run to run),
    # never left as ciphertext or partial plaintext.
    for _ in range(8):
        model = torch.nn.Module()
        model.w = torch.nn.Parameter(torch.full((MIB,), 7.0))
        model.b = torch.nn.Parameter(torch.full((10,), 7, dtype=torch.int8), requires_grad=False)
        with pytest.raises(fastshard.IntegrityError):
            fastshard.load(model, path, encryption=EncryptionKey.from_bytes(b"\2" * 32))
        assert not model.w.detach().any()
        assert not model.b.detach().any()


def test_flipped_ciphertext_byte_caught_by_mac(tmp_path):
    sd = {"a": random_tensor(torch.uint8, (3 * MIB,), 8), "b": torch.arange(5)}
    key = EncryptionKey.random()
    path = tmp_path / "fs.tensors"
    fastshard.save(sd, path, encryption=key)
    rec = layout(path)[0]
    at = rec["data_offset"] + 2 * MIB + 17  # inside the second chunk
    data = path.read_bytes()
    patch(path, at, bytes([data[at] ^ 0x01]))
    with pytest.raises(fastshard.IntegrityError, match="authentication tag") as e:
        fastshard.load_state_dict(path, encryption=key)
    start = rec["data_offset"] + 2 * MIB
    assert e.value.byte_range == (start, start + MIB)
    assert e.value.tensor == "a"
    # Unselected tensors still load.
    assert_bit_equal(fastshard.load_state_dict(path, encryption=key, names=["b"])["b"], sd["b"])


def test_hashes_cover_plaintext(tmp_path):
    """tensorizer's SHA-256 in encrypted records is over the plaintext: a
    tampered hash is caught by verify_hash after decryption succeeds."""
    key = EncryptionKey.random()
    path = tmp_path / "fs.tensors"
    fastshard.save({"a": torch.arange(100, dtype=torch.int32)}, path, encryption=key)
    rec = layout(path)[0]
    # Record: …dims, u16 section len, u8 count (1), u8 type, u8 len, sha256.
    sha_at = rec["record_dims_at"] + 4 * len(rec["dims"]) + 2 + 1 + 2
    raw = path.read_bytes()
    assert struct.unpack_from("<HBBB", raw, sha_at - 5) == (35, 1, 1, 32)
    patch(path, sha_at, bytes([raw[sha_at] ^ 0xFF]))
    assert fastshard.load_state_dict(path, encryption=key)["a"].sum() == 4950
    with pytest.raises(fastshard.IntegrityError, match="sha256"):
        fastshard.load_state_dict(path, encryption=key, verify_hash=True)


def test_key_mismatches_are_refused(tmp_path):
    plain = tmp_path / "plain.tensors"
    fastshard.save({"a": torch.ones(3)}, plain)
    with pytest.raises(fastshard.InvalidArgumentError, match="not encrypted"):
        fastshard.open(plain, encryption=EncryptionKey.random())
    enc = tmp_path / "enc.tensors"
    fastshard.save({"a": torch.ones(3)}, enc, encryption=EncryptionKey.random())
    with fastshard.open(enc) as f:  # the index is plaintext
        assert f.keys() == ["a"] and f.encrypted
        with pytest.raises(fastshard.InvalidArgumentError, match="encrypted") as e:
            f.load_state_dict()
        assert e.value.uri == str(enc)
    # A passphrase cannot open a raw-key file (no KDF parameters stored).
    with pytest.raises(fastshard.InvalidArgumentError, match="raw key"):
        fastshard.load_state_dict(enc, encryption=EncryptionKey.from_passphrase("x"))
    with pytest.raises(fastshard.InvalidArgumentError):
        fastshard.load_state_dict(enc, encryption=b"\0" * 32)


def test_key_object_hides_its_secret(tmp_path):
    k = EncryptionKey.from_passphrase("hunter2")
    assert "hunter2" not in repr(k)
    raw = EncryptionKey.from_bytes(b"\xab" * 32)
    assert "ab" not in repr(raw).lower().replace("bytes", "")
    with pytest.raises(TypeError):
        pickle.dumps(raw)
    with pytest.raises(fastshard.InvalidArgumentError):
        EncryptionKey.from_bytes(b"short")
    short = tmp_path / "k"
    short.write_bytes(b"x" * 33)
    with pytest.raises(fastshard.InvalidArgumentError):
        EncryptionKey.from_file(short)
    saved = tmp_path / "saved.key"
    raw.to_file(saved)
    assert EncryptionKey.from_file(saved).key_bytes == b"\xab" * 32
    assert saved.stat().st_mode & 0o077 == 0
