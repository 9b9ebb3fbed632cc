"""Broken files give typed errors that say where; models stay untouched when
they do not fit the file."""

from __future__ import annotations

import logging
import re
import shutil
import struct

import pytest
import torch
from conftest import random_tensor, small_net
from tensorizer_files import layout, patch

import fastshard

SD = {
    "first": random_tensor(torch.float32, (4, 4), 1),
    "second": torch.arange(3, dtype=torch.int64) * 1_000_003,
    "third": random_tensor(torch.bfloat16, (5,), 2),
}


@pytest.fixture
def good(tz_write):
    return tz_write(SD, "good.tensors")


@pytest.fixture
def v4(tz_write):
    """A data version 4 file (it has a meta tensor), where flags count."""
    return tz_write({"a": torch.ones(2), "m": torch.empty(3, device="meta")}, "v4.tensors")


def _load_error(path, exc=fastshard.FormatError, **kwargs):
    with pytest.raises(exc) as info:
        fastshard.load_state_dict(path, **kwargs)
    err = info.value
    # Messages name the file (docs/architecture.md, boundary rule 5).
    assert err.uri == str(path) or str(path) in str(err)
    return err


def _assert_names_offset(err):
    assert err.byte_range is not None or re.search(r"\d", str(err)), str(err)


def _truncate(src, dst, size):
    shutil.copy(src, dst)
    with open(dst, "r+b") as f:
        f.truncate(size)
    return dst


@pytest.mark.parametrize(
    "where",
    ["magic", "version", "flags", "tensor_count", "metadata_len", "index", "index_padding"],
)
def test_truncated_header_and_index(good, tmp_path, where):
    cut = {
        "magic": 3,
        "version": 7,
        "flags": 0x20,
        "tensor_count": 0x3C,
        "metadata_len": 0x45,
        "index": 0x49 + 10,
        "index_padding": 0x49 + 2000,
    }[where]
    err = _load_error(_truncate(good, tmp_path / "t.tensors", cut))
    _assert_names_offset(err)


@pytest.mark.parametrize("where", ["record_header", "record_header_end", "data"])
def test_truncated_record_and_data(good, tmp_path, where):
    second = layout(good)[1]
    cut = {
        "record_header": second["header_offset"] + 5,
        "record_header_end": second["data_offset"] - 1,
        "data": second["data_offset"] + 3,
    }[where]
    err = _load_error(_truncate(good, tmp_path / "t.tensors", cut))
    assert err.tensor in (None, "second")
    assert "second" in str(err)
    _assert_names_offset(err)


def test_truncated_everywhere(tmp_path):
    # A small exact-index file cut at every length: always a FormatError,
    # never another exception, a crash or a partial result.
    path = tmp_path / "small.tensors"
    sd = {"a": torch.arange(3.0), "m": torch.empty(2, device="meta"), "b": torch.ones(2, 2)}
    fastshard.save(sd, path, exact_index=True)
    full = path.read_bytes()
    cut_path = tmp_path / "cut.tensors"
    for size in range(len(full) - 8):  # the last 8 bytes are the end marker
        cut_path.write_bytes(full[:size])
        with pytest.raises(fastshard.FormatError):
            fastshard.load_state_dict(cut_path)


def test_bad_magic(good):
    patch(good, 0, b"|TZX|")
    err = _load_error(good)
    assert re.search("magic", str(err), re.I)


# A version or flag this build does not know may be a newer format rather
# than a broken file, so UnsupportedError is as right as FormatError.
UNKNOWN = (fastshard.FormatError, fastshard.UnsupportedError)


@pytest.mark.parametrize("version", [0, 6, 0xFFFFFFFF])
def test_unknown_version(good, version):
    patch(good, 5, struct.pack("<I", version))
    err = _load_error(good, UNKNOWN)
    assert re.search("version", str(err), re.I)
    assert str(version) in str(err)


@pytest.mark.parametrize(
    "offset,value",
    [(0x09, 0x04), (0x09, 0x80), (0x0A, 0x01), (0x28, 0x80), (0x09, 0x02)],
    ids=["bit2", "bit7", "bit8", "bit255", "versioned_headers_on_v4"],
)
def test_unknown_flag_bits(v4, offset, value):
    patch(v4, offset, bytes([value]))
    err = _load_error(v4, UNKNOWN)
    assert re.search("flag|version", str(err), re.I)


@pytest.mark.parametrize("field", ["header_offset", "data_offset", "data_length"])
def test_index_entry_outside_file(good, field):
    entry = layout(good)[1]
    size = good.stat().st_size
    pos = entry["offsets_at"] + {"header_offset": 0, "data_offset": 8, "data_length": 16}[field]
    patch(good, pos, struct.pack("<Q", size + 100 if field != "data_length" else 1 << 40))
    err = _load_error(good)
    assert "second" in str(err)
    assert err.tensor in (None, "second")


def test_record_dtype_disagrees_with_index(good):
    first = layout(good)[0]
    patch(good, first["record_dtype_at"] + 1, b"i")  # "<f4" → "<i4"
    err = _load_error(good)
    assert "first" in str(err)
    assert err.tensor in (None, "first")


def test_record_shape_disagrees_with_index(good):
    first = layout(good)[0]
    patch(good, first["record_dims_at"], struct.pack("<I", 2))  # (4, 4) → (2, 4)
    err = _load_error(good)
    assert "first" in str(err)
    assert err.tensor in (None, "first")


