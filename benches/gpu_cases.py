"""The cases of benches/gpu_bench.py, each fastshard beside its peers on
the same files (see that file's docstring)."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpu_peers as peers
import torch
from gpu_harness import Bench, GiB, MiB, generate, llama_like, same, small_shapes, write

import fastshard


def model_check(model: torch.nn.Module, sample: dict[str, torch.Tensor]) -> Callable[[Any], bool]:
    return lambda _: same(dict(model.named_buffers()), sample)


def case_big(b: Bench, tmp: Path) -> dict[str, Any]:
    shapes = llama_like(b.args.layers)
    t0 = time.perf_counter()
    sd = generate(shapes, b.device)
    files = write(sd, tmp, "big")
    nbytes = sum(t.numel() * 2 for t in sd.values())
    names = list(sd)
    sample = {n: sd[n] for n in (names[0], names[len(names) // 2], names[-2], names[-1])}
    b.result["big"] = {
        "bytes": nbytes,
        "tensors": len(sd),
        "write_seconds": time.perf_counter() - t0,
    }
    del sd
    model = b.model_for(shapes)
    check = model_check(model, sample)
    b.run(
        "big",
        "fastshard load(model)",
        lambda: peers.fastshard_model(files["tensorizer"], model),
        nbytes,
        check,
    )
    b.run(
        "big",
        "fastshard load_state_dict",
        lambda: peers.fastshard_sd(files["tensorizer"], b.device, None),
        nbytes,
        lambda o: same(o, sample),
    )
    b.run(
        "big",
        "fastshard (safetensors file)",
        lambda: peers.fastshard_model(files["safetensors"], model),
        nbytes,
        check,
    )
    b.peers("big", files, nbytes, sample)
    return {"files": files, "shapes": shapes, "sample": sample, "bytes": nbytes, "model": model}


def case_small(b: Bench, tmp: Path) -> None:
    shapes = small_shapes(b.args.small_count)
    sd = generate(shapes, b.device)
    files = write(sd, tmp, "small")
    nbytes = sum(t.numel() * 2 for t in sd.values())
    names = list(sd)
    sample = {n: sd[n] for n in names[:: max(1, len(names) // 50)]}
    b.result["small"] = {"bytes": nbytes, "tensors": len(sd)}
    del sd
    b.run(
        "small",
        "fastshard load_state_dict",
        lambda: peers.fastshard_sd(files["tensorizer"], b.device, None),
        nbytes,
        lambda o: same(o, sample),
    )
    model = b.model_for(shapes)
    b.run(
        "small",
        "fastshard load(model)",
        lambda: peers.fastshard_model(files["tensorizer"], model),
        nbytes,
        model_check(model, sample),
    )
    b.peers("small", files, nbytes, sample)


def case_slices(b: Bench, big: dict[str, Any], rank: int = 1, world: int = 8) -> None:
    plan: dict[str, tuple[int, int] | None] = {}
    nbytes = 0
    for n, s in big["shapes"].items():
        if len(s) == 2 and s[0] % world == 0:
            rows = s[0] // world
            plan[n] = (rank * rows, rows)
            nbytes += rows * s[1] * 2
        else:
            plan[n] = None
            nbytes += s[0] * 2
    want = {
        n: (t if plan[n] is None else t[plan[n][0] : plan[n][0] + plan[n][1]])
        for n, t in big["sample"].items()
    }
    files = big["files"]
    b.result["slices"] = {"bytes": nbytes, "rank": rank, "world": world}
    b.run(
        "slices",
        "fastshard load_state_dict rank 1/8",
        lambda: peers.fastshard_sd(files["tensorizer"], b.device, plan),
        nbytes,
        lambda o: same(o, want),
    )
    b.run(
        "slices",
        "safetensors prefetch plan",
        lambda: peers.st_prefetch(files["safetensors"], b.device, plan),
        nbytes,
        lambda o: same(o, want),
    )
    b.run(
        "slices",
        "safetensors get_slice",
        lambda: peers.st_slices(files["safetensors"], b.device, plan),
        nbytes,
        lambda o: same(o, want),
        repeat=1,
    )


def case_verify(b: Bench, big: dict[str, Any]) -> None:
    path, model = big["files"]["tensorizer"], big["model"]
    rec = b.run(
        "verify",
        "fastshard load(model) verify_hash",
        lambda: peers.fastshard_model(path, model, verify_hash=True),
        big["bytes"],
        model_check(model, big["sample"]),
    )
    sha = peers.sha256_rate(path, peers.threads())
    b.result["cases"]["verify"]["sha256 ceiling"] = {"best": sha}
    b.rows.append(("verify", f"SHA-256 on {peers.threads()} threads (ceiling)", f"{sha:.2f} GB/s"))
    print(
        f"verify   SHA-256 ceiling {sha:.2f} GB/s; fastshard {rec.get('best', 0):.2f}", flush=True
    )


def case_encrypted(b: Bench, tmp: Path, big: dict[str, Any]) -> None:
    shapes: dict[str, tuple[int, ...]] = {}
    total = 0
    for n, s in big["shapes"].items():
        if total >= 2 * GiB:
            break
        if "embed" in n or "lm_head" in n:
            continue
        shapes[n] = s
        total += 2 * int(torch.tensor(s).prod())
    sd = generate(shapes, b.device)
    key = fastshard.EncryptionKey.from_bytes(bytes(range(32)))
    plain = write(sd, tmp, "plain")["tensorizer"]
    enc = write(sd, tmp, "enc", encryption=key)["tensorizer"]
    names = list(sd)
    sample = {n: sd[n] for n in (names[0], names[-1])}
    del sd
    model = b.model_for(shapes)
    check = model_check(model, sample)
    b.run(
        "encrypt",
        "fastshard plain (same tensors)",
        lambda: peers.fastshard_model(plain, model),
        total,
        check,
    )
    b.run(
        "encrypt",
        "fastshard encrypted",
        lambda: peers.fastshard_model(enc, model, encryption=key),
        total,
        check,
    )
    cast = {n: t.float() for n, t in sample.items()}
    b.run(
        "encrypt",
        "fastshard encrypted, cast to fp32",
        lambda: fastshard.load_state_dict(
            enc, device=b.device, encryption=key, dtype=torch.float32
        ),
        total,
        lambda o: all(torch.equal(o[n], t.to(b.device)) for n, t in cast.items()),
        repeat=1,
    )
    try:
        rate = peers.secretbox_rate(total, peers.threads())
        b.result["cases"]["encrypt"]["secretbox ceiling"] = {"best": rate}
        b.rows.append(
            (
                "encrypt",
                f"secretbox open on {peers.threads()} threads (ceiling)",
                f"{rate:.2f} GB/s",
            )
        )
    except ImportError as e:
        b.result["skipped"]["secretbox ceiling"] = str(e)


def case_cold(b: Bench, big: dict[str, Any]) -> None:
    if not peers.drop_caches():
        b.result["skipped"]["cold"] = "cannot drop the page cache (not root)"
        return
    folder = Path(tempfile.mkdtemp(prefix="fastshard-cold-", dir=b.args.cold_dir))
    try:
        shapes = {n: s for n, s in big["shapes"].items() if "layers." in n}
        keep = dict(list(shapes.items())[: 9 * 9])  # 9 layers, ~3.9 GB
        sd = generate(keep, b.device)
        files = write(sd, folder, "cold")
        nbytes = sum(t.numel() * 2 for t in sd.values())
        sample = {n: sd[n] for n in list(sd)[:2]}
        del sd
        dd = peers.dd_rate(files["tensorizer"])
        b.result["cases"].setdefault("cold", {})["dd"] = {"best": dd}
        b.rows.append(("cold", "dd (ceiling)", f"{dd:.2f} GB/s"))
        model = b.model_for(keep)
        drop = peers.drop_caches
        b.run(
            "cold",
            "fastshard load(model)",
            lambda: peers.fastshard_model(files["tensorizer"], model),
            nbytes,
            model_check(model, sample),
            repeat=1,
            before=drop,
        )
        b.run(
            "cold",
            "fastshard (safetensors file)",
            lambda: peers.fastshard_model(files["safetensors"], model),
            nbytes,
            model_check(model, sample),
            repeat=1,
            before=drop,
        )
        for name in ("safetensors prefetch", "InstantTensor", "fastsafetensors"):
            fmt, loader = peers.PEERS[name]
            b.run(
                "cold",
                name,
                lambda p=files[fmt], ld=loader: ld(p, b.device, None),
                nbytes,
                lambda o: same(o, sample),
                repeat=1,
                before=drop,
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def ceilings(b: Bench, big: dict[str, Any]) -> None:
    c: dict[str, float] = (
        {}
        if not b.cuda
        else {
            "pinned_h2d_1GiB": peers.pinned_h2d(b.device, GiB),
            "pinned_h2d_64MiB": peers.pinned_h2d(b.device, 64 * MiB),
        }
    )
    buf = torch.empty(2 * GiB, dtype=torch.uint8, pin_memory=b.cuda)
    for n in (8, 16, 32):
        c[f"read_pinned_{n}_threads"] = peers.threaded_read(big["files"]["tensorizer"], n, buf)
    del buf
    b.result["ceilings"] = c
    for k, v in c.items():
        b.rows.append(("ceiling", k, f"{v:.2f} GB/s"))
        print(f"ceiling  {k:36} {v:.2f} GB/s", flush=True)
    b.save()
