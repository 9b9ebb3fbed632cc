"""Recording a run into the docs site (fastshard_lab/record.py, runs.py):
synthetic results of a preset go through the writer into a temporary docs
folder, with no server and no measurement; and the docs' own list of runs
is the one the lab writes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from fastshard_lab import command, plots, record, runs

REPO = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"
MACHINE = {
    "date": "2026-12-06 10:00:00 UTC",
    "cpus": 2,
    "platform": "Linux-test",
    "loadavg_before": [0.5, 0.4, 0.3],
    "mem_total_gib": 8.0,
    "versions": {"python": "3.11.2", "fastshard": "0.1.0"},
    "native": {"path": "/x/_native.abi3.so", "bytes": 1 << 20, "mtime": "2026-12-06 09:00:00"},
}


def _rec(source: str, loader: str, gbps: float) -> dict[str, Any]:
    return {"source": source, "loader": loader, "returns": "fresh", "gbps_median": gbps}


def _out(folder: Path, body: str, *extra_pngs: str) -> Path:
    """What a preset leaves in --out: results.json, meta.json, table.md, PNGs."""
    folder.mkdir(parents=True, exist_ok=True)
    recs = [_rec(s, n, g) for s, n, g in (("seaweedfs", "default", 1.3), ("moto", "default", 0.3))]
    recs += [_rec("seaweedfs", "raw-64", 1.0), _rec("moto", "raw-64", 0.03)]
    (folder / "results.json").write_text(json.dumps(recs, indent=1))
    meta = {"args": {"preset": "matrix", "runs": 3}, "skipped": {}}
    meta["sweep"] = [{"source": "s3", "concurrency": c, "gbps": c / 10} for c in (4, 16, 64)]
    (folder / "meta.json").write_text(json.dumps(meta))
    (folder / "table.md").write_text(body + "\n")
    for name in extra_pngs:
        plots.memory(folder / name, {"fastshard (s3)": [(0.0, 1 << 20), (1.0, 1 << 28)]})
    return folder


def _at(when: str) -> time.struct_time:
    return time.strptime(when, "%Y-%m-%d %H:%M:%S")


def _png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG and path.stat().st_size > 1000


def test_a_run_is_recorded_in_a_folder_of_its_own_listed_newest_first(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks"
    docs.mkdir()
    (docs / "2026-12-01.md").write_text("# Runs of 2026-12-01\n\nas they were\n")
    out = _out(tmp_path / "out", "| a | b |\n|---|---|\n| first | 1 |", "memory.png")
    older = record.record(
        "default", out, docs, "python -m fastshard_lab", _at("2026-12-05 09:00:00")
    )
    cmd = "python -m fastshard_lab --preset matrix --runs 3"
    first = record.record("matrix", out, docs, cmd, _at("2026-12-06 10:00:00"), MACHINE, "ab12")

    assert first == docs / "2026-12-06-matrix"
    names = {p.name for p in first.iterdir()}
    # throughput.png from results.json, sweep.png from meta.json, memory.png as the preset drew it
    plotted = {"throughput.png", "sweep.png", "memory.png"}
    assert names == {"table.md", "results.json", "meta.json"} | plotted
    assert all(_png(first / name) and _png(older / name) for name in plotted)
    assert (first / "results.json").read_bytes() == (out / "results.json").read_bytes()
    meta = json.loads((first / "meta.json").read_text())
    want = {"date": "2026-12-06", "time": "10:00:00", "preset": "matrix", "command": cmd}
    assert meta["recorded"] == want | {"commit": "ab12"}
    assert meta["machine"] == MACHINE and meta["args"] == {"preset": "matrix", "runs": 3}
    page = (first / "table.md").read_text()
    assert page.startswith("# matrix: 2026-12-06\n")
    for text in (
        f"`{cmd}`",
        "machine: 2 CPUs, 8 GiB, Linux-test",
        "commit `ab12`",
        "](results.json)",
    ):
        assert text in page
    assert "![GB/s per source and loader](throughput.png)" in page and "](memory.png)" in page
    assert record.tables(page) == "| a | b |\n|---|---|\n| first | 1 |"

    # The same preset again that day: a folder of its own, the first one untouched.
    (out / "table.md").write_text("second run\n")
    second = record.record("matrix", out, docs, cmd, _at("2026-12-06 15:30:00"), MACHINE)
    assert second.name == "2026-12-06-matrix-2"
    assert (first / "table.md").read_text() == page
    assert record.tables((second / "table.md").read_text()) == "second run"

    listing = (docs / "runs.md").read_text()
    order = [
        "[2026-12-06-matrix-2](2026-12-06-matrix-2/table.md)",
        "[2026-12-06-matrix](2026-12-06-matrix/table.md)",
        "[2026-12-05-default](2026-12-05-default/table.md)",
        "## Recorded by hand (history)",
        "[Runs of 2026-12-01](2026-12-01.md)",
    ]
    assert [listing.index(x) for x in order] == sorted(listing.index(x) for x in order)
    assert "| 2026-12-06 15:30 |" in listing and f"`{cmd}`" in listing
    assert "Recorded by hand before the harness wrote results; kept as history." in listing


def test_render_redraws_a_folder_from_its_json_keeping_the_tables(tmp_path: Path) -> None:
    """A folder from before the page had markers: its whole table.md is the
    preset's text, its command comes from meta.json's arguments."""
    docs = tmp_path / "benchmarks"
    folder = _out(docs / "2026-12-05-matrix-shaper-service", "253 MiB object\n\n| x |\n|---|")
    args = {"preset": "matrix", "runs": 3, "stores": "", "proxies": "shaper-service", "out": "/t"}
    (folder / "meta.json").write_text(json.dumps({"args": args, "skipped": {}}))

    assert command.main(["--render", str(folder)]) == 0
    page = (folder / "table.md").read_text()
    want = "python -m fastshard_lab --preset matrix --runs 3 --stores '' --proxies shaper-service"
    assert f"`{want}`" in page and "machine: not recorded" in page
    assert record.tables(page) == "253 MiB object\n\n| x |\n|---|"
    assert _png(folder / "throughput.png") and not (folder / "sweep.png").exists()
    assert command.main(["--render", str(folder)]) == 0
    assert (folder / "table.md").read_text() == page  # a second render changes nothing
    assert "[2026-12-05-matrix-shaper-service]" in (docs / "runs.md").read_text()


def test_record_is_offered_where_a_preset_writes_files_and_checked_first(tmp_path: Path) -> None:
    assert command.build_parser("matrix").parse_args(["--record"]).record
    with pytest.raises(SystemExit):  # staging writes no --out: nothing to record
        command.build_parser("staging").parse_args(["--preset", "staging", "--record"])
    with pytest.raises(SystemExit, match="--record: no folder"):
        command.main(["--preset", "matrix", "--record", "--docs", str(tmp_path / "none")])
    with pytest.raises(SystemExit):
        command.main(["--index", "--runs", "3"])


def test_the_docs_list_of_runs_is_the_one_the_lab_writes() -> None:
    """docs/benchmarks/runs.md is up to date (python -m fastshard_lab --index
    writes it; make docs runs that), and every folder the harness recorded
    has the page record.py writes."""
    docs = REPO / "docs" / "benchmarks"
    assert (docs / "runs.md").read_text() == runs.listing(docs)
    folders = runs.recorded(docs)
    assert folders
    for run in folders:
        page = (run.folder / "table.md").read_text()
        assert record.TABLES_BEGIN in page and page.startswith(f"# {run.preset}: {run.date}\n")
        assert _png(run.folder / "throughput.png")
