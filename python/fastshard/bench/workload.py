"""The tensors a benchmark loads, the objects it writes them as, and the
digest every loader's result is checked against.

Every tensor comes from a seed, so each loader (and each run) sees the same
bytes. Shapes: ``llm`` (a Llama-like fp16 model: embeddings, attention and
MLP weights, norms), ``uniform`` (16 MiB fp16 tensors) and ``many-small``
(64 KiB tensors: per-tensor overheads dominate).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import torch

from . import SHAPES

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
StateDict = dict[str, torch.Tensor]


def parse_size(text: str) -> int:
    """``64MiB``, ``1GiB``, ``500MB``, ``1e9`` → bytes."""
    units = {"kib": KiB, "mib": MiB, "gib": GiB, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    t = text.strip().lower()
    for unit, factor in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if t.endswith(unit):
            return int(float(t[: -len(unit)]) * factor)
    return int(float(t))


def llama_shapes(
    size: int, hidden: int, mlp: int, kv: int, vocab: int
) -> Iterator[tuple[str, tuple[int, ...]]]:
    """A Llama-style fp16 model's names and shapes, with as many decoder
    layers as bring it near ``size`` bytes."""
    layer = [
        ("self_attn.q_proj.weight", (hidden, hidden)),
        ("self_attn.k_proj.weight", (kv, hidden)),
        ("self_attn.v_proj.weight", (kv, hidden)),
        ("self_attn.o_proj.weight", (hidden, hidden)),
        ("mlp.gate_proj.weight", (mlp, hidden)),
        ("mlp.up_proj.weight", (mlp, hidden)),
        ("mlp.down_proj.weight", (hidden, mlp)),
        ("input_layernorm.weight", (hidden,)),
        ("post_attention_layernorm.weight", (hidden,)),
    ]
    per_layer = sum(2 * torch.Size(s).numel() for _, s in layer)
    fixed = 2 * 2 * vocab * hidden + 2 * hidden
    yield "model.embed_tokens.weight", (vocab, hidden)
    for i in range(max(1, round((size - fixed) / per_layer))):
        for name, shape in layer:
            yield f"model.layers.{i}.{name}", shape
    yield "model.norm.weight", (hidden,)
    yield "lm_head.weight", (vocab, hidden)


def _llm_shapes(size: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    hidden = 2048 if size >= GiB else 1024 if size >= 256 * MiB else 512
    return llama_shapes(size, hidden, hidden * 11 // 4, hidden // 8, 16 * hidden)


def shapes(kind: str, size: int) -> list[tuple[str, tuple[int, ...]]]:
    if kind == "llm":
        return list(_llm_shapes(size))
    if kind == "uniform":
        return [(f"w{i:05d}", (4096, 2048)) for i in range(max(1, size // (16 * MiB)))]
    if kind == "many-small":
        return [(f"t{i:06d}", (128, 256)) for i in range(max(1, size // (64 * KiB)))]
    raise ValueError(f"unknown shape {kind!r}; one of {', '.join(SHAPES)}")


def state_dict(kind: str, size: int, seed: int = 0) -> StateDict:
    gen = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(shape, generator=gen, dtype=torch.float16)
        for name, shape in shapes(kind, size)
    }


def digest(sd: StateDict) -> str:
    """Names, dtypes, shapes and bytes, in name order (loaders differ in order)."""
    h = hashlib.sha256()
    for name in sorted(sd):
        t = sd[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 * MiB):
            h.update(chunk)
    return h.hexdigest()


def write_objects(sd: StateDict, folder: Path) -> dict[str, Path]:
    """The same tensors as a tensorizer object (written by tensorizer when
    installed), a fastshard object, a safetensors object and a torch file;
    formats whose writer is missing are left out."""
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    import fastshard

    out["fastshard"] = folder / "model.fastshard.tensors"
    fastshard.save(sd, out["fastshard"])
    try:
        from tensorizer import TensorSerializer

        out["tensorizer"] = folder / "model.tensors"
        ser = TensorSerializer(str(out["tensorizer"]))
        ser.write_state_dict(sd)
        ser.close()
    except ImportError:
        pass
    try:
        from safetensors.torch import save_file

        out["safetensors"] = folder / "model.safetensors"
        save_file(sd, str(out["safetensors"]))
    except ImportError:
        pass
    out["torch"] = folder / "model.pt"
    torch.save(sd, out["torch"])
    return out
