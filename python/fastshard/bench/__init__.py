"""``fastshard bench``: one run that measures fastshard against the raw
ceiling of each source and against tensorizer, Run:ai Model Streamer,
safetensors and torch.load, on the same tensors.

Without ``--uri`` it writes a seeded workload as a tensorizer object (by
tensorizer), a fastshard object, a safetensors object and a torch file,
starts SeaweedFS (S3) and nginx (HTTP) on 127.0.0.1 as needed, and stops
them when done. Every load runs in a fresh process; one warm-up round
(which also checks each loader's data against the source) precedes
``--repeat`` measured rounds whose order alternates. Memory is touched
fresh in every process, as it is when a server starts: the numbers include
first-touch page faults, except the ceiling's, whose buffer is pre-faulted
(the transfer alone).

Writes ``results.json`` (one record per source and loader), ``meta.json``,
``table.md`` and PNG plots (throughput per loader and source; fastshard's
throughput against concurrency and part size; RSS over one load) to
``--out``.
"""

from __future__ import annotations

import argparse

# torch-free: ``fastshard --help`` and the other subcommands import this.
SHAPES = ("llm", "uniform", "many-small")
DEFAULTS = {"size": "1GiB", "shape": "llm", "repeat": 3, "world_size": 1, "out": "bench-out"}


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="fastshard bench", description=__doc__)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = __doc__
    p.add_argument(
        "--source",
        default="all",
        choices=["s3", "http", "file", "all"],
        help="where the objects are read from (default: all)",
    )
    p.add_argument("--size", default=DEFAULTS["size"], help="workload size (default: 1GiB)")
    p.add_argument(
        "--shape",
        default=DEFAULTS["shape"],
        choices=SHAPES,
        help="llm: Llama-like fp16 model; uniform: 16 MiB tensors; many-small: 64 KiB "
        "tensors (default: llm)",
    )
    p.add_argument(
        "--world-size",
        type=int,
        default=DEFAULTS["world_size"],
        help="also load N tensor-parallel ranks at once from the one object, each reading "
        "its dim-0 slices (loader 'fastshard-tpN'; default: 1, off)",
    )
    p.add_argument(
        "--repeat", type=int, default=DEFAULTS["repeat"], help="measured rounds (default: 3)"
    )
    p.add_argument("--out", default=DEFAULTS["out"], help="output folder (default: bench-out)")
    p.add_argument(
        "--uri",
        default=None,
        help="benchmark this tensorizer object instead (s3://, http(s):// or a path; "
        "credentials from the environment); loaders: fastshard, tensorizer, ceiling",
    )
    p.add_argument(
        "--loaders",
        default="all",
        help="comma-separated subset of ceiling,fastshard,tensorizer,runai,safetensors,torch "
        "(default: all that are installed)",
    )
    p.add_argument(
        "--sweep",
        default="4,16,64",
        help="fastshard concurrencies and part sizes (MiB) to sweep on the first remote "
        "source, one load each; '' for none (default: 4,16,64)",
    )
    p.add_argument("--seed", type=int, default=0, help="workload and order seed (default: 0)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    return p


def main(argv: list[str] | None = None) -> int:
    return run_args(build_parser().parse_args(argv))


def run_args(args: argparse.Namespace) -> int:
    from .run import run

    return run(args)
