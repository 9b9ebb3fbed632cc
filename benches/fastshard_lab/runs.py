"""The list of recorded runs, ``docs/benchmarks/runs.md``: every folder the
harness recorded (record.py), newest first, then the pages recorded by hand
before it did (``YYYY-MM-DD.md``), labelled as history. Written by every
``--record`` and ``--render``, and by ``python -m fastshard_lab --index``,
which ``make docs`` runs before it builds the site: a recorded run appears
in the site without anyone editing mkdocs.yml (mkdocs.yml's ``not_in_nav``
names the run pages, which the list links to). Torch- and matplotlib-free."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .params import DOCS
from .parser import PRESETS, build_parser

LISTING = "runs.md"
PAGE = "table.md"
HAND_PAGE = re.compile(r"^(\d{4}-\d{2}-\d{2})\.md$")
FOLDER = re.compile(r"^(\d{4}-\d{2}-\d{2})-(.+?)(?:-(\d+))?$")
# Options that say where things go or what to do, not what was measured.
NOT_REPRODUCED = {"help", "preset", "out", "record", "docs", "render", "index"}


@dataclass
class Run:
    """A recorded run: its folder, and what its meta.json (or, for a folder
    recorded before meta.json said, its name and arguments) says of it."""

    folder: Path
    date: str
    time: str  # "" where the run's meta.json does not say
    preset: str
    command: str

    @property
    def order(self) -> tuple[str, str, int, str]:
        """Sort key, oldest first: date, time, the same day's count, name."""
        match = FOLDER.match(self.folder.name)
        count = int(match.group(3)) if match and match.group(3) else 1
        return (self.date, self.time, count, self.folder.name)


def command_line(parser: argparse.ArgumentParser, preset: str, args: dict[str, Any]) -> str:
    """The command that reproduces a run: ``python -m fastshard_lab``, the
    preset, and every option whose value (as meta.json keeps it) differs
    from the preset's default; where results go is left out."""
    defaults = vars(parser.parse_args(["--preset", preset]))
    words = ["python", "-m", "fastshard_lab"] + (
        [] if preset == "default" else ["--preset", preset]
    )
    for action in parser._actions:
        dest = action.dest
        if dest in NOT_REPRODUCED or dest not in args or not action.option_strings:
            continue
        value, default = args[dest], defaults.get(dest)
        if _plain(value) == _plain(default):
            continue
        flag = max(action.option_strings, key=len)
        if action.nargs == 0:  # store_true / store_false: the flag alone
            words.append(flag)
        elif isinstance(value, list):
            words += [flag, *(shlex.quote(str(v)) for v in value)]
        else:
            words += [flag, shlex.quote(str(value))]
    return " ".join(words)


def _plain(value: Any) -> Any:
    """A value as JSON gives it back: paths as strings, tuples as lists."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else {}


def about(folder: Path) -> Run:
    meta = _read_json(folder / "meta.json")
    rec = meta.get("recorded", {})
    match = FOLDER.match(folder.name)
    args = meta.get("args", {})
    preset = rec.get("preset") or args.get("preset") or (match.group(2) if match else "default")
    command = rec.get("command")
    if command is None:
        known = preset in PRESETS and args
        command = command_line(build_parser(preset), preset, args) if known else "not recorded"
    date = rec.get("date") or (match.group(1) if match else "unknown")
    return Run(folder, date, rec.get("time", ""), preset, command)


def recorded(docs: Path) -> list[Run]:
    """The harness's folders (those with results.json), newest first."""
    folders = [p for p in docs.iterdir() if p.is_dir() and (p / "results.json").exists()]
    return sorted((about(p) for p in folders), key=lambda r: r.order, reverse=True)


def by_hand(docs: Path) -> list[tuple[str, str, str]]:
    """(date, file name, first heading) of each page recorded by hand, newest first."""
    out = []
    for path in docs.iterdir():
        match = HAND_PAGE.match(path.name)
        if match:
            heads = [ln[2:].strip() for ln in path.read_text().splitlines() if ln.startswith("# ")]
            out.append((match.group(1), path.name, heads[0] if heads else match.group(1)))
    return sorted(out, reverse=True)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def listing(docs: Path) -> str:
    lines = [
        "# Recorded runs",
        "",
        "<!-- Written by python -m fastshard_lab (fastshard_lab/runs.py) from the folders "
        "beside it; `make docs` rewrites it. Never edit by hand. -->",
        "",
        "Every run the harness recorded (`python -m fastshard_lab --preset NAME --record`), "
        "newest first. Each folder holds the run's page (`table.md`: the machine, the command "
        "that reproduces it, the tables and the plots), `results.json` and `meta.json`, as the "
        "harness wrote them; how a run is recorded: [Method](index.md#recording-a-run). "
        "Compare ratios within one run only.",
        "",
        "| date | run | preset | reproduce |",
        "|---|---|---|---|",
    ]
    for run in recorded(docs):
        when = f"{run.date} {run.time[:5]}".strip()
        link = f"[{run.folder.name}]({run.folder.name}/{PAGE})"
        lines.append(f"| {when} | {link} | `{run.preset}` | `{_cell(run.command)}` |")
    lines += [
        "",
        "## Recorded by hand (history)",
        "",
        "Recorded by hand before the harness wrote results; kept as history. Each page "
        "describes the code of its day, moved here from the README as it was written then.",
        "",
        "| date | page |",
        "|---|---|",
    ]
    lines += [f"| {date} | [{_cell(title)}]({name}) |" for date, name, title in by_hand(docs)]
    return "\n".join(lines) + "\n"


def write_listing(docs: Path = DOCS) -> Path:
    """docs/benchmarks/runs.md, rewritten only when its text changes."""
    path = docs / LISTING
    text = listing(docs)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path
