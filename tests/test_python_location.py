"""fastshard._layouts.location (Python): what every part of the Python layer asks of a URI
(its kind, local path, query string, display form, folder), answered in
one place; these cases are what a reimplementation over the native
Location type must keep."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

import fastshard
from fastshard._layouts import location as loc
from fastshard._native import Location

PRESIGNED = "https://user:pw@h.example:8443/b/m-%03d.tensors?X-Amz-Signature=s3cr3t#frag"


@pytest.mark.parametrize(
    ("uri", "kind", "path"),
    [
        ("/models/m.tensors", "file", "/models/m.tensors"),
        ("m.tensors", "file", "m.tensors"),
        ("file:///models/m.tensors", "file", "/models/m.tensors"),
        ("s3://bucket/dir/m.tensors", "s3", None),
        ("http://h/m.tensors", "http", None),
        (PRESIGNED, "http", None),
    ],
)
def test_kind_and_local_path(uri: str, kind: str, path: str | None) -> None:
    assert loc.kind(uri) == kind
    assert loc.local_path(uri) == path
    assert loc.is_local(uri) == (path is not None)


def test_only_urls_have_a_query_string() -> None:
    assert loc.split(PRESIGNED) == (
        "https://user:pw@h.example:8443/b/m-%03d.tensors",
        "?X-Amz-Signature=s3cr3t#frag",
    )
    assert Location("http://h/m.tensors").query == ""
    # In an S3 key or a local path "?" is an ordinary character.
    assert loc.split("s3://b/what?.tensors") == ("s3://b/what?.tensors", "")
    assert loc.head("/tmp/a?b") == "/tmp/a?b"


def test_display_removes_every_secret() -> None:
    shown = loc.display(PRESIGNED)
    assert shown == "https://h.example:8443/b/m-%03d.tensors?…"
    assert "s3cr3t" not in shown and "pw" not in shown and "frag" not in shown
    assert loc.display("http://h/m.tensors#x") == "http://h/m.tensors"
    for plain in ("s3://b/k?x=1", "/tmp/m.tensors", "file:///tmp/m"):
        assert loc.display(plain) == plain


def test_directories_siblings_and_children(tmp_path: Path) -> None:
    def is_dir(uri: str) -> bool:
        return Location(uri).is_dir

    assert is_dir("s3://b/dir/") and not is_dir("s3://b/dir")
    assert is_dir("https://h/dir/?sig=1")
    assert is_dir(str(tmp_path)) and is_dir(f"file://{tmp_path}")
    assert not is_dir(str(tmp_path / "missing"))
    assert loc.directory("s3://b/dir/m.tensors") == "s3://b/dir/"
    assert loc.directory("https://h/d/m.t?sig=a/b") == "https://h/d/"
    assert loc.directory("m.tensors") == ""
    assert loc.name("https://h/d/m.t?sig=a/b") == "m.t"
    assert loc.name("s3://b/dir/") == ""
    assert loc.sibling("s3://b/dir/m.tensors", "x.json") == "s3://b/dir/x.json"
    assert loc.text(Location("s3://b/dir").child("m")) == "s3://b/dir/m"
    assert loc.text(Location("s3://b/dir/").child("m")) == "s3://b/dir/m"
    assert loc.text(Location("https://h/d?sig=1").child("m")) == "https://h/d/m?sig=1"
    assert loc.as_directory("/tmp/x") == "/tmp/x/" and loc.as_directory("/tmp/x/") == "/tmp/x/"


def test_derived_locations_keep_what_the_parse_found() -> None:
    base = Location("s3://b/dir/")
    assert (
        base.child("m-%03d.tensors").renamed("m-001.tensors").display == "s3://b/dir/m-001.tensors"
    )
    signed = Location("https://h/b/m-%03d.tensors?X-Amz-Signature=s")
    one = signed.renamed("m-001.tensors")
    assert (one.head, one.query) == ("https://h/b/m-001.tensors", "?X-Amz-Signature=s")
    assert Location("https://h/b?sig=1").child("x").query == "?sig=1"
    assert loc.parsed(base) is base


@pytest.mark.s3
def test_one_open_parses_its_uri_once(seaweed: Any) -> None:
    """``load_state_dict("s3://b/dir/", rank=1, world_size=2)``: the directory
    URI is parsed once, and its manifest, template and rank file are derived
    from the parsed location, never parsed again from a string (the open,
    the manifest read, the native reader, the load and its progress)."""
    prefix = f"s3://{seaweed.bucket}/parsed-once-{uuid.uuid4().hex[:8]}/"
    sources = [{"w": torch.full((4, 3), float(r)), "rank": torch.tensor([r])} for r in range(2)]
    fastshard.save_sharded(sources, prefix, **seaweed.opts())
    before = Location.parsed_from_python()
    got = fastshard.load_state_dict(prefix, rank=1, world_size=2, **seaweed.opts())
    assert Location.parsed_from_python() - before == 1
    assert torch.equal(got["w"], sources[1]["w"]) and got["rank"].item() == 1


def parses(fn: Any) -> int:
    before = Location.parsed_from_python()
    fn()
    return Location.parsed_from_python() - before


def test_saves_and_opens_of_every_layout_parse_their_uri_once(tmp_path: Path) -> None:
    """A per-rank save (its files and manifest), a packed save and open, and
    an HF directory's open (its index and every shard) derive what they
    read and write from the one parsed URI they were given."""
    from safetensors.torch import save_file

    sources = [{"w": torch.full((4, 3), float(r))} for r in range(2)]
    (tmp_path / "sh").mkdir()
    assert parses(lambda: fastshard.save_sharded(sources, f"{tmp_path}/sh/")) == 1
    packed = tmp_path / "p.tensors"
    assert parses(lambda: fastshard.save_sharded(sources, packed, packed=True)) == 1
    got: dict[str, Any] = {}
    assert parses(lambda: got.update(fastshard.load_state_dict(packed, rank=1, world_size=2))) == 1
    assert torch.equal(got["w"], sources[1]["w"])
    hf = tmp_path / "hf"
    hf.mkdir()
    names = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    save_file({"a": torch.ones(2)}, str(hf / names[0]))
    save_file({"b": torch.zeros(2)}, str(hf / names[1]))
    index = {"weight_map": {"a": names[0], "b": names[1]}}
    (hf / "model.safetensors.index.json").write_text(json.dumps(index))
    got.clear()
    assert parses(lambda: got.update(fastshard.load_state_dict(f"{hf}/"))) == 1
    assert sorted(got) == ["a", "b"]
