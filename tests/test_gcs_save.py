"""Saves to gs:// through the Cloud Storage emulator, fake-gcs-server, on
port 80 (Google's client, which fastshard saves through, leaves the port out
of its Host header: see ``fastshard_lab.gcs``). The object holds exactly
the bytes of a local save and loads bit for bit through fastshard and
through the real tensorizer (its HTTP reader on the emulator's download
address), whether it went up in one request or in several; a second save
replaces the whole object; a sharded save writes its manifest beside the
files; a missing bucket is NotFoundError naming the URI; a save that fails
part way leaves no object."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from conftest import random_tensor
from remote_files import MiB, assert_read_back, assert_same, save_sources, tensorizer_read
from servers import FakeGcs, require_fake_gcs

import fastshard
from fastshard.shard import manifest_location, read_manifest

pytestmark = pytest.mark.gcs


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcs]:
    server = FakeGcs(tmp_path_factory.mktemp("fake-gcs-80"), port=80)
    try:
        yield server.start(require_fake_gcs())
    finally:
        server.stop()


@pytest.mark.parametrize("size", ["small", "parts"])
def test_save_read_by_fastshard_and_tensorizer(gcs, tmp_path, size):
    sd = save_sources()
    if size == "parts":
        # 72 MiB: two parts of the save's writer, five requests of the upload.
        sd["big"] = random_tensor(torch.float16, (36 * MiB,), 6)
    uri = f"gs://{gcs.bucket}/saved/{size}.tensors"
    written = fastshard.save(sd, uri, **gcs.opts())
    local = tmp_path / "local.tensors"
    assert fastshard.save(sd, local) == written
    assert gcs.get(uri) == local.read_bytes()  # the object is exactly the local file
    assert_same(fastshard.load_state_dict(uri, verify_hash=True, **gcs.opts()), sd)
    from tensorizer import stream_io  # its own HTTP reader

    assert_read_back(tensorizer_read(stream_io.open_stream(gcs.media_url(uri), "rb")), sd)


def test_a_second_save_replaces_the_whole_object(gcs):
    uri = f"gs://{gcs.bucket}/saved/overwrite.tensors"
    fastshard.save({"a": torch.ones(100_000)}, uri, **gcs.opts())
    fastshard.save({"b": torch.zeros(3)}, uri, **gcs.opts())
    out = fastshard.load_state_dict(uri, **gcs.opts())
    assert list(out) == ["b"] and torch.equal(out["b"], torch.zeros(3))


def test_sharded_save_writes_its_manifest_beside_the_files(gcs):
    parts = [{"w": random_tensor(torch.float32, (64, 8), rank)} for rank in range(2)]
    uris = fastshard.save_sharded(parts, f"gs://{gcs.bucket}/sharded/", **gcs.opts())
    assert uris == [f"gs://{gcs.bucket}/sharded/model-rank-{r:03d}.tensors" for r in range(2)]
    manifest = read_manifest(manifest_location(uris[0]), gcs.opts())
    assert manifest is not None and manifest.world_size == 2
    for uri, want in zip(uris, parts, strict=True):
        assert_same(fastshard.load_state_dict(uri, verify_hash=True, **gcs.opts()), want)
    # A second save deletes the first set's manifest before it writes.
    again = fastshard.save_sharded(parts[:1], f"gs://{gcs.bucket}/sharded/", **gcs.opts())
    manifest = read_manifest(manifest_location(again[0]), gcs.opts())
    assert manifest is not None and manifest.world_size == 1


def test_a_missing_bucket_is_not_found(gcs):
    uri = "gs://no-such-bucket/model.tensors"
    with pytest.raises(fastshard.NotFoundError) as info:
        fastshard.save({"a": torch.ones(4)}, uri, **gcs.opts())
    assert uri in str(info.value)


def test_a_save_that_fails_part_way_leaves_no_object(gcs):
    uri = f"gs://{gcs.bucket}/saved/cut.tensors"
    big = {"w": random_tensor(torch.float16, (64 * MiB,), 7)}  # 128 MiB
    with pytest.raises(fastshard.FastshardError):
        fastshard.save(big, uri, deadline_seconds=0.3, **gcs.opts())
    assert "saved/cut.tensors" not in gcs.names()
