"""Typed errors from real servers (SeaweedFS, moto and rclone for S3,
nginx): wrong secret, missing objects and buckets, a corrupted object caught
by verify_hash, an object replaced mid-load (also on a store that ignores
If-Match: rclone itself, moto behind a proxy that drops it), presigned URLs,
servers that ignore Range. Messages name the URI (bucket and key) and never
hold a secret."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import remote_files
import torch
from conftest import as_bytes, assert_bit_equal, random_tensor
from fault_proxy import FaultProxy, Faults
from servers import MotoS3, no_range_server, require_binary
from tensorizer_files import layout, patch, tensorizer_write

import fastshard

S3 = pytest.mark.s3
HTTP = pytest.mark.http


def _text(err: BaseException) -> str:
    """Everything an error could show: str, repr, args, attributes."""
    return " ".join([str(err), repr(err), *map(repr, err.args), repr(vars(err))])


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return remote_files.two_versions(tmp_path_factory.mktemp("versions"))


def test_wrong_secret_is_a_fast_auth_error(s3_server, s3_server_corpus):
    uri = s3_server_corpus["tz-dtypes"].uris["s3"]
    secret = "not-the-secret-Hq7Lp0"
    with FaultProxy(s3_server.s3_port) as proxy:  # pass-through, counts requests
        started = time.monotonic()
        with pytest.raises(fastshard.AuthError) as info:
            fastshard.open(
                uri, **s3_server.opts(s3_endpoint=proxy.endpoint, s3_secret_access_key=secret)
            )
        elapsed = time.monotonic() - started
    assert elapsed < 5.0, f"AuthError took {elapsed:.2f} s"
    # One read and the probes beside it (never retried either).
    assert proxy.log.requests - proxy.log.probes == 1, "auth errors must not be retried"
    err = info.value
    assert isinstance(err, fastshard.StorageError)
    assert uri in str(err) and err.uri == uri
    assert "explicit" in str(err)  # names the credential source
    text = _text(err)
    assert secret not in text and s3_server.secret_key not in text
    # An unknown key id is an AuthError too.
    with pytest.raises(fastshard.AuthError):
        fastshard.open(uri, **s3_server.opts(s3_access_key_id="nobody"))


def test_wrong_secret_on_save(s3_server):
    secret = "not-the-secret-Hq7Lp0"
    uri = f"s3://{s3_server.bucket}/denied/x.tensors"
    with pytest.raises(fastshard.AuthError) as info:
        fastshard.save({"a": torch.ones(4)}, uri, **s3_server.opts(s3_secret_access_key=secret))
    assert secret not in _text(info.value)
    with pytest.raises(fastshard.NotFoundError):
        fastshard.open(uri, **s3_server.opts())  # nothing half-written


def test_missing_key_and_bucket(s3_server):
    uri = f"s3://{s3_server.bucket}/no/such/key.tensors"
    with pytest.raises(fastshard.NotFoundError) as info:
        fastshard.load_state_dict(uri, **s3_server.opts())
    assert isinstance(info.value, FileNotFoundError)
    assert uri in str(info.value)
    assert info.value.uri == uri
    uri = "s3://no-such-bucket-xyz/model.tensors"
    with pytest.raises(FileNotFoundError) as info:
        fastshard.open(uri, **s3_server.opts())
    assert isinstance(info.value, fastshard.NotFoundError)
    assert "no-such-bucket-xyz" in str(info.value)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(fastshard.NotFoundError):
        fastshard.load(model, uri, **s3_server.opts())
    with pytest.raises(fastshard.InvalidArgumentError, match="bucket and a key"):
        fastshard.open("s3://just-a-bucket", **s3_server.opts())


@HTTP
def test_missing_url(nginx):
    url = nginx.url("nope/missing.tensors")
    with pytest.raises(fastshard.NotFoundError) as info:
        fastshard.load_state_dict(url)
    assert isinstance(info.value, FileNotFoundError)
    assert "nope/missing.tensors" in str(info.value)


def _honours_if_match(server: Any, uri: str) -> bool:
    """Whether ``server`` refuses a GET of ``uri`` whose If-Match names
    another ETag (412), as boto3 sees it; rclone answers it with the bytes."""
    from botocore.exceptions import ClientError

    bucket, key = uri.removeprefix("s3://").split("/", 1)
    try:
        server.client().get_object(Bucket=bucket, Key=key, IfMatch='"0ther"', Range="bytes=0-0")
    except ClientError as e:
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 412, e.response
        return True
    return False


def test_object_replaced_mid_load_s3(s3_server, two_versions):
    v1, v2 = two_versions
    uri = s3_server.upload(v1, "changing/model.tensors")
    honours = _honours_if_match(s3_server, uri)
    f = fastshard.open(uri, part_size_bytes=1 << 20, **s3_server.opts())
    s3_server.upload(v2, "changing/model.tensors")  # new ETag
    result = None
    with pytest.raises(fastshard.ObjectChangedError) as info:
        result = f.load_state_dict()
    assert result is None
    text = str(info.value)
    assert uri in text and info.value.uri == uri
    if honours:  # SeaweedFS, moto: the pinned GET is refused (412)
        assert "ETag no longer matches" in text, text
    else:  # rclone: the new bytes come back, under the new ETag
        assert "response carries ETag" in text and "bytes " in text, text
    # Reopened, the new version loads whole.
    out = fastshard.load_state_dict(uri, verify_hash=True, **s3_server.opts())
    expected = fastshard.load_state_dict(v2)
    assert list(out) == list(expected)
    for name, want in expected.items():
        assert_bit_equal(out[name], want)


@pytest.fixture(scope="module")
def corrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A 3.3 MiB file written by tensorizer (so with hashes) whose tensor
    "middle" has one byte flipped past the first MiB, and what was written."""
    sd = {
        "head": random_tensor(torch.float32, (64, 1024), 1),
        "middle": random_tensor(torch.bfloat16, (1024, 1024), 2),
        "tail": random_tensor(torch.int32, (256, 1024), 3),
    }
    path = tensorizer_write(sd, tmp_path_factory.mktemp("corrupted") / "model.tensors")
    (middle,) = (e for e in layout(path) if e["name"] == "middle")
    at = middle["data_offset"] + middle["data_length"] // 2
    assert at > 1 << 20
    patch(path, at, bytes([path.read_bytes()[at] ^ 0x5A]))
    return path, sd


