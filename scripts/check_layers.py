#!/usr/bin/env python3
"""Fail when the module graph has an arrow back up.

Python (python/fastshard): no import cycle between modules. Every import
counts wherever it is written, inside a function too: an import deferred to
call time still ties the two modules together. The one exception is an
import under ``if TYPE_CHECKING:``, which never runs and exists only so
annotations can name a type. A package's ``__init__`` is a module like any
other; importing ``a.b`` is not counted as importing ``a`` (Python runs
``a/__init__`` first, but the code of ``a.b`` does not depend on it).
Dynamic imports (``importlib.import_module`` with a computed name) are not
seen.

The facade: a module of ``fastshard.vllm`` imports only public modules and
names (no ``_`` in the dotted path), its own package, and ``fastshard._core``;
``reader.py`` and ``module.py`` never import the rooms behind the facade
(``_engine``, ``_coop``, ``_layouts``). Each offence is named with its file:line.

The rooms: a module of ``_engine``, ``_coop`` or ``_layouts`` never imports a
public module above it, one that reaches a room through its own imports
(``shard``, ``packed``, ``cooperative``, ``reader``…); public leaves that
reach none (``errors``, ``tp``) are below every room and fine. Imports under
TYPE_CHECKING count here too.

The benchmark lab (benches/fastshard_lab) gets the same cycle check, and
the package may not import it at all: the lab is a development package
outside the wheel, built on fastshard, never under it.

Rust (rust/, scripts/layers_rust.py): no two top-level modules (``rust/<name>.rs`` or
``rust/<name>/``, lib.rs excepted) that refer to each other, through
``crate::<other>`` paths anywhere in the code (``use`` or inline) or
``super::`` paths that climb out of the module; and no two source files that
refer to each other, test code aside.

Exit status: 0 clean, 1 a violation. ``--graph`` prints the Python module
graph (each module and what it imports), for notes and reviews.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from layers_rust import Edge, check_rust, shown

ROOT = Path(__file__).resolve().parent.parent


# -- Python ------------------------------------------------------------------


def python_modules(package: Path) -> dict[str, Path]:
    """Dotted module name → file, for every module of the package at ``package``.
    A native extension counts through its stub (``_native.pyi``), so
    importing it is an edge to a leaf rather than to the package."""
    base = package.name
    out: dict[str, Path] = {}
    for path in sorted([*package.rglob("*.py"), *package.rglob("*.pyi")]):
        parts = list(path.relative_to(package).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.setdefault(".".join([base, *parts]), path)  # a .py before its .pyi
    return out


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (or
    ``typing.TYPE_CHECKING``), which never run."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        if name != "TYPE_CHECKING":
            continue
        for stmt in node.body:
            for inner in ast.walk(stmt):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    skipped.add(id(inner))
    return skipped


def _import_nodes(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of ``tree``, wherever they stand."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from X import ...`` names."""
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]  # relative to the module's own package
    if node.level > 1:
        parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def python_edges(package: Path) -> tuple[list[Edge], set[str]]:
    """Every import between modules of the package (TYPE_CHECKING ones left
    out), and the module names."""
    modules = python_modules(package)
    edges: list[Edge] = []
    for name, path in modules.items():
        if path.suffix == ".pyi":
            continue  # a native module: its stub imports types, the module nothing
        tree = ast.parse(path.read_text(), filename=str(path))
        skipped = _type_checking_only(tree)
        is_package = path.name == "__init__.py"
        for node in _import_nodes(tree):
            if id(node) in skipped:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node)
                for alias in node.names:
                    # "from pkg import mod" imports the module pkg.mod;
                    # "from pkg import name" runs pkg (its __init__).
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]  # "import a.b.c" of a name in a.b
                if target and target != name:
                    edges.append(Edge(name, target, path, node.lineno))
    return edges, set(modules)


