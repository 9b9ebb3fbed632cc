"""Tensor-parallel loads of every layout, one spawned process per rank in a
gloo group, against the real SeaweedFS: per-rank files, one packed object
holding every rank, one unsharded object sliced per rank (fused qkv with
unequal parts, row-parallel dim-1 weights, replicated norms and biases), the
same cooperatively (each byte fetched once per group), and a host-memory
budget. The same layouts, smaller and rank by rank in one process, load from
each S3 store: SeaweedFS, moto and rclone."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fastshard
from fastshard import ShardSpec
from fastshard._coop import shm as _shm

# The block's sizes: hidden, query, key (and value), intermediate, vocabulary.
Sizes = tuple[int, int, int, int, int]
BIG: Sizes = (1024, 1024, 512, 2048, 4096)  # ~26 MiB: the group loads
SMALL: Sizes = (256, 256, 128, 512, 1024)  # ~1.6 MiB: every S3 store, rank by rank
H, Q, K, INTER, VOCAB = BIG
Split = tuple[int, tuple[int, ...] | None] | None


def specs(sizes: Sizes = BIG) -> dict[str, ShardSpec]:
    _, q, k, inter, _ = sizes
    return {
        "qkv.weight": ShardSpec(0, parts=(q, k, k)),
        "qkv.bias": ShardSpec(0, parts=(q, k, k)),
        "gate_up.weight": ShardSpec(0, parts=(inter, inter)),
    }


def splits(sizes: Sizes = BIG) -> dict[str, Split]:
    """How the reference slices each tensor: (dim, fused parts) or None (replicated)."""
    _, q, k, inter, _ = sizes
    return {
        "embed.weight": (0, None),
        "qkv.weight": (0, (q, k, k)),
        "qkv.bias": (0, (q, k, k)),
        "o.weight": (1, None),
        "o.bias": None,
        "norm.weight": None,
        "norm.bias": None,
        "gate_up.weight": (0, (inter, inter)),
        "down.weight": (1, None),
    }


SPECS = specs()
DIM0 = ["embed.weight", "qkv.weight", "qkv.bias", "gate_up.weight"]
# How a cooperative load's ranks exchange (the env's values), and what its
# stats then say on a group whose ranks share this host.
EXCHANGES = {"auto": "shared-memory", "collective": "collective"}
# A state dict has no model shapes to infer splits from: every split is named.
SD_SPECS = {**SPECS, "embed.weight": 0}


class TPBlock(torch.nn.Module):
    """A transformer block's weights as one tensor-parallel rank holds them."""

    def __init__(self, world_size: int, sizes: Sizes = BIG) -> None:
        super().__init__()
        w = world_size
        h, q, k, inter, vocab = sizes
        self.embed = torch.nn.Embedding(vocab // w, h, dtype=torch.bfloat16)
        self.qkv = torch.nn.Linear(h, (q + 2 * k) // w, dtype=torch.bfloat16)
        self.o = torch.nn.Linear(q // w, h, dtype=torch.bfloat16)
        self.norm = torch.nn.LayerNorm(h)  # float32, replicated
        # float32 in the model, bfloat16 in the file: loaded through a cast.
        self.gate_up = torch.nn.Linear(h, 2 * inter // w, bias=False)
        self.down = torch.nn.Linear(inter // w, h, bias=False, dtype=torch.bfloat16)


def full_state(sizes: Sizes = BIG) -> dict[str, torch.Tensor]:
    """The unsharded checkpoint (file dtypes), the same in every process."""
    g = torch.Generator().manual_seed(1234)
    ref = TPBlock(1, sizes)
    out: dict[str, torch.Tensor] = {}
    for name, t in ref.state_dict().items():
        dtype = torch.bfloat16 if name.startswith("gate_up") else t.dtype
        out[name] = torch.randn(t.shape, generator=g).to(dtype)
    return out


def ref_slice(
    name: str, full: torch.Tensor, rank: int, world_size: int, sizes: Sizes = BIG
) -> torch.Tensor:
    split = splits(sizes)[name]
    if split is None:
        return full
    dim, parts = split
    pieces = full.split(list(parts), dim) if parts else [full]
    return torch.cat([p.chunk(world_size, dim)[rank] for p in pieces], dim)


def rank_state(
    full: dict[str, torch.Tensor], rank: int, world_size: int, sizes: Sizes = BIG
) -> dict[str, Any]:
    return {n: ref_slice(n, t, rank, world_size, sizes).contiguous() for n, t in full.items()}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)))


def check_model(
    model: torch.nn.Module, full: dict[str, torch.Tensor], rank: int, ws: int, sizes: Sizes = BIG
) -> None:
    got = model.state_dict()
    assert sorted(got) == sorted(full)
    for name, t in full.items():
        want = ref_slice(name, t, rank, ws, sizes).to(got[name].dtype)
        assert _same_bits(got[name].contiguous(), want.contiguous()), f"rank {rank}: {name}"


def _cooperative(
    uri: str, rank: int, ws: int, full: dict[str, torch.Tensor], budget: int, opts: dict[str, Any]
) -> dict[str, Any]:
    """A cooperative model load and state-dict load: the bytes each
    fetched and received, and how the ranks exchanged."""
    model = TPBlock(ws)
    stats = fastshard.load(
        model, uri, rank, ws, shard_specs=SPECS, cooperative=True, max_host_bytes=budget, **opts
    )
    check_model(model, full, rank, ws)
    # The same as a state dict: the dim-0 splits sliced, the rest whole
    # (so replicated for this load), within a budget of its own.
    with fastshard.open(uri, max_host_bytes=budget, **opts) as f:
        sd = f.load_state_dict(rank=rank, world_size=ws, shard_specs=SD_SPECS, cooperative=True)
        sd_stats = f.stats
    for name, t in full.items():
        want = ref_slice(name, t, rank, ws) if name in DIM0 else t
        assert _same_bits(sd[name], want.contiguous()), f"rank {rank}: {name}"
    return {
        "fetched": stats.bytes_fetched,
        "received": stats.bytes_received,
        "peak": stats.peak_host_bytes,
        "exchange": [stats.exchange, sd_stats.exchange],
        "sd_received": sd_stats.bytes_received,
        "sd_share": sum(t.nbytes for t in sd.values()),
    }


def _rank_main(rank: int, ws: int, uris: dict[str, str], opts: dict[str, Any], out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out}/pg", rank=rank, world_size=ws)
    try:
        full = full_state()
        report: dict[str, Any] = {}

        # 1. This rank's own file of a per-rank set; meta parameters materialise.
        with torch.device("meta"):
            model = TPBlock(ws)
        stats = fastshard.load(model, uris["per_rank"], rank, ws, **opts)
        check_model(model, full, rank, ws)
        share = sum(t.nbytes for t in rank_state(full, rank, ws).values())
        report["per_rank"] = {"fetched": stats.bytes_fetched, "share": share}

        # 2. One packed object holding every rank: only this rank's records.
        with torch.device("meta"):
            model = TPBlock(ws)
        stats = fastshard.load(model, uris["packed"], rank, ws, **opts)
        check_model(model, full, rank, ws)
        report["packed"] = {"fetched": stats.bytes_fetched, "share": share}

        # 3. One unsharded object, sliced: only this rank's bytes are read.
        model = TPBlock(ws)
        stats = fastshard.load(model, uris["full"], rank, ws, shard_specs=SPECS, **opts)
        check_model(model, full, rank, ws)
        report["unsharded"] = {
            "fetched": stats.bytes_fetched,
            "amplification": stats.read_amplification,
        }
        sd = fastshard.load_state_dict(
            uris["full"], rank=rank, world_size=ws, names=DIM0, shard_specs=SD_SPECS, **opts
        )
        for name in DIM0:
            assert _same_bits(sd[name], ref_slice(name, full[name], rank, ws)), name
        with fastshard.open(uris["full"], **opts) as f:
            f.load_state_dict(rank=rank, world_size=ws, names=DIM0, shard_specs=SD_SPECS)
            dim0_share = sum(ref_slice(n, full[n], rank, ws).nbytes for n in DIM0)
            report["dim0"] = {"fetched": f.stats.bytes_fetched, "share": dim0_share}

        # 4. Cooperative: the group fetches the object once between them,
        # under a budget small enough that big tensors travel in row blocks,
        # exchanged through shared memory (these ranks share a host) and
        # through the group's all-to-all (as across hosts).
        budget = 3 << 20
        report["budget"] = budget
        for exchange in EXCHANGES:
            os.environ[_shm.ENV] = exchange
            report[exchange] = _cooperative(uris["full"], rank, ws, full, budget, opts)
        Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def tp_objects(seaweed: Any) -> dict[str, Any]:
    full = full_state()
    opts = seaweed.opts()
    base = f"s3://{seaweed.bucket}/tp-loading"
    fastshard.save(full, f"{base}/full.tensors", **opts)
    templates, packed = {}, {}
    for ws in (1, 2, 4):
        states = [rank_state(full, r, ws) for r in range(ws)]
        template = f"{base}/ws{ws}/model-rank-%03d.tensors"
        fastshard.save_sharded(states, template, **opts)
        templates[ws] = template
        packed[ws] = f"{base}/ws{ws}/packed.tensors"
        fastshard.save_sharded(states, packed[ws], packed=True, **opts)
    with fastshard.open(f"{base}/full.tensors", **opts) as f:
        size = f.file_size
    return {
        "opts": opts,
        "full": f"{base}/full.tensors",
        "templates": templates,
        "packed": packed,
        "size": size,
    }


@pytest.mark.parametrize("ws", [1, 2, 4])
def test_every_layout_at_world_size(ws: int, tp_objects: dict[str, Any], tmp_path: Path) -> None:
    uris = {
        "full": tp_objects["full"],
        "per_rank": tp_objects["templates"][ws],
        "packed": tp_objects["packed"][ws],
    }
    mp.spawn(_rank_main, args=(ws, uris, tp_objects["opts"], str(tmp_path)), nprocs=ws)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ws)]
    for r in reports:
        # Per-rank files and dim-0 slices: this rank's bytes and nothing else
        # (bytes_fetched excludes the discovery read of header and index).
        for layout in ("per_rank", "packed"):
            assert r[layout]["fetched"] <= 1.02 * r[layout]["share"], (layout, r)
        assert r["dim0"]["fetched"] <= 1.02 * r["dim0"]["share"], r
        share = r["per_rank"]["share"]
        for exchange, name in EXCHANGES.items():
            coop = r[exchange]
            # A group of one loads alone: nothing to exchange.
            assert coop["exchange"] == [name if ws > 1 else ""] * 2, (exchange, r)
            assert coop["peak"] <= r["budget"], r
            # From the other ranks a rank receives its own slices and the
            # replicated tensors, nothing more (less what it fetched itself).
            assert coop["received"] <= 1.05 * share, r
            assert coop["sd_received"] <= 1.05 * coop["sd_share"], r
            if ws > 1:
                assert coop["received"] > 0, r
    for exchange in EXCHANGES:
        total_coop = sum(r[exchange]["fetched"] for r in reports)
        assert total_coop <= 1.02 * tp_objects["size"], (exchange, total_coop, tp_objects["size"])
    if ws > 1:
        # Uncoordinated slicing reads more than the object between the ranks
        # (row-parallel weights are strided); cooperation is what fixes it.
        assert sum(r["unsharded"]["fetched"] for r in reports) > total_coop


