"""Every option checked up front (issue 35, item 5): numbers out of range or
of the wrong type, on/off options given something else, dtype names, and
misspelt options are InvalidArgumentErrors naming the option and what it
takes, raised before any read (a missing file would be a NotFoundError
otherwise); UnsupportedError is not a FormatError; ``fastshard verify`` on a
safetensors file checks what the format allows and exits 0."""

from __future__ import annotations

import struct
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fastshard
from fastshard import _options, cli
from fastshard._engine import tensors as _tensors
from fastshard._options import OpenOptions, SaveOptions

# Finite values (no NaN bit patterns), so torch.equal compares casts.
SD = {
    "w": torch.randn(4, 3, generator=torch.Generator().manual_seed(1)),
    "b": torch.arange(5.0).half(),
}


def _message(err: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(err.value)
    assert "{ " not in text and "None" not in text, text  # no Debug dump, no missing name
    return text


def _numeric(hint: object) -> bool:
    return any(arg in (int, float) for arg in (*typing.get_args(hint), hint))


def test_every_numeric_option_is_in_the_one_table() -> None:
    hints = {**typing.get_type_hints(OpenOptions), **typing.get_type_hints(SaveOptions)}
    numeric = {key for key, hint in hints.items() if _numeric(hint)}
    assert numeric == set(_options.NUMBERS)
    flags = {key for key, hint in hints.items() if bool in (*typing.get_args(hint), hint)}
    assert flags == set(_options.FLAGS)


BAD_NUMBERS = [
    ("concurrency", -1, "a whole number from 1 to 2**64 - 1"),
    ("concurrency", 0, "a whole number from 1 to 2**64 - 1"),
    ("concurrency", 1 << 64, "a whole number from 1 to 2**64 - 1"),
    ("concurrency", 2.0, "a whole number from 1"),
    ("concurrency", True, "a whole number from 1"),
    ("part_size_bytes", -4096, "a whole number from 1 to 2**64 - 1"),
    ("max_host_bytes", "1GiB", "a whole number from 1 to 2**64 - 1"),
    ("throughput_target_gbps", -1, "a finite number greater than 0"),
    ("throughput_target_gbps", 0, "a finite number greater than 0"),
    ("throughput_target_gbps", float("nan"), "a finite number greater than 0"),
    ("throughput_target_gbps", "fast", "a finite number greater than 0"),
    ("max_attempts", -1, "a whole number from 1 to 2**32 - 1"),
    ("max_attempts", 0, "a whole number from 1 to 2**32 - 1"),
    ("max_attempts", 1 << 32, "a whole number from 1 to 2**32 - 1"),
    ("deadline_seconds", -0.5, "a finite number greater than 0"),
    ("deadline_seconds", 0, "a finite number greater than 0"),
    ("deadline_seconds", float("inf"), "a finite number greater than 0"),
    ("cache_max_bytes", -1, "a whole number from 0 to 2**64 - 1"),
]


@pytest.mark.parametrize(("key", "value", "accepted"), BAD_NUMBERS)
def test_a_bad_number_names_the_option_and_its_range_before_any_read(
    tmp_path: Path, key: str, value: object, accepted: str
) -> None:
    missing = tmp_path / "missing.tensors"  # a read would be a NotFoundError
    with pytest.raises(fastshard.InvalidArgumentError) as info:
        fastshard.load_state_dict(missing, **{key: value})  # type: ignore[misc]
    text = str(info.value)
    assert text.startswith(f"{key} must be {accepted}"), text
    assert text.endswith(f", not {value!r}"), text
    assert "{ " not in text and "Overflow" not in text, text


@pytest.mark.parametrize("value", [-64, 0, 3, 8192, "64", 64.0])
def test_a_bad_alignment_is_refused_before_anything_is_written(tmp_path: Path, value: Any) -> None:
    path = tmp_path / "x.tensors"
    with pytest.raises(fastshard.InvalidArgumentError) as info:
        fastshard.save(SD, path, align=value)
    assert _message(info).startswith("align must be a power of two from 1 to 4096, not ")
    assert not path.exists()


def test_numbers_in_range_still_load_and_numpy_integers_are_whole_numbers(tmp_path: Path) -> None:
    path = tmp_path / "m.tensors"
    fastshard.save(SD, path, align=np.int64(64))  # type: ignore[typeddict-item]
    sd = fastshard.load_state_dict(
        path,
        concurrency=np.int32(1),  # type: ignore[typeddict-item]
        part_size_bytes=1,
        max_host_bytes=1 << 20,
        throughput_target_gbps=np.float32(0.5),  # type: ignore[typeddict-item]
        max_attempts=(1 << 32) - 1,
        deadline_seconds=60,
    )
    assert all(torch.equal(sd[k], SD[k]) for k in SD)


@pytest.mark.parametrize("key", sorted(_options.FLAGS))
@pytest.mark.parametrize("value", ["no", 1, 0.0])
def test_an_on_off_option_takes_only_booleans(tmp_path: Path, key: str, value: object) -> None:
    with pytest.raises(fastshard.InvalidArgumentError) as info:
        fastshard.load_state_dict(tmp_path / "missing.tensors", **{key: value})  # type: ignore[misc]
    assert str(info.value) == f"{key} must be True or False, not {value!r}"


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("bf16", torch.bfloat16),
        ("bfloat16", torch.bfloat16),
        ("torch.bfloat16", torch.bfloat16),
        ("torch.bf16", torch.bfloat16),
        ("BF16", torch.bfloat16),
        ("float16", torch.float16),
        ("half", torch.float16),
        ("fp16", torch.float16),
        ("torch.half", torch.float16),
        ("float32", torch.float32),
        ("float", torch.float32),
        ("fp32", torch.float32),
        ("float64", torch.float64),
        ("double", torch.float64),
        ("fp64", torch.float64),
    ],
)
def test_a_dtype_name_loads_as_its_torch_dtype(
    tmp_path: Path, name: str, dtype: torch.dtype
) -> None:
    path = tmp_path / "m.tensors"
    fastshard.save(SD, path)
    by_name = fastshard.load_state_dict(path, dtype=name)
    by_dtype = fastshard.load_state_dict(path, dtype=dtype)
    for key, tensor in by_name.items():
        assert tensor.dtype == dtype
        assert torch.equal(tensor, by_dtype[key])
        assert torch.equal(tensor, SD[key].to(dtype))


