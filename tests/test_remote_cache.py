"""The node-local cache (``cache_dir``) against a real store, SeaweedFS: a
second load of an object reads local disk only (the discovery request
aside), bit for bit; a corrupted or truncated entry is refetched; two
processes filling the cache at once agree and leave one entry; an object
replaced on the store is fetched again."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_bit_equal, random_tensor
from fault_proxy import FaultProxy

import fastshard

pytestmark = pytest.mark.s3

MiB = 1 << 20
OBJECT = 256 * MiB
# The ranges an entry checks (rust/io/cache/entry.rs): a damaged byte costs
# at most this much from the store.
BLOCK = 4 * MiB


def state(seed: int, mib: int) -> dict[str, torch.Tensor]:
    """Tensors of `mib` MiB in all: two large ones and a few small."""
    each = (mib * MiB - 3 * 4096) // 2 // 4
    return {
        "big.0": random_tensor(torch.float32, (each,), seed),
        "big.1": random_tensor(torch.float32, (each,), seed + 1),
        **{f"small.{i}": random_tensor(torch.float16, (1024,), seed + 2 + i) for i in range(3)},
    }


@pytest.fixture(scope="module")
def big(seaweed, tmp_path_factory) -> tuple[str, dict[str, torch.Tensor]]:
    """A 256 MiB object on SeaweedFS and what it holds."""
    sd = state(1, OBJECT // MiB)
    path = tmp_path_factory.mktemp("cache-src") / "big.tensors"
    fastshard.save(sd, path)
    return seaweed.upload(path, "cache/big.tensors"), sd


def entries(cache: Path) -> tuple[list[Path], list[Path]]:
    """The manifests and data files in the cache."""
    return sorted(cache.glob("*.manifest")), sorted(cache.glob("*.data"))


def load(uri: str, **opts: Any) -> tuple[dict[str, torch.Tensor], fastshard.LoadStats]:
    with fastshard.open(uri, **opts) as f:
        out = f.load_state_dict()
        return out, f.stats


def assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for k, t in want.items():
        assert_bit_equal(got[k], t)


def test_a_second_load_reads_the_cache_alone(seaweed, big, tmp_path) -> None:
    uri, sd = big
    opts = seaweed.opts(cache_dir=tmp_path / "cache")
    got, first = load(uri, **opts)
    assert_equal(got, sd)
    assert first.bytes_from_cache == 0
    assert first.bytes_fetched >= first.bytes_wanted > OBJECT - MiB
    got, second = load(uri, **opts)
    assert_equal(got, sd)
    # Nothing from the store after the open's discovery request.
    assert (second.bytes_fetched, second.requests) == (0, 0)
    # Each cached byte is read (and checked) once: parts are cut at the
    # entry's checked ranges.
    assert second.bytes_from_cache == second.bytes_wanted == first.bytes_wanted
    manifests, data = entries(tmp_path / "cache")
    assert len(manifests) == len(data) == 1


@pytest.mark.parametrize("store", ["s3", "http"])
def test_a_held_object_costs_the_store_one_head(seaweed, nginx, tmp_path, store) -> None:
    sd = state(3, 8)
    path = tmp_path / "small.tensors"
    fastshard.save(sd, path)
    if store == "s3":
        uri, port = seaweed.upload(path, "cache/small.tensors"), seaweed.s3_port
    else:
        uri, port = nginx.publish(path, "cache/small.tensors"), nginx.port
    with FaultProxy(port) as proxy:  # pass-through; logs each request
        opts: dict[str, Any] = {"cache_dir": tmp_path / "cache"}
        if store == "s3":
            opts = seaweed.opts(s3_endpoint=proxy.endpoint, **opts)
        else:
            uri = uri.replace(f":{port}/", f":{proxy.port}/")
        assert_equal(load(uri, **opts)[0], sd)
        proxy.reset_log()
        got, st = load(uri, **opts)
        log = proxy.reset_log()
    assert_equal(got, sd)
    assert st.bytes_fetched == 0
    # Discovery asked for the version alone; the index came from the entry.
    assert [method for method, _, _ in log.seen] == ["HEAD"]


def test_the_environment_variable_turns_the_cache_on(seaweed, big, tmp_path, monkeypatch):
    uri, sd = big
    monkeypatch.setenv("FASTSHARD_CACHE_DIR", str(tmp_path / "env-cache"))
    names = ["small.0", "small.2"]
    first = fastshard.load_state_dict(uri, names=names, **seaweed.opts())
    with fastshard.open(uri, **seaweed.opts()) as f:
        again = f.load_state_dict(names=names)
        assert (f.stats.bytes_fetched, f.stats.bytes_from_cache > 0) == (0, True)
    for k in names:
        assert_bit_equal(first[k], sd[k])
        assert_bit_equal(again[k], sd[k])
    # A rank that read only its slices cached only those.
    _, data = entries(tmp_path / "env-cache")
    assert data[0].stat().st_blocks * 512 < 2 * MiB


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_entry_is_detected_and_refetched(seaweed, big, tmp_path, damage) -> None:
    uri, sd = big
    opts = seaweed.opts(cache_dir=tmp_path / "cache")
    load(uri, **opts)
    # A load once the entry has settled checks every piece and seals it
    # (rust/io/cache/seal.rs): the damage below must break the seals.
    time.sleep(0.3)
    load(uri, **opts)
    _, (data,) = entries(tmp_path / "cache")
    with open(data, "r+b") as f:
        if damage == "flip":
            f.seek(OBJECT // 2)
            byte = f.read(1)
            f.seek(OBJECT // 2)
            f.write(bytes([byte[0] ^ 0xFF]))
        else:
            f.truncate(OBJECT - 10 * MiB)
    got, st = load(uri, **opts)
    assert_equal(got, sd)
    assert st.bytes_fetched > 0
    # Only the checked ranges (BLOCK, 4 MiB at most) that failed are
    # fetched again: the one a flipped byte is in, or those past the cut.
    assert st.bytes_fetched <= (BLOCK if damage == "flip" else 10 * MiB + BLOCK)
    got, st = load(uri, **opts)
    assert_equal(got, sd)
    assert st.bytes_fetched == 0, "the entry healed"


CHILD = """
import hashlib, json, sys, fastshard
opts = json.loads(sys.argv[2])
with fastshard.open(sys.argv[1], **opts) as f:
    sd = f.load_state_dict()
    digest = hashlib.sha256()
    for k, t in sd.items():
        digest.update(k.encode())
        digest.update(t.contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes())
    print(json.dumps({"digest": digest.hexdigest(), "fetched": f.stats.bytes_fetched,
                      "cached": f.stats.bytes_from_cache}))
