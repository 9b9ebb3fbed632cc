"""What the plugin-contract tests share (test_vllm_plugin.py, test_vllm_config.py,
test_vllm_loader.py, test_vllm_serialize.py): vLLM's loader for a format,
vLLM's own CLI parsing, a fresh interpreter, what vLLM's serializer writes,
and this worker's ranks as the tests set them. Import it after vLLM has
been found importable."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tensorizer import EncryptionParams, TensorSerializer
from vllm.config import LoadConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader import get_model_loader
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm_like_model import TinyForCausalLM

from fastshard.vllm import ranks as franks
from fastshard.vllm.loader import FastshardModelLoader
from fastshard.vllm.names import MARKER

ROOT = Path(__file__).resolve().parent.parent
PYTHON_DIR = ROOT / "python"


def loader_for(load_format: str = "fastshard", extra: object = None) -> FastshardModelLoader:
    lc = LoadConfig(load_format=load_format, model_loader_extra_config=extra or {})
    loader = get_model_loader(lc)
    assert isinstance(loader, FastshardModelLoader)
    return loader


def cli_load_config(model: Path, *argv: str) -> LoadConfig:
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", str(model), *argv])
    return EngineArgs.from_cli_args(args).create_load_config()


def run_code(code: str, env: dict[str, str] | None = None, extra_path: str = "") -> str:
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


class ModelConfig:
    """What the loader reads from vLLM's ModelConfig in load_weights."""

    def __init__(self, model: str = "/nonexistent", quantization: str | None = None) -> None:
        self.model = model
        self.quantization = quantization


def tensorize_vllm(model: torch.nn.Module, path: Path, key: bytes | None = None) -> None:
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


def set_ranks(monkeypatch: pytest.MonkeyPatch, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1) -> None:
    monkeypatch.setattr(franks, "current", lambda: franks.Ranks(tp_rank, tp_size, pp_rank, pp_size))


def assert_same(actual: torch.nn.Module, expected: torch.nn.Module) -> None:
    a, e = dict(actual.named_parameters()), dict(expected.named_parameters())
    assert a.keys() == e.keys()
    for name in e:
        assert torch.equal(a[name], e[name]), name


def assert_ranks_load(
    monkeypatch: pytest.MonkeyPatch,
    load_format: str,
    extra: dict,
    refs: list[torch.nn.Module],
    layout: str | None = None,
) -> None:
    """Every rank r of ``len(refs)`` loads, as that rank, the parameters of
    ``refs[r]`` into a fresh TinyForCausalLM (through the plan ``layout``)."""
    loader = loader_for(load_format, extra)
    for r, ref in enumerate(refs):
        set_ranks(monkeypatch, r, len(refs))
        if layout is not None:
            assert loader.plan(ModelConfig()).layout == layout
        model = TinyForCausalLM(r, len(refs))
        loader.load_weights(model, ModelConfig())
        assert_same(model, ref)
