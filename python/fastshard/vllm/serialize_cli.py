"""``fastshard serialize [options] URI [vllm engine arguments...]``.

Starts vLLM (``vllm.LLM``) with the given engine arguments (``--model``,
``--tensor-parallel-size``, ``--pipeline-parallel-size``, ...) and fastshard's
worker extension, then writes every rank with
``fastshard.vllm.serialize.serialize``. S3 settings come from the
environment, as for ``fastshard serve``. vLLM is imported only when the
command runs.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from ._commands import Subparsers, vllm_subcommand
from .names import WORKER_EXTENSION


def add_parser(sub: Subparsers) -> None:
    where = "a directory or s3:// prefix, or a per-rank template"
    p = vllm_subcommand(sub, cmd_serialize, uri_help=where, rest="vLLM engine arguments")
    key_help = "32-byte key file (local or s3://) to encrypt with"
    p.add_argument("--encryption-keyfile", metavar="FILE", help=key_help)
    p.add_argument("--no-artifacts", action="store_true", help="write the weights only")


def engine_kwargs(vllm_args: list[str]) -> dict[str, Any]:
    """vLLM's own parsing of engine arguments, as ``vllm.LLM`` keywords,
    with fastshard's worker extension."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser(prog="fastshard serialize"))
    args = parser.parse_args([a for a in vllm_args if a != "--"])
    engine = EngineArgs.from_cli_args(args)
    if engine.worker_extension_cls and engine.worker_extension_cls != WORKER_EXTENSION:
        raise SystemExit("fastshard serialize: --worker-extension-cls is set by fastshard")
    kwargs = {f.name: getattr(engine, f.name) for f in dataclasses.fields(engine)}
    kwargs["worker_extension_cls"] = WORKER_EXTENSION
    return kwargs


def cmd_serialize(args: argparse.Namespace) -> int:
    """write a vLLM model's ranks, manifest and artifacts (local or S3)

    Start vLLM with the given engine arguments (--model MODEL and any other
    of vLLM's) and write every tensor- and pipeline-parallel rank's weights
    to URI (a directory or s3:// prefix, or a per-rank template), then
    fastshard-manifest.json and the model's non-weight files."""
    from vllm import LLM

    from .serialize import serialize

    llm = LLM(**engine_kwargs(args.vllm_args))
    location = serialize(
        llm,
        args.uri,
        encryption_keyfile=args.encryption_keyfile,
        artifacts=not args.no_artifacts,
    )
    print(location)
    return 0
