"""The shape shared by ``fastshard serve`` and ``fastshard serialize``: a
subcommand that takes fastshard's options, a URI, and then any number of
vLLM's own arguments, passed on untouched."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeAlias

# A string: argparse's class takes no type argument at run time.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def vllm_subcommand(
    sub: Subparsers,
    name: str,
    func: Callable[[argparse.Namespace], int],
    *,
    usage: str,
    summary: str,
    description: str,
    uri_help: str | None,
    rest_help: str,
) -> argparse.ArgumentParser:
    """``fastshard NAME [options] URI [vllm arguments...]``; the caller adds
    its options to the parser returned."""
    p = sub.add_parser(name, usage=usage, help=summary, description=description)
    p.add_argument("uri", help=uri_help)
    p.add_argument("vllm_args", nargs=argparse.REMAINDER, help=rest_help)
    p.set_defaults(func=func)
    return p