@pytest.mark.parametrize(("name", "hint"), [("bf61", "bf16"), ("flaot32", "float32"), ("x", None)])
def test_another_dtype_name_is_refused_naming_the_accepted_ones_before_any_read(
    tmp_path: Path, name: str, hint: str | None
) -> None:
    with pytest.raises(fastshard.InvalidArgumentError) as info:
        fastshard.load_state_dict(tmp_path / "missing.tensors", dtype=name)
    text = _message(info)
    assert text.startswith(f"dtype {name!r} is not a dtype name"), text
    assert "bfloat16 (bf16), float16 (half, fp16), float32 (float, fp32)" in text, text
    assert (f"did you mean {hint!r}" in text) if hint else ("did you mean" not in text), text
    assert not isinstance(info.value, (fastshard.FormatError, fastshard.UnsupportedError))


def test_a_dtype_torch_lacks_names_no_tensor_when_there_is_none() -> None:
    with pytest.raises(fastshard.UnsupportedError) as info:
        _tensors.dtype_from_name("float7_e3m3")
    assert _message(info).startswith("dtype 'float7_e3m3' is not available in torch ")
    with pytest.raises(fastshard.UnsupportedError, match="of tensor 'w' is not available"):
        _tensors.dtype_from_name("float7_e3m3", tensor="w")


def test_a_misspelt_option_names_the_nearest_one_before_any_read(tmp_path: Path) -> None:
    missing = tmp_path / "missing.tensors"
    with pytest.raises(fastshard.InvalidArgumentError) as info:
        fastshard.load_state_dict(missing, verify_hashes=True)  # type: ignore[call-arg]
    assert _message(info) == "unknown option 'verify_hashes'; did you mean 'verify_hash'?"
    with pytest.raises(fastshard.InvalidArgumentError) as info:
        fastshard.save(SD, missing, s3_regoin="x")  # type: ignore[call-arg]
    assert _message(info) == "unknown option 's3_regoin' for save; did you mean 's3_region'?"
    assert not missing.exists()


def test_an_option_like_no_other_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(fastshard.InvalidArgumentError) as info:
        fastshard.load_state_dict(tmp_path / "missing.tensors", zzz=1)  # type: ignore[call-arg]
    text = _message(info)
    assert text.startswith("unknown option 'zzz'; the options are "), text
    for known in ("cache_dir", "concurrency", "mmap", "progress", "verify_hash"):
        assert known in text, text
    with pytest.raises(fastshard.InvalidArgumentError) as info:
        fastshard.save(SD, tmp_path / "x.tensors", zzz=1)  # type: ignore[call-arg]
    text = _message(info)
    assert text.startswith("unknown option 'zzz' for save; the options are "), text
    assert "align" in text and "cache_dir" not in text and "verify_hash" not in text, text


def test_unsupported_is_not_a_format_error(tmp_path: Path) -> None:
    assert issubclass(fastshard.UnsupportedError, fastshard.FastshardError)
    assert not issubclass(fastshard.UnsupportedError, fastshard.FormatError)
    # A newer tensorizer data version: a valid file this build cannot read.
    path = tmp_path / "m.tensors"
    fastshard.save(SD, path)
    with path.open("r+b") as f:
        f.seek(5)
        f.write(struct.pack("<I", 99))
    with pytest.raises(fastshard.UnsupportedError) as info:
        fastshard.load_state_dict(path)
    assert not isinstance(info.value, fastshard.FormatError)
    assert "unsupported tensorizer data version 99" in _message(info)
    assert info.value.uri == str(path)


def test_verify_on_safetensors_checks_structure_and_bounds_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "m.safetensors"
    save_file(SD, str(path))
    assert cli.main(["verify", str(path)]) == cli.EXIT_OK
    out = capsys.readouterr()
    assert out.out.startswith(f"OK {path}: 2 tensors, {4 * 3 * 4 + 5 * 2} bytes, "), out.out
    assert "safetensors files store no hashes, so structure and bounds were checked" in out.out
    assert "verify_hash" not in out.out + out.err
    # What it checks: a file cut short is an error (exit 2).
    path.write_bytes(path.read_bytes()[:-4])
    assert cli.main(["verify", str(path)]) == cli.EXIT_ERROR
    assert "FormatError" in capsys.readouterr().err


def test_verify_on_tensorizer_files_still_checks_hashes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.tensors"
    fastshard.save(SD, path)
    assert cli.main(["verify", str(path)]) == cli.EXIT_OK
    assert "hashes match" in capsys.readouterr().out
