"""fastshard's vLLM plugin against vLLM's own code: its plugin discovery,
loader registry, argument parsing and config objects, with vLLM-like model
classes (tests/vllm_like_model.py) for the loader's layouts, ranks and
errors. Real engines: test_vllm_engine.py, test_vllm_serve.py,
test_vllm_tp.py.

vLLM's config objects and argument parsing need VLLM_TARGET_DEVICE=cpu on a
machine without a GPU ("Failed to infer device type" otherwise).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import fields
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import torch

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

try:
    import vllm  # noqa: F401
except Exception as e:  # pragma: no cover - depends on the environment
    pytest.skip(
        f"vLLM is not importable here ({e!r}): the plugin needs it", allow_module_level=True
    )

from tensorizer import EncryptionParams, TensorSerializer
from vllm.config import LoadConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader import get_model_loader
from vllm.model_executor.model_loader.tensorizer import TensorizerConfig
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm_like_model import TinyForCausalLM, hf_state_dict, rank_model

import fastshard
import fastshard.vllm as fv
from fastshard import cli
from fastshard.vllm import config as fconfig
from fastshard.vllm import ranks as franks
from fastshard.vllm.loader import FastshardModelLoader
from fastshard.vllm.names import MARKER

ROOT = Path(__file__).resolve().parent.parent
PYTHON_DIR = ROOT / "python"


@pytest.fixture(scope="module", autouse=True)
def registered() -> None:
    fv.register()


def _loader(load_format: str = "fastshard", extra: object = None) -> FastshardModelLoader:
    lc = LoadConfig(load_format=load_format, model_loader_extra_config=extra or {})
    loader = get_model_loader(lc)
    assert isinstance(loader, FastshardModelLoader)
    return loader


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # An existing directory: with HF_HUB_OFFLINE=1 (conftest) EngineArgs
    # resolves any other --model as a Hugging Face repo id.
    return tmp_path_factory.mktemp("tiny")


def _cli_load_config(model: Path, *argv: str) -> LoadConfig:
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", str(model), *argv])
    return EngineArgs.from_cli_args(args).create_load_config()


def _run(code: str, env: dict[str, str] | None = None, extra_path: str = "") -> str:
    """Run ``code`` in a fresh interpreter (vLLM's registry is process-global)."""
    full_env = {**os.environ, **(env or {})}
    path = [p for p in (extra_path, str(PYTHON_DIR), full_env.get("PYTHONPATH", "")) if p]
    full_env["PYTHONPATH"] = os.pathsep.join(path)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout


# -- the entry point ---------------------------------------------------------


def _entry_point() -> EntryPoint:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    group = meta["project"]["entry-points"]["vllm.general_plugins"]
    assert group == {"fastshard": "fastshard.vllm:register"}
    return EntryPoint("fastshard", group["fastshard"], "vllm.general_plugins")


def test_entry_point_resolves_to_register():
    assert _entry_point().load() is fv.register


def test_vllm_discovers_and_runs_the_entry_point(tmp_path: Path):
    # A dist-info carrying pyproject's entry point (what an install of the
    # wheel writes) is enough for importlib.metadata, so vLLM's own plugin
    # loading finds and calls register() without building the package.
    ep = _entry_point()
    info = tmp_path / "fastshard-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fastshard\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[{ep.group}]\n{ep.name} = {ep.value}\n")
    out = _run(
        """
        import sys
        import vllm.plugins
        from vllm.plugins import load_plugins_by_group
        print("found fastshard:", "fastshard" in load_plugins_by_group("vllm.general_plugins"))
        vllm.plugins.load_general_plugins()
        # register() defers until vLLM's loader registry is imported.
        print("registry imported:", "vllm.model_executor.model_loader" in sys.modules)
        from vllm.config import LoadConfig
        from vllm.model_executor.model_loader import get_model_loader
        for f in ("fastshard", "tensorizer"):
            extra = {"tensorizer_config": {"tensorizer_dir": "/m"}}
            print(f, type(get_model_loader(LoadConfig(load_format=f,
                  model_loader_extra_config=extra))).__name__)
        """,
        extra_path=str(tmp_path),
    )
    assert "found fastshard: True" in out
    assert "registry imported: False" in out
    assert "fastshard FastshardModelLoader" in out
    assert "tensorizer FastshardModelLoader" in out


# -- the registry ------------------------------------------------------------


