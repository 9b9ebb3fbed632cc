"""gs:// against fake-gcs-server, the Cloud Storage emulator: files written
by tensorizer and by fastshard load bit for bit (plain, verified, as
tensor-parallel slices); a missing object is NotFoundError; an object
replaced mid-load is ObjectChangedError (the emulator ignores If-Match, so
the response's own ETag is what tells); credentials that cannot be used are
a typed error that holds no secret. The emulator checks no credentials at
all, so a wrong key cannot be tested against it; the key file's parsing is."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conftest import assert_bit_equal, random_tensor
from remote_files import MiB, assert_same
from servers import FakeGcs, require_fake_gcs

import fastshard

pytestmark = pytest.mark.gcs


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcs]:
    server = FakeGcs(tmp_path_factory.mktemp("fake-gcs"))
    try:
        yield server.start(require_fake_gcs())
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gcs_corpus(gcs: FakeGcs, corpus: dict[str, Any]) -> dict[str, Any]:
    for name, c in corpus.items():
        c.uris["gs"] = gcs.upload(c.path, f"corpus/{name}.tensors")
    return corpus


@pytest.mark.parametrize("name", ["tz-dtypes", "fs-special", "tz-nested", "fs-nested"])
def test_state_dicts_bit_equal(gcs, gcs_corpus, name):
    c = gcs_corpus[name]
    out = fastshard.load_state_dict(c.uris["gs"], verify_hash=True, **gcs.opts())
    assert_same(out, c.source)
    with fastshard.open(c.uris["gs"], **gcs.opts()) as f:
        assert f.file_size == c.size and f.uri == c.uris["gs"]


def test_big_object_in_many_ranged_reads(gcs, gcs_corpus):
    c = gcs_corpus["tz-big"]
    with fastshard.open(c.uris["gs"], part_size_bytes=MiB, verify_hash=True, **gcs.opts()) as f:
        out = f.load_state_dict()
        stats = f.stats
    assert_same(out, c.source)
    assert stats.requests >= 40 and stats.retries == 0
    assert c.tensor_bytes <= stats.bytes_fetched <= 1.01 * c.size


def test_a_second_load_reads_the_node_cache(gcs, gcs_corpus, tmp_path):
    c = gcs_corpus["tz-big"]
    opts = gcs.opts(cache_dir=tmp_path / "cache")
    first = fastshard.open(c.uris["gs"], **opts)
    with first:
        assert_same(first.load_state_dict(), c.source)
    with fastshard.open(c.uris["gs"], verify_hash=True, **opts) as f:
        out = f.load_state_dict()
        stats = f.stats
    assert_same(out, c.source)
    # Discovery pinned the version with a HEAD: nothing else from the store.
    assert (stats.bytes_fetched, stats.requests) == (0, 0)
    assert stats.bytes_from_cache == first.stats.bytes_fetched


@pytest.mark.parametrize("rank", [0, 1])
def test_tensor_parallel_slices(gcs, gcs_corpus, rank):
    c = gcs_corpus["tz-big"]
    names = ["w0", "w1", "w4"]
    args: dict[str, Any] = {"rank": rank, "world_size": 2, "names": names}
    args["shard_specs"] = dict.fromkeys(names, 0)
    want = fastshard.load_state_dict(c.path, **args)
    with fastshard.open(c.uris["gs"], **gcs.opts()) as f:
        got = f.load_state_dict(**args)
        fetched = f.stats.bytes_fetched
    for name in names:
        assert_bit_equal(got[name], want[name])
        assert got[name].shape[0] == c.source[name].shape[0] // 2
    # Only this rank's rows travel.
    assert fetched < 0.6 * sum(c.source[n].nbytes for n in names)


def test_sharded_set_with_its_manifest(gcs, tmp_path):
    from test_sharded_files import assert_state_equal, rank_state

    from fastshard import _native, shard

    local = tmp_path / "set"
    local.mkdir()
    sources = [rank_state(r, 2) for r in range(2)]
    fastshard.save_sharded(sources, f"{local}/")
    for f in local.iterdir():
        gcs.upload(f, f"set/{f.name}")
    base = f"gs://{gcs.bucket}/set/"
    assert _native.read_object(base + shard.MANIFEST_NAME, **gcs.opts()) is not None
    assert _native.read_object(base + "nothing.json", **gcs.opts()) is None
    out = fastshard.load_state_dict(base, rank=1, world_size=2, **gcs.opts())
    assert_state_equal(out, sources[1])
    with pytest.raises(fastshard.ShardMismatchError, match="says world_size=2"):
        fastshard.load_state_dict(base, rank=0, world_size=4, **gcs.opts())


def test_emulator_variable_routes_unsigned_requests(gcs, gcs_corpus, monkeypatch):
    c = gcs_corpus["fs-special"]
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"127.0.0.1:{gcs.port}")
    assert_same(fastshard.load_state_dict(c.uris["gs"]), c.source)


def test_missing_object(gcs):
    uri = f"gs://{gcs.bucket}/no/such/model.tensors"
    with pytest.raises(fastshard.NotFoundError) as info:
        fastshard.load_state_dict(uri, **gcs.opts())
    assert isinstance(info.value, FileNotFoundError)
    assert info.value.uri == uri and uri in str(info.value)
    with pytest.raises(fastshard.NotFoundError):
        fastshard.open("gs://no-such-bucket-xyz/model.tensors", **gcs.opts())


def test_object_replaced_mid_load(gcs, tmp_path):
    versions = []
    for seed in (1, 2):
        sd = {f"t{i}": random_tensor(torch.float32, (256, 1024), seed * 10 + i) for i in range(6)}
        fastshard.save(sd, tmp_path / f"v{seed}.tensors")
        versions.append((tmp_path / f"v{seed}.tensors").read_bytes())
    assert len(versions[0]) == len(versions[1])
    uri = gcs.put(versions[0], "changing/model.tensors")
    f = fastshard.open(uri, part_size_bytes=MiB, **gcs.opts())
    gcs.put(versions[1], "changing/model.tensors")
    result = None
    with pytest.raises(fastshard.ObjectChangedError) as info:
        result = f.load_state_dict()
    assert result is None
    assert uri in str(info.value) and "ETag" in str(info.value)
    # Reopened, the new version loads whole.
    out = fastshard.load_state_dict(uri, verify_hash=True, **gcs.opts())
    want = fastshard.load_state_dict(tmp_path / "v2.tensors")
    for name, t in want.items():
        assert_bit_equal(out[name], t)


def _text(err: BaseException) -> str:
    return " ".join([str(err), repr(err), *map(repr, err.args), repr(vars(err))])


@pytest.mark.parametrize("how", ["option", "GOOGLE_APPLICATION_CREDENTIALS"])
def test_malformed_service_account_is_a_typed_error(gcs_corpus, tmp_path, monkeypatch, how):
    secret = "c2VjcmV0LWtleS1tYXRlcmlhbC1abVk3"
    key = tmp_path / "service-account.json"
    key.write_text(
        '{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\n'
        + secret
        + '", "client_email": "x@y.iam.gserviceaccount.com", "private_key_id": "1"'
    )  # truncated: no closing brace
    uri = gcs_corpus["fs-special"].uris["gs"]
    if how == "option":
        opts: dict[str, Any] = {"gcs_service_account": key}
    else:
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
        opts = {}
    with pytest.raises(fastshard.AuthError) as info:
        fastshard.open(uri, max_attempts=1, **opts)
    text = _text(info.value)
    assert secret not in text
    assert "service-account.json" in str(info.value) and uri in str(info.value)


def test_unknown_bucket_less_uri():
    with pytest.raises(fastshard.InvalidArgumentError):
        fastshard.open("gs:///model.tensors")