def test_slices_from_every_s3_store(s3_server: Any) -> None:
    """Every layout at world size 2, saved to the store by fastshard and
    loaded rank by rank (no group: nothing cooperative) in parts of 64 KiB:
    each rank's tensors bit-equal torch's slices of the full ones, and
    per-rank, packed and dim-0 loads read only that rank's bytes."""
    ws, sizes = 2, SMALL
    full = full_state(sizes)
    opts, parts = s3_server.opts(), {"part_size_bytes": 64 << 10}
    base = f"s3://{s3_server.bucket}/tp-stores"
    uris = {
        "full": f"{base}/full.tensors",
        "per_rank": f"{base}/model-rank-%03d.tensors",
        "packed": f"{base}/packed.tensors",
    }
    fastshard.save(full, uris["full"], **opts)
    states = [rank_state(full, r, ws, sizes) for r in range(ws)]
    fastshard.save_sharded(states, uris["per_rank"], **opts)
    fastshard.save_sharded(states, uris["packed"], packed=True, **opts)
    sd_specs = {**specs(sizes), "embed.weight": 0}
    for rank in range(ws):
        share = sum(t.nbytes for t in states[rank].values())
        for layout in ("per_rank", "packed"):
            with torch.device("meta"):
                model = TPBlock(ws, sizes)
            stats = fastshard.load(model, uris[layout], rank, ws, **parts, **opts)
            check_model(model, full, rank, ws, sizes)
            assert 0 < stats.bytes_fetched <= 1.02 * share, (layout, rank, stats)
        # The unsharded object sliced: fused qkv of unequal parts, dim-1
        # (strided) row-parallel weights, gate_up cast to the model's float32.
        model = TPBlock(ws, sizes)
        stats = fastshard.load(
            model, uris["full"], rank, ws, shard_specs=specs(sizes), **parts, **opts
        )
        check_model(model, full, rank, ws, sizes)
        assert stats.requests > 1, stats
        with fastshard.open(uris["full"], **parts, **opts) as f:
            sd = f.load_state_dict(rank=rank, world_size=ws, names=DIM0, shard_specs=sd_specs)
            fetched = f.stats.bytes_fetched
        assert list(sd) == DIM0
        for name in DIM0:
            want = ref_slice(name, full[name], rank, ws, sizes)
            assert _same_bits(sd[name], want.contiguous()), (rank, name)
        # A gap of up to 64 KiB between wanted ranges is read through, not
        # split into two requests: here the other rank's 64 KiB of q rows.
        dim0_share = sum(t.nbytes for t in sd.values())
        assert 0 < fetched <= 1.02 * dim0_share + (64 << 10), (rank, fetched, dim0_share)