def test_corrupted_data_caught_by_hashes(good):
    second = layout(good)[1]
    patch(good, second["data_offset"] + 9, b"\x7f")
    err = _load_error(good, fastshard.IntegrityError, verify_hash=True)
    assert err.tensor == "second"
    assert "second" in str(err)
    # Without verify_hash the bytes load as they are: it is the hashes that
    # catch the corruption.
    out = fastshard.load_state_dict(good)
    assert not torch.equal(out["second"], SD["second"])
    assert torch.equal(out["first"], SD["first"])


def test_corrupted_stored_hash(good):
    third = layout(good)[2]
    # The CRC32 value sits 8 bytes before the SHA-256 entry, which ends
    # 8 bytes before the data (after it: the i64 data length).
    crc_at = third["data_offset"] - 8 - 34 - 4
    data = good.read_bytes()
    assert data[crc_at - 2 : crc_at] == b"\x00\x04"  # hash type 0 (CRC32), 4 bytes
    patch(good, crc_at, bytes([data[crc_at] ^ 0xFF]))
    err = _load_error(good, fastshard.IntegrityError, verify_hash=True)
    assert err.tensor == "third"


def test_missing_file(tmp_path):
    path = tmp_path / "nope.tensors"
    with pytest.raises(fastshard.NotFoundError) as info:
        fastshard.open(path)
    assert isinstance(info.value, FileNotFoundError)
    assert isinstance(info.value, fastshard.StorageError)
    assert info.value.uri == str(path) or str(path) in str(info.value)
    with pytest.raises(FileNotFoundError):
        fastshard.load_state_dict(str(path))


def _snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_same(model, snap):
    state = model.state_dict()
    assert list(state) == list(snap)
    for k, v in snap.items():
        assert torch.equal(state[k], v), k


@pytest.mark.parametrize("problem", ["missing", "unexpected", "shape"])
def test_load_mismatch_raises_before_reading(tz_write, problem):
    src = small_net(seed=1)
    if problem == "unexpected":
        src.register_buffer("surplus", torch.ones(2))
    path = tz_write(src)
    # Corrupt a tensor: had any byte been read, verify_hash would raise
    # IntegrityError instead of the name check's InvalidArgumentError.
    patch(path, layout(path)[4]["data_offset"], b"\xff\xff")
    dst = small_net(seed=2)
    if problem == "missing":
        dst.more = torch.nn.Linear(2, 2)
        expected = ["more.weight", "more.bias"]
    elif problem == "unexpected":
        expected = ["surplus"]
    else:
        dst.lin = torch.nn.Linear(4, 5)
        dst.norm = torch.nn.BatchNorm1d(5)
        expected = ["lin.weight", "norm.running_mean"]
    snap = _snapshot(dst)
    with pytest.raises(fastshard.InvalidArgumentError) as info:
        fastshard.load(dst, path, verify_hash=True)
    for name in expected:
        assert name in str(info.value)
    _assert_same(dst, snap)


def test_meta_model_untouched_on_mismatch(tz_write):
    path = tz_write(small_net(seed=3))
    with torch.device("meta"):
        dst = small_net(seed=3)
        dst.lin = torch.nn.Linear(4, 7)
    with pytest.raises(fastshard.InvalidArgumentError, match="lin.weight"):
        fastshard.load(dst, path)
    assert all(p.is_meta for p in dst.parameters())


def test_an_unreachable_s3_endpoint_is_named_and_told_in_words(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from servers import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: refused at once
    with caplog.at_level(logging.WARNING, logger="fastshard"):
        with pytest.raises(fastshard.StorageError) as info:
            fastshard.load_state_dict(
                "s3://models/m.tensors",
                s3_endpoint=dead,
                s3_access_key_id="key",
                s3_secret_access_key="secret",
                # Long enough that retries outlast the first second (the
                # client's set-up takes part of it), when the warning comes.
                deadline_seconds=6,
            )
    text = str(info.value)
    assert "s3://models/m.tensors" in text, text
    # How long it tried, and the last attempt's failure in words (unless
    # the deadline cut that attempt short).
    tried = re.search(r"(deadline passed after|gave up after \d+ attempts in) \d+\.\d s", text)
    assert tried, text
    last = text[tried.end() :]
    assert (
        f"S3 connection to {dead} failed" in last
        and "refused" in last.lower()
        or "deadline passed while waiting for the server" in last
    ), text
    # No Debug dump of the SDK's types, nor the client's layers above the
    # socket's own words.
    assert "{ " not in text and "DispatchFailure" not in text and "secret" not in text, text
    assert "dispatch failure" not in text and "client error" not in text, text
    # While it retried, one warning said so, naming the endpoint.
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    said = warned[0].getMessage()
    assert warned[0].name.startswith("fastshard"), warned[0].name
    assert f"S3 connection to {dead} failed" in said and "retrying (attempt" in said, said
    assert "{ " not in said and "secret" not in said, said


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_an_unreachable_http_server_is_named_and_told_in_words(scheme: str) -> None:
    from servers import free_port

    port = free_port()  # nothing listens: refused at once
    uri = f"{scheme}://127.0.0.1:{port}/m.tensors?X-Amz-Signature=s3cr3t"
    with pytest.raises(fastshard.StorageError) as info:
        fastshard.load_state_dict(uri, max_attempts=2)
    text = str(info.value)
    assert f"HTTP connection to 127.0.0.1:{port} failed: " in text, text
    assert "refused" in text.lower(), text
    # Where, in words; never reqwest's "for url (...)", nor the query.
    assert "url" not in text and "s3cr3t" not in text and "{ " not in text, text
    assert "client error" not in text and "tcp connect error" not in text, text
    assert f"in {scheme}://127.0.0.1:{port}/m.tensors?…" in text, text
