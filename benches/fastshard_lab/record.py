"""A run recorded into the docs site: ``python -m fastshard_lab --preset NAME
--record`` runs the preset as usual (everything to ``--out``), then copies
its results into ``docs/benchmarks/<date>-<preset>/``: ``results.json`` as
the preset wrote it, ``meta.json`` with what recorded it added (the date and
time the run started, the command that reproduces it, the machine where the
preset did not describe it), the PNGs the preset drew, a throughput chart of
results.json, and ``table.md``: the run's page (title, date, machine, the
command, the plots, and the preset's tables as it printed them). A second
run of a preset on the same day gets ``-2``, then ``-3``: a folder is never
written over. Then the list of runs (runs.py) is written again.

``python -m fastshard_lab --render DIR`` redraws a recorded folder's plots
and page from its results.json and meta.json, measuring nothing: the tables
are kept as the preset printed them (between the page's two markers; a
folder recorded before the page had them gives its whole table.md)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from . import plots, runs
from .params import DOCS
from .parser import PRESETS
from .runs import PAGE, Run

TABLES_BEGIN = "<!-- the preset's tables, as it printed them -->"
TABLES_END = "<!-- end of the preset's tables -->"
# What each plot shows (its alt text), by file name; others are named by theirs.
PLOT_NAMES = {
    "throughput.png": "GB/s per source and loader",
    "sweep.png": "fastshard's GB/s against concurrency and part size",
    "memory.png": "RSS over one load",
}


def new_folder(docs: Path, date: str, preset: str) -> Path:
    """``docs/<date>-<preset>``, made here; ``-2``, ``-3``, ... when taken."""
    count = 1
    while True:
        name = f"{date}-{preset}" + ("" if count == 1 else f"-{count}")
        try:
            (docs / name).mkdir()
            return docs / name
        except FileExistsError:
            count += 1


def tables(page: str) -> str:
    """The preset's text in a run's page: between the markers, or the whole
    file where it has none (written before record.py, as the preset wrote it)."""
    if TABLES_BEGIN in page and TABLES_END in page:
        return page.split(TABLES_BEGIN, 1)[1].split(TABLES_END, 1)[0].strip("\n")
    return page.strip("\n")


def _machine_lines(meta: dict[str, Any]) -> list[str]:
    from .machine import header

    info = meta.get("machine")
    if not isinstance(info, dict):
        return ["machine: not recorded (this run's meta.json has no machine description)"]
    try:
        return header(info)
    except (KeyError, TypeError, IndexError):
        return [f"machine: {info}"]


def page(run: Run, meta: dict[str, Any], body: str, pngs: list[str]) -> str:
    summary = PRESETS.get(run.preset, ("", "a preset no longer in the lab"))[1]
    when = f"{run.date} {run.time}".strip()
    commit = meta.get("recorded", {}).get("commit")
    lines = [
        f"# {run.preset}: {run.date}",
        "",
        "<!-- Written by python -m fastshard_lab (fastshard_lab/record.py) from results.json "
        "and meta.json beside it; never edit by hand. Redraw the page and its plots with "
        f"python -m fastshard_lab --render {DOCS / run.folder.name} -->",
        "",
        f"The `{run.preset}` preset ({summary}), run on {when}, as the harness recorded it.",
        "",
        f"- reproduce: `{run.command}`",
        *([f"- code: commit `{commit}`"] if commit else []),
        *(f"- {line}" for line in _machine_lines(meta)),
        "- files: [results.json](results.json) (what the tables show, one record per row), "
        "[meta.json](meta.json) (machine, versions, arguments, what was skipped)",
        "- all recorded runs: [Recorded runs](../runs.md)",
        "",
    ]
    if pngs:
        lines += ["## Plots", ""]
        lines += [f"![{PLOT_NAMES.get(p, p)}]({p})\n" for p in pngs]
    # Blank lines around the markers: Markdown would take text that touches
    # an HTML comment for part of it.
    lines += ["## Tables", "", TABLES_BEGIN, "", body, "", TABLES_END]
    return "\n".join(lines) + "\n"


def _draw(folder: Path, run: Run, recs: Any, meta: dict[str, Any]) -> list[str]:
    """Every plot results.json and meta.json can give, drawn again; the names
    of all PNGs in the folder (kept ones too: memory.png needs runs.json)."""
    title = f"{run.preset}, {run.date}"
    rows = plots.plottable(recs)
    if rows:
        plots.throughput(folder / "throughput.png", rows, title)
    points = plots.sweep_points(meta.get("sweep"))
    if points:
        plots.sweep(folder / "sweep.png", points)
    names = sorted(p.name for p in folder.glob("*.png"))
    known = [n for n in PLOT_NAMES if n in names]
    return known + [n for n in names if n not in PLOT_NAMES]


def render(folder: Path) -> Path:
    """The page and plots of a recorded folder, again, from its files."""
    run = runs.about(folder)
    recs = json.loads((folder / "results.json").read_text())
    meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").exists() else {}
    body = tables((folder / PAGE).read_text()) if (folder / PAGE).exists() else ""
    pngs = _draw(folder, run, recs, meta)
    (folder / PAGE).write_text(page(run, meta, body, pngs))
    return folder / PAGE


def record(
    preset: str,
    out: Path,
    docs: Path,
    command: str,
    started: time.struct_time,
    machine: dict[str, Any] | None = None,
    commit: str | None = None,
) -> Path:
    """The run a preset wrote to ``out`` into a new folder of ``docs``
    (results.json copied byte for byte); then its page and the list of runs."""
    meta = json.loads((out / "meta.json").read_text()) if (out / "meta.json").exists() else {}
    if machine is not None and "machine" not in meta:
        meta["machine"] = machine
    date = time.strftime("%Y-%m-%d", started)
    meta["recorded"] = {
        "date": date,
        "time": time.strftime("%H:%M:%S", started),
        "preset": preset,
        "command": command,
    }
    if commit:
        meta["recorded"]["commit"] = commit
    folder = new_folder(docs, date, preset)
    shutil.copyfile(out / "results.json", folder / "results.json")
    (folder / "meta.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    for png in sorted(out.glob("*.png")):
        shutil.copyfile(png, folder / png.name)
    body = (out / PAGE).read_text() if (out / PAGE).exists() else ""
    (folder / PAGE).write_text(f"{TABLES_BEGIN}\n\n{body.strip()}\n\n{TABLES_END}\n")
    render(folder)
    runs.write_listing(docs)
    return folder