def test_slicing_errors_are_typed_and_early(tmp_path: Path) -> None:
    full = full_state()
    path = tmp_path / "full.tensors"
    fastshard.save(full, path)
    # Unequal fused parts cannot be inferred from shapes alone... they can,
    # as an even split, which is wrong; a spec whose parts do not add up is refused.
    bad = {"qkv.weight": ShardSpec(0, parts=(Q, K))}
    with pytest.raises(fastshard.InvalidArgumentError, match="do not add up"):
        fastshard.load(TPBlock(2), path, 0, 2, shard_specs=bad)
    # parts= is the fused sizes, not a rank count (that comes from world_size).
    with pytest.raises(fastshard.InvalidArgumentError, match="fused"):
        fastshard.load_state_dict(
            path,
            rank=0,
            world_size=2,
            shard_specs={"o.weight": ShardSpec(0, parts=2)},  # type: ignore[arg-type]
        )
    # A dim that does not split evenly.
    with pytest.raises(fastshard.InvalidArgumentError, match="split evenly"):
        fastshard.load_state_dict(path, rank=0, world_size=3, shard_specs={"o.weight": 1})
    # A model whose shapes fit no split names the tensor and asks for a spec.
    model = TPBlock(2)
    model.o = torch.nn.Linear(Q // 4, H, dtype=torch.bfloat16)
    with pytest.raises(fastshard.InvalidArgumentError, match=r"o\.weight.*shard_specs"):
        fastshard.load(model, path, 0, 2, shard_specs=SPECS)
    # Rank beyond the world, and a state dict asked for slices without specs.
    with pytest.raises(fastshard.ShardMismatchError, match="rank 2 does not exist"):
        fastshard.load(TPBlock(2), path, 2, 2, shard_specs=SPECS)
    with pytest.raises(fastshard.InvalidArgumentError, match="shard_specs"):
        fastshard.load_state_dict(path, rank=0, world_size=2)
    # Slices cannot be hash-checked: refused, not silently skipped.
    with pytest.raises(fastshard.InvalidArgumentError, match="verify_hash"):
        fastshard.load(TPBlock(2), path, 0, 2, shard_specs=SPECS, verify_hash=True)
    # Cooperation needs a process group.
    with pytest.raises(fastshard.InvalidArgumentError, match="init_process_group"):
        fastshard.load(TPBlock(2), path, 0, 2, shard_specs=SPECS, cooperative=True)


def test_local_slices_and_budgeted_casts(tmp_path: Path) -> None:
    full = full_state()
    path = tmp_path / "full.tensors"
    fastshard.save(full, path)
    for ws in (2, 4):
        for rank in range(ws):
            model = TPBlock(ws)
            # gate_up is cast (a temporary per batch) under a budget smaller
            # than one of its temporaries: it loads in blocks of rows.
            stats = fastshard.load(model, path, rank, ws, shard_specs=SPECS, max_host_bytes=1 << 20)
            check_model(model, full, rank, ws)
            assert 0 < stats.peak_host_bytes <= 1 << 20
            assert stats.read_amplification >= 1.0
    with pytest.raises(fastshard.InvalidArgumentError, match="max_host_bytes"):
        fastshard.load(TPBlock(2), path, 0, 2, shard_specs=SPECS, max_host_bytes=1000)
