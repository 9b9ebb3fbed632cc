"""Serializing a vLLM model with fastshard through a stand-in LLM (in this
process, one worker per TP rank): the worker extension, the manifest and
artifacts beside the weights (local and S3), `fastshard serialize` and
`fastshard serve`'s fetch of the artifacts. test_vllm_engine.py serializes
real engines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the plugin needs vLLM")  # conftest: VLLM_TARGET_DEVICE=cpu

from vllm_like_model import hf_state_dict, rank_model
from vllm_plugin_helpers import assert_ranks_load, set_ranks

import fastshard
from fastshard import cli
from fastshard.vllm.names import MARKER

pytestmark = pytest.mark.usefixtures("vllm_registered")


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
                return self.model, False

        out = []
        for r, m in enumerate(self.models):
            set_ranks(self.monkeypatch, r, len(self.models))
            out.append(getattr(Worker(m), method)(**json.loads(json.dumps(kwargs))))
        return out


def _serialize_and_load_back(monkeypatch, tmp_path: Path, uri: str, opts: dict) -> list[str]:
    from fastshard.vllm.serialize import serialize

    hf = hf_state_dict(seed=5)
    refs = [rank_model(hf, r, 2) for r in range(2)]
    llm = _FakeLLM(monkeypatch, refs, _model_dir_with_artifacts(tmp_path))
    location = serialize(llm, uri, **opts)
    assert location.endswith("fastshard-manifest.json")
    assert_ranks_load(monkeypatch, "fastshard", {"uri": uri, **opts}, refs, layout="vllm")
    assert not any(hasattr(ref, MARKER) for ref in refs)
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


def test_serialize_parses_its_uri_once_and_once_per_worker(monkeypatch, tmp_path: Path):
    # The driver parses the directory once and hands the parsed template on
    # (manifest, stale-manifest removal); each worker, another process in
    # vLLM, parses the template's text once; the artifacts' folder once.
    from fastshard._native import Location
    from fastshard.vllm.serialize import serialize

    refs = [rank_model(hf_state_dict(seed=5), r, 2) for r in range(2)]
    llm = _FakeLLM(monkeypatch, refs, _model_dir_with_artifacts(tmp_path))
    for artifacts, parses in ((False, 1 + 2), (True, 1 + 2 + 1)):
        out = tmp_path / f"out-{artifacts}"
        before = Location.parsed_from_python()
        serialize(llm, f"{out}/", artifacts=artifacts)
        assert Location.parsed_from_python() - before == parses, artifacts
        assert (out / "model-rank-001.tensors").is_file()


def test_serialize_refuses_a_single_file_without_showing_its_query(tmp_path: Path):
    from fastshard.errors import InvalidArgumentError
    from fastshard.vllm.serialize import serialize

    for uri, shown in (
        (str(tmp_path / "m.tensors"), str(tmp_path / "m.tensors")),
        ("https://h/m.tensors?X-Amz-Signature=s3cr3t", "https://h/m.tensors?…"),
    ):
        with pytest.raises(InvalidArgumentError) as e:
            serialize(None, uri)
        assert f"{shown!r} is neither a directory nor a per-rank template" in str(e.value)
        assert "s3cr3t" not in str(e.value)


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
    # Without the index, a Hugging Face repo's well-known files are fetched.
    fetched = fetch_artifacts(f"{out}/", tmp_path / "cache", {})
    assert "config.json" in [p.name for p in fetched]
    assert (tmp_path / "cache" / "config.json").read_text() == "changed\n"
    (out / "config.json").unlink()
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
    assert_ranks_load(monkeypatch, "fastshard", {"uri": str(out)}, refs)
