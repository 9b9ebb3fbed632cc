"""Shard manifests beside remote files (issue 4, item 1): written on S3 by
save_sharded, read from S3 and HTTP by every load, with the same checks as
local sets; and the native small-object calls that carry them, against the
real SeaweedFS and nginx servers."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import uuid

import pytest
from conftest import assert_bit_equal
from test_sharded_files import assert_state_equal, rank_state, tp_net

import fastshard
from fastshard import _native, shard

pytestmark = pytest.mark.s3


def _prefix(seaweed, name: str) -> str:
    """A fresh folder per test: the session's server is shared."""
    return f"s3://{seaweed.bucket}/manifests/{name}-{uuid.uuid4().hex[:8]}/"


def _manifest(seaweed, prefix: str) -> dict:
    return json.loads(seaweed.get(prefix + shard.MANIFEST_NAME))


def _put_manifest(seaweed, prefix: str, doc: dict) -> None:
    _native.write_object(prefix + shard.MANIFEST_NAME, json.dumps(doc).encode(), **seaweed.opts())


@pytest.fixture
def s3_set(seaweed):
    prefix = _prefix(seaweed, "tp3")
    template = prefix + "model-rank-%03d.tensors"
    sources = [rank_state(r, 3) for r in range(3)]
    uris = fastshard.save_sharded(sources, template, **seaweed.opts())
    return prefix, template, sources, uris


def test_s3_save_writes_a_manifest_listing_every_rank(seaweed, s3_set, caplog):
    prefix, template, sources, uris = s3_set
    doc = _manifest(seaweed, prefix)
    assert doc["format"] == "fastshard-sharded" and doc["world_size"] == 3
    assert doc["template"] == "model-rank-%03d.tensors"
    assert [e["rank"] for e in doc["files"]] == [0, 1, 2]
    for entry, uri in zip(doc["files"], uris, strict=True):
        data = seaweed.get(uri)
        assert entry["name"] == uri.rsplit("/", 1)[1]
        assert entry["size"] == len(data)
        # Hashed natively while uploading: the digest of what S3 now holds.
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    with caplog.at_level(logging.WARNING, logger="fastshard"):
        for rank, source in enumerate(sources):
            # The world size may come from the manifest alone.
            with fastshard.open(template, rank=rank, **seaweed.opts()) as f:
                assert f.opened.world_size == 3
                assert f.opened.manifest is not None
                assert_state_equal(f.load_state_dict(), source)
    assert caplog.text == ""


def test_s3_set_copied_to_disk_verifies_locally(seaweed, s3_set, tmp_path):
    """The manifest names files relative to it, so a downloaded set keeps
    working, and the hashes taken while uploading check the local copies."""
    prefix, _, sources, uris = s3_set
    for uri in [*uris, prefix + shard.MANIFEST_NAME]:
        (tmp_path / uri.rsplit("/", 1)[1]).write_bytes(seaweed.get(uri))
    out = fastshard.load_state_dict(f"{tmp_path}/", rank=1, verify_manifest_hashes=True)
    assert_state_equal(out, sources[1])


def test_s3_wrong_world_size_and_rank(seaweed, s3_set):
    _, template, _, _ = s3_set
    with pytest.raises(fastshard.ShardMismatchError) as info:
        fastshard.load_state_dict(template, rank=0, world_size=2, **seaweed.opts())
    assert "says world_size=3" in str(info.value)
    assert "asked world_size=2" in str(info.value)
    assert shard.MANIFEST_NAME in str(info.value)
    with pytest.raises(fastshard.ShardMismatchError, match=r"rank 3 does not exist.*0\.\.2"):
        fastshard.load_state_dict(template, rank=3, **seaweed.opts())


def test_s3_directory_uri(seaweed, s3_set):
    prefix, _, sources, _ = s3_set
    out = fastshard.load_state_dict(prefix, rank=2, world_size=3, **seaweed.opts())
    assert_state_equal(out, sources[2])
    with pytest.raises(fastshard.ShardMismatchError, match="asked world_size=4"):
        fastshard.load_state_dict(prefix, rank=0, world_size=4, **seaweed.opts())
    # Without a manifest a directory means its model.tensors.
    single = _prefix(seaweed, "single")
    fastshard.save(sources[1], single + "model.tensors", **seaweed.opts())
    assert_state_equal(fastshard.load_state_dict(single, **seaweed.opts()), sources[1])


