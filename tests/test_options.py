"""Options of the public functions: every one is typed (visible to IDEs and
type checkers), documented, and the list agrees with the native layer's;
unknown ones still raise at run time; the memory budget is divided as the
staging ring and cooperative loads expect."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import torch

import fastshard
from fastshard import _budget, _native, _options
from fastshard._budget import Budget
from fastshard._options import OpenOptions, SaveOptions


def test_the_source_options_are_listed_once_on_each_side() -> None:
    """rust/py/options.rs lists the names the native layer takes
    (``SOURCE_OPTIONS`` at run time, compared with the typed list below);
    ``_options.SourceOptions`` types them, and the stubs reuse that type
    rather than keeping a third list."""
    root = Path(__file__).resolve().parent.parent
    rust = (root / "rust" / "py" / "options.rs").read_text()
    known = rust.split("pub const KNOWN: &[&str] = &[", 1)[1].split("];", 1)[0]
    assert [n.strip().strip('"') for n in known.split(",") if n.strip()] == list(
        _native.SOURCE_OPTIONS
    )
    stub = (root / "python" / "fastshard" / "_native.pyi").read_text()
    assert "from fastshard._options import SourceOptions as _SourceOptions" in stub
    assert "class _SourceOptions" not in stub
    assert all(f"{name}:" not in stub for name in _native.SOURCE_OPTIONS)


def test_the_load_knobs_are_listed_once_on_each_side(tmp_path: Path) -> None:
    """Reader.load and Reader.stage take their keywords through one native
    list (rust/py/reader.rs's LOAD_KNOBS), which the stubs' _LoadKnobs
    types; a keyword outside it is a TypeError, as for a named keyword."""
    root = Path(__file__).resolve().parent.parent
    rust = (root / "rust" / "py" / "reader.rs").read_text()
    listed = rust.split("const LOAD_KNOBS: &[&str] = &[", 1)[1].split("];", 1)[0]
    knobs = [n.strip().strip('"') for n in listed.split(",") if n.strip()]
    stub = (root / "python" / "fastshard" / "_native.pyi").read_text()
    typed = stub.split("class _LoadKnobs(TypedDict, total=False):", 1)[1].split("\n\n", 2)[1]
    assert knobs == [line.split(":")[0].strip() for line in typed.splitlines()]
    path = tmp_path / "one.tensors"
    fastshard.save({"w": torch.ones(4)}, path)
    reader = _native.Reader(str(path))
    out = bytearray(16)
    with pytest.raises(TypeError, match="unexpected keyword argument 'verify_hashes'"):
        reader.load([0], [out], verify_hashes=True)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="argument 'concurrency'"):
        reader.load([0], [out], concurrency="8")  # type: ignore[typeddict-item]
    reader.load([0], [out], verify_hash=True, concurrency=None)
    assert bytes(out) == torch.ones(4).numpy().tobytes()


def test_the_typed_options_are_the_native_layers() -> None:
    assert _options.SourceOptions.__optional_keys__ == set(_native.SOURCE_OPTIONS)
    assert not _options.OpenOptions.__required_keys__
    load_only = OpenOptions.__optional_keys__ - _options.SourceOptions.__optional_keys__
    assert load_only == {
        "verify_hash",
        "concurrency",
        "part_size_bytes",
        "max_host_bytes",
        "throughput_target_gbps",
        "encryption",
        "progress",
        "mmap",
    }
    cache = {"cache_dir", "cache_max_bytes"}
    assert _options.CacheOptions.__optional_keys__ == cache
    assert SaveOptions.__optional_keys__ == (set(_native.SOURCE_OPTIONS) - cache) | {
        "encryption",
        "align",
    }


@pytest.mark.parametrize("key", ["concurrency", "part_size_bytes", "max_host_bytes"])
@pytest.mark.parametrize("value", [-1, 0, 2.5, True, "8"])
def test_counts_that_are_not_positive_whole_numbers_name_the_option(
    tmp_path: Path, key: str, value: object
) -> None:
    path = tmp_path / "m.tensors"
    fastshard.save({"w": torch.ones(3)}, path)
    whole = f"^{key} must be a whole number from 1 to 2\\*\\*64 - 1, not "
    with pytest.raises(fastshard.InvalidArgumentError, match=whole):
        fastshard.load_state_dict(path, **{key: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("bfloat61", "bfloat16"),
        ("torch.flaot32", "float32"),
    ],
)
def test_a_dtype_name_torch_lacks_is_an_argument_error_with_a_suggestion(
    tmp_path: Path, name: str, hint: str
) -> None:
    path = tmp_path / "m.tensors"
    fastshard.save({"w": torch.ones(3)}, path)
    with pytest.raises(fastshard.InvalidArgumentError) as info:
        fastshard.load_state_dict(path, dtype=name)
    assert f"did you mean {hint!r}" in str(info.value)
    assert "None" not in str(info.value) and not isinstance(info.value, fastshard.FormatError)
    assert fastshard.load_state_dict(path, dtype="bfloat16")["w"].dtype == torch.bfloat16


def test_every_open_option_is_documented() -> None:
    doc = fastshard.open.__doc__ or ""
    missing = [name for name in OpenOptions.__optional_keys__ if f"``{name}``" not in doc]
    assert not missing


@pytest.mark.parametrize(
    ("function", "options"),
    [
        (fastshard.open, OpenOptions),
        (fastshard.load_state_dict, OpenOptions),
        (fastshard.load, OpenOptions),
        (fastshard.TensorFile.__init__, OpenOptions),
        (fastshard.save, SaveOptions),
        (fastshard.save_sharded, SaveOptions),
    ],
)
def test_public_functions_type_their_options(function: object, options: type) -> None:
    hints = typing.get_type_hints(function, include_extras=True)
    assert hints["opts"] == typing.Unpack[options]


def test_state_dict_keywords_are_explicit() -> None:
    hints = typing.get_type_hints(fastshard.load_state_dict)
    for name in ("device", "names", "rank", "world_size", "dtype", "shard_specs", "cooperative"):
        assert name in hints


def test_unknown_options_still_raise(tmp_path: Path) -> None:
    path = tmp_path / "m.tensors"
    fastshard.save({"w": torch.ones(3)}, path)
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.zeros(3))
    calls = [
        lambda: fastshard.open(path, concurrncy=4),
        lambda: fastshard.load_state_dict(path, concurrncy=4),
        lambda: fastshard.load(model, path, concurrncy=4),
    ]
    for call in calls:
        with pytest.raises(
            fastshard.InvalidArgumentError,
            match="^unknown option 'concurrncy'; did you mean 'concurrency'\\?$",
        ):
            call()
    with pytest.raises(fastshard.InvalidArgumentError, match="did you mean 'verify_hash'"):
        fastshard.load_state_dict(path, verify_hashes=True)  # type: ignore[call-arg]
    with pytest.raises(
        fastshard.InvalidArgumentError, match="^unknown option 'x' for save; the options are "
    ):
        fastshard.save({"w": torch.ones(3)}, path, x=1)  # type: ignore[call-arg]
    with pytest.raises(fastshard.InvalidArgumentError, match="for save; did you mean 'align'"):
        fastshard.save({"w": torch.ones(3)}, path, alig=64)  # type: ignore[call-arg]
    with pytest.raises(fastshard.UnsupportedError, match="progress is a load option"):
        fastshard.save({"w": torch.ones(3)}, path, progress=True)  # type: ignore[call-arg]
    # A save writes to the store only: a cache option would be ignored.
    with pytest.raises(fastshard.InvalidArgumentError, match="^cache_dir is a load option"):
        fastshard.save({"w": torch.ones(3)}, path, cache_dir=tmp_path)  # type: ignore[call-arg]
    with pytest.raises(fastshard.InvalidArgumentError, match="progress must be"):
        fastshard.open(path, progress="yes")  # type: ignore[typeddict-item]


def test_options_are_split_and_normalised() -> None:
    key = fastshard.EncryptionKey.random()
    settings = _options.open_settings(
        {
            "s3_region": "r",
            "s3_config_path": Path("/x/cfg"),
            "s3_anonymous": True,
            "s3_profile": None,
            "verify_hash": True,
            "concurrency": 8,
            "max_host_bytes": 1 << 20,
            "encryption": key,
            "progress": False,
        }
    )
    assert settings.source == {"s3_region": "r", "s3_config_path": "/x/cfg", "s3_anonymous": True}
    assert settings.native == {"verify_hash": True, "concurrency": 8, "encryption": key.native()}
    assert settings.budget == Budget(1 << 20) and settings.progress is False
    assert settings.verify_hash and settings.encrypted
    with pytest.raises(fastshard.InvalidArgumentError, match="ca_bundle must be a path"):
        _options.open_settings({"ca_bundle": 3})
    # On/off options take True or False only: bool("no") would be True.
    with pytest.raises(fastshard.InvalidArgumentError, match="^verify_hash must be True or"):
        _options.open_settings({"verify_hash": "no"})
    saved = _options.save_settings({"s3_endpoint": "http://e", "encryption": key})
    assert saved == {"s3_endpoint": "http://e", "encryption": key.native()}
    assert _options.without_key(saved) == {"s3_endpoint": "http://e"}


def test_the_budget_is_divided_in_one_place() -> None:
    none = Budget()
    assert none.whole() == {} and none.beside_slabs(1 << 20) is None
    assert none.staging(256) == 256 and not none.bounded
    # Rounds small enough that each one's exchange overlaps the next one's fetch.
    assert none.cooperative_batch(2) == _budget.COOPERATIVE_ROUND < _budget.COOPERATIVE_BYTES // 5
    assert Budget(1 << 40).cooperative_batch(8) == _budget.COOPERATIVE_ROUND
    assert none.or_default(7) == 7
    mib = Budget(1 << 20)
    assert mib.whole() == {"max_host_bytes": 1 << 20}
    assert mib.staging(256) == 1 << 19  # half for the ring's slabs
    assert mib.beside_slabs(1 << 19) == 1 << 19  # the rest for the staged load's reads
    assert mib.beside_slabs(2 << 20) == 0
    assert mib.cooperative_batch(2) == (1 << 20) // 5  # one per rank, sends, next, scratch
    assert Budget(3).cooperative_batch(8) == 1
    assert mib.or_default(7) == 1 << 20
