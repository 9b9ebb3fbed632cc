"""The Rust half of check_layers.py: no two top-level modules (``rust/<name>.rs``
or ``rust/<name>/``, lib.rs excepted) that refer to each other, through
``crate::<other>`` paths anywhere in the code (``use`` or inline) or
``super::`` paths that climb out of the module.

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
_TOKEN = re.compile(r"\bmod\s+([A-Za-z_]\w*)\s*\{|[{}]|\b(crate|super)((?:\s*::\s*super)*)\s*::\s*")
_IDENT = re.compile(r"\s*([A-Za-z_]\w*)")


def _strip(source: str) -> str:
    # Keep line count (for messages) by replacing with spaces of equal length.
    def blank(m: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    return _LITERAL.sub(blank, _COMMENT.sub(blank, source))


def _group_heads(text: str, at: int) -> list[str]:
    """First identifier of each item of a ``{a::x, b, c::{..}}`` group
    starting at ``text[at] == "{"``."""
    depth, heads, expect = 0, [], True
    i = at
    while i < len(text):
        c = text[i]
        if c == "{":
            depth += 1
            expect = depth == 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                break
        elif c == "," and depth == 1:
            expect = True
        elif expect and depth == 1 and (c.isalpha() or c == "_"):
            m = _IDENT.match(text, i)
            assert m is not None
            heads.append(m.group(1))
            i = m.end()
            expect = False
            continue
        i += 1
    return heads


def _file_module(path: Path, rust: Path) -> list[str]:
    parts = list(path.relative_to(rust).with_suffix("").parts)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return parts


def rust_references(path: Path, rust: Path) -> Iterator[tuple[str, int]]:
    """(top-level module referred to, line) for every ``crate::`` or
    ``super::`` path in one file."""
    text = _strip(path.read_text())
    file_mod = _file_module(path, rust)
    inline: list[tuple[str, int]] = []  # inline `mod x {` and the brace depth it opened at
    depth = 0
    for m in _TOKEN.finditer(text):
        tok = m.group(0)
        if m.group(1):
            depth += 1
            inline.append((m.group(1), depth))
            continue
        if tok == "{":
            depth += 1
            continue
        if tok == "}":
            if inline and inline[-1][1] == depth:
                inline.pop()
            depth -= 1
            continue
        here = file_mod + [name for name, _ in inline]
        if m.group(2) == "crate":
            base: list[str] = []
        else:
            ups = 1 + m.group(3).count("super")
            if ups > len(here):
                continue  # above the crate root: not valid Rust, nothing to say
            base = here[: len(here) - ups]
        line = text.count("\n", 0, m.start()) + 1
        if base:
            yield base[0], line
            continue
        rest = m.end()
        if rest < len(text) and text[rest] == "{":
            for head in _group_heads(text, rest):
                yield head, line
        else:
            ident = _IDENT.match(text, rest)
            if ident is not None:
                yield ident.group(1), line


def rust_edges(rust: Path) -> list[Edge]:
    tops = {p.stem for p in rust.glob("*.rs") if p.name != "lib.rs"}
    tops |= {p.name for p in rust.iterdir() if p.is_dir()}
    edges = []
    for path in sorted(rust.rglob("*.rs")):
        if path.parent == rust and path.name == "lib.rs":
            continue
        own = _file_module(path, rust)[0]
        for target, line in rust_references(path, rust):
            if target in tops and target != own:
                edges.append(Edge(own, target, path, line))
    return edges


def check_rust(rust: Path, root: Path) -> list[str]:
    edges = rust_edges(rust)
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
                f"rust modules {a} and {b} import each other "
                f"({len(by_pair[(a, b)])} + {len(by_pair[(b, a)])} references)\n"
                + "\n".join(where)
                + (f"\n  … {more} more" if more > 0 else "")
            )
    return problems + check_kind_matches(rust, root)


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
