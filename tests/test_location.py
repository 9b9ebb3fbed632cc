"""``fastshard._native.Location``: a URI parsed once in Rust (kind, parts,
a display form without secrets), and the native entry points taking it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastshard import _native
from fastshard.errors import InvalidArgumentError, NotFoundError, UnsupportedError

Location = _native.Location


def test_plain_path(tmp_path: Path) -> None:
    f = tmp_path / "m.tensors"
    loc = Location(str(f))
    assert loc.kind == "file"
    assert loc.path == str(f)
    assert loc.display == str(f) == str(loc)
    assert loc.head == str(f)
    assert loc.query == ""
    assert loc.bucket is None and loc.key is None
    assert not loc.is_dir
    assert repr(loc) == f"Location({str(f)!r})"
    # os.PathLike works, and a directory on disk is a directory now.
    assert Location(tmp_path).is_dir
    assert Location(tmp_path).path == str(tmp_path)
    assert loc.sibling("manifest.json").path == str(tmp_path / "manifest.json")


def test_file_url_keeps_question_marks(tmp_path: Path) -> None:
    loc = Location(f"file://{tmp_path}/a?b.tensors")
    assert loc.kind == "file"
    assert loc.path == f"{tmp_path}/a?b.tensors"
    assert loc.query == ""
    assert loc.display == f"file://{tmp_path}/a?b.tensors"
    assert Location(f"file://{tmp_path}").is_dir
    assert loc.sibling("x").display == f"file://{tmp_path}/x"


def test_s3_object_and_prefix() -> None:
    obj = Location("s3://bucket/dir/model-%03d.tensors")
    assert obj.kind == "s3"
    assert (obj.bucket, obj.key) == ("bucket", "dir/model-%03d.tensors")
    assert obj.path is None
    assert obj.head == "s3://bucket/dir/model-%03d.tensors"
    assert obj.query == ""
    assert not obj.is_dir
    assert obj.sibling("fastshard-manifest.json").key == "dir/fastshard-manifest.json"

    prefix = Location("s3://bucket/dir/")
    assert prefix.is_dir
    assert prefix.key == "dir/"
    assert Location("s3://bucket").key == ""
    assert Location("s3://bucket").sibling("m").display == "s3://bucket/m"
    # In an S3 key "?" is an ordinary character.
    assert Location("s3://b/k?v").key == "k?v"


def test_http_url_hides_user_info_query_and_fragment() -> None:
    url = "https://user:hunter2@host.example:8443/d/m.tensors?token=s3cr3t#part"
    loc = Location(url)
    assert loc.kind == "http"
    assert loc.display == "https://host.example:8443/d/m.tensors?…"
    assert str(loc) == loc.display
    assert repr(loc) == "Location('https://host.example:8443/d/m.tensors?…')"
    for secret in ("hunter2", "user", "s3cr3t", "part"):
        assert secret not in loc.display and secret not in repr(loc)
    assert loc.head == "https://user:hunter2@host.example:8443/d/m.tensors"
    assert loc.query == "?token=s3cr3t#part"
    assert loc.path is None and loc.bucket is None
    sibling = loc.sibling("fastshard-manifest.json")
    assert sibling.query == ""
    assert sibling.head == "https://user:hunter2@host.example:8443/d/fastshard-manifest.json"
    assert Location("http://h/d/?sig=1").is_dir
    assert Location("http://h/a#frag").display == "http://h/a"


def test_presigned_url() -> None:
    url = (
        "https://bucket.s3.amazonaws.com/m-%d.tensors?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=AKIDEXAMPLE%2F20260101&X-Amz-Signature=deadbeef"
    )
    loc = Location(url)
    assert loc.display == "https://bucket.s3.amazonaws.com/m-%d.tensors?…"
    assert loc.head == "https://bucket.s3.amazonaws.com/m-%d.tensors"
    assert loc.head + loc.query == url
    assert "deadbeef" not in loc.display and "AKIDEXAMPLE" not in loc.display


def test_bad_scheme_and_s3_without_bucket() -> None:
    with pytest.raises(UnsupportedError) as info:
        Location("az://user:pw@b/k?sig=x")
    assert info.value.uri == "az://b/k?…"
    assert "pw" not in str(info.value) and "sig" not in str(info.value)
    for bad in ("s3://", "s3:///key"):
        with pytest.raises(InvalidArgumentError):
            Location(bad)
    with pytest.raises(TypeError):
        Location(3)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        Location("/x").kind = "s3"  # type: ignore[misc]


def test_entry_points_take_a_location(tmp_path: Path) -> None:
    manifest = Location(str(tmp_path / "m.json"))
    assert _native.read_object(manifest) is None
    _native.write_object(manifest, b"{}")
    assert _native.read_object(manifest) == b"{}"
    _native.delete_object(manifest)
    assert _native.read_object(str(tmp_path / "m.json")) is None

    target = Location(str(tmp_path / "t.tensors"))
    size = _native.write_file(target, [("a", 2, 0, "uint8", [4], False)], [b"\x01\x02\x03\x04"])
    assert size == (tmp_path / "t.tensors").stat().st_size
    reader = _native.Reader(target)
    assert reader.uri == target.display
    assert [e[0] for e in reader.entries()] == ["a"]
    buf = bytearray(4)
    reader.load([0], [buf])
    assert bytes(buf) == b"\x01\x02\x03\x04"

    with pytest.raises(NotFoundError):
        _native.Reader(Location(str(tmp_path / "missing.tensors")))
    with pytest.raises(UnsupportedError):
        _native.write_object(Location("https://h/m.json?sig=x"), b"x")
