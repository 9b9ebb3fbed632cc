"""``--model-loader-extra-config`` as vLLM hands it to a loader, parsed.

vLLM gives the loader ``LoadConfig.model_loader_extra_config`` as it was
passed: a dict (from ``LLM(...)`` or the CLI's JSON, multi-line included),
or, for ``--load-format tensorizer``, the reshaped form that
``EngineArgs.create_load_config`` makes: the user's keys at the top level
plus a nested ``"tensorizer_config"`` holding ``tensorizer_dir`` (the
``--model`` value) and a copy of every top-level TensorizerConfig field.
A ``TensorizerConfig`` object and a JSON string are accepted too.

Every key vLLM's tensorizer loader accepts is accepted here, plus
fastshard's own; any other key is an error naming the known ones. Keys with
a fastshard meaning become ``fastshard.open`` options; the others are kept
in ``ignored`` for the loader to report. Nothing here imports vLLM or torch.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .._core import SOURCE_OPTIONS
from .._core import location as _location
from ..errors import InvalidArgumentError

# A child of vLLM's logger, so vLLM prints it in its format (loader.py).
log = logging.getLogger("vllm.fastshard")

NESTED_KEY = "tensorizer_config"

# vLLM's TensorizerConfig init fields (0.33: tensorizer.py), plus lora_dir,
# which older vLLM releases had and tensorizer users may still pass.
TENSORIZER_KEYS = frozenset(
    {
        "tensorizer_uri",
        "tensorizer_dir",
        "vllm_tensorized",
        "verify_hash",
        "num_readers",
        "encryption_keyfile",
        "s3_access_key_id",
        "s3_secret_access_key",
        "s3_endpoint",
        "stream_kwargs",
        "serialization_kwargs",
        "deserialization_kwargs",
        "lora_dir",
    }
)

# fastshard's own keys: where, how the file is laid out, how to read it, and
# every source option of fastshard.open (S3 region, addressing, retries...).
FASTSHARD_KEYS = frozenset(
    {"uri", "layout", "concurrency", "part_size_bytes", "max_host_bytes", "cooperative"}
) | frozenset(SOURCE_OPTIONS)

KNOWN_KEYS = TENSORIZER_KEYS | FASTSHARD_KEYS

Layout = Literal["auto", "vllm", "hf"]
LAYOUTS: tuple[Layout, ...] = ("auto", "vllm", "hf")

# tensorizer's open_stream kwargs that are fastshard source options.
_STREAM_TO_OPEN = {
    "s3_access_key_id": "s3_access_key_id",
    "s3_secret_access_key": "s3_secret_access_key",
    "s3_endpoint": "s3_endpoint",
    "s3_config_path": "s3_config_path",
}
# TensorDeserializer kwargs that have a fastshard meaning.
_DESERIALIZE_HONOURED = frozenset({"verify_hash", "num_readers"})


@dataclass(frozen=True)
class LoaderConfig:
    """What the loader needs, in fastshard's terms.

    ``uri``: a file, a per-rank template (``%0Nd`` or ``{rank}``) or a
    directory; None means the model directory (``--model``). ``open_opts``
    are ``fastshard.open`` options except ``encryption``, which is read
    from ``encryption_keyfile`` when loading. ``ignored`` maps each given
    key that fastshard does not use to why."""

    uri: str | None
    layout: Layout
    cooperative: bool
    open_opts: dict[str, Any]
    encryption_keyfile: str | None = None
    ignored: dict[str, str] = field(default_factory=dict)

    def report_ignored(self) -> None:
        if self.ignored:
            listed = "; ".join(f"{k} ({why})" for k, why in sorted(self.ignored.items()))
            log.warning("fastshard: ignoring tensorizer options it has no use for: %s", listed)


def _as_dict(extra: object) -> dict[str, Any]:
    if extra is None:
        return {}
    if isinstance(extra, (str, bytes, bytearray)):
        try:
            extra = json.loads(extra)
        except json.JSONDecodeError as e:
            raise InvalidArgumentError(f"model_loader_extra_config is not valid JSON: {e}") from e
    to_serializable = getattr(extra, "to_serializable", None)
    if callable(to_serializable):  # vLLM's TensorizerConfig
        extra = to_serializable()
    if not isinstance(extra, Mapping):
        raise InvalidArgumentError(
            f"model_loader_extra_config must be a JSON object, not {type(extra).__name__}"
        )
    return dict(extra)


def _check_keys(where: str, keys: object) -> None:
    unknown = sorted(str(k) for k in keys if k not in KNOWN_KEYS)  # type: ignore[attr-defined]
    if unknown:
        raise InvalidArgumentError(
            f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} in "
            f"{where} for the fastshard loader; known keys: {', '.join(sorted(KNOWN_KEYS))}"
        )


def _kwargs(merged: dict[str, Any], key: str) -> dict[str, Any]:
    value = merged.get(key)
    if value is None:
        return {}
    if isinstance(value, str):  # tensorizer_kwargs_arg: JSON text of a dict
        value = _as_dict(value)
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{key} must be a JSON object, not {type(value).__name__}")
    return dict(value)


def _int(key: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgumentError(f"{key} must be a positive integer, not {value!r}")
    return value


def _bool(key: str, value: object) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{key} must be true or false, not {value!r}")
    return value


def _uri(merged: dict[str, Any]) -> str | None:
    uri, turi, tdir = merged.get("uri"), merged.get("tensorizer_uri"), merged.get("tensorizer_dir")
    for key, value in (("uri", uri), ("tensorizer_uri", turi), ("tensorizer_dir", tdir)):
        if value is not None and not isinstance(value, str):
            raise InvalidArgumentError(f"{key} must be a string, not {type(value).__name__}")
    if uri and turi and uri != turi:
        raise InvalidArgumentError(
            f"uri={uri!r} and tensorizer_uri={turi!r} disagree: give one of them"
        )
    if uri or turi:
        return uri or turi
    if tdir:
        # A directory: its fastshard-manifest.json names the per-rank files,
        # otherwise model.tensors in it (tensorizer's meaning of the key).
        return _location.as_directory(tdir)
    return None


def parse_extra_config(extra: object) -> LoaderConfig:
    """``model_loader_extra_config`` (dict, reshaped tensorizer dict,
    TensorizerConfig or JSON text) as a LoaderConfig; unknown keys and
    ill-typed values raise InvalidArgumentError."""
    top = _as_dict(extra)
    nested_raw = top.pop(NESTED_KEY, None)
    _check_keys("model_loader_extra_config", top)
    nested = _as_dict(nested_raw)
    _check_keys(f"model_loader_extra_config[{NESTED_KEY!r}]", nested)
    # vLLM copies the top-level tensorizer keys into the nested dict and adds
    # tensorizer_dir=--model there: the top level wins where both have a key.
    merged = {**nested, **top}

    layout = merged.get("layout", "auto")
    if layout not in LAYOUTS:
        raise InvalidArgumentError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    if _bool("vllm_tensorized", merged.get("vllm_tensorized")):
        if layout == "hf":
            raise InvalidArgumentError("vllm_tensorized=true contradicts layout='hf'")
        layout = "vllm"
    cooperative = bool(_bool("cooperative", merged.get("cooperative")))

    stream = _kwargs(merged, "stream_kwargs")
    deserialize = _kwargs(merged, "deserialization_kwargs")
    serialize = _kwargs(merged, "serialization_kwargs")
    ignored: dict[str, str] = {}

    opts: dict[str, Any] = {}
    # Source options: fastshard's own, then tensorizer's top-level S3 keys,
    # then stream_kwargs (which win in vLLM's TensorizerArgs too).
    for key in SOURCE_OPTIONS:
        if merged.get(key) is not None:
            opts[key] = merged[key]
    for key, value in stream.items():
        if key in _STREAM_TO_OPEN:
            if value is not None:
                opts[_STREAM_TO_OPEN[key]] = value
        else:
            ignored[f"stream_kwargs.{key}"] = "no fastshard meaning"

    verify = _bool("verify_hash", deserialize.get("verify_hash", merged.get("verify_hash")))
    if verify is not None:
        opts["verify_hash"] = verify
    for key in ("concurrency", "part_size_bytes", "max_host_bytes"):
        value = _int(key, merged.get(key))
        if value is not None:
            opts[key] = value
    readers = _int("num_readers", deserialize.get("num_readers", merged.get("num_readers")))
    if readers is not None and "concurrency" not in opts:
        opts["concurrency"] = readers  # parallel reads of the file, fastshard's concurrency
    for key in deserialize:
        if key not in _DESERIALIZE_HONOURED:
            ignored[f"deserialization_kwargs.{key}"] = "no fastshard meaning"
    for key in serialize:
        ignored[f"serialization_kwargs.{key}"] = "used when serializing, not loading"
    if merged.get("lora_dir") is not None:
        ignored["lora_dir"] = "LoRA adapters are loaded by vLLM, not by the model loader"

    keyfile = merged.get("encryption_keyfile")
    if keyfile is not None and not isinstance(keyfile, str):
        raise InvalidArgumentError("encryption_keyfile must be a path or URI string")
    return LoaderConfig(
        uri=_uri(merged),
        layout=layout,
        cooperative=cooperative,
        open_opts=opts,
        encryption_keyfile=keyfile,
        ignored=ignored,
    )
