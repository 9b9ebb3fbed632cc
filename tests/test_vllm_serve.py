"""The seed's own command, as a user types it: `vllm serve s3://bucket/prefix
--load-format tensorizer` (and `fastshard`, and `fastshard serve`) on a
prefix the real engine serialized itself to (vllm_engines), answering
/v1/completions with the baseline's text; a prefix whose weights are gone
fails with fastshard's error instead of hanging."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_engine_files import BIN, PROMPTS, SERVE_ARGS, engine_env, serialized

from fastshard_lab.served import Served

pytestmark = pytest.mark.s3

READY_SECONDS = 600


def _serve_and_compare(vllm_engines, seaweed, tmp_path: Path, argv: list[str]) -> str:
    env = engine_env(seaweed, vllm_engines["root"] / "cache")
    with Served(argv, env, tmp_path / "serve.log") as served:
        assert served.wait_ready(READY_SECONDS), served.output[-6000:]
        name = served.model()
        baseline = vllm_engines["results"]["baseline"]
        n = len(baseline["tokens"][0])
        texts = [served.complete(p, n, name) for p in PROMPTS]
        assert texts == baseline["text"], (texts, baseline["text"])
        return served.output + f"\nSERVED MODEL {name}\n"


def _prefix(vllm_engines) -> str:
    return serialized(vllm_engines["files"], vllm_engines["root"], "s3", "plain")


@pytest.mark.parametrize("load_format", ["tensorizer", "fastshard"])
def test_vllm_serve_s3_prefix(vllm_engines, seaweed, tmp_path, load_format):
    prefix = _prefix(vllm_engines)
    argv = [str(BIN / "vllm"), "serve", prefix, "--load-format", load_format, *SERVE_ARGS]
    output = _serve_and_compare(vllm_engines, seaweed, tmp_path, argv)
    assert f"SERVED MODEL {prefix}" in output  # the URI stays the model's name
    loaded = [ln for ln in output.splitlines() if "fastshard: loaded" in ln]
    assert len(loaded) == 1, loaded
    assert f"{prefix}model-rank-000.tensors" in loaded[0]
    assert "model files (config, tokenizer)" in output  # fetched by fastshard, not Run:ai


def test_fastshard_serve_s3_prefix(vllm_engines, seaweed, tmp_path):
    prefix = _prefix(vllm_engines)
    argv = [str(BIN / "fastshard"), "serve", prefix, *SERVE_ARGS]
    output = _serve_and_compare(vllm_engines, seaweed, tmp_path, argv)
    assert any("fastshard: loaded" in ln for ln in output.splitlines())


def test_prefix_whose_weights_are_gone_is_an_error_not_a_hang(vllm_engines, seaweed, tmp_path):
    """The artifacts and manifest are there, the weights object is not: the
    engine exits with fastshard's NotFoundError naming it."""
    src = _prefix(vllm_engines)
    bucket, key = src.removeprefix("s3://").split("/", 1)
    gone = f"s3://{bucket}/gone/"
    client = seaweed.client()
    listed = client.list_objects_v2(Bucket=bucket, Prefix=key)["Contents"]
    for obj in listed:
        name = obj["Key"].removeprefix(key)
        if name != "model-rank-000.tensors":
            client.copy_object(
                Bucket=bucket, Key=f"gone/{name}", CopySource={"Bucket": bucket, "Key": obj["Key"]}
            )
    env = engine_env(seaweed, vllm_engines["root"] / "cache")
    argv = [str(BIN / "vllm"), "serve", gone, "--load-format", "tensorizer", *SERVE_ARGS]
    with Served(argv, env, tmp_path / "serve.log") as served:
        assert not served.wait_ready(READY_SECONDS), "served without its weights"
        assert served.proc.returncode != 0
        assert "NotFoundError" in served.output
        assert f"{gone}model-rank-000.tensors" in served.output