"""


def test_two_processes_filling_at_once_agree_and_leave_one_entry(seaweed, big, tmp_path):
    uri, sd = big
    cache = tmp_path / "cache"
    opts = seaweed.opts(cache_dir=str(cache))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, uri, json.dumps(opts)],
            stdout=subprocess.PIPE,
            env=env,
        )
        for _ in range(2)
    ]
    outs = []
    for c in children:
        stdout, _ = c.communicate(timeout=300)
        assert c.returncode == 0
        outs.append(json.loads(stdout))
    want = hashlib.sha256()
    for k, t in sd.items():
        want.update(k.encode())
        want.update(t.contiguous().view(-1).view(dtype=torch.uint8).numpy().tobytes())
    assert [o["digest"] for o in outs] == [want.hexdigest()] * 2
    manifests, data = entries(cache)
    assert len(manifests) == len(data) == 1
    got, st = load(uri, **opts)
    assert_equal(got, sd)
    assert st.bytes_fetched == 0


def test_an_object_replaced_on_the_store_is_fetched_again(seaweed, tmp_path) -> None:
    src = tmp_path / "v.tensors"
    opts = seaweed.opts(cache_dir=tmp_path / "cache")
    v1, v2 = state(10, 4), state(20, 4)
    fastshard.save(v1, src)
    uri = seaweed.upload(src, "cache/replaced.tensors")
    assert_equal(load(uri, **opts)[0], v1)
    assert load(uri, **opts)[1].bytes_fetched == 0
    fastshard.save(v2, src)
    seaweed.upload(src, "cache/replaced.tensors")
    got, st = load(uri, **opts)
    assert_equal(got, v2)
    assert st.bytes_from_cache == 0 and st.bytes_fetched >= st.bytes_wanted
    # The new version replaced the old one's entry.
    manifests, data = entries(tmp_path / "cache")
    assert len(manifests) == len(data) == 1
    got, st = load(uri, **opts)
    assert_equal(got, v2)
    assert st.bytes_fetched == 0


def test_the_size_cap_keeps_the_most_recently_used(seaweed, tmp_path) -> None:
    opts = seaweed.opts(cache_dir=tmp_path / "cache", cache_max_bytes=6 * MiB)
    uris = []
    for i in range(3):
        src = tmp_path / f"{i}.tensors"
        fastshard.save(state(30 + i, 4), src)
        uris.append(seaweed.upload(src, f"cache/cap-{i}.tensors"))
    for uri in uris:
        load(uri, **opts)
    manifests, _ = entries(tmp_path / "cache")
    assert len(manifests) == 1
    assert load(uris[-1], **opts)[1].bytes_fetched == 0
    assert load(uris[0], **opts)[1].bytes_from_cache == 0


def test_a_bad_cap_or_directory_is_a_typed_error(seaweed, big, tmp_path, monkeypatch) -> None:
    uri, _ = big
    monkeypatch.setenv("FASTSHARD_CACHE_MAX_BYTES", "a lot")
    with pytest.raises(fastshard.InvalidArgumentError, match="FASTSHARD_CACHE_MAX_BYTES"):
        fastshard.open(uri, cache_dir=tmp_path, **seaweed.opts())
    monkeypatch.delenv("FASTSHARD_CACHE_MAX_BYTES")
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(fastshard.FastshardError, match="file"):
        fastshard.open(uri, cache_dir=blocker / "sub", **seaweed.opts())
