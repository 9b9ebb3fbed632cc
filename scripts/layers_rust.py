"""The Rust half of check_layers.py: no two top-level modules (``rust/<name>.rs``
or ``rust/<name>/``, lib.rs excepted) that refer to each other, through
``crate::<other>`` paths anywhere in the code (``use`` or inline) or
``super::`` paths that climb out of the module; and no two source files
that do, test code aside (a module under ``#[cfg(test)]`` or
``#[cfg(all(test, ...))]``, inline or in a file of its own): a path names
the file its module is written in (an item of a mod.rs, a re-export, names
the mod.rs).

And the store registry is the one place that picks a backend: a variant of
the location's ``Kind`` (a ``match`` arm, an ``== Kind::X`` comparison, a
``matches!``) anywhere but in the registry (``rust/io/registry.rs``) and the
module that defines and parses kinds (``rust/location.rs``) fails, as does a
wildcard arm (``_ =>``) in a match over kinds, which would read a new kind
as an old one."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    file: Path
    line: int


def shown(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


# -- Rust --------------------------------------------------------------------

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
# Strings, chars and raw strings, so a path inside one is not a reference;
# lifetimes ('a) are left alone by requiring the closing quote.
_LITERAL = re.compile(r'r(#*)".*?"\1|b?"(?:\\.|[^"\\])*"|b?\'(?:\\.|[^\'\\])\'', re.S)
# An inline `mod name {` (with the attributes before it), a brace, or the
# start of a `crate::` / `super::` path.
_TOKEN = re.compile(
    r"((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?\bmod\s+([A-Za-z_]\w*)\s*\{"
    r"|[{}]|\b(crate|super)((?:\s*::\s*super)*)\s*::\s*"
)
_IDENT = re.compile(r"\s*([A-Za-z_]\w*)")


def _strip(source: str) -> str:
    # Keep line count (for messages) by replacing with spaces of equal length.
    def blank(m: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    return _LITERAL.sub(blank, _COMMENT.sub(blank, source))


_PATH_STEP = re.compile(r"\s*::\s*")


def _path_at(text: str, at: int) -> tuple[list[list[str]], int]:
    """The module paths a ``use``-style path starting at ``text[at]`` names
    (``a::b::c``, or ``a::{b::c, d::{e, f}}``: one path per leaf), and where
    it ends. A leaf that is not an identifier (``*``, ``self``) ends its
    path one step short."""
    segments: list[str] = []
    i = at
    while True:
        if i < len(text) and text[i] == "{":
            return _group_at(text, i, segments)
        ident = _IDENT.match(text, i)
        if ident is None:
            return [segments], i
        segments.append(ident.group(1))
        i = ident.end()
        step = _PATH_STEP.match(text, i)
        if step is None:
            return [segments], i
        i = step.end()


def _group_at(text: str, at: int, prefix: list[str]) -> tuple[list[list[str]], int]:
    """The paths of a ``{x, y::z, ..}`` group at ``text[at] == "{"``, each
    after ``prefix``."""
    paths: list[list[str]] = []
    i = at + 1
    while i < len(text):
        while i < len(text) and text[i] in " \t\n,":
            i += 1
        if i >= len(text) or text[i] == "}":
            return paths or [prefix], i + 1
        inner, end = _path_at(text, i)
        paths += [prefix + p for p in inner]
        # Past what the item adds (`as name`, `*`): to its comma or the close.
        depth = 0
        i = max(end, i + 1)
        while i < len(text) and not (depth == 0 and text[i] in ",}"):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
    return paths or [prefix], i


@dataclass(frozen=True)
class Module:
    """A source file: its module path, and whether it is compiled for
    tests only (declared under ``#[cfg(test)]``, or inside such a module)."""

    path: tuple[str, ...]
    test_only: bool


# `#[cfg(test)]` and `#[path = ".."]`, in either order, before `mod name;`.
_MOD_DECL = re.compile(r"((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")
_PATH_ATTR = re.compile(r'#\[path\s*=\s*"([^"]+)"\]')
# `#[cfg(test)]`, or `#[cfg(all(test, ...))]`: compiled for tests only.
_CFG_TEST = re.compile(r"#\[cfg\((?:test|all\((?:[^\]]*,\s*)?test\b[^\]]*)\)\]")


def modules(rust: Path) -> dict[Path, Module]:
    """Each source file's module: its path from its place in the tree, or,
    for a file a ``#[path = ".."] mod name;`` includes (the ``*_tests.rs``
    files), the including module's path and ``name``."""
    found: dict[Path, Module] = {}
    for path in sorted(rust.rglob("*.rs")):
        parts = list(path.relative_to(rust).with_suffix("").parts)
        if path.parent == rust and path.name == "lib.rs":
            parts = []
        elif parts[-1] == "mod":
            parts = parts[:-1]
        found[path] = Module(tuple(parts), False)
    # Declarations, parents first, so a test-only parent marks its children.
    for path in sorted(found, key=lambda p: len(found[p].path)):
        declaring = found[path]
        child_dir = path.parent if path.name in ("mod.rs", "lib.rs") else path.with_suffix("")
        for m in _MOD_DECL.finditer(_COMMENT.sub("", path.read_text())):
            attrs, name = m.group(1), m.group(2)
            attr = _PATH_ATTR.search(attrs)
            if attr is not None:
                child = path.parent / attr.group(1)
            else:
                child = next(
                    (
                        f
                        for f in (child_dir / f"{name}.rs", child_dir / name / "mod.rs")
                        if f in found
                    ),
                    child_dir / f"{name}.rs",
                )
            if child in found:
                test_only = declaring.test_only or bool(_CFG_TEST.search(attrs))
                found[child] = Module((*declaring.path, name), test_only)
    return found


def rust_references(path: Path, module: Module) -> Iterator[tuple[list[str], int, bool]]:
    """(module path referred to, line, whether the referring code is test
    code) for every ``crate::`` or ``super::`` path in one file."""
    text = _strip(path.read_text())
    # Inline `mod x {`s open here: name, the brace depth it opened at, and
    # whether it is compiled for tests only.
    inline: list[tuple[str, int, bool]] = []
    depth = 0
    for m in _TOKEN.finditer(text):
        tok = m.group(0)
        if m.group(2):
            depth += 1
            inline.append((m.group(2), depth, bool(_CFG_TEST.search(m.group(1)))))
            continue
        if tok == "{":
            depth += 1
            continue
        if tok == "}":
            if inline and inline[-1][1] == depth:
                inline.pop()
            depth -= 1
            continue
        here = [*module.path, *(name for name, _, _ in inline)]
        if m.group(3) == "crate":
            base: list[str] = []
        else:
            ups = 1 + m.group(4).count("super")
            if ups > len(here):
                continue  # above the crate root: not valid Rust, nothing to say
            base = here[: len(here) - ups]
        line = text.count("\n", 0, m.start()) + 1
        test = module.test_only or any(test for _, _, test in inline)
        for tail in _path_at(text, m.end())[0]:
            yield base + tail, line, test


def rust_edges(rust: Path) -> tuple[list[Edge], list[Edge]]:
    """Edges between top-level modules (any code, tests included), and
    between files (code that is not test code): a file naming an item of a
    module is an edge to the file that module is written in."""
    found = modules(rust)
    files = {m.path: p for p, m in found.items()}
    tops = {m.path[0] for m in found.values() if m.path}
    top_edges, file_edges = [], []
    for path, module in found.items():
        if not module.path:
            continue  # lib.rs declares the modules, nothing more
        for target, line, test in rust_references(path, module):
            if target and target[0] in tops and target[0] != module.path[0]:
                top_edges.append(Edge(module.path[0], target[0], path, line))
            written = next(
                (
                    files[tuple(target[:k])]
                    for k in range(len(target), 0, -1)
                    if tuple(target[:k]) in files
                ),
                None,
            )
            if not test and written is not None and written != path:
                file_edges.append(
                    Edge(str(path.relative_to(rust)), str(written.relative_to(rust)), path, line)
                )
    return top_edges, file_edges


def _pairs(edges: list[Edge], what: str, root: Path) -> list[str]:
    """Each pair of ``what`` with edges both ways."""
    by_pair: dict[tuple[str, str], list[Edge]] = {}
    for e in edges:
        by_pair.setdefault((e.source, e.target), []).append(e)
    problems = []
    for a, b in sorted(by_pair):
        if a < b and (b, a) in by_pair:
            where = [
                f"  {e.source} -> {e.target} ({shown(e.file, root)}:{e.line})"
                for e in by_pair[(a, b)][:5] + by_pair[(b, a)][:5]
            ]
            more = len(by_pair[(a, b)]) + len(by_pair[(b, a)]) - len(where)
            problems.append(
                f"rust {what} {a} and {b} import each other "
                f"({len(by_pair[(a, b)])} + {len(by_pair[(b, a)])} references)\n"
                + "\n".join(where)
                + (f"\n  … {more} more" if more > 0 else "")
            )
    return problems


def check_rust(rust: Path, root: Path) -> list[str]:
    top_edges, file_edges = rust_edges(rust)
    return (
        _pairs(top_edges, "modules", root)
        + _pairs(file_edges, "files", root)
        + check_kind_matches(rust, root)
    )


# -- The store registry: the only match on the location's kind ----------------

# Files that may name a location kind's variants (the module that defines
# the enum and parses URIs into it, the registry that maps a kind to its
# store), with the test files they include.
KIND_ALLOWED = ("location.rs", "location_tests.rs", "io/registry.rs", "io/registry_tests.rs")
_KIND_ENUM = re.compile(r"\benum\s+Kind\s*\{([^}]*)\}")
_WILDCARD_ARM = re.compile(r"(?<![\w.])_\s*(?:if\b[^=]*)?=>")


def kind_variants(rust: Path) -> list[str]:
    """The variants of ``location::Kind`` as rust/location.rs declares them."""
    location = rust / "location.rs"
    if not location.is_file():
        return []
    m = _KIND_ENUM.search(_strip(location.read_text()))
    if m is None:
        return []
    body = re.sub(r"#\[[^\]]*\]", " ", m.group(1))
    return re.findall(r"\b([A-Z]\w*)\b", body)


def _kind_path(variants: list[str]) -> re.Pattern[str]:
    names = "|".join(map(re.escape, variants))
    # `Kind::S3`, and the forms that bring variants in unnamed: `Kind::*`,
    # `Kind::{...}`.
    return re.compile(rf"\bKind\s*::\s*(?:(?:{names})\b|\*|\{{)")


def _match_blocks(text: str) -> Iterator[tuple[int, int]]:
    """(start of its ``{``, end) of every ``match`` block's body."""
    for m in re.finditer(r"\bmatch\b", text):
        brace = text.find("{", m.end())
        if brace < 0:
            continue
        depth = 0
        for i in range(brace, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    yield brace, i
                    break


def _top_level(text: str, start: int, end: int) -> str:
    """The block's text at its own depth, nested blocks blanked."""
    out, depth = [], 0
    for c in text[start + 1 : end]:
        if c == "{":
            depth += 1
        out.append(c if depth == 0 else (c if c == "\n" else " "))
        if c == "}":
            depth -= 1
    return "".join(out)


def check_kind_matches(rust: Path, root: Path) -> list[str]:
    variants = kind_variants(rust)
    if not variants:
        return []
    pattern = _kind_path(variants)
    problems = []
    for path in sorted(rust.rglob("*.rs")):
        rel = path.relative_to(rust).as_posix()
        text = _strip(path.read_text())
        where = shown(path, root)
        if rel not in KIND_ALLOWED:
            lines = sorted({text.count("\n", 0, m.start()) + 1 for m in pattern.finditer(text)})
            for line in lines:
                problems.append(
                    f"{where}:{line}: the location's kind is matched outside the store "
                    "registry (rust/io/registry.rs): pick the backend through "
                    "io::registry::store, so a new kind has one place to go"
                )
            continue
        for start, end in _match_blocks(text):
            arms = _top_level(text, start, end)
            if not pattern.search(arms):
                continue
            for m in _WILDCARD_ARM.finditer(arms):
                line = text.count("\n", 0, start + 1 + m.start()) + 1
                problems.append(
                    f"{where}:{line}: a wildcard arm in a match on the location's kind: "
                    "name every kind, so a new one does not compile until it has a store"
                )
    return problems
