"""The shape shared by ``fastshard serve`` and ``fastshard serialize``: a
subcommand that takes fastshard's options, a URI, and then any number of
vLLM's own arguments, passed on untouched."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from typing import TypeAlias

# A string: argparse's class takes no type argument at run time.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def vllm_subcommand(
    sub: Subparsers,
    func: Callable[[argparse.Namespace], int],
    *,
    uri_help: str | None,
    rest: str,
) -> argparse.ArgumentParser:
    """``fastshard NAME [options] URI [REST...]`` run by ``func``
    (``cmd_NAME``), whose docstring is the command's help: its first
    paragraph the summary, the rest the description. ``rest`` names the
    vLLM arguments passed on. The caller adds its options to the parser
    returned."""
    name = func.__name__.removeprefix("cmd_")
    # argparse folds the docstring's line breaks when it wraps the text.
    summary, _, description = (inspect.getdoc(func) or name).partition("\n\n")
    # argparse's own usage would show the vLLM arguments as "...".
    usage = f"fastshard {name} [options] URI [{rest}...]"
    p = sub.add_parser(name, usage=usage, help=summary, description=description)
    p.add_argument("uri", metavar="URI", help=uri_help)
    p.add_argument("vllm_args", nargs=argparse.REMAINDER, help=rest)
    p.set_defaults(func=func)
    return p