def test_verify_hash_catches_a_corrupted_object(s3_server, corrupted):
    path, sd = corrupted
    uri = s3_server.upload(path, "corrupted/model.tensors")
    opts = s3_server.opts(part_size_bytes=1 << 20)
    with pytest.raises(fastshard.IntegrityError) as info:
        fastshard.load_state_dict(uri, verify_hash=True, **opts)
    err = info.value
    assert err.tensor == "middle" and "middle" in str(err), str(err)
    assert uri in str(err), str(err)
    model = torch.nn.Module()
    for name, t in sd.items():
        model.register_buffer(name, torch.empty_like(t))
    with pytest.raises(fastshard.IntegrityError, match="middle"):
        fastshard.load(model, uri, verify_hash=True, **opts)
    # The tensors around it pass their hashes.
    out = fastshard.load_state_dict(uri, names=["head", "tail"], verify_hash=True, **opts)
    assert_bit_equal(out["head"], sd["head"])
    assert_bit_equal(out["tail"], sd["tail"])
    # Unchecked, "middle" loads as stored, the flipped byte with it: only
    # the hash told.
    out = fastshard.load_state_dict(uri, **opts)
    (middle,) = (e for e in layout(path) if e["name"] == "middle")
    start = middle["data_offset"]
    stored = path.read_bytes()[start : start + middle["data_length"]]
    assert as_bytes(out["middle"]).numpy().tobytes() == stored
    assert not torch.equal(as_bytes(out["middle"]), as_bytes(sd["middle"]))
    assert_bit_equal(out["head"], sd["head"])