def cycles(nodes: Iterable[str], edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {n: set() for n in nodes}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        # Iterative, so a deep graph cannot hit the recursion limit.
        nonlocal counter
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for n in sorted(graph):
        if n not in index:
            visit(n)
    return sorted(found)


def check_python(package: Path, root: Path) -> list[str]:
    edges, modules = python_edges(package)
    problems = []
    for component in cycles(modules, ((e.source, e.target) for e in edges)):
        members = set(component)
        inside = sorted(
            {
                f"  {e.source} -> {e.target} ({shown(e.file, root)}:{e.line})"
                for e in edges
                if e.source in members and e.target in members
            }
        )
        problems.append(
            f"python import cycle between {len(component)} modules: {', '.join(component)}\n"
            + "\n".join(inside)
        )
    return problems


def check_no_import(package: Path, forbidden: str, root: Path) -> list[str]:
    """An import of ``forbidden`` (or a module under it) anywhere in the package."""
    problems = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _import_nodes(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                if name == forbidden or name.startswith(forbidden + "."):
                    problems.append(
                        f"{package.name} imports {name} ({shown(path, root)}:{node.lineno}): "
                        f"{forbidden} is outside the wheel"
                    )
    return problems


# The facade (python/fastshard/_core.py) and the rooms it stands in front of.
FACADE = "_core"
ROOMS = ("_engine", "_coop", "_layouts")
# Above the facade: vllm/ may import public modules and names and the facade
# only; reader.py and module.py anything but the rooms.
ABOVE = ("reader", "module")


def _private(parts: Iterable[str]) -> bool:
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts)


def _imported(
    module: str, is_package: bool, node: ast.Import | ast.ImportFrom
) -> list[tuple[str, str | None]]:
    """(module, name imported from it or None) of an import statement."""
    if isinstance(node, ast.Import):
        return [(alias.name, None) for alias in node.names]
    base = _resolve(module, is_package, node)
    return [(base, alias.name) for alias in node.names]


def check_facade(package: Path, root: Path) -> list[str]:
    """vllm/ below the facade only through it: each import names a module of
    fastshard.vllm, the facade, or a public module or name; reader.py and
    module.py never name a room. Imports under TYPE_CHECKING count too."""
    base = package.name
    problems = []
    for name, path in python_modules(package).items():
        parts = name.split(".")[1:]
        in_vllm = parts[:1] == ["vllm"]
        if not in_vllm and parts not in ([a] for a in ABOVE):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _import_nodes(tree):
            for target, imported in _imported(name, path.name == "__init__.py", node):
                t = target.split(".")
                if t[0] != base or t[1:2] == ["vllm"]:
                    continue
                inner = t[1:] + ([imported] if imported else [])
                if in_vllm:
                    bad = inner[:1] != [FACADE] and _private(inner)
                else:
                    bad = bool(inner) and inner[0] in ROOMS
                if bad:
                    what = f"{target}.{imported}" if imported else target
                    problems.append(
                        f"{name} imports {what} ({shown(path, root)}:{node.lineno}): "
                        f"{'vllm/ may import public names and' if in_vllm else 'go through'} "
                        f"fastshard.{FACADE} only"
                    )
    return problems


def _above(edges: list[Edge], modules: set[str], base: str) -> set[str]:
    """The public modules that reach a room through their imports."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        graph[e.source].add(e.target)
    rooms = {m for m in modules if m.split(".")[1:2] and m.split(".")[1] in ROOMS}
    reaches = set(rooms)
    changed = True
    while changed:  # a fixed point: the graph is small
        changed = False
        for m, targets in graph.items():
            if m not in reaches and targets & reaches:
                reaches.add(m)
                changed = True
    return {m for m in reaches - rooms if m != base and not _private(m.split(".")[1:])}


def check_rooms(package: Path, root: Path) -> list[str]:
    """No room imports a public module above it (one that reaches a room)."""
    base = package.name
    edges, modules = python_edges(package)
    above = _above(edges, modules, base)
    problems = []
    for name, path in python_modules(package).items():
        parts = name.split(".")[1:]
        if path.suffix == ".pyi" or parts[:1] not in ([r] for r in ROOMS):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _import_nodes(tree):
            for target, imported in _imported(name, path.name == "__init__.py", node):
                sub = f"{target}.{imported}" if imported else target
                hit = sub if sub in above else target if target in above else None
                if hit is not None:
                    problems.append(
                        f"{name} imports {hit} ({shown(path, root)}:{node.lineno}): "
                        f"a room never imports a public module above it; move what it "
                        f"needs into a room and let {hit} re-export it"
                    )
    return problems


def python_graph(package: Path) -> str:
    edges, modules = python_edges(package)
    out: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        out[e.source].add(e.target)
    prefix = package.name + "."
    lines = []
    for m in sorted(out):
        short = sorted(t.removeprefix(prefix) for t in out[m])
        lines.append(f"{m.removeprefix(prefix)} -> {', '.join(short) if short else '(none)'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="repository root")
    ap.add_argument("--graph", action="store_true", help="print the Python module graph")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    package = root / "python" / "fastshard"
    lab = root / "benches" / "fastshard_lab"
    rust = root / "rust"
    if args.graph:
        print(python_graph(package))
        return 0
    failed = False
    py_problems = check_python(package, root) if package.is_dir() else []
    py_problems += check_python(lab, root) if lab.is_dir() else []
    py_problems += check_no_import(package, lab.name, root) if package.is_dir() else []
    py_problems += check_facade(package, root) if package.is_dir() else []
    py_problems += check_rooms(package, root) if package.is_dir() else []
    for p in py_problems:
        print(f"error: {p}", file=sys.stderr)
    failed |= bool(py_problems)
    rust_problems = check_rust(rust, root) if rust.is_dir() else []
    for p in rust_problems:
        print(f"error: {p}", file=sys.stderr)
    failed |= bool(rust_problems)
    if not failed:
        print(
            "layers: no Python import cycle, fastshard never imports fastshard_lab, "
            "vllm/ reaches the core through fastshard._core only, "
            "no room imports a public module above it, "
            "no pair of Rust modules or files importing each other"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
