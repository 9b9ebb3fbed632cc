"""One worker of test_vllm_plugin's gloo tests: vLLM's own distributed
groups (TP=2, then PP=2) on 2 CPU processes, loading through the plugin.

Usage: python vllm_tp_worker.py RANK PORT TP_EXTRA HF_EXTRA PP_EXTRA, each
EXTRA the JSON model_loader_extra_config of that phase; prints "ok <phase>"."""

from __future__ import annotations

import json
import logging
import os
import re
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402
from vllm.config import LoadConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed import parallel_state as ps  # noqa: E402
from vllm.model_executor.model_loader import get_model_loader  # noqa: E402
from vllm_like_model import TinyForCausalLM, hf_state_dict, rank_model  # noqa: E402
from vllm_triton_check import satisfy_if_asked  # noqa: E402

import fastshard.vllm as fv  # noqa: E402


class _ModelConfig:
    model = "/nonexistent"
    quantization = None


def _check(model: torch.nn.Module, ref: torch.nn.Module, phase: str) -> None:
    got, want = dict(model.named_parameters()), dict(ref.named_parameters())
    assert got.keys() == want.keys(), phase
    for name, value in want.items():
        assert torch.equal(got[name], value), f"{phase}: {name}"
    print("ok", phase, flush=True)


class _Lines(logging.Handler):
    """The loader's summary lines."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


SUMMARY = _Lines()
logging.getLogger("vllm.fastshard").addHandler(SUMMARY)
logging.getLogger("vllm.fastshard").setLevel(logging.INFO)


def _load(extra: dict, model: torch.nn.Module) -> tuple[int, int]:
    """Load, and return the bytes this rank fetched from the store and
    received from the other ranks (its summary line)."""
    lc = LoadConfig(load_format="tensorizer", model_loader_extra_config=extra)
    get_model_loader(lc).load_weights(model, _ModelConfig())  # type: ignore[arg-type]
    m = re.search(r"(\d+) bytes fetched.* (\d+) bytes received", SUMMARY.lines[-1])
    assert m, SUMMARY.lines[-1]
    return int(m[1]), int(m[2])


def _share(model: torch.nn.Module) -> int:
    """Bytes of this rank's parameters: its slices and the replicated weights."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def main() -> None:
    rank, port = int(sys.argv[1]), sys.argv[2]
    # vLLM's CPU worker names its shared-memory TP/PP groups after the init
    # method's port before it sets up distributed state; its communicator
    # reads the name back (KeyError without it).
    os.environ.setdefault("VLLM_DIST_IDENT", port)
    tp_extra, hf_extra, pp_extra = (json.loads(a) for a in sys.argv[3:6])
    fv.register()
    satisfy_if_asked()  # vLLM 0.34 without a GPU: the test's fixture (conftest.py)
    with set_current_vllm_config(VllmConfig()):
        ps.init_distributed_environment(
            world_size=2,
            rank=rank,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            local_rank=rank,
            backend="gloo",
        )
        ps.initialize_model_parallel(tensor_model_parallel_size=2)
        tp = ps.get_tp_group().rank_in_group
        model = TinyForCausalLM(tp, 2)
        _load(tp_extra, model)
        _check(model, rank_model(hf_state_dict(seed=0), tp, 2), "tp-per-rank")

        model = TinyForCausalLM(tp, 2)
        fetched, received = _load(hf_extra, model)
        _check(model, rank_model(hf_state_dict(seed=7), tp, 2), "tp-hf-cooperative")
        # Only its own slices and the replicated weights come from the peer.
        assert 0 < received <= 1.05 * _share(model), (received, _share(model))
        coop = f"cooperative fetched {fetched} received {received} share {_share(model)}"

        ps.destroy_model_parallel()
        ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=2)
        pp = ps.get_pp_group().rank_in_group
        model = TinyForCausalLM(0, 1)
        _load(pp_extra, model)
        _check(model, rank_model(hf_state_dict(seed=10 + pp), 0, 1), "pp-per-rank")
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()
    print(coop, flush=True)


if __name__ == "__main__":
    main()