@HTTP
def test_object_replaced_mid_load_http(nginx, two_versions):
    v1, v2 = two_versions
    url = nginx.publish(v1, "changing/model.tensors")
    f = fastshard.open(url, part_size_bytes=1 << 20)
    nginx.publish(v2, "changing/model.tensors")
    served = nginx.root / "changing" / "model.tensors"
    later = time.time() + 10  # nginx's ETag is mtime-size; make sure it moves
    os.utime(served, (later, later))
    with pytest.raises(fastshard.ObjectChangedError):
        f.load_state_dict()


@pytest.fixture(scope="module")
def moto_unchecked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3]:
    """moto checking no signatures: the one S3 store here in front of which
    a proxy may drop If-Match (SigV4 signs it)."""
    binary = require_binary(
        "moto_server", os.path.join(os.path.dirname(sys.executable), "moto_server")
    )
    server = MotoS3(tmp_path_factory.mktemp("moto-unchecked"), auth=False)
    try:
        yield server.start(binary)
    finally:
        server.stop()


def _replaced_on_a_store_ignoring_if_match(uri: str, replace: Any, **opts: Any) -> str:
    """Opens ``uri``, has ``replace()`` put the other version in its place,
    then loads: the store answers every pinned GET with the new bytes."""
    f = fastshard.open(uri, part_size_bytes=1 << 20, **opts)
    replace()
    result = None
    with pytest.raises(fastshard.ObjectChangedError) as info:
        result = f.load_state_dict()
    assert result is None, "a load across two versions must not return"
    text = str(info.value)
    # The response's own ETag told (a 412 would say "no longer matches").
    assert "response carries ETag" in text, text
    assert "bytes " in text  # the range
    return text


@pytest.mark.moto
def test_store_ignoring_if_match_never_mixes_versions_s3(moto_unchecked, two_versions):
    v1, v2 = two_versions
    server = moto_unchecked
    uri = server.upload(v1, "ignoring/model.tensors")
    with FaultProxy(server.s3_port, Faults(ignore_conditions=True)) as proxy:
        opts = server.opts(s3_endpoint=proxy.endpoint)
        text = _replaced_on_a_store_ignoring_if_match(
            uri, lambda: server.upload(v2, "ignoring/model.tensors"), **opts
        )
    assert uri in text
    # Every GET after discovery was sent pinned; the proxy dropped the pin.
    assert all("if-match" in h for _, _, h in proxy.log.reads[1:])


@HTTP
def test_store_ignoring_if_match_never_mixes_versions_http(nginx, two_versions):
    v1, v2 = two_versions
    url = nginx.publish(v1, "ignoring/model.tensors")

    def replace() -> None:
        nginx.publish(v2, "ignoring/model.tensors")
        later = time.time() + 10  # nginx's ETag is mtime-size; make sure it moves
        os.utime(nginx.root / "ignoring" / "model.tensors", (later, later))

    with FaultProxy(nginx.port, Faults(ignore_conditions=True)) as proxy:
        proxied = url.replace(f"127.0.0.1:{nginx.port}", f"127.0.0.1:{proxy.port}")
        text = _replaced_on_a_store_ignoring_if_match(proxied, replace)
    assert "ignoring/model.tensors" in text


@S3
def test_presigned_url(seaweed, s3_corpus):
    c = s3_corpus["tz-special"]
    url = seaweed.presign(c.uris["s3"])
    signature = re.search(r"X-Amz-Signature=([0-9a-f]+)", url)
    assert signature
    out = fastshard.load_state_dict(url, verify_hash=True)
    from remote_files import assert_same

    assert_same(out, c.source)
    with fastshard.open(url) as f:
        assert "Signature" not in f.uri and "X-Amz" not in f.uri
    # A presigned URL of a key that does not exist: not found, no secrets.
    missing = seaweed.presign(f"s3://{seaweed.bucket}/missing/x.tensors")
    with pytest.raises(fastshard.NotFoundError) as info:
        fastshard.open(missing)
    sig = re.search(r"X-Amz-Signature=([0-9a-f]+)", missing)
    assert sig
    text = _text(info.value)
    assert "Signature" not in text and "X-Amz-Credential" not in text and sig.group(1) not in text
    assert "missing/x.tensors" in str(info.value)
    # A tampered signature: an AuthError, still without the signature.
    bad = url.replace(signature.group(1), "0" * len(signature.group(1)))
    with pytest.raises(fastshard.AuthError) as info:
        fastshard.open(bad)
    assert "Signature" not in _text(info.value) and signature.group(1) not in _text(info.value)


