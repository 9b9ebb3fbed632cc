"""S3 part bodies read from the socket into the tensors (rust/io/s3/direct):
each ranged GET is presigned by the store's SDK client and sent by the
direct reader. Discovery goes through the SDK, which signs in an
``Authorization`` header; the direct reader's requests carry their
signature in the query instead, which is how these tests tell the two
apart. An error answer to a presigned request is asked again through the
SDK, whose answer decides: its error kind, or (moto, which takes no
presigned requests while it checks signatures) the SDK for the rest."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import remote_files
from conftest import assert_bit_equal
from fault_proxy import FaultProxy, Faults
from remote_files import MiB, assert_same

import fastshard

SECRET_RE = re.compile(r"x-amz-signature=|x-amz-credential=", re.IGNORECASE)


def _parts(proxy: FaultProxy) -> list[tuple[str, dict[str, str]]]:
    """Target and headers of the ranged GETs after discovery's first."""
    gets = [(t, h) for method, t, h in proxy.log.reads if method == "GET" and "range" in h]
    return gets[1:]


def _presigned(part: tuple[str, dict[str, str]]) -> bool:
    target, headers = part
    return "authorization" not in headers and "x-amz-signature=" in target.lower()


def _through(server: Any, faults: Faults | None = None) -> tuple[FaultProxy, dict[str, Any]]:
    proxy = FaultProxy(server.s3_port, faults, seed=7)
    return proxy, server.opts(s3_endpoint=proxy.endpoint)


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return remote_files.two_versions(tmp_path_factory.mktemp("direct-versions"))


def test_direct_loads_are_bit_equal_and_bypass_the_sdk(seaweed, s3_corpus, corpus, monkeypatch):
    uri = s3_corpus["tz-big"].uris["s3"]
    proxy, opts = _through(seaweed)
    with proxy:
        out = fastshard.load_state_dict(uri, part_size_bytes=MiB, concurrency=8, **opts)
        assert_same(out, corpus["tz-big"].source)
        parts = _parts(proxy)
        assert len(parts) > 10
        assert all(map(_presigned, parts)), parts[:2]
        # Each part asks for its own range, signed with it.
        assert len({h["range"] for _, h in parts}) == len(parts)
        # Switched off, the same load goes through the SDK.
        monkeypatch.setenv("FASTSHARD_HTTP_DIRECT", "0")
        proxy.reset_log()
        out = fastshard.load_state_dict(uri, part_size_bytes=MiB, concurrency=8, **opts)
        assert_same(out, corpus["tz-big"].source)
        parts = _parts(proxy)
        assert parts and not any(map(_presigned, parts)), parts[:2]


@pytest.mark.moto
def test_a_store_refusing_presigned_requests_loads_through_the_sdk(moto, moto_corpus, corpus):
    uri = moto_corpus["tz-big"].uris["s3"]
    proxy, opts = _through(moto)
    with proxy, fastshard.open(uri, part_size_bytes=4 * MiB, concurrency=1, **opts) as f:
        out = f.load_state_dict()
    assert_same(out, corpus["tz-big"].source)
    parts = _parts(proxy)
    # One refused presigned request; then every part through the SDK.
    assert _presigned(parts[0]) and not any(map(_presigned, parts[1:])), parts[:3]


def test_a_body_cut_short_resumes_where_it_stopped(seaweed, s3_corpus, corpus):
    uri = s3_corpus["tz-big"].uris["s3"]
    proxy, opts = _through(seaweed)
    with proxy, fastshard.open(uri, part_size_bytes=4 * MiB, concurrency=4, **opts) as f:
        proxy.set_faults(Faults(truncate=0.3))
        out = f.load_state_dict()
        stats = f.stats
    assert_same(out, corpus["tz-big"].source)
    assert proxy.log.truncated > 0
    assert stats.retries >= proxy.log.truncated
    parts = _parts(proxy)
    assert all(map(_presigned, parts))
    # Each retry asks for what was missing, not for the whole part again.
    starts = {int(re.match(r"bytes=(\d+)-", h["range"]).group(1)) % (4 * MiB) for _, h in parts}  # type: ignore[union-attr]
    assert any(s != 0 for s in starts)


def test_a_wrong_signature_is_an_auth_error_without_secrets(seaweed, s3_corpus):
    # SeaweedFS answers 403, as to a wrong secret; moto checks no signatures
    # of presigned requests.
    uri = s3_corpus["tz-big"].uris["s3"]
    proxy, opts = _through(seaweed)
    with proxy, fastshard.open(uri, part_size_bytes=4 * MiB, **opts) as f:
        proxy.set_faults(Faults(forge_signature="all"))
        with pytest.raises(fastshard.AuthError) as info:
            f.load_state_dict()
    err = info.value
    text = " ".join([str(err), repr(err), *map(repr, err.args)])
    assert uri in str(err) and "explicit" in str(err)
    assert seaweed.secret_key not in text
    assert not SECRET_RE.search(text), text
    assert _presigned(_parts(proxy)[0])


def test_a_presigned_request_refused_alone_goes_to_the_sdk(seaweed, s3_corpus, corpus):
    uri = s3_corpus["tz-big"].uris["s3"]
    proxy, opts = _through(seaweed)
    with proxy, fastshard.open(uri, part_size_bytes=4 * MiB, concurrency=1, **opts) as f:
        proxy.set_faults(Faults(forge_signature="query"))
        out = f.load_state_dict()
    assert_same(out, corpus["tz-big"].source)
    parts = _parts(proxy)
    assert _presigned(parts[0]) and not any(map(_presigned, parts[1:])), parts[:3]


def test_a_key_deleted_mid_load_is_not_found(seaweed, two_versions):
    v1, _ = two_versions
    uri = seaweed.upload(v1, "direct/deleted.tensors")
    proxy, opts = _through(seaweed)
    with proxy, fastshard.open(uri, part_size_bytes=MiB, **opts) as f:
        seaweed.client().delete_object(Bucket=seaweed.bucket, Key="direct/deleted.tensors")
        with pytest.raises(fastshard.NotFoundError) as info:
            f.load_state_dict()
    assert uri in str(info.value)
    assert "bytes " in str(info.value)  # the part's range
    assert _presigned(_parts(proxy)[0])


def test_an_object_replaced_mid_load_is_a_changed_object(seaweed, two_versions):
    v1, v2 = two_versions
    uri = seaweed.upload(v1, "direct/changing.tensors")
    proxy, opts = _through(seaweed)
    with proxy, fastshard.open(uri, part_size_bytes=MiB, **opts) as f:
        seaweed.upload(v2, "direct/changing.tensors")
        with pytest.raises(fastshard.ObjectChangedError) as info:
            f.load_state_dict()
    assert uri in str(info.value)
    parts = _parts(proxy)
    assert _presigned(parts[0]) and all("if-match" in h for _, h in parts)
    # Reopened, the new version loads whole.
    out = fastshard.load_state_dict(uri, **seaweed.opts())
    expected = fastshard.load_state_dict(v2)
    for name, want in expected.items():
        assert_bit_equal(out[name], want)
