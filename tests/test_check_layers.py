"""scripts/check_layers.py: it must catch an arrow back up in a tree built
here (Python import cycles, imports inside functions included; Rust
top-level modules that refer to each other), and pass a tree without one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "check_layers.py"


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def check(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


PKG = "python/fastshard/"


def test_an_import_inside_a_function_closes_a_cycle(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            PKG + "__init__.py": "",
            PKG + "reader.py": "from . import shard\n",
            PKG + "shard.py": """\
                def shown(uri):
                    from .reader import display  # deferred, still a cycle
                    return display(uri)
            """,
        },
    )
    out = check(root)
    assert out.returncode == 1, out
    assert "fastshard.reader, fastshard.shard" in out.stderr
    assert "python/fastshard/shard.py:2" in out.stderr  # where the back edge is


def test_a_cycle_through_relative_imports_of_a_subpackage(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            PKG + "__init__.py": "",
            PKG + "options.py": "import fastshard.sub.loader as l\n",
            PKG + "sub/__init__.py": "",
            PKG + "sub/loader.py": "from .. import options\n",
        },
    )
    out = check(root)
    assert out.returncode == 1, out
    assert "fastshard.options, fastshard.sub.loader" in out.stderr


def test_the_package_importing_the_lab_fails(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            PKG + "__init__.py": "",
            PKG + "cli.py": """\
                def bench():
                    from fastshard_lab.command import main  # deferred, still counted
                    return main()
            """,
            "benches/fastshard_lab/__init__.py": "",
            "benches/fastshard_lab/command.py": "import fastshard\n",  # the lab may use it
        },
    )
    out = check(root)
    assert out.returncode == 1, out
    assert "fastshard imports fastshard_lab.command (python/fastshard/cli.py:2)" in out.stderr


def test_type_checking_imports_and_a_dag_pass(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            PKG + "__init__.py": "from .errors import Error\n",
            PKG + "errors.py": "class Error(Exception): ...\n",
            PKG + "_native.pyi": "def f() -> None: ...\n",
            PKG + "reader.py": "from . import _native, ring\nfrom .errors import Error\n",
            PKG + "ring.py": """\
                from typing import TYPE_CHECKING

                from . import _native
                if TYPE_CHECKING:
                    from .reader import Reader  # annotations only
            """,
        },
    )
    out = check(root)
    assert out.returncode == 0, out
    graph = check(root, "--graph").stdout
    assert "reader -> _native, errors, ring" in graph
    assert "ring -> _native" in graph
    assert "errors -> (none)" in graph


RUST_PAIR = {
    "rust/lib.rs": "pub mod exec;\npub mod io;\npub mod format;\n",
    "rust/exec/mod.rs": "pub mod executor;\n",
    "rust/exec/executor.rs": """\
        use crate::{format::Index, io::RangeSource};
        // crate::nothing in a comment does not count
        const S: &str = "crate::io::ignored";
    """,
    "rust/io/mod.rs": "pub mod file;\n",
    "rust/io/file.rs": """\
        fn f<'a>(x: &'a str) -> &'a str {
            super::super::exec::runtime();
            x
        }
    """,
    "rust/format/mod.rs": """\
        mod tests {
            use super::*;
            use super::super::format::Index;
        }
    """,
}


def test_rust_modules_that_import_each_other_fail(tmp_path: Path) -> None:
    root = tree(tmp_path, RUST_PAIR)
    out = check(root)
    assert out.returncode == 1, out
    assert "error: rust modules exec and io import each other (1 + 1 references)" in out.stderr
    assert "rust/io/file.rs:2" in out.stderr
    assert "format" not in out.stderr.split("import each other")[0]


def test_rust_one_way_references_pass(tmp_path: Path) -> None:
    files = dict(RUST_PAIR)
    files["rust/io/file.rs"] = "use crate::format::Index;\n"
    out = check(tree(tmp_path, files))
    assert out.returncode == 0, out
    assert "rust" not in out.stderr


RUST_FILES = {
    "rust/lib.rs": "pub mod io;\n",
    "rust/io/mod.rs": "mod client;\nmod errors;\nmod upload;\npub use client::Client;\n",
    "rust/io/client.rs": """\
        pub struct Client;
        fn f() { super::errors::causes(); }
    """,
    "rust/io/errors.rs": """\
        use super::{client::Client, upload};
        pub fn causes() {}
        #[cfg(test)]
        #[path = "errors_tests.rs"]
        mod tests;
    """,
    "rust/io/errors_tests.rs": "use crate::io::upload::Upload;\n",
    "rust/io/upload.rs": """\
        pub struct Upload;
        use super::Client; // a re-export: an item of io/mod.rs
        #[cfg(test)]
        mod tests {
            use crate::io::errors::causes;
        }
    """,
}


def test_rust_files_that_import_each_other_fail(tmp_path: Path) -> None:
    out = check(tree(tmp_path, RUST_FILES))
    assert out.returncode == 1, out
    said = out.stderr
    assert "error: rust files io/client.rs and io/errors.rs import each other (1 + 1" in said
    assert "io/errors.rs -> io/client.rs (rust/io/errors.rs:1)" in said
    # Test code (a #[cfg(test)] file, an inline `mod tests`) and an item of
    # the parent module are no file's import.
    assert "upload.rs and" not in said and "and io/upload.rs" not in said, said


def test_rust_test_code_is_told_by_its_cfg_not_its_name(tmp_path: Path) -> None:
    files = dict(RUST_FILES)
    files["rust/io/client.rs"] = "pub struct Client;\n"
    # Compiled for tests with a feature: test code, whatever its name.
    files["rust/io/upload.rs"] = """\
        pub struct Upload;
        #[cfg(all(test, feature = "gcs"))]
        mod bad_key {
            use crate::io::errors::causes;
        }
    """
    out = check(tree(tmp_path, files))
    assert out.returncode == 0, out
    # Named `tests` but compiled into the library: the library's import.
    files["rust/io/upload.rs"] = """\
        pub struct Upload;
        #[cfg(feature = "gcs")]
        mod tests {
            use crate::io::errors::causes;
        }
    """
    out = check(tree(tmp_path / "lib", files))
    assert out.returncode == 1, out
    assert "rust files io/errors.rs and io/upload.rs import each other" in out.stderr, out


def test_rust_files_one_way_pass(tmp_path: Path) -> None:
    files = dict(RUST_FILES)
    files["rust/io/client.rs"] = "pub struct Client;\n"
    out = check(tree(tmp_path, files))
    assert out.returncode == 0, out
    assert "no pair of Rust modules or files importing each other" in out.stdout


RUST_KINDS = {
    "rust/lib.rs": "pub mod io;\npub mod location;\npub mod save;\n",
    "rust/location.rs": """\
        pub enum Kind {
            /// A local path.
            File,
            S3,
            #[allow(dead_code)]
            Gcs,
        }
        impl Kind {
            pub fn as_str(self) -> &'static str {
                match self {
                    Kind::File => "file",
                    Kind::S3 => "s3",
                    Kind::Gcs => "gs",
                }
            }
        }
    """,
    "rust/io/mod.rs": "pub mod registry;\n",
    "rust/io/registry.rs": """\
        use crate::location::{Kind, Location};
        pub fn store(loc: &Location) -> Box<dyn Store> {
            match loc.kind() {
                Kind::File => Box::new(FileStore),
                Kind::S3 | Kind::Gcs => Box::new(ObjectStore { kind: loc.kind() }),
            }
        }
    """,
    "rust/save/mod.rs": """\
        // Kind::S3 in a comment does not count, nor "Kind::Gcs" in a string.
        const S: &str = "Kind::Gcs";
        pub fn save(loc: &crate::location::Location) {
            crate::io::registry::store(loc).check_writable(loc);
        }
    """,
}


def test_a_match_on_the_location_kind_outside_the_registry_fails(tmp_path: Path) -> None:
    files = dict(RUST_KINDS)
    files["rust/save/upload.rs"] = """\
        use crate::location::Kind;
        pub fn start(loc: &Location) {
            if loc.kind() == Kind::S3 {
                s3();
            }
            match loc.kind() {
                Kind::Gcs => gcs(),
                _ => http(),
            }
        }
    """
    out = check(tree(tmp_path, files))
    assert out.returncode == 1, out
    assert (
        "rust/save/upload.rs:3: the location's kind is matched outside the store registry"
        in out.stderr
    )
    assert "rust/save/upload.rs:7:" in out.stderr
    assert "rust/save/mod.rs" not in out.stderr
    assert "rust/io/registry.rs" not in out.stderr.replace("(rust/io/registry.rs)", "")


def test_a_wildcard_arm_in_the_registry_fails(tmp_path: Path) -> None:
    files = dict(RUST_KINDS)
    files["rust/io/registry.rs"] = """\
        use crate::location::{Kind, Location};
        pub fn store(loc: &Location) -> Box<dyn Store> {
            match loc.kind() {
                Kind::File => Box::new(FileStore),
                _ => Box::new(HttpStore),
            }
        }
    """
    out = check(tree(tmp_path, files))
    assert out.returncode == 1, out
    assert "rust/io/registry.rs:5: a wildcard arm in a match on the location's kind" in out.stderr


def test_matches_on_the_kind_inside_the_registry_pass(tmp_path: Path) -> None:
    out = check(tree(tmp_path, RUST_KINDS))
    assert out.returncode == 0, out
    assert "rust" not in out.stderr


def test_vllm_reaches_the_core_through_the_facade_only(tmp_path: Path) -> None:
    files = {
        PKG + "__init__.py": "",
        PKG + "errors.py": "class Error(Exception): ...\n",
        # A stub imports types only: no edge back from the native module.
        PKG + "_native.pyi": "from fastshard._core import Key\ndef read_object() -> None: ...\n",
        PKG + "_core.py": "from ._engine import dispatch\nfrom ._native import read_object\n",
        PKG + "_engine/__init__.py": "",
        PKG + "_engine/dispatch.py": "from .. import errors\n",
        PKG + "reader.py": "from . import _core\n",
        PKG + "vllm/__init__.py": "from . import _ready\n",
        PKG + "vllm/_ready.py": "",
        PKG + "vllm/hf.py": """\
            from typing import TYPE_CHECKING

            from .. import __version__, _core, errors
            from .._core import read_object
            from ..errors import Error
            from . import _ready
            if TYPE_CHECKING:
                from .._core import Key
        """,
    }
    out = check(tree(tmp_path, files))
    assert out.returncode == 0, out
    files[PKG + "vllm/hf.py"] = """\
        from .. import errors
        from .._native import read_object
        def later():
            from .._engine import dispatch
            from .. import _budget
    """
    files[PKG + "reader.py"] = "from ._engine.dispatch import load\n"
    files[PKG + "_budget.py"] = ""
    out = check(tree(tmp_path, files))
    assert out.returncode == 1, out
    assert "fastshard.vllm.hf imports fastshard._native.read_object" in out.stderr
    assert "python/fastshard/vllm/hf.py:2" in out.stderr
    assert "fastshard.vllm.hf imports fastshard._engine.dispatch" in out.stderr
    assert "python/fastshard/vllm/hf.py:4" in out.stderr
    assert "fastshard.vllm.hf imports fastshard._budget (python/fastshard/vllm/hf.py:5)" in (
        out.stderr
    )
    assert "fastshard.reader imports fastshard._engine.dispatch.load" in out.stderr
    assert "errors" not in out.stderr


def test_a_room_never_imports_a_public_module_above_it(tmp_path: Path) -> None:
    files = {
        PKG + "__init__.py": "",
        PKG + "errors.py": "class Error(Exception): ...\n",
        PKG + "tp.py": "from .errors import Error\n",  # a public leaf: below every room
        PKG + "shard.py": "from ._layouts.resolve import resolve as resolve\n",
        PKG + "_layouts/__init__.py": "",
        PKG + "_layouts/resolve.py": "from .. import errors, tp\n",
        PKG + "_layouts/hf.py": """\
            from typing import TYPE_CHECKING
            from .resolve import resolve
            if TYPE_CHECKING:
                from ..tp import Slice
        """,
    }
    out = check(tree(tmp_path, files))
    assert out.returncode == 0, out
    # shard.py reaches a room, so it is above them all: no cycle, still an arrow up.
    files[PKG + "_layouts/hf.py"] = "from .. import shard\n"
    files[PKG + "_engine/__init__.py"] = ""
    files[PKG + "_engine/ring.py"] = """\
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from ..shard import resolve
    """
    out = check(tree(tmp_path, files))
    assert out.returncode == 1, out
    assert "fastshard._layouts.hf imports fastshard.shard (python/fastshard/_layouts/hf.py:1)" in (
        out.stderr
    )
    assert (
        "fastshard._engine.ring imports fastshard.shard (python/fastshard/_engine/ring.py:3)"
        in (out.stderr)
    )
    assert "fastshard.tp" not in out.stderr and "errors" not in out.stderr
