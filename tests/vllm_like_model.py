"""A tiny decoder built like a vLLM model, for the plugin's tests.

Like vLLM's models it holds one rank's tensor-parallel share of each weight
(merged ``qkv_proj`` and ``gate_up_proj``, column- and row-parallel
linears, a vocab-parallel embedding), parameters without grad, and a
``load_weights(iterable of (HF name, full tensor))`` that takes this rank's
slices of Hugging Face weights and returns the names it loaded.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

HIDDEN = 8
INTER = 16
VOCAB = 32
LAYERS = 2


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class _Weight(nn.Module):
    def __init__(self, rows: int, cols: int) -> None:
        super().__init__()
        self.weight = _param(rows, cols)


class _Attention(nn.Module):
    def __init__(self, tp: int) -> None:
        super().__init__()
        self.qkv_proj = _Weight(3 * HIDDEN // tp, HIDDEN)
        self.o_proj = _Weight(HIDDEN, HIDDEN // tp)


class _Mlp(nn.Module):
    def __init__(self, tp: int) -> None:
        super().__init__()
        self.gate_up_proj = _Weight(2 * INTER // tp, HIDDEN)
        self.down_proj = _Weight(HIDDEN, INTER // tp)


class _Layer(nn.Module):
    def __init__(self, tp: int) -> None:
        super().__init__()
        self.input_layernorm = nn.Module()
        self.input_layernorm.weight = _param(HIDDEN)
        self.self_attn = _Attention(tp)
        self.mlp = _Mlp(tp)


class _Body(nn.Module):
    def __init__(self, tp: int) -> None:
        super().__init__()
        self.embed_tokens = _Weight(VOCAB // tp, HIDDEN)
        self.layers = nn.ModuleList(_Layer(tp) for _ in range(LAYERS))
        self.norm = nn.Module()
        self.norm.weight = _param(HIDDEN)


# HF name fragment → (vLLM parameter fragment, shard index in the merged
# weight, number of shards), like vLLM's stacked_params_mapping.
_STACKED = {
    "q_proj": ("qkv_proj", 0, 3),
    "k_proj": ("qkv_proj", 1, 3),
    "v_proj": ("qkv_proj", 2, 3),
    "gate_proj": ("gate_up_proj", 0, 2),
    "up_proj": ("gate_up_proj", 1, 2),
}
_ROW_PARALLEL = ("o_proj", "down_proj")
_REPLICATED = ("layernorm", "norm.weight")


class TinyForCausalLM(nn.Module):
    def __init__(self, tp_rank: int = 0, tp_size: int = 1) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.model = _Body(tp_size)
        self.lm_head = _Weight(VOCAB // tp_size, HIDDEN)

    def _shard(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        # narrow, as vLLM's parallel weight loaders take a rank's part
        size = t.shape[dim] // self.tp_size
        return t.narrow(dim, self.tp_rank * size, size)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, full in weights:
            for frag, (merged, idx, _n) in _STACKED.items():
                if f".{frag}." in name:
                    target = name.replace(frag, merged)
                    part = self._shard(full, 0)
                    rows = part.shape[0]
                    params[target].data[idx * rows : (idx + 1) * rows].copy_(part)
                    loaded.add(target)
                    break
            else:
                param = params[name]  # an unknown name is a KeyError, as in vLLM
                if any(r in name for r in _REPLICATED):
                    part = full
                elif any(r in name for r in _ROW_PARALLEL):
                    part = self._shard(full, 1)
                else:
                    part = self._shard(full, 0)
                if part.shape != param.shape:
                    raise ValueError(f"{name}: {tuple(part.shape)} vs {tuple(param.shape)}")
                param.data.copy_(part)
                loaded.add(name)
        return loaded


def hf_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """Full (unsharded) weights under Hugging Face Llama names."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    sd = {"model.embed_tokens.weight": r(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = r(HIDDEN)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + f"self_attn.{proj}.weight"] = r(HIDDEN, HIDDEN)
        sd[p + "mlp.gate_proj.weight"] = r(INTER, HIDDEN)
        sd[p + "mlp.up_proj.weight"] = r(INTER, HIDDEN)
        sd[p + "mlp.down_proj.weight"] = r(HIDDEN, INTER)
    sd["model.norm.weight"] = r(HIDDEN)
    sd["lm_head.weight"] = r(VOCAB, HIDDEN)
    return sd


def rank_model(hf: dict[str, torch.Tensor], tp_rank: int, tp_size: int) -> TinyForCausalLM:
    """The model of one rank with its share of ``hf`` loaded (the reference)."""
    m = TinyForCausalLM(tp_rank, tp_size)
    m.load_weights(hf.items())
    return m
