"""``python -m fastshard_lab [--preset NAME] [options]``: pick a preset, parse its
options, check what it needs, run it.

Every preset (parser.py lists them) is a module of ``fastshard_lab.presets``
with a docstring (its ``--help``), ``add_arguments(parser)``,
``requires(args)`` (the modules it cannot run without) and ``run(args) ->
exit code``. Torch-free: ``--help`` and the dependency check answer before
torch would have loaded.

``--record`` (presets that write to ``--out``) puts a run that succeeded
into the docs site as well (record.py); ``--render DIR ...`` redraws
recorded folders and ``--index`` writes the list of runs (runs.py), both
without measuring anything.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from .deps import MissingDependency, require
from .params import DOCS
from .parser import PRESETS, build_parser, preset_module

__all__ = ["EXIT_MISSING", "PRESETS", "build_parser", "main"]

EXIT_MISSING = 2


def _recorded(argv: list[str]) -> int | None:
    """``--render DIR ...`` and ``--index``, which measure nothing; None
    when neither was given (then a preset runs)."""
    p = argparse.ArgumentParser(prog="python -m fastshard_lab", add_help=False, allow_abbrev=False)
    p.add_argument("--render", nargs="+", type=Path, default=[])
    p.add_argument("--index", action="store_true")
    p.add_argument("--docs", type=Path, default=DOCS)
    known, rest = p.parse_known_args(argv)
    if not known.render and not known.index:
        return None
    if rest:
        p.error(f"--render and --index take no other options: {' '.join(rest)}")
    from . import record, runs

    if known.render:
        require(["matplotlib"], who="python -m fastshard_lab --render")
    for folder in known.render:
        if not (folder / "results.json").exists():
            p.error(f"--render: {folder} has no results.json (not a recorded run)")
        print(f"wrote {record.render(folder)}")
    docs = known.render[0].parent if known.render else known.docs
    if not docs.is_dir():
        p.error(f"--index: no folder {docs} (run from the checkout's root, or give --docs)")
    print(f"wrote {runs.write_listing(docs)}")
    return 0


def _commit() -> str | None:
    """The checkout's commit, ``-dirty`` when files differ from it; None
    outside a git checkout."""
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def _record(preset: str, args: argparse.Namespace, run: ModuleType) -> int:
    """Run the preset, then record what it wrote to --out (when it succeeded)."""
    from . import machine, record
    from .runs import command_line

    command = command_line(build_parser(preset), preset, vars(args))
    started, info = time.localtime(), machine.describe()
    code = int(run.run(args))
    if code != 0:
        print(f"not recorded: the run failed (exit code {code})", file=sys.stderr)
        return code
    folder = record.record(preset, args.out, args.docs, command, started, info, _commit())
    print(f"recorded {folder} ({folder / 'table.md'}); list of runs: {args.docs / 'runs.md'}")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        done = _recorded(argv)
    except MissingDependency as e:
        print(e, file=sys.stderr)
        return EXIT_MISSING
    if done is not None:
        return done
    first = argparse.ArgumentParser(prog="python -m fastshard_lab", add_help=False)
    first.add_argument("--preset", choices=list(PRESETS), default="default")
    preset = first.parse_known_args(argv)[0].preset
    args = build_parser(preset).parse_args(argv)
    mod = preset_module(preset)
    try:
        # Before anything is written or measured: a run must not fail at its end.
        recording = getattr(args, "record", False)
        if recording and not args.docs.is_dir():
            raise SystemExit(
                f"--record: no folder {args.docs} (run from the checkout's root, or give --docs)"
            )
        needs = [*mod.requires(args), *(["matplotlib"] if recording else [])]
        require(needs, who=f"python -m fastshard_lab --preset {preset}")
        return _record(preset, args, mod) if recording else int(mod.run(args))
    except MissingDependency as e:
        print(e, file=sys.stderr)
        return EXIT_MISSING