@HTTP
def test_server_that_ignores_range(corpus):
    c = corpus["tz-big"]
    with no_range_server(c.path.parent) as base:
        url = f"{base}/{c.path.name}"
        with pytest.raises(fastshard.UnsupportedError, match="Range") as info:
            fastshard.load_state_dict(url)
    assert isinstance(info.value, fastshard.FastshardError)
    assert c.path.name in str(info.value)


@HTTP
def test_no_range_server_small_file_is_not_misread(corpus):
    # A server that ignores Range answers the discovery read with the whole
    # file: either it loads exactly (a file within that read), or the
    # missing Range support is reported; never wrong bytes.
    c = corpus["tz-special"]
    from remote_files import assert_same

    with no_range_server(c.path.parent) as base:
        try:
            out: Any = fastshard.load_state_dict(f"{base}/{c.path.name}", verify_hash=True)
        except fastshard.UnsupportedError as e:
            assert "Range" in str(e)
        else:
            assert_same(out, c.source)


def test_save_refuses_http():
    with pytest.raises(fastshard.UnsupportedError, match=r"local paths, s3:// and gs:// only"):
        fastshard.save({"a": torch.ones(1)}, "http://127.0.0.1:9/x.tensors")


@HTTP
def test_https_with_a_custom_ca_bundle(nginx, http_corpus):
    require_binary("openssl")
    assert nginx.tls_port and nginx.ca_bundle
    c = http_corpus["fs-special"]
    url = nginx.tls_url(c.uris["http"].split("/", 3)[3])
    from remote_files import assert_same

    out = fastshard.load_state_dict(url, ca_bundle=nginx.ca_bundle, verify_hash=True)
    assert_same(out, c.source)
    # Without the CA the certificate is not trusted: a storage error, at once.
    started = time.monotonic()
    with pytest.raises(fastshard.StorageError) as info:
        fastshard.open(url, max_attempts=1)
    assert time.monotonic() - started < 5
    assert "127.0.0.1" in str(info.value)
    assert "certificate" in str(info.value)


@HTTP
def test_tls_errors_are_not_retried(nginx):
    require_binary("openssl")
    # Retried, the error would end with the deadline's "passed while retrying".
    with pytest.raises(fastshard.StorageError) as info:
        fastshard.open(nginx.tls_url("anything.tensors"), deadline_seconds=0.5)
    assert "deadline" not in str(info.value)


@S3
@HTTP
def test_an_s3_endpoint_with_an_untrusted_certificate_fails_at_once(nginx):
    require_binary("openssl")
    opts: dict[str, Any] = {
        "s3_endpoint": nginx.tls_url().rstrip("/"),
        "s3_access_key_id": "fastshard",
        "s3_secret_access_key": "not-a-secret",
    }
    # The SDK's client refuses nginx's certificate: a storage error, not
    # retried until the deadline.
    with pytest.raises(fastshard.StorageError) as info:
        fastshard.open("s3://models/x.tensors", deadline_seconds=3, **opts)
    assert "TLS verification failed" in str(info.value)
    assert "deadline" not in str(info.value)
    # Trusting its CA, the same request reaches nginx (which is no S3).
    with pytest.raises(fastshard.FastshardError) as reached:
        fastshard.open("s3://models/x.tensors", ca_bundle=nginx.ca_bundle, max_attempts=1, **opts)
    assert "TLS verification" not in str(reached.value)


@HTTP
def test_bad_ca_bundle_is_an_invalid_argument(nginx):
    require_binary("openssl")
    with pytest.raises(fastshard.InvalidArgumentError, match="CA bundle"):
        fastshard.open(
            nginx.tls_url("x.tensors"), ca_bundle=nginx.base / "nginx.conf", max_attempts=1
        )
