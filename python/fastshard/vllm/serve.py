"""``fastshard serve s3://bucket/prefix [vllm serve arguments...]``.

vLLM refuses ``s3://`` model paths for load formats other than Run:ai's
(its issue #32807), so the model's non-weight files are fetched into a local
cache (``artifacts.py``: listed by the index serialization wrote, names that
would leave the cache refused) and ``vllm serve <cache> --load-format
fastshard`` is executed with the weights' ``uri`` set to the prefix. S3
credentials and endpoint come from the environment (``S3_ENDPOINT_URL``,
``S3_ACCESS_KEY_ID``/``S3_SECRET_ACCESS_KEY``, ``~/.s3cfg`` or the AWS
chain), which vLLM's workers inherit: nothing secret goes on a command line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from .._core import location as _location
from ._commands import Subparsers, vllm_subcommand
from .artifacts import cache_dir_for, cache_root, fetch_artifacts

_OWNED = ("--load-format", "--model-loader-extra-config")


def vllm_command(
    uri: str, cache: Path, vllm_args: Sequence[str], loader_config: dict[str, object]
) -> list[str]:
    for arg in vllm_args:
        if arg.split("=", 1)[0] in _OWNED:
            raise SystemExit(
                f"fastshard serve: {arg.split('=', 1)[0]} is set by fastshard serve; pass "
                "loader keys with --loader-config JSON"
            )
    extra = {**loader_config, "uri": _location.as_directory(uri)}
    return [
        "vllm",
        "serve",
        str(cache),
        "--load-format",
        "fastshard",
        "--model-loader-extra-config",
        json.dumps(extra),
        *vllm_args,
    ]


def add_parser(sub: Subparsers) -> None:
    where = "s3://bucket/prefix/ (or a URL or directory) written by serialize"
    p = vllm_subcommand(sub, cmd_serve, uri_help=where, rest="vllm serve arguments")
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        type=Path,
        default=None,
        help="cache root (default: $FASTSHARD_CACHE_DIR or ~/.cache/fastshard)",
    )
    p.add_argument(
        "--loader-config",
        metavar="JSON",
        default="{}",
        help="JSON of fastshard loader keys (concurrency, ...)",
    )
    p.add_argument(
        "--print-command", action="store_true", help="fetch, print the vllm command, do not run it"
    )


def cmd_serve(args: argparse.Namespace) -> int:
    """serve a fastshard-serialized model from S3 with vLLM

    Fetch the model's non-weight files into a local cache, then exec
    `vllm serve <cache> --load-format fastshard` with the weights read from
    URI."""
    loader_config = json.loads(args.loader_config)
    if not isinstance(loader_config, dict):
        raise SystemExit("fastshard serve: --loader-config must be a JSON object")
    vllm_args = [a for a in args.vllm_args if a != "--"]
    cache = cache_dir_for(args.uri, args.cache_dir or cache_root())
    fetched = fetch_artifacts(args.uri, cache, {})
    command = vllm_command(args.uri, cache, vllm_args, loader_config)
    if args.print_command:
        print(json.dumps({"cache": str(cache), "fetched": [p.name for p in fetched]}))
        print(json.dumps(command))
        return 0
    exe = shutil.which(command[0])
    if exe is None:
        raise SystemExit("fastshard serve: vllm is not installed (no `vllm` on PATH)")
    os.execv(exe, command)
    return 0  # not reached
