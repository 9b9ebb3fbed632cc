"""The tensors a benchmark loads, the objects it writes them as, how a
tensor-parallel rank's share is cut from them, and the one digest every
loader's result is checked against.

Every tensor comes from a seed, so each loader (and each run) sees the same
bytes. Shapes (``params.SHAPES``): ``llm`` (a Llama-like fp16 model:
embeddings, attention and MLP weights, norms), ``uniform`` (16 MiB fp16
tensors), ``many-small`` (64 KiB tensors: per-tensor overheads dominate) and
``experts`` (4-64 KiB tensors of mixed sizes, named like a mixture of
experts' weights).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .params import SHAPES, KiB, MiB

StateDict = dict[str, torch.Tensor]
Specs = dict[str, int | None]  # tensor name → the dim a rank's slice is cut along (None: whole)
ROW_PARALLEL = ("o_proj.weight", "down_proj.weight")  # split along dim 1 in tensor parallelism
EXPERT_MEAN = 34 * KiB  # the mean size of an ``experts`` tensor (rows uniform in 32..512)


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
    hidden = 2048 if size >= 1 << 30 else 1024 if size >= 256 * MiB else 512
    return llama_shapes(size, hidden, hidden * 11 // 4, hidden // 8, 16 * hidden)


def _expert_shapes(size: int, gen: torch.Generator) -> list[tuple[str, tuple[int, ...]]]:
    count = max(1, size // EXPERT_MEAN)
    rows = torch.randint(32, 513, (count,), generator=gen).tolist()  # 4-64 KiB of fp16 x 64
    return [
        (f"model.layers.{i // 64}.experts.{i % 64}.w{i % 3}", (r, 64)) for i, r in enumerate(rows)
    ]


def shapes(kind: str, size: int, seed: int = 0) -> list[tuple[str, tuple[int, ...]]]:
    if kind == "llm":
        return list(_llm_shapes(size))
    if kind == "uniform":
        return [(f"w{i:05d}", (4096, 2048)) for i in range(max(1, size // (16 * MiB)))]
    if kind == "many-small":
        return [(f"t{i:06d}", (128, 256)) for i in range(max(1, size // (64 * KiB)))]
    if kind == "experts":
        return _expert_shapes(size, torch.Generator().manual_seed(seed + 1))
    raise ValueError(f"unknown shape {kind!r}; one of {', '.join(SHAPES)}")


def state_dict(kind: str, size: int, seed: int = 0) -> StateDict:
    gen = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(shape, generator=gen, dtype=torch.float16)
        for name, shape in shapes(kind, size, seed)
    }


def weights_module(size_mib: int) -> torch.nn.Module:
    """A module of 16 MiB float32 parameters, ``size_mib`` in all (at least
    one): a model to save, or to load into parameters already written."""
    m = torch.nn.Module()
    for i in range(max(1, size_mib // 16)):
        m.register_parameter(f"w{i}", torch.nn.Parameter(torch.randn(4 << 20)))
    return m


def total_bytes(sd: StateDict) -> int:
    return sum(t.nbytes for t in sd.values())


# -- the digest ------------------------------------------------------------


def digest(sd: StateDict) -> str:
    """SHA-256 over names, dtypes, shapes and bytes, in name order (loaders
    differ in order). SHA-256 because OpenSSL's is the fastest hash here."""
    h = hashlib.sha256()
    for name in sorted(sd):
        t = sd[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def bytes_digest(data: bytes | bytearray | memoryview) -> str:
    """The raw clients' digest: SHA-256 of the object's bytes."""
    return hashlib.sha256(data).hexdigest()


def file_digest(path: Path) -> str:
    """``bytes_digest`` of a file's contents, read in 16 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 * MiB):
            h.update(chunk)
    return h.hexdigest()


# -- tensor-parallel shares --------------------------------------------------


def split_specs(sd: StateDict, world: int, rule: str = "tp") -> Specs:
    """Which dim each tensor is cut along for ``world`` ranks. ``tp``: as a
    Llama is split (o_proj/down_proj along dim 1, other 2-D weights along
    dim 0, the rest replicated); ``dim0``: every 2-D tensor along dim 0.
    A tensor whose dim does not divide by ``world`` is replicated."""
    out: Specs = {}
    for name, t in sd.items():
        dim = None
        if t.dim() == 2:
            dim = 1 if rule == "tp" and name.endswith(ROW_PARALLEL) else 0
            if t.shape[dim] % world:
                dim = None
        out[name] = dim
    return out


def shard(sd: StateDict, specs: Specs, rank: int, world: int) -> StateDict:
    """Rank ``rank``'s share: each tensor's slice along its spec's dim."""
    out = {}
    for name, t in sd.items():
        dim = specs.get(name)
        out[name] = (t if dim is None else t.chunk(world, dim)[rank]).contiguous()
    return out


def rank_digests(sd: StateDict, specs: Specs, world: int) -> list[str]:
    return [digest(shard(sd, specs, r, world)) for r in range(world)]


# -- objects -----------------------------------------------------------------

FORMATS = ("fastshard", "tensorizer", "safetensors", "torch")
FILENAMES = {
    "fastshard": "model.fastshard.tensors",
    "tensorizer": "model.tensors",
    "safetensors": "model.safetensors",
    "torch": "model.pt",
}


# The fastshard object's tensor alignment (fastshard.save's ``align``).
ALIGN = 64


@dataclass
class Objects:
    """One state dict written as files: format → path, and who wrote each."""

    paths: dict[str, Path] = field(default_factory=dict)
    writers: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __getitem__(self, fmt: str) -> Path:
        return self.paths[fmt]

    def __contains__(self, fmt: object) -> bool:
        return fmt in self.paths


def _write_tensorizer(sd: StateDict, path: Path) -> str:
    from tensorizer import TensorSerializer, __version__

    ser = TensorSerializer(str(path))
    ser.write_state_dict(sd)
    ser.close()
    return f"tensorizer {__version__}"


def _write_fastshard(sd: StateDict, path: Path) -> str:
    import fastshard

    # Aligned, as safetensors' format is, so a mapped load (fastshard-mmap)
    # views every tensor in place; every other reader reads it as any file.
    fastshard.save(sd, path, align=ALIGN)
    return f"fastshard.save(align={ALIGN})"


def _write_safetensors(sd: StateDict, path: Path) -> str:
    import safetensors
    from safetensors.torch import save_file

    save_file(sd, str(path))
    return f"safetensors {safetensors.__version__}"


def _write_torch(sd: StateDict, path: Path) -> str:
    torch.save(sd, path)
    return f"torch.save {torch.__version__}"


WRITERS: dict[str, Callable[[StateDict, Path], str]] = {
    "fastshard": _write_fastshard,
    "tensorizer": _write_tensorizer,
    "safetensors": _write_safetensors,
    "torch": _write_torch,
}


def _tensorizer_fallback(sd: StateDict, path: Path, objs: Objects, err: Exception) -> str:
    """tensorizer's index is a fixed 256 KiB and overflows at a few thousand
    tensors; its reader has no such limit, so fastshard writes that file."""
    import fastshard

    path.unlink(missing_ok=True)
    fastshard.save(sd, path, exact_index=True)
    objs.notes.append(
        f"tensorizer cannot write {len(sd)} tensors ({err}), so fastshard.save wrote "
        f"{path.name} with an exact-size index; tensorizer's reader loads that file"
    )
    return "fastshard.save (exact-size index)"


def write_objects(
    sd: StateDict,
    folder: Path,
    formats: tuple[str, ...] = FORMATS,
    log: Callable[[str], None] = print,
) -> Objects:
    """The same tensors in each of ``formats`` under ``folder``; a format
    whose writer is not installed is left out."""
    from .deps import PEER_MODULES, installed

    folder.mkdir(parents=True, exist_ok=True)
    objs = Objects()
    for fmt in formats:
        module = PEER_MODULES.get(fmt)
        if module is not None and not installed(module):
            continue
        path = folder / FILENAMES[fmt]
        path.unlink(missing_ok=True)
        start = time.perf_counter()
        try:
            who = WRITERS[fmt](sd, path)
        except RuntimeError as err:  # tensorizer: "Metadata overflow"
            if fmt != "tensorizer":
                raise
            who = _tensorizer_fallback(sd, path, objs, err)
        objs.paths[fmt], objs.writers[fmt] = path, who
        secs = time.perf_counter() - start
        log(
            f"  wrote {path.name} ({path.stat().st_size / MiB:,.0f} MiB) with {who} in {secs:.1f} s"
        )
    return objs