def test_s3_size_disagreement(seaweed, s3_set):
    prefix, template, _, _ = s3_set
    doc = _manifest(seaweed, prefix)
    doc["files"][1]["size"] += 1
    _put_manifest(seaweed, prefix, doc)
    with pytest.raises(fastshard.ShardMismatchError) as info:
        fastshard.load_state_dict(template, rank=1, world_size=3, **seaweed.opts())
    real = doc["files"][1]["size"] - 1
    assert f"is {real} bytes" in str(info.value) and f"says {real + 1}" in str(info.value)
    assert "model-rank-001.tensors" in str(info.value)
    # Other ranks still load.
    fastshard.load_state_dict(template, rank=0, world_size=3, **seaweed.opts())


def test_s3_deleted_rank_file(seaweed, s3_set):
    _, template, _, uris = s3_set
    _native.delete_object(uris[2], **seaweed.opts())
    with pytest.raises(fastshard.NotFoundError) as info:
        fastshard.load_state_dict(template, rank=2, world_size=3, **seaweed.opts())
    assert isinstance(info.value, FileNotFoundError)
    assert "rank 2 of template" in str(info.value)
    assert "model-rank-002.tensors" in str(info.value) and "lists it" in str(info.value)


def test_s3_unreadable_manifest(seaweed, s3_set):
    prefix, template, _, _ = s3_set
    _native.write_object(prefix + shard.MANIFEST_NAME, b"{not json", **seaweed.opts())
    with pytest.raises(fastshard.ShardMismatchError, match="unreadable shard manifest"):
        fastshard.load_state_dict(template, rank=0, **seaweed.opts())


def test_s3_resave_replaces_the_manifest(seaweed):
    prefix = _prefix(seaweed, "resave")
    template = prefix + "m-{rank}.tensors"
    fastshard.save_sharded([rank_state(r, 4) for r in range(4)], template, **seaweed.opts())
    assert _manifest(seaweed, prefix)["world_size"] == 4
    # A failed save leaves no manifest describing the previous set.
    with pytest.raises(fastshard.InvalidArgumentError):
        fastshard.save_sharded([{"a": rank_state(0, 1)["rank"]}, {}], template, **seaweed.opts())
    assert _native.read_object(prefix + shard.MANIFEST_NAME, **seaweed.opts()) is None
    fastshard.save_sharded([rank_state(r, 2) for r in range(2)], template, **seaweed.opts())
    assert _manifest(seaweed, prefix)["world_size"] == 2
    out = fastshard.load_state_dict(template, rank=1, **seaweed.opts())
    assert_state_equal(out, rank_state(1, 2))


def test_s3_modules_round_trip(seaweed):
    prefix = _prefix(seaweed, "net")
    sources = [tp_net(r, 2) for r in range(2)]
    fastshard.save_sharded(sources, prefix, **seaweed.opts())
    for rank, source in enumerate(sources):
        model = tp_net(rank, 2, seed_base=7)
        fastshard.load(model, prefix, rank=rank, world_size=2, **seaweed.opts())
        for key, value in source.state_dict().items():
            assert_bit_equal(model.state_dict()[key], value)


def test_s3_refused_manifest_leaves_the_error_to_the_file(seaweed, s3_set, caplog):
    """A refused manifest read is skipped with a warning (S3 answers 403 for
    a missing key to callers without ListBucket); the file's own open then
    reports the real error, and no secret appears anywhere."""
    _, template, _, _ = s3_set
    bad = seaweed.opts(s3_secret_access_key="wrong-secret-Xy7", max_attempts=1)
    with caplog.at_level(logging.WARNING, logger="fastshard"):
        with pytest.raises(fastshard.AuthError) as info:
            fastshard.load_state_dict(template, rank=0, **bad)
    assert f"{shard.MANIFEST_NAME} cannot be read" in caplog.text
    assert "model-rank-000.tensors" in str(info.value)
    assert "wrong-secret-Xy7" not in str(info.value) + repr(info.value) + caplog.text


# -- the native small-object calls --------------------------------------------