def test_get_model_loader_gives_fastshard_for_both_formats():
    assert type(_loader("fastshard")) is FastshardModelLoader
    assert type(_loader("tensorizer", {"tensorizer_uri": "/m/model.tensors"})) is (
        FastshardModelLoader
    )


def test_register_is_idempotent():
    fv.register()
    fv.register()
    assert type(_loader("fastshard")) is FastshardModelLoader


def test_takeover_off_keeps_vllms_tensorizer_loader():
    out = _run(
        """
        import fastshard.vllm as fv
        from vllm.engine.arg_utils import EngineArgs
        from vllm.model_executor.model_loader import get_model_loader
        fv.register()
        lc = EngineArgs(model="/", load_format="tensorizer").create_load_config()
        print(type(get_model_loader(lc)).__module__, type(get_model_loader(lc)).__name__)
        print(type(get_model_loader(lc.__class__(load_format="fastshard"))).__name__)
        """,
        env={"FASTSHARD_TAKEOVER_TENSORIZER": "0"},
    )
    assert "vllm.model_executor.model_loader.tensorizer_loader TensorizerLoader" in out
    assert "FastshardModelLoader" in out


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
    lc = _cli_load_config(
        model_dir, "--load-format", "tensorizer", "--model-loader-extra-config", MULTILINE
    )
    extra = lc.model_loader_extra_config
    assert extra["tensorizer_config"]["tensorizer_dir"] == str(model_dir)  # vLLM's reshaping
    cfg = _loader("tensorizer", extra).config
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
    lc = _cli_load_config(
        model_dir, "--load-format", "tensorizer", "--model-loader-extra-config", json.dumps(extra)
    )
    cfg = _loader("tensorizer", lc.model_loader_extra_config).config
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
    lc = _cli_load_config(model_dir, "--load-format", "tensorizer")
    assert _loader("tensorizer", lc.model_loader_extra_config).config.uri == f"{model_dir}/"


def test_cli_fastshard_format_with_own_keys(model_dir):
    text = '{"uri": "s3://b/m/", "layout": "hf", "cooperative": true,\n "concurrency": 32,'
    text += ' "part_size_bytes": 8388608, "max_host_bytes": 1073741824, "s3_region": "x"}'
    lc = _cli_load_config(
        model_dir, "--load-format", "fastshard", "--model-loader-extra-config", text
    )
    cfg = _loader("fastshard", lc.model_loader_extra_config).config
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
        _loader("fastshard", extra)


