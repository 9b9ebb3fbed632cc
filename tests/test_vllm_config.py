"""``--model-loader-extra-config`` through vLLM's own parsing (CLI and
LoadConfig) into fastshard's LoaderConfig: every key vLLM's tensorizer
loader takes, fastshard's own, and the errors for the rest."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the plugin needs vLLM")  # conftest: VLLM_TARGET_DEVICE=cpu

from vllm.model_executor.model_loader import get_model_loader
from vllm.model_executor.model_loader.tensorizer import TensorizerConfig
from vllm_plugin_helpers import cli_load_config, loader_for

import fastshard
from fastshard.vllm import config as fconfig

pytestmark = pytest.mark.usefixtures("vllm_registered")


# -- configuration -------------------------------------------------------------


def test_known_keys_cover_vllms_tensorizer_config():
    init_fields = {f.name for f in fields(TensorizerConfig) if f.init}
    assert init_fields <= fconfig.TENSORIZER_KEYS


MULTILINE = """{
    "tensorizer_uri": "/weights/model-rank-%03d.tensors",
    "stream_kwargs": {
        "force_http": false,
        "s3_endpoint": "http://127.0.0.1:9"
    },
    "deserialization_kwargs": {
        "verify_hash": true,
        "num_readers": 8
    },
    "serialization_kwargs": {"limit_cpu_concurrency": 4}
}"""


def test_cli_multiline_json_tensorizer_shape(model_dir):
    lc = cli_load_config(
        model_dir, "--load-format", "tensorizer", "--model-loader-extra-config", MULTILINE
    )
    extra = lc.model_loader_extra_config
    assert extra["tensorizer_config"]["tensorizer_dir"] == str(model_dir)  # vLLM's reshaping
    cfg = loader_for("tensorizer", extra).config
    assert cfg.uri == "/weights/model-rank-%03d.tensors"
    assert cfg.open_opts == {
        "s3_endpoint": "http://127.0.0.1:9",
        "verify_hash": True,
        "concurrency": 8,
    }
    assert set(cfg.ignored) == {
        "stream_kwargs.force_http",
        "serialization_kwargs.limit_cpu_concurrency",
    }


def test_cli_every_tensorizer_key(model_dir, tmp_path: Path):
    extra = {
        "tensorizer_uri": "s3://bucket/m/model-rank-%02d.tensors",
        "vllm_tensorized": True,
        "verify_hash": False,
        "num_readers": 3,
        "encryption_keyfile": "s3://bucket/m/key",
        "s3_access_key_id": "AK",
        "s3_secret_access_key": "SK",
        "s3_endpoint": "http://127.0.0.1:9",
        "stream_kwargs": {},
        "serialization_kwargs": {},
        "deserialization_kwargs": {},
        "lora_dir": "/loras/x",
    }
    lc = cli_load_config(
        model_dir, "--load-format", "tensorizer", "--model-loader-extra-config", json.dumps(extra)
    )
    cfg = loader_for("tensorizer", lc.model_loader_extra_config).config
    assert cfg.uri == extra["tensorizer_uri"]
    assert cfg.layout == "vllm"
    assert cfg.encryption_keyfile == "s3://bucket/m/key"
    assert cfg.open_opts == {
        "s3_access_key_id": "AK",
        "s3_secret_access_key": "SK",
        "s3_endpoint": "http://127.0.0.1:9",
        "verify_hash": False,
        "concurrency": 3,
    }
    assert set(cfg.ignored) == {"lora_dir"}


def test_cli_tensorizer_dir_only_is_the_model_dir(model_dir):
    lc = cli_load_config(model_dir, "--load-format", "tensorizer")
    assert loader_for("tensorizer", lc.model_loader_extra_config).config.uri == f"{model_dir}/"


def test_cli_fastshard_format_with_own_keys(model_dir):
    text = '{"uri": "s3://b/m/", "layout": "hf", "cooperative": true,\n "concurrency": 32,'
    text += ' "part_size_bytes": 8388608, "max_host_bytes": 1073741824, "s3_region": "x"}'
    lc = cli_load_config(
        model_dir, "--load-format", "fastshard", "--model-loader-extra-config", text
    )
    cfg = loader_for("fastshard", lc.model_loader_extra_config).config
    assert (cfg.uri, cfg.layout, cfg.cooperative) == ("s3://b/m/", "hf", True)
    assert cfg.open_opts == {
        "s3_region": "x",
        "concurrency": 32,
        "part_size_bytes": 8 << 20,
        "max_host_bytes": 1 << 30,
    }


def test_tensorizer_config_object_and_json_string():
    tc = TensorizerConfig(tensorizer_uri="/w/model.tensors", num_readers=2)
    assert fconfig.parse_extra_config(tc).uri == "/w/model.tensors"
    assert fconfig.parse_extra_config(MULTILINE).open_opts["concurrency"] == 8


@pytest.mark.parametrize(
    "extra",
    [
        {"tensorizer_uri": "/m.tensors", "bogus": 1},
        {"tensorizer_config": {"tensorizer_dir": "/m", "device": "cuda"}},
        {"dtype": "float16"},
    ],
)
def test_unknown_keys_are_rejected(extra):
    with pytest.raises(fastshard.InvalidArgumentError, match="known keys: .*tensorizer_uri"):
        loader_for("fastshard", extra)


def test_unknown_key_from_the_cli_is_rejected(model_dir):
    lc = cli_load_config(
        model_dir, "--load-format", "tensorizer", "--model-loader-extra-config", '{"mode": "rb"}'
    )
    with pytest.raises(fastshard.InvalidArgumentError, match="unknown key 'mode'"):
        get_model_loader(lc)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"layout": "pt"}, "layout must be"),
        ({"concurrency": 0}, "positive integer"),
        ({"cooperative": "yes"}, "true or false"),
        ({"uri": "/a", "tensorizer_uri": "/b"}, "disagree"),
        ({"vllm_tensorized": True, "layout": "hf"}, "contradicts"),
        ({"stream_kwargs": [1]}, "JSON object"),
    ],
)
def test_bad_values_are_rejected(extra, match):
    with pytest.raises(fastshard.InvalidArgumentError, match=match):
        fconfig.parse_extra_config(extra)


def test_cache_options_are_open_options():
    extra = {"uri": "s3://b/m.tensors", "cache_dir": "/nvme/cache", "cache_max_bytes": 1 << 30}
    cfg = fconfig.parse_extra_config(extra)
    assert cfg.open_opts == {"cache_dir": "/nvme/cache", "cache_max_bytes": 1 << 30}
