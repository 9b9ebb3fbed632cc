"""The files the S3/HTTP tests serve: written by the real tensorizer and by
fastshard, with their source tensors to compare against bit for bit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from conftest import DTYPES, assert_bit_equal, random_tensor, small_net
from tensorizer_files import tensorizer_write

import fastshard

MiB = 1 << 20


@dataclass
class Corpus:
    """One local file; ``source`` is what was written (a state dict, nested
    structure or module), ``writer`` "tensorizer" or "fastshard"."""

    name: str
    path: Path
    source: Any
    writer: str
    uris: dict[str, str] = field(default_factory=dict)  # transport -> URI

    @property
    def size(self) -> int:
        return self.path.stat().st_size

    @property
    def tensor_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in flatten(self.source).values())


def flatten(obj: Any, prefix: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], torch.Tensor]:
    """{path: tensor} of a (nested) state dict, list or module."""
    if isinstance(obj, torch.nn.Module):
        return {(k,): v for k, v in obj.state_dict().items()}
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj)
    out: dict[tuple[Any, ...], torch.Tensor] = {}
    for k, v in items:
        out.update(flatten(v, (*prefix, k)))
    return out


def assert_same(actual: Any, expected: Any) -> None:
    """Same structure, names in the same order, every tensor bit-equal
    (meta tensors load as zeros)."""
    a, e = flatten(actual), flatten(expected)
    assert list(a) == list(e)
    for key, want in e.items():
        if want.is_meta:
            want = torch.zeros(want.shape, dtype=want.dtype)
        assert_bit_equal(a[key], want)


def save_sources() -> dict[str, Any]:
    """What the save tests write: tensors tensorizer itself can read back
    (not empty opaque dtypes)."""
    return {
        "bf16": random_tensor(torch.bfloat16, (64, 33), 1),
        "f8": random_tensor(torch.float8_e4m3fn, (5, 7), 2),
        "c64": random_tensor(torch.complex64, (9,), 3),
        "i64": random_tensor(torch.int64, (2, 3), 4),
        "flag": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.25),
        "empty": torch.empty(0, 2),
        "meta": torch.empty(4, device="meta"),
        "layers.0.weight": random_tensor(torch.float32, (128, 128), 5),
    }


def tensorizer_read(stream: Any) -> dict[str, torch.Tensor]:
    """Every tensor of ``stream``, read by the real tensorizer (hashes checked)."""
    from tensorizer import TensorDeserializer

    with stream, TensorDeserializer(stream, device="cpu", verify_hash=True) as d:
        return {k: v.detach().clone() for k, v in d.items()}


def assert_read_back(back: dict[str, torch.Tensor], saved: dict[str, Any]) -> None:
    """What tensorizer read is what was saved, in order (a meta tensor reads as zeros)."""
    assert list(back) == list(saved)
    for name, want in saved.items():
        if want.is_meta:
            want = torch.zeros(want.shape, dtype=want.dtype)
        assert_bit_equal(back[name], want)


def _dtype_samples() -> dict[str, torch.Tensor]:
    sd: dict[str, torch.Tensor] = {}
    for i, dt in enumerate(DTYPES):
        name = str(dt).removeprefix("torch.")
        sd[f"{name}.matrix"] = random_tensor(dt, (3, 5), i)
        sd[f"{name}.scalar"] = random_tensor(dt, (), i + 100)
        sd[f"{name}.empty"] = random_tensor(dt, (0, 4), i + 200)
    return sd


def _special() -> dict[str, Any]:
    base = random_tensor(torch.float32, (6, 8), 7)
    return {
        "model.layers.0.self_attn.q_proj.weight": base,
        "transposed": base.t().contiguous(),
        "名前.ünïcode": torch.arange(5, dtype=torch.int16),
        "meta": torch.empty(3, 2, device="meta"),
        "meta_i64": torch.empty(4, dtype=torch.int64, device="meta"),
        "one": torch.ones(1, dtype=torch.bfloat16),
    }


def _nested() -> dict[str, Any]:
    return {
        "encoder": {"w": random_tensor(torch.float16, (4, 4), 1), "layers": [torch.ones(2)]},
        "decoder": [{"b": torch.arange(3)}, {"b": torch.arange(3, 6)}],
        "top": torch.tensor(2.5),
    }


def big_state_dict() -> dict[str, torch.Tensor]:
    """~43 MiB in tensors of several dtypes, with small tensors between the
    large ones, so a load with small parts issues dozens of ranged reads."""
    return {
        "w0": random_tensor(torch.bfloat16, (2048, 2560), 1),  # 10 MiB
        "b0": random_tensor(torch.float32, (7,), 2),
        "w1": random_tensor(torch.float16, (2560, 2048), 3),  # 10 MiB
        "empty": torch.empty(0, 3),
        "w2": random_tensor(torch.float32, (1024, 2560), 4),  # 10 MiB
        "w3": random_tensor(torch.int8, (5 * MiB + 3,), 5),  # 5 MiB, odd size
        "w4": random_tensor(torch.bfloat16, (2048, 2048), 6),  # 8 MiB
    }


def two_versions(folder: Path) -> tuple[Path, Path]:
    """Two files of the same layout and size but different bytes, loaded in
    several parts (so reads continue after the first): an object replaced
    mid-load."""
    out = []
    for seed in (1, 2):
        sd = {f"t{i}": random_tensor(torch.float32, (256, 1024), seed * 10 + i) for i in range(6)}
        path = folder / f"v{seed}.tensors"
        fastshard.save(sd, path)
        out.append(path)
    assert out[0].stat().st_size == out[1].stat().st_size
    return out[0], out[1]


def _fastshard_write(obj: Any, path: Path) -> Path:
    fastshard.save(obj, path)
    return path


SMALL: dict[str, tuple[Callable[[], Any], Callable[[Any, Path], Path]]] = {
    "tz-dtypes": (_dtype_samples, tensorizer_write),
    "fs-dtypes": (_dtype_samples, _fastshard_write),
    "tz-special": (_special, tensorizer_write),
    "fs-special": (_special, _fastshard_write),
    "tz-nested": (_nested, tensorizer_write),
    "fs-nested": (_nested, _fastshard_write),
    "tz-module": (lambda: small_net(3), tensorizer_write),
    "fs-module": (lambda: small_net(4), _fastshard_write),
}


def build(folder: Path) -> dict[str, Corpus]:
    """Write every corpus file under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Corpus] = {}
    for name, (make, write) in SMALL.items():
        source = make()
        path = write(source, folder / f"{name}.tensors")
        out[name] = Corpus(name, path, source, "tensorizer" if name[:2] == "tz" else "fastshard")
    big = big_state_dict()
    out["tz-big"] = Corpus(
        "tz-big", tensorizer_write(big, folder / "tz-big.tensors"), big, "tensorizer"
    )
    assert out["tz-big"].size >= 40 * MiB
    return out