def test_unknown_key_from_the_cli_is_rejected(model_dir):
    lc = _cli_load_config(
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


# -- loading -------------------------------------------------------------------


class _ModelConfig:
    """What the loader reads from vLLM's ModelConfig in load_weights."""

    def __init__(self, model: str = "/nonexistent", quantization: str | None = None) -> None:
        self.model = model
        self.quantization = quantization


def _tensorize_vllm(model: torch.nn.Module, path: Path, key: bytes | None = None) -> None:
    """What vLLM's serialize_vllm_model writes for one rank: the live module
    with a meta ``vllm_tensorized_marker`` parameter, via write_module."""
    model.register_parameter(
        MARKER, torch.nn.Parameter(torch.tensor((1,), device="meta"), requires_grad=False)
    )
    enc = EncryptionParams(key=key) if key is not None else None
    ser = TensorSerializer(str(path), encryption=enc)
    ser.write_module(model)
    ser.close()
    del model._parameters[MARKER]


def _set_ranks(monkeypatch, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1):
    monkeypatch.setattr(franks, "current", lambda: franks.Ranks(tp_rank, tp_size, pp_rank, pp_size))


def _assert_same(actual: torch.nn.Module, expected: torch.nn.Module) -> None:
    a, e = dict(actual.named_parameters()), dict(expected.named_parameters())
    assert a.keys() == e.keys()
    for name in e:
        assert torch.equal(a[name], e[name]), name


@pytest.fixture
def per_rank_files(tmp_path: Path):
    """vLLM-tensorized files of TP=2 x PP=2 (file rank = pp * tp_size + tp),
    each rank's model holding its TP share of a different seed per PP rank."""
    refs = {}
    for pp in range(2):
        hf = hf_state_dict(seed=pp)
        for tp in range(2):
            m = rank_model(hf, tp, 2)
            refs[(tp, pp)] = m
            _tensorize_vllm(m, tmp_path / f"model-rank-{pp * 2 + tp:03d}.tensors")
    return tmp_path / "model-rank-%03d.tensors", refs


def test_loads_vllm_tensorized_rank_file_into_existing_params(monkeypatch, per_rank_files):
    template, refs = per_rank_files
    _set_ranks(monkeypatch, tp_rank=1, tp_size=2, pp_rank=1, pp_size=2)
    loader = _loader("tensorizer", {"tensorizer_uri": str(template)})
    model = TinyForCausalLM(1, 2)
    before = {n: p for n, p in model.named_parameters()}
    loader.load_weights(model, _ModelConfig())
    _assert_same(model, refs[(1, 1)])  # PP rank 1's own file, not TP rank 1's of PP 0
    assert all(p is before[n] for n, p in model.named_parameters())  # filled in place
    assert not hasattr(model, MARKER)


def test_pp_ranks_do_not_collide(monkeypatch, per_rank_files):
    template, refs = per_rank_files
    loader = _loader("fastshard", {"uri": str(template)})
    for pp in range(2):
        for tp in range(2):
            _set_ranks(monkeypatch, tp, 2, pp, 2)
            model = TinyForCausalLM(tp, 2)
            loader.load_weights(model, _ModelConfig())
            _assert_same(model, refs[(tp, pp)])


def test_single_rank_vllm_file_in_the_model_dir(model_dir, monkeypatch, tmp_path: Path):
    ref = rank_model(hf_state_dict(), 0, 1)
    _tensorize_vllm(ref, tmp_path / "model.tensors")
    lc = _cli_load_config(model_dir, "--load-format", "tensorizer")
    lc.model_loader_extra_config["tensorizer_config"]["tensorizer_dir"] = str(tmp_path)
    loader = _loader("tensorizer", lc.model_loader_extra_config)
    model = TinyForCausalLM()
    loader.load_weights(model, _ModelConfig())
    assert loader.plan(_ModelConfig()).layout == "vllm"
    _assert_same(model, ref)


def test_encrypted_per_rank_file(tmp_path: Path):
    key = EncryptionParams.random().key
    (tmp_path / "key").write_bytes(key)
    ref = rank_model(hf_state_dict(), 0, 1)
    _tensorize_vllm(ref, tmp_path / "model-rank-000.tensors", key=key)
    extra = {
        "tensorizer_uri": str(tmp_path / "model-rank-%03d.tensors"),
        "encryption_keyfile": str(tmp_path / "key"),
    }
    model = TinyForCausalLM()
    _loader("tensorizer", extra).load_weights(model, _ModelConfig())
    _assert_same(model, ref)


def test_fastshard_directory_with_manifest(monkeypatch, tmp_path: Path):
    hf = hf_state_dict()
    refs = [rank_model(hf, r, 2) for r in range(2)]
    fastshard.save_sharded([dict(m.named_parameters()) for m in refs], f"{tmp_path}/")
    loader = _loader("fastshard", {"uri": str(tmp_path)})
    for r in range(2):
        _set_ranks(monkeypatch, r, 2)
        model = TinyForCausalLM(r, 2)
        loader.load_weights(model, _ModelConfig())
        _assert_same(model, refs[r])
    _set_ranks(monkeypatch, 0, 4)  # the manifest says 2 ranks
    with pytest.raises(fastshard.ShardMismatchError):
        loader.load_weights(TinyForCausalLM(0, 4), _ModelConfig())


def test_mis_shaped_and_missing_weights_are_errors(monkeypatch, per_rank_files):
    template, _ = per_rank_files
    _set_ranks(monkeypatch, 0, 2)
    loader = _loader("fastshard", {"uri": str(template)})
    wrong_tp = TinyForCausalLM(0, 1)  # full-size params: every shape differs
    with pytest.raises(fastshard.InvalidArgumentError, match="shape mismatch"):
        loader.load_weights(wrong_tp, _ModelConfig())
    extra_param = TinyForCausalLM(0, 2)
    extra_param.register_parameter("extra", torch.nn.Parameter(torch.zeros(2)))
    with pytest.raises(fastshard.InvalidArgumentError, match="missing from the file"):
        loader.load_weights(extra_param, _ModelConfig())


def test_one_vllm_file_for_several_ranks_is_refused(monkeypatch, tmp_path: Path):
    _tensorize_vllm(rank_model(hf_state_dict(), 0, 1), tmp_path / "model.tensors")
    _set_ranks(monkeypatch, 0, 2)
    loader = _loader("fastshard", {"uri": str(tmp_path / "model.tensors")})
    with pytest.raises(fastshard.ShardMismatchError, match="need one file each"):
        loader.load_weights(TinyForCausalLM(0, 2), _ModelConfig())


def _write_hf(path: Path, sd: dict[str, torch.Tensor]) -> None:
    ser = TensorSerializer(str(path))
    ser.write_state_dict(sd)
    ser.close()


def test_hf_layout_feeds_model_load_weights(monkeypatch, tmp_path: Path):
    hf = hf_state_dict(seed=3)
    _write_hf(tmp_path / "model.tensors", hf)
    # A small max_host_bytes: the weights reach load_weights in many batches.
    extra = {"tensorizer_uri": str(tmp_path / "model.tensors"), "max_host_bytes": 2048}
    loader = _loader("tensorizer", extra)
    for r in range(2):
        _set_ranks(monkeypatch, r, 2)
        assert loader.plan(_ModelConfig()).layout == "hf"
        model = TinyForCausalLM(r, 2)
        loader.load_weights(model, _ModelConfig())
        _assert_same(model, rank_model(hf, r, 2))


def test_hf_layout_missing_weights_are_errors(tmp_path: Path):
    hf = hf_state_dict()
    del hf["model.norm.weight"]
    _write_hf(tmp_path / "model.tensors", hf)
    loader = _loader("fastshard", {"uri": str(tmp_path / "model.tensors")})
    with pytest.raises(fastshard.InvalidArgumentError, match=r"not loaded: model\.norm\.weight"):
        loader.load_weights(TinyForCausalLM(), _ModelConfig())


def test_download_model_is_a_no_op():
    assert _loader("fastshard").download_model(_ModelConfig()) is None  # type: ignore[arg-type]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.s3
def test_ranks_from_vllms_gloo_groups(tmp_path: Path, seaweed):
    """Two processes with vLLM's own TP (then PP) groups over gloo load
    per-rank files and, cooperatively, one HF-layout file from the local S3
    server, then per-rank PP files from local disk."""
    for d in ("tp", "pp"):
        (tmp_path / d).mkdir()
    prefix = f"s3://{seaweed.bucket}/vllm-gloo"
    for r in range(2):
        name = f"model-rank-{r:03d}.tensors"
        _tensorize_vllm(rank_model(hf_state_dict(seed=0), r, 2), tmp_path / "tp" / name)
        seaweed.upload(tmp_path / "tp" / name, f"vllm-gloo/tp/{name}")
        _tensorize_vllm(rank_model(hf_state_dict(seed=10 + r), 0, 1), tmp_path / "pp" / name)
    _write_hf(tmp_path / "hf.tensors", hf_state_dict(seed=7))
    seaweed.upload(tmp_path / "hf.tensors", "vllm-gloo/hf/model.tensors")
    keys = {
        "s3_endpoint": seaweed.endpoint,
        "s3_access_key_id": seaweed.access_key,
        "s3_secret_access_key": seaweed.secret_key,
    }
    phases = [
        {"tensorizer_uri": f"{prefix}/tp/model-rank-%03d.tensors", **keys},
        {
            "tensorizer_uri": f"{prefix}/hf/model.tensors",
            "cooperative": True,
            "max_host_bytes": 4096,  # several shared batches
            **keys,
        },
        {"tensorizer_uri": str(tmp_path / "pp" / "model-rank-%03d.tensors")},
    ]
    here = Path(__file__).resolve().parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(here), str(PYTHON_DIR), os.environ.get("PYTHONPATH", "")]
        ),
    }
    port = str(_free_port())
    argv = [json.dumps(p) for p in phases]
    procs = [
        subprocess.Popen(
            [sys.executable, str(here / "vllm_tp_worker.py"), str(r), port, *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=400)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rc, out, err in outs:
        assert rc == 0, err[-4000:]
        assert out.split("\n")[:3] == ["ok tp-per-rank", "ok tp-hf-cooperative", "ok pp-per-rank"]


@pytest.mark.s3
def test_encrypted_rank_files_and_keyfile_on_s3(monkeypatch, model_dir, tmp_path: Path, seaweed):
    """tensorizer-style keys from vLLM's CLI: per-rank files and the key
    file on S3, credentials and endpoint in stream_kwargs."""
    key = EncryptionParams.random().key
    (tmp_path / "key").write_bytes(key)
    key_uri = seaweed.upload(tmp_path / "key", "vllm-enc/key")
    refs = {}
    for r in range(2):
        refs[r] = rank_model(hf_state_dict(seed=4), r, 2)
        path = tmp_path / f"model-rank-{r:02d}.tensors"
        _tensorize_vllm(refs[r], path, key=key)
        seaweed.upload(path, f"vllm-enc/model-rank-{r:02d}.tensors")
    extra = {
        "tensorizer_uri": f"s3://{seaweed.bucket}/vllm-enc/model-rank-%02d.tensors",
        "encryption_keyfile": key_uri,
        "stream_kwargs": {
            "s3_endpoint": seaweed.endpoint,
            "s3_access_key_id": seaweed.access_key,
            "s3_secret_access_key": seaweed.secret_key,
        },
        "deserialization_kwargs": {"verify_hash": True, "num_readers": 4},
    }
    lc = _cli_load_config(
        model_dir, "--load-format", "tensorizer", "--model-loader-extra-config", json.dumps(extra)
    )
    loader = _loader("tensorizer", lc.model_loader_extra_config)
    for r in range(2):
        _set_ranks(monkeypatch, r, 2)
        model = TinyForCausalLM(r, 2)
        loader.load_weights(model, _ModelConfig())
        _assert_same(model, refs[r])


# -- serialization -------------------------------------------------------------


def _model_dir_with_artifacts(root: Path) -> Path:
    d = root / "hf-model"
    d.mkdir()
    for name in ("config.json", "generation_config.json", "tokenizer.json", "modeling_tiny.py"):
        (d / name).write_text(f"{name}\n")
    for name in ("model.safetensors", "README.md", "old.tensors"):
        (d / name).write_text("not an artifact\n")
    (d / "sub").mkdir()
    return d


class _FakeLLM:
    """What serialize() uses of vllm.LLM: collective_rpc by method name on
    every worker (here: in this process, one per TP rank) and the model
    config."""

    def __init__(self, monkeypatch, models, model_dir: Path) -> None:
        from types import SimpleNamespace

        self.monkeypatch, self.models = monkeypatch, models
        self.llm_engine = SimpleNamespace(
            model_config=SimpleNamespace(model=str(model_dir), revision=None)
        )

    def collective_rpc(self, method: str, kwargs: dict):
        from fastshard.vllm.serialize import FastshardWorkerExtension

        class Worker(FastshardWorkerExtension):
            def __init__(self, model):
                self.model = model

            def fastshard_checkpoint_model(self):
                return self.model

        out = []
        for r, m in enumerate(self.models):
            _set_ranks(self.monkeypatch, r, len(self.models))
            out.append(getattr(Worker(m), method)(**json.loads(json.dumps(kwargs))))
        return out


def _serialize_and_load_back(monkeypatch, tmp_path: Path, uri: str, opts: dict) -> list[str]:
    from fastshard.vllm.serialize import serialize

    hf = hf_state_dict(seed=5)
    refs = [rank_model(hf, r, 2) for r in range(2)]
    llm = _FakeLLM(monkeypatch, refs, _model_dir_with_artifacts(tmp_path))
    location = serialize(llm, uri, **opts)
    assert location.endswith("fastshard-manifest.json")
    loader = _loader("fastshard", {"uri": uri, **opts})
    for r in range(2):
        _set_ranks(monkeypatch, r, 2)
        assert loader.plan(_ModelConfig()).layout == "vllm"
        model = TinyForCausalLM(r, 2)
        loader.load_weights(model, _ModelConfig())
        _assert_same(model, refs[r])
        assert not hasattr(refs[r], MARKER)
    return location


def test_serialize_through_a_worker_extension(monkeypatch, tmp_path: Path):
    out = tmp_path / "out"
    _serialize_and_load_back(monkeypatch, tmp_path, f"{out}/", {})
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "config.json",
        "fastshard-artifacts.json",
        "fastshard-manifest.json",
        "generation_config.json",
        "model-rank-000.tensors",
        "model-rank-001.tensors",
        "modeling_tiny.py",
        "tokenizer.json",
    ]
    manifest = json.loads((out / "fastshard-manifest.json").read_text())
    assert manifest["world_size"] == 2
    with fastshard.open(out / "model-rank-001.tensors") as f:
        assert ".vllm_tensorized_marker" in f.keys()


@pytest.mark.s3
def test_serialize_to_s3_and_serve(monkeypatch, tmp_path: Path, seaweed, capsys):
    uri = f"s3://{seaweed.bucket}/vllm-serialized/"
    _serialize_and_load_back(monkeypatch, tmp_path, uri, seaweed.opts())
    assert seaweed.get(uri + "config.json") == b"config.json\n"
    # fastshard serve: S3 settings from the environment, as vLLM's workers get them.
    monkeypatch.setenv("S3_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("S3_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("S3_SECRET_ACCESS_KEY", seaweed.secret_key)
    cache_root = tmp_path / "cache"
    argv = ["serve", "--cache-dir", str(cache_root), "--print-command", uri]
    assert cli.main([*argv, "--tensor-parallel-size", "2"]) == 0
    info, command = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    cache = Path(info["cache"])
    assert cache.parent.parent == cache_root
    assert sorted(p.name for p in cache.iterdir()) == [
        "config.json",
        "generation_config.json",
        "modeling_tiny.py",
        "tokenizer.json",
    ]
    assert (cache / "tokenizer.json").read_text() == "tokenizer.json\n"
    assert command[:5] == ["vllm", "serve", str(cache), "--load-format", "fastshard"]
    assert json.loads(command[6]) == {"uri": uri}
    assert command[7:] == ["--tensor-parallel-size", "2"]


def _write_index(d: Path, files: list[dict]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    index = {"format": "fastshard-artifacts", "version": 1, "files": files}
    (d / "fastshard-artifacts.json").write_text(json.dumps(index))


@pytest.mark.parametrize("name", ["../evil", "a/../../evil", "..", "/etc/evil", "sub\\evil", ""])
def test_serve_refuses_names_escaping_the_cache(tmp_path: Path, name):
    from fastshard.vllm.artifacts import fetch_artifacts

    src = tmp_path / "src"
    _write_index(
        src,
        [
            {"name": "config.json", "size": 0, "sha256": "x"},
            {"name": name, "size": 1, "sha256": "y"},
        ],
    )
    (tmp_path / "evil").write_text("untouched")
    with pytest.raises(fastshard.InvalidArgumentError, match="escape"):
        fetch_artifacts(f"{src}/", tmp_path / "cache" / "m", {})
    assert (tmp_path / "evil").read_text() == "untouched"
    assert not (tmp_path / "cache" / "m").exists()  # refused before anything was written


def test_serve_checks_fetched_artifacts(tmp_path: Path):
    from fastshard.vllm.artifacts import copy_artifacts, fetch_artifacts

    src = _model_dir_with_artifacts(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    copy_artifacts(src, f"{out}/", {})
    (out / "config.json").write_text("changed\n")
    with pytest.raises(fastshard.IntegrityError, match="config.json"):
        fetch_artifacts(f"{out}/", tmp_path / "cache", {})
    (out / "fastshard-artifacts.json").unlink()
    with pytest.raises(fastshard.NotFoundError, match="serialize"):
        fetch_artifacts(f"{out}/", tmp_path / "cache", {})


def test_serve_owns_the_load_format(tmp_path: Path):
    from fastshard.vllm.serve import vllm_command

    with pytest.raises(SystemExit, match="--load-format"):
        vllm_command("s3://b/m/", tmp_path, ["--load-format=auto"], {})


def test_serialize_command(monkeypatch, tmp_path: Path, capsys):
    """`fastshard serialize`: vLLM's parser takes the engine arguments, the LLM
    gets fastshard's worker extension, every rank is written. (A stand-in LLM
    runs the ranks here; test_vllm_engine.py serializes real engines.)"""
    import vllm as vllm_module

    from fastshard.vllm.serialize import WORKER_EXTENSION

    hf = hf_state_dict(seed=9)
    refs = [rank_model(hf, r, 2) for r in range(2)]
    seen = {}

    def fake_llm(**kwargs):
        seen.update(kwargs)
        return _FakeLLM(monkeypatch, refs, Path(kwargs["model"]))

    monkeypatch.setattr(vllm_module, "LLM", fake_llm)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}\n")
    out = tmp_path / "out"
    argv = ["serialize", f"{out}/", "--model", str(model_dir), "--tensor-parallel-size", "2"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.strip() == f"{out}/fastshard-manifest.json"
    assert seen["worker_extension_cls"] == WORKER_EXTENSION
    assert (seen["model"], seen["tensor_parallel_size"]) == (str(model_dir), 2)
    assert (out / "config.json").read_text() == "{}\n"
    loader = _loader("fastshard", {"uri": str(out)})
    for r in range(2):
        _set_ranks(monkeypatch, r, 2)
        model = TinyForCausalLM(r, 2)
        loader.load_weights(model, _ModelConfig())
        _assert_same(model, refs[r])
