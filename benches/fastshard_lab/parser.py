"""The lab's command line, without running anything: which presets there
are (``PRESETS``) and each one's parser (``build_parser``: the preset's own
options, and the recording ones, record.py's and runs.py's). Torch-free:
importing a preset module imports no torch."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from types import ModuleType

from .params import DOCS

# name → (module under fastshard_lab.presets, one line for --help)
PRESETS = {
    "default": ("default", "every loader on file, S3 and HTTP, checked, with plots"),
    "local": ("local", "local files: 1 GiB of 16 MiB tensors and 10,000 small ones"),
    "remote": ("remote", "S3 and HTTP against raw clients, with a concurrency x part sweep"),
    "tp": ("tp", "world size N from one model on S3: per-rank, packed, unsharded"),
    "trust": ("trust", "the cost of verify_hash and encryption"),
    "network": ("network", "through the shaping proxy: latency and per-connection bandwidth"),
    "network-model": ("netmodel", "the throughput model for a real network (no loads)"),
    "ready": ("ready", "vllm serve to its first completion, fastshard vs vLLM's loaders"),
    "staging": ("staging", "what the CUDA staging ring costs on the CPU"),
    "cast": ("cast", "casts on the CPU through the staging engine vs safetensors + cast"),
    "safetensors": ("safetensors", "a .safetensors file and an HF repo: Run:ai, load_file"),
    "matrix": ("matrix", "stores x proxies: the default against fixed settings and a raw client"),
}


def preset_module(preset: str) -> ModuleType:
    return importlib.import_module(f"fastshard_lab.presets.{PRESETS[preset][0]}")


def _epilog() -> str:
    lines = ["presets (python -m fastshard_lab --preset NAME --help lists a preset's options):"]
    lines += [f"  {name:<14} {summary}" for name, (_, summary) in PRESETS.items()]
    return "\n".join(lines)


def _add_docs(p: argparse._ActionsContainer) -> None:
    p.add_argument(
        "--docs",
        type=Path,
        default=DOCS,
        metavar="DIR",
        help=f"the docs' benchmarks folder that --record and --index write (default: "
        f"{DOCS}, from the checkout's root)",
    )


def _add_recording(p: argparse.ArgumentParser, writes_out: bool) -> None:
    g = p.add_argument_group("recording a run into the docs site (benches/README.md)")
    if writes_out:
        g.add_argument(
            "--record",
            action="store_true",
            help="when the run succeeds, also write it to DOCS/<date>-<preset>[-N]/ (table.md "
            "page, results.json, meta.json, plots) and rewrite DOCS/runs.md",
        )
    g.add_argument(
        "--render",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="measure nothing: redraw these recorded folders' plots and pages from their "
        "results.json and meta.json",
    )
    g.add_argument("--index", action="store_true", help="measure nothing: rewrite DOCS/runs.md")
    _add_docs(g)


def build_parser(preset: str = "default") -> argparse.ArgumentParser:
    mod = preset_module(preset)
    prog = "python -m fastshard_lab" + ("" if preset == "default" else f" --preset {preset}")
    p = argparse.ArgumentParser(
        prog=prog,
        description=mod.__doc__,
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--preset", choices=list(PRESETS), default="default", help="what to measure (see below)"
    )
    mod.add_arguments(p)
    _add_recording(p, writes_out=any(a.dest == "out" for a in p._actions))
    return p
