"""What the wheel ships: the python/fastshard tree under maturin's
python-source (pyproject's [tool.maturin] include and exclude applied), and
none of the benchmark lab (benches/fastshard_lab: the server launchers, the
presets, the shaping proxies and their lookup), which is a development
package of its own."""

from __future__ import annotations

import ast
import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
MATURIN = PYPROJECT["tool"]["maturin"]

# Words that name the lab's servers, presets and shaping proxies, in file
# names and in the shipped code.
LAB_NAMES = ("seaweed", "nginx", "moto", "rclone", "fake_gcs", "fake-gcs", "preset", "shaper")
LAB_CODE = ("SeaweedFS(", "class Nginx", "moto_server", "rclone serve", "fake-gcs-server",
            "cargo build")  # fmt: skip


def _globs(key: str) -> list[str]:
    out = []
    for item in MATURIN.get(key, []):
        out.append(item if isinstance(item, str) else item["path"])
    return out


def wheel_files() -> list[str]:
    """The paths, relative to python/, of the files maturin puts in the wheel
    besides the native module it builds."""
    source = ROOT / MATURIN.get("python-source", ".")
    package = source / MATURIN["module-name"].split(".")[0]
    out = []
    for path in sorted(package.rglob("*")):
        rel = path.relative_to(source).as_posix()
        if not path.is_file() or "__pycache__" in rel or path.suffix in (".so", ".pyc"):
            continue
        if any(fnmatch.fnmatch(rel, g) for g in _globs("exclude")):
            continue
        out.append(rel)
    for glob in _globs("include"):
        out += [p.relative_to(ROOT).as_posix() for p in ROOT.glob(glob) if p.is_file()]
    return out


def test_the_wheel_ships_the_library_and_no_lab() -> None:
    files = wheel_files()
    assert "fastshard/__init__.py" in files and "fastshard/cli.py" in files
    assert "fastshard/_native.pyi" in files and "fastshard/py.typed" in files
    named = [f for f in files if any(word in f.lower() for word in LAB_NAMES)]
    assert named == [], f"server launchers, presets or shapers in the wheel: {named}"
    assert not [f for f in files if f.startswith("fastshard/bench/")]
    for rel in files:
        if not rel.endswith(".py"):
            continue
        text = (ROOT / MATURIN.get("python-source", ".") / rel).read_text()
        found = [word for word in LAB_CODE if word in text]
        assert found == [], f"{rel} carries the lab's code: {found}"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                assert not any(n.startswith("fastshard_lab") for n in names), rel


def test_the_lab_is_its_own_package_with_its_presets() -> None:
    lab = ROOT / "benches" / "fastshard_lab"
    project = tomllib.loads((ROOT / "benches" / "pyproject.toml").read_text())["project"]
    assert project["name"] == "fastshard-lab" and project["dependencies"] == []
    for name in ("servers.py", "web.py", "moto.py", "rclone.py", "gcs.py", "shaper.py"):
        assert (lab / name).is_file(), name
    assert (lab / "presets" / "matrix.py").is_file()
    # The wheel's bench extra names what `fastshard bench URI` compares with, no server.
    extra = " ".join(PYPROJECT["project"]["optional-dependencies"]["bench"])
    assert not [s for s in ("seaweedfs", "moto", "rclone", "fake-gcs") if s in extra], extra
    assert "-e ./benches" in (ROOT / "requirements-demo.txt").read_text().splitlines()