def test_object_round_trip_s3(seaweed):
    uri = _prefix(seaweed, "obj") + "x.json"
    opts = seaweed.opts()
    assert _native.read_object(uri, **opts) is None
    _native.write_object(uri, b'{"a": 1}', **opts)
    assert _native.read_object(uri, **opts) == b'{"a": 1}'
    assert seaweed.get(uri) == b'{"a": 1}'
    _native.write_object(uri, b"", **opts)
    assert _native.read_object(uri, **opts) == b""
    _native.delete_object(uri, **opts)
    assert _native.read_object(uri, **opts) is None
    _native.delete_object(uri, **opts)  # already gone: fine
    assert _native.read_object(f"s3://no-such-bucket-{uuid.uuid4().hex[:6]}/k", **opts) is None


def test_object_too_large(seaweed, tmp_path):
    uri = _prefix(seaweed, "big") + "big.bin"
    _native.write_object(uri, b"z" * 5000, **seaweed.opts())
    with pytest.raises(fastshard.InvalidArgumentError, match="5000 bytes") as info:
        _native.read_object(uri, max_bytes=4999, **seaweed.opts())
    assert info.value.uri == uri
    assert len(_native.read_object(uri, max_bytes=5000, **seaweed.opts()) or b"") == 5000
    local = tmp_path / "big.bin"
    local.write_bytes(b"z" * 5000)
    with pytest.raises(fastshard.InvalidArgumentError, match="more than max_bytes=10"):
        _native.read_object(str(local), max_bytes=10)


def test_object_round_trip_local(tmp_path):
    uri = str(tmp_path / "m.json")
    assert _native.read_object(uri) is None
    _native.write_object(uri, b"one")
    _native.write_object(f"file://{uri}", b"two")
    assert _native.read_object(uri) == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]  # no partial files left
    _native.delete_object(uri)
    _native.delete_object(uri)
    assert _native.read_object(uri) is None
    with pytest.raises(fastshard.NotFoundError):
        _native.write_object(str(tmp_path / "missing" / "m.json"), b"x")


def test_object_wrong_credentials(seaweed):
    uri = f"s3://{seaweed.bucket}/manifests/any.json"
    secret = "wrong-secret-Qk4"
    for call in (
        lambda o: _native.read_object(uri, **o),
        lambda o: _native.write_object(uri, b"x", **o),
        lambda o: _native.delete_object(uri, **o),
    ):
        with pytest.raises(fastshard.AuthError) as info:
            call(seaweed.opts(s3_secret_access_key=secret))
        text = str(info.value) + repr(info.value)
        assert "explicit s3_access_key_id" in text
        assert secret not in text
        assert info.value.uri == uri


@pytest.mark.http
def test_object_http_is_read_only(nginx):
    with pytest.raises(fastshard.UnsupportedError):
        _native.write_object(nginx.url("x.json"), b"x")
    with pytest.raises(fastshard.UnsupportedError):
        _native.delete_object(nginx.url("x.json"))


# -- HTTP -------------------------------------------------------------------


@pytest.mark.http
def test_http_manifest_checks(nginx, tmp_path):
    name = f"sharded-{uuid.uuid4().hex[:8]}"
    local = tmp_path / name
    local.mkdir()
    sources = [rank_state(r, 2) for r in range(2)]
    fastshard.save_sharded(sources, f"{local}/")
    served = nginx.root / name
    shutil.copytree(local, served)
    base = nginx.url(name + "/")
    assert _native.read_object(base + shard.MANIFEST_NAME) is not None
    assert _native.read_object(base + "nothing.json") is None
    template = base + shard.DEFAULT_TEMPLATE
    for uri in (template, base):
        out = fastshard.load_state_dict(uri, rank=1, **({"world_size": 2} if uri == base else {}))
        assert_state_equal(out, sources[1])
        with fastshard.open(uri, rank=0) as f:
            assert f.opened.world_size == 2  # from the manifest over HTTP
    with pytest.raises(fastshard.ShardMismatchError, match="says world_size=2"):
        fastshard.load_state_dict(base, rank=0, world_size=4)
    # A size the served file does not have: caught once the file is opened.
    doc = json.loads((served / shard.MANIFEST_NAME).read_text())
    doc["files"][0]["size"] = 7
    (served / shard.MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(fastshard.ShardMismatchError, match="says 7"):
        fastshard.load_state_dict(template, rank=0)
    (served / "model-rank-001.tensors").unlink()
    with pytest.raises(fastshard.NotFoundError, match="rank 1 of template .*lists it"):
        fastshard.load_state_dict(template, rank=1)
    with pytest.raises(fastshard.UnsupportedError, match="remote"):
        fastshard.load_state_dict(template, rank=0, verify_manifest_hashes=True)
