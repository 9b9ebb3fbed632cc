"""test_vllm_plugin's end-to-end check with a real vLLM model on the CPU:
a tiny random Llama (config written with transformers) loaded by vLLM's
``get_model`` through fastshard's loader, from an HF-layout file and from a
vLLM-tensorized per-rank file, compared with vLLM's own TensorizerLoader.

Usage: python vllm_llama_worker.py DIR PORT; prints "ok <step>" lines."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402
from tensorizer import TensorSerializer  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed import parallel_state as ps  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.model_executor.model_loader import get_model  # noqa: E402
from vllm.model_executor.model_loader.tensorizer_loader import TensorizerLoader  # noqa: E402

import fastshard.vllm as fv  # noqa: E402
from fastshard.shard import write_manifest  # noqa: E402
from fastshard.vllm.loader import MARKER, FastshardModelLoader  # noqa: E402
from fastshard.vllm.serialize import save_rank  # noqa: E402


def _config(model_dir: str, load_format: str, extra: dict) -> VllmConfig:
    return EngineArgs(
        model=model_dir,
        skip_tokenizer_init=True,
        load_format=load_format,
        model_loader_extra_config=extra,
        dtype="float32",
        max_model_len=128,
        enforce_eager=True,
    ).create_engine_config()


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}


def _same(a: torch.nn.Module, b: torch.nn.Module, step: str) -> None:
    sa, sb = _state(a), _state(b)
    assert sa.keys() == sb.keys(), (step, sa.keys() ^ sb.keys())
    for k in sa:
        assert torch.equal(sa[k], sb[k]), (step, k)


def _post_processed(model: torch.nn.Module) -> bool:
    linears = [m for m in model.modules() if type(m).__name__ == "QKVParallelLinear"]
    return bool(linears) and all(hasattr(m, "cpu_linear") for m in linears)


def main() -> None:
    root, port = sys.argv[1], sys.argv[2]
    model_dir = os.path.join(root, "tiny")
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(model_dir)
    torch.manual_seed(0)
    hf_file = os.path.join(root, "hf.tensors")
    ser = TensorSerializer(hf_file)
    ser.write_state_dict(LlamaForCausalLM(cfg).state_dict())
    ser.close()
    fv.register()

    vc = _config(model_dir, "tensorizer", {"tensorizer_uri": hf_file})
    with set_current_vllm_config(vc):
        ps.init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            local_rank=0,
            backend="gloo",
        )
        ps.initialize_model_parallel(1)

        # HF layout through the takeover of --load-format tensorizer.
        model = get_model(vllm_config=vc)
        assert isinstance(FastshardModelLoader(vc.load_config), FastshardModelLoader)
        assert _post_processed(model) and not model.training
        # vLLM's own loader on the same file gives the same weights (each
        # model is built under its own config: layer names are registered
        # in the config's forward context).
        vc_own = _config(model_dir, "tensorizer", {"tensorizer_uri": hf_file})
        with set_current_vllm_config(vc_own):
            own = TensorizerLoader(vc_own.load_config).load_model(vc_own, vc_own.model_config)
        _same(model, own, "hf")
        # vLLM's own skips post-processing (its bug #55198): informational.
        print("vllm's own loader post-processed:", _post_processed(own), flush=True)
        print("ok hf", flush=True)

        # What tensorize_vllm_model writes for rank 0: the live module and
        # its marker; loaded back with --load-format fastshard.
        template = os.path.join(root, "vllm", "model-rank-%03d.tensors")
        os.makedirs(os.path.dirname(template))
        model.register_parameter(
            MARKER, torch.nn.Parameter(torch.tensor((1,), device="meta"), requires_grad=False)
        )
        ser = TensorSerializer(template % 0)
        ser.write_module(model)
        ser.close()
        del model._parameters[MARKER]
        vc2 = _config(model_dir, "fastshard", {"uri": template})
        with set_current_vllm_config(vc2):
            again = get_model(vllm_config=vc2)
        _same(again, model, "vllm")
        assert _post_processed(again) and not again.training and not hasattr(again, MARKER)
        print("ok vllm", flush=True)

        # fastshard's own per-rank writer on the live vLLM model (what the
        # worker extension runs), served back from the directory.
        out = save_rank(model, os.path.join(root, "fs") + "/")
        assert out["rank"] == 0 and out["world_size"] == 1, out
        write_manifest(os.path.join(root, "fs", "model-rank-%03d.tensors"), [out["size"]], "test")
        vc3 = _config(model_dir, "fastshard", {"uri": os.path.join(root, "fs")})
        with set_current_vllm_config(vc3):
            third = get_model(vllm_config=vc3)
        _same(third, model, "fastshard-save")
        assert _post_processed(third) and not hasattr(model, MARKER)
        print("ok fastshard-save", flush=True)
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()


if __name__ == "__main__":
    main()
