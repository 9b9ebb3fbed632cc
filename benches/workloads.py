"""State dicts for the demo and benchmarks, and writers for every format they load.

All data is generated from a seed, so every run (and every loader) sees the same bytes.
Files go to a scratch folder (by default the repository's git-ignored ``.bench/``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

REPO = Path(__file__).resolve().parent.parent
SCRATCH = REPO / ".bench"

StateDict = dict[str, torch.Tensor]


def _randn(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float16)


def model_like_state_dict(target_bytes: int = GiB, seed: int = 0) -> StateDict:
    """A Llama-shaped fp16 state dict of about ``target_bytes``.

    TinyLlama-1.1B's shapes (hidden 2048, MLP 5632, 4 KV heads of 64, vocab 32000); the
    number of decoder layers is chosen so the total lands near the target (~84 MiB a layer
    plus 250 MiB of embeddings and LM head; 1 GiB gives 9 layers, 0.98 GiB).
    """
    from fastshard.bench.workload import llama_shapes

    gen = torch.Generator().manual_seed(seed)
    sd: StateDict = {}
    for name, shape in llama_shapes(target_bytes, hidden=2048, mlp=5632, kv=256, vocab=32000):
        sd[name] = _randn(shape, gen)
    return sd


def uniform_state_dict(
    count: int = 64, shape: tuple[int, ...] = (2048, 4096), seed: int = 1
) -> StateDict:
    """``count`` fp16 tensors of one shape: 64 x (2048, 4096) is 64 x 16 MiB = 1 GiB."""
    gen = torch.Generator().manual_seed(seed)
    return {f"layers.{i}.weight": _randn(shape, gen) for i in range(count)}


def many_small_state_dict(
    count: int = 10_000, min_bytes: int = 4 * KiB, max_bytes: int = 64 * KiB, seed: int = 2
) -> StateDict:
    """``count`` fp16 tensors of (rows, 64) with sizes spread uniformly in [min, max] bytes,
    named like the experts of a mixture-of-experts model."""
    gen = torch.Generator().manual_seed(seed)
    cols = 64
    lo, hi = min_bytes // (2 * cols), max_bytes // (2 * cols)
    rows = torch.randint(lo, hi + 1, (count,), generator=gen).tolist()
    return {
        f"model.layers.{i // 64}.experts.{i % 64}.w{i % 3}": _randn((r, cols), gen)
        for i, r in enumerate(rows)
    }


def total_bytes(sd: StateDict) -> int:
    return sum(t.nbytes for t in sd.values())


def digest(sd: StateDict) -> str:
    """A digest over names, dtypes, shapes and bytes (order independent)."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(sd):
        t = sd[name].detach()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        if t.numel():
            h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


# --- writers -----------------------------------------------------------------------------


class CannotWrite(Exception):
    """The peer's writer cannot produce this file (the reason is the message)."""


def write_tensorizer(sd: StateDict, path: Path) -> str:
    from tensorizer import TensorSerializer, __version__

    ser = TensorSerializer(str(path))
    try:
        ser.write_state_dict(sd)
        ser.close()
    except RuntimeError as exc:  # tensorizer's fixed 256 KiB index: "Metadata overflow"
        path.unlink(missing_ok=True)
        raise CannotWrite(f"tensorizer {__version__}: {exc}") from exc
    return f"tensorizer {__version__}"


def write_fastshard(sd: StateDict, path: Path, exact_index: bool | None = None) -> str:
    import fastshard

    fastshard.save(sd, path, exact_index=exact_index)
    return "fastshard.save" + (" (exact-size index)" if exact_index else "")


def write_safetensors(sd: StateDict, path: Path) -> str:
    import safetensors
    from safetensors.torch import save_file

    save_file(sd, str(path))
    return f"safetensors {safetensors.__version__}"


def write_torch(sd: StateDict, path: Path) -> str:
    torch.save(sd, path)
    return f"torch.save {torch.__version__}"


# Which file each format lives in, and who writes it.
FORMATS: dict[str, tuple[str, Callable[[StateDict, Path], str]]] = {
    "tensors": ("model.tensors", write_tensorizer),
    "safetensors": ("model.safetensors", write_safetensors),
    "torch": ("model.pt", write_torch),
}


@dataclass
class Written:
    """A state dict on disk in several formats."""

    folder: Path
    model_bytes: int
    tensors: int
    digest: str
    files: dict[str, str] = field(default_factory=dict)  # format -> path
    writers: dict[str, str] = field(default_factory=dict)  # format -> who wrote it
    notes: list[str] = field(default_factory=list)
    write_seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}


def write_all(
    sd: StateDict, folder: Path, formats: list[str], log: Callable[[str], None] = print
) -> Written:
    """Write ``sd`` in each of ``formats`` under ``folder``.

    When tensorizer's writer cannot write the file (its index is a fixed 256 KiB, which
    overflows at a few thousand tensors), ``fastshard.save`` writes the ``.tensors`` file
    with an exact-size index instead, and a note says so; tensorizer's reader has no such
    limit, so tensorizer still loads that file.
    """
    folder.mkdir(parents=True, exist_ok=True)
    out = Written(folder, total_bytes(sd), len(sd), digest(sd))
    for fmt in formats:
        filename, writer = FORMATS[fmt]
        path = folder / filename
        path.unlink(missing_ok=True)
        start = time.perf_counter()
        try:
            who = writer(sd, path)
        except CannotWrite as exc:
            if fmt != "tensors":
                raise
            out.notes.append(
                f"{exc}: tensorizer cannot write {len(sd)} tensors, so fastshard.save wrote "
                "model.tensors with an exact-size index; tensorizer's reader loads that file"
            )
            log(f"  {filename}: {exc}; writing it with fastshard.save(exact_index=True)")
            start = time.perf_counter()
            who = write_fastshard(sd, path, exact_index=True)
        out.write_seconds[fmt] = time.perf_counter() - start
        out.files[fmt] = str(path)
        out.writers[fmt] = who
        log(
            f"  wrote {filename} ({os.path.getsize(path) / MiB:,.0f} MiB) with {who} "
            f"in {out.write_seconds[fmt]:.1f} s"
        )
    (folder / "manifest.json").write_text(json.dumps(out.to_json(), indent=2) + "\n")
    return out


def warm_page_cache(path: str | os.PathLike[str], chunk: int = 16 * MiB) -> None:
    """Read a file once so that every loader starts from a warm page cache."""
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        while f.readinto(buf):
            pass
