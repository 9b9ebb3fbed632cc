"""Probes find which slice of each weight a rank's ``load_weights`` takes
(what a cooperative load must fetch for it) without reading anything and
without touching the model's parameters."""

from __future__ import annotations

import pytest
import torch
from vllm_like_model import INTER, TinyForCausalLM, hf_state_dict

from fastshard.vllm.probe import ProbeFailed, probe


def _weights() -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    return [(n, tuple(t.shape), t.dtype) for n, t in hf_state_dict().items()]


@pytest.mark.parametrize("rank", [0, 1])
def test_each_weight_loader_s_slice_is_noted(rank):
    model = TinyForCausalLM(rank, 2)
    uses = probe(model.load_weights, _weights())
    half = INTER // 2
    assert uses["model.layers.0.mlp.gate_proj.weight"] == [(0, ((rank * half, half),))]
    assert uses["model.layers.1.mlp.down_proj.weight"] == [(1, ((rank * half, half),))]
    assert uses["model.layers.0.self_attn.o_proj.weight"] == [(1, ((rank * 4, 4),))]
    assert uses["lm_head.weight"] == [(0, ((rank * 16, 16),))]
    # Replicated weights are copied whole.
    assert uses["model.norm.weight"] == [None]
    assert uses["model.layers.1.input_layernorm.weight"] == [None]
    assert set(uses) == set(hf_state_dict())


def test_the_parameters_are_left_as_they_were():
    model = TinyForCausalLM(1, 2)
    for i, p in enumerate(model.parameters()):
        p.data.fill_(i)
    before = {n: p.clone() for n, p in model.named_parameters()}
    probe(model.load_weights, _weights())
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n


def test_a_weight_the_model_skips_is_not_used():
    def load_weights(weights):
        for name, w in weights:
            if name != "skipped":
                torch.zeros(2, 2).copy_(w.narrow(0, 0, 2))

    uses = probe(
        load_weights, [("kept", (4, 2), torch.float32), ("skipped", (4, 2), torch.float32)]
    )
    assert uses == {"kept": [(0, ((0, 2),))], "skipped": []}


def test_several_slices_and_uses_beyond_narrow():
    def load_weights(weights):
        for name, w in weights:
            if name == "two":
                w.narrow(-1, 0, 1)
                w.narrow(1, 1, 1)
            elif name == "scalar":
                torch.zeros(1).fill_(w.item())
            else:
                torch.zeros(3, 2).copy_(w.t())

    uses = probe(
        load_weights,
        [
            ("two", (4, 2), torch.float16),
            ("scalar", (), torch.float32),
            ("t", (2, 3), torch.float32),
        ],
    )
    assert uses == {"two": [(1, ((0, 1),)), (1, ((1, 1),))], "scalar": [None], "t": [None]}


def test_a_narrow_of_a_slice_is_the_first_slice_only():
    def load_weights(weights):
        for _, w in weights:
            part = w.narrow(0, 2, 2).to("cpu").contiguous()
            torch.zeros(1, 3).copy_(part.narrow(0, 1, 1))

    assert probe(load_weights, [("w", (4, 3), torch.float32)]) == {"w": [(0, ((2, 2),))]}


@pytest.mark.parametrize(
    "use",
    [lambda w: w.numpy(), lambda w: torch.cat([torch.zeros(1, 2), w])],
    ids=["values", "mixed-with-real"],
)
def test_a_use_it_cannot_follow_fails(use):
    def load_weights(weights):
        for _, w in weights:
            use(w)

    with pytest.raises(ProbeFailed):
        probe(load_weights, [("w", (4, 2), torch.float32)])


def test_a_model_that_raises_fails_the_probe():
    def load_weights(weights):
        for _ in weights:
            raise KeyError("no such parameter")

    with pytest.raises(ProbeFailed, match="KeyError"):
        probe(load_weights, [("w", (4, 2), torch.float32)])
