"""``python -m fastshard_lab [--preset NAME] [options]``: pick a preset, parse its
options, check what it needs, run it.

Every preset is a module of ``fastshard_lab.presets`` with a docstring
(its ``--help``), ``add_arguments(parser)``, ``requires(args)`` (the modules
it cannot run without) and ``run(args) -> exit code``. Torch-free: ``--help``
and the dependency check answer before torch would have loaded.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from .deps import MissingDependency, require

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
EXIT_MISSING = 2


def _module(preset: str) -> ModuleType:
    return importlib.import_module(f"fastshard_lab.presets.{PRESETS[preset][0]}")


def _epilog() -> str:
    lines = ["presets (python -m fastshard_lab --preset NAME --help lists a preset's options):"]
    lines += [f"  {name:<14} {summary}" for name, (_, summary) in PRESETS.items()]
    return "\n".join(lines)


def build_parser(preset: str = "default") -> argparse.ArgumentParser:
    mod = _module(preset)
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
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    first = argparse.ArgumentParser(prog="python -m fastshard_lab", add_help=False)
    first.add_argument("--preset", choices=list(PRESETS), default="default")
    preset = first.parse_known_args(argv)[0].preset
    args = build_parser(preset).parse_args(argv)
    mod = _module(preset)
    try:
        # Before anything is written or measured: a run must not fail at its end.
        require(mod.requires(args), who=f"python -m fastshard_lab --preset {preset}")
        return int(mod.run(args))
    except MissingDependency as e:
        print(e, file=sys.stderr)
        return EXIT_MISSING
