"""What benches/gpu_bench.py measures with: the files it writes (a
Llama-like model, many small tensors), and ``Bench``, which times each
loader, checks its bytes and keeps the results."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpu_peers as peers
import torch

import fastshard

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10
DIM, FFN, KV, VOCAB = 4096, 14336, 1024, 128256


def llama_like(layers: int) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, DIM)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (DIM, DIM),
            p + "self_attn.k_proj.weight": (KV, DIM),
            p + "self_attn.v_proj.weight": (KV, DIM),
            p + "self_attn.o_proj.weight": (DIM, DIM),
            p + "mlp.gate_proj.weight": (FFN, DIM),
            p + "mlp.up_proj.weight": (FFN, DIM),
            p + "mlp.down_proj.weight": (DIM, FFN),
            p + "input_layernorm.weight": (DIM,),
            p + "post_attention_layernorm.weight": (DIM,),
        }
    return shapes | {"model.norm.weight": (DIM,), "lm_head.weight": (VOCAB, DIM)}


def small_shapes(count: int) -> dict[str, tuple[int, ...]]:
    gen = torch.Generator().manual_seed(7)
    rows = torch.randint(32, 513, (count,), generator=gen)  # x 64 bf16: 4-64 KiB
    return {f"experts.{i}.w": (int(r), 64) for i, r in enumerate(rows)}


def generate(shapes: dict[str, tuple[int, ...]], device: torch.device) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(11)  # fast on a GPU
    return {
        n: torch.randn(s, dtype=torch.bfloat16, device=device, generator=gen).cpu()
        for n, s in shapes.items()
    }


def write(sd: dict[str, torch.Tensor], folder: Path, stem: str, **opts: Any) -> dict[str, Path]:
    from safetensors.torch import save_file

    tz, st = folder / f"{stem}.tensors", folder / f"{stem}.safetensors"
    fastshard.save(sd, tz, **opts)
    if not opts:
        save_file(sd, str(st))
    return {"tensorizer": tz, "safetensors": st}


def same(out: dict[str, torch.Tensor], sample: dict[str, torch.Tensor]) -> bool:
    for n, want in sample.items():
        got = out[n]
        if got.shape != want.shape or got.dtype != want.dtype:
            return False
        if not torch.equal(got.view(torch.int16), want.to(got.device).view(torch.int16)):
            return False
    return True


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.out = Path(args.out)
        self.started = time.perf_counter()
        self.result: dict[str, Any] = {
            "gpu": torch.cuda.get_device_name(self.device) if self.cuda else "cpu (smoke run)",
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "cpus": peers.threads(),
            "versions": {
                m: peers.version(m)
                for m in (
                    "fastshard",
                    "safetensors",
                    "instanttensor",
                    "fastsafetensors",
                    "tensorizer",
                )
            },
            "cases": {},
            "skipped": {},
        }
        self.rows: list[tuple[str, str, str]] = []

    def left(self) -> float:
        return self.args.budget_seconds - (time.perf_counter() - self.started)

    def save(self) -> None:
        self.result["seconds"] = time.perf_counter() - self.started
        (self.out / "gpu_bench.json").write_text(json.dumps(self.result, indent=1, default=str))

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def timed(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - t0, out

    def run(
        self,
        case: str,
        name: str,
        fn: Callable[[], Any],
        nbytes: int,
        check: Callable[[Any], bool] | None,
        repeat: int | None = None,
        before: Callable[[], Any] | None = None,
    ) -> dict[str, Any]:
        """Times ``fn`` ``repeat`` times (``before`` each, untimed); GB/s
        of ``nbytes``; the first result checked."""
        rec: dict[str, Any] = {"runs": []}
        peers.LAST_STATS.clear()
        try:
            for k in range(repeat or self.args.repeat):
                if before is not None:
                    before()
                dt, out = self.timed(fn)
                rec["runs"].append(nbytes / dt / 1e9)
                slow = dt > self.args.slow_seconds  # one run says enough
                if k == 0:
                    rec["equal"] = None if check is None else bool(check(out))
                    if isinstance(out, fastshard.LoadStats):
                        rec["stats"] = vars(out)
                    elif peers.LAST_STATS:
                        rec["stats"] = vars(peers.LAST_STATS.pop())
                del out
                if self.cuda:
                    torch.cuda.empty_cache()
                if slow:
                    break
        except ImportError as e:
            rec["skipped"] = str(e)
        except Exception as e:  # a peer's failure is a row, not the end of the run
            rec["error"] = f"{type(e).__name__}: {e}"
        if rec["runs"]:
            rec["best"] = max(rec["runs"])
            rec["median"] = statistics.median(rec["runs"])
        self.result["cases"].setdefault(case, {})[name] = rec
        shown = (
            f"{rec['best']:.2f} GB/s (median {rec['median']:.2f}, first {rec['runs'][0]:.2f})"
            if rec["runs"]
            else rec.get("skipped") or rec.get("error", "")
        )
        if rec.get("equal") is False:
            shown += "  WRONG BYTES"
        self.rows.append((case, name, shown))
        print(f"{case:8} {name:36} {shown}", flush=True)
        self.save()
        return rec

    def model_for(self, shapes: dict[str, tuple[int, ...]]) -> torch.nn.Module:
        """A module tree whose buffers are named as the file's tensors,
        allocated on the device beforehand (as vLLM's model is)."""
        model = torch.nn.Module()
        for name, shape in shapes.items():
            *path, leaf = name.split(".")
            mod = model
            for part in path:
                if not hasattr(mod, part):
                    mod.add_module(part, torch.nn.Module())
                mod = getattr(mod, part)
            mod.register_buffer(leaf, torch.empty(shape, dtype=torch.bfloat16, device=self.device))
        return model

    def peers(
        self,
        case: str,
        files: dict[str, Path],
        nbytes: int,
        sample: dict[str, torch.Tensor],
        plan: peers.Plan = None,
    ) -> None:
        for name, (fmt, loader) in peers.PEERS.items():
            if self.left() < 30:
                self.result["skipped"][f"{case}/{name}"] = "out of time"
                continue
            path = files[fmt]
            self.run(
                case,
                name,
                lambda p=path, ld=loader: ld(p, self.device, plan),
                nbytes,
                lambda o: same(o, sample),
            )
