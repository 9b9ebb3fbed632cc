"""fastshard's vLLM loader with vLLM-like model classes
(tests/vllm_like_model.py): vLLM-layout per-rank files (tensorizer- and
fastshard-written, PP ranks, encrypted, manifest directories), the HF
layout through model.load_weights, vLLM's own TP and PP groups over gloo,
and the errors for files that do not fit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the plugin needs vLLM")  # conftest: VLLM_TARGET_DEVICE=cpu

import torch
from tensorizer import EncryptionParams, TensorSerializer
from vllm_like_model import TinyForCausalLM, hf_state_dict, rank_model
from vllm_plugin_helpers import (
    PYTHON_DIR,
    ModelConfig,
    assert_ranks_load,
    assert_same,
    cli_load_config,
    loader_for,
    set_ranks,
    tensorize_vllm,
)

import fastshard
from fastshard.vllm import loader as floader
from fastshard.vllm.names import MARKER

pytestmark = pytest.mark.usefixtures("vllm_registered")


@pytest.fixture
def per_rank_files(tmp_path: Path):
    """vLLM-tensorized files of TP=2 x PP=2 (file rank = pp * tp_size + tp),
    each rank's model holding its TP share of a different seed per PP rank."""
    refs = {}
    for pp in range(2):
        hf = hf_state_dict(seed=pp)
        for tp in range(2):
            m = rank_model(hf, tp, 2)
            refs[(tp, pp)] = m
            tensorize_vllm(m, tmp_path / f"model-rank-{pp * 2 + tp:03d}.tensors")
    return tmp_path / "model-rank-%03d.tensors", refs


def test_loads_vllm_tensorized_rank_file_into_existing_params(monkeypatch, per_rank_files):
    template, refs = per_rank_files
    set_ranks(monkeypatch, tp_rank=1, tp_size=2, pp_rank=1, pp_size=2)
    loader = loader_for("tensorizer", {"tensorizer_uri": str(template)})
    model = TinyForCausalLM(1, 2)
    before = {n: p for n, p in model.named_parameters()}
    loader.load_weights(model, ModelConfig())
    assert_same(model, refs[(1, 1)])  # PP rank 1's own file, not TP rank 1's of PP 0
    assert all(p is before[n] for n, p in model.named_parameters())  # filled in place
    assert not hasattr(model, MARKER)


def test_pp_ranks_do_not_collide(monkeypatch, per_rank_files):
    template, refs = per_rank_files
    loader = loader_for("fastshard", {"uri": str(template)})
    for pp in range(2):
        for tp in range(2):
            set_ranks(monkeypatch, tp, 2, pp, 2)
            model = TinyForCausalLM(tp, 2)
            loader.load_weights(model, ModelConfig())
            assert_same(model, refs[(tp, pp)])


def test_single_rank_vllm_file_in_the_model_dir(model_dir, monkeypatch, tmp_path: Path):
    ref = rank_model(hf_state_dict(), 0, 1)
    tensorize_vllm(ref, tmp_path / "model.tensors")
    lc = cli_load_config(model_dir, "--load-format", "tensorizer")
    lc.model_loader_extra_config["tensorizer_config"]["tensorizer_dir"] = str(tmp_path)
    loader = loader_for("tensorizer", lc.model_loader_extra_config)
    model = TinyForCausalLM()
    loader.load_weights(model, ModelConfig())
    assert loader.plan(ModelConfig()).layout == "vllm"
    assert_same(model, ref)


def test_encrypted_per_rank_file(tmp_path: Path):
    key = EncryptionParams.random().key
    (tmp_path / "key").write_bytes(key)
    ref = rank_model(hf_state_dict(), 0, 1)
    tensorize_vllm(ref, tmp_path / "model-rank-000.tensors", key=key)
    extra = {
        "tensorizer_uri": str(tmp_path / "model-rank-%03d.tensors"),
        "encryption_keyfile": str(tmp_path / "key"),
    }
    model = TinyForCausalLM()
    loader_for("tensorizer", extra).load_weights(model, ModelConfig())
    assert_same(model, ref)


def test_fastshard_directory_with_manifest(monkeypatch, tmp_path: Path):
    hf = hf_state_dict()
    refs = [rank_model(hf, r, 2) for r in range(2)]
    fastshard.save_sharded([dict(m.named_parameters()) for m in refs], f"{tmp_path}/")
    assert_ranks_load(monkeypatch, "fastshard", {"uri": str(tmp_path)}, refs)
    loader = loader_for("fastshard", {"uri": str(tmp_path)})
    set_ranks(monkeypatch, 0, 4)  # the manifest says 2 ranks
    with pytest.raises(fastshard.ShardMismatchError):
        loader.load_weights(TinyForCausalLM(0, 4), ModelConfig())


def test_mis_shaped_and_missing_weights_are_errors(monkeypatch, per_rank_files):
    template, _ = per_rank_files
    set_ranks(monkeypatch, 0, 2)
    loader = loader_for("fastshard", {"uri": str(template)})
    wrong_tp = TinyForCausalLM(0, 1)  # full-size params: every shape differs
    with pytest.raises(fastshard.InvalidArgumentError, match="shape mismatch"):
        loader.load_weights(wrong_tp, ModelConfig())
    extra_param = TinyForCausalLM(0, 2)
    extra_param.register_parameter("extra", torch.nn.Parameter(torch.zeros(2)))
    with pytest.raises(fastshard.InvalidArgumentError, match="missing from the file"):
        loader.load_weights(extra_param, ModelConfig())


def test_one_vllm_file_for_several_ranks_is_refused(monkeypatch, tmp_path: Path):
    tensorize_vllm(rank_model(hf_state_dict(), 0, 1), tmp_path / "model.tensors")
    set_ranks(monkeypatch, 0, 2)
    loader = loader_for("fastshard", {"uri": str(tmp_path / "model.tensors")})
    with pytest.raises(fastshard.ShardMismatchError, match="need one file each"):
        loader.load_weights(TinyForCausalLM(0, 2), ModelConfig())


def _write_hf(path: Path, sd: dict[str, torch.Tensor]) -> None:
    ser = TensorSerializer(str(path))
    ser.write_state_dict(sd)
    ser.close()


def test_hf_layout_feeds_model_load_weights(monkeypatch, tmp_path: Path):
    hf = hf_state_dict(seed=3)
    _write_hf(tmp_path / "model.tensors", hf)
    # A small max_host_bytes: the weights reach load_weights in many batches.
    extra = {"tensorizer_uri": str(tmp_path / "model.tensors"), "max_host_bytes": 2048}
    refs = [rank_model(hf, r, 2) for r in range(2)]
    assert_ranks_load(monkeypatch, "tensorizer", extra, refs, layout="hf")


def test_hf_layout_missing_weights_are_errors(tmp_path: Path):
    hf = hf_state_dict()
    del hf["model.norm.weight"]
    _write_hf(tmp_path / "model.tensors", hf)
    loader = loader_for("fastshard", {"uri": str(tmp_path / "model.tensors")})
    with pytest.raises(fastshard.InvalidArgumentError, match=r"not loaded: model\.norm\.weight"):
        loader.load_weights(TinyForCausalLM(), ModelConfig())


def test_download_model_is_a_no_op():
    assert loader_for("fastshard").download_model(ModelConfig()) is None  # type: ignore[arg-type]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.s3
@pytest.mark.usefixtures("vllm_config_without_triton")
def test_ranks_from_vllms_gloo_groups(tmp_path: Path, seaweed):
    """Two processes with vLLM's own TP (then PP) groups over gloo load
    per-rank files and, cooperatively, one HF-layout file from the local S3
    server, then per-rank PP files from local disk."""
    for d in ("tp", "pp"):
        (tmp_path / d).mkdir()
    prefix = f"s3://{seaweed.bucket}/vllm-gloo"
    for r in range(2):
        name = f"model-rank-{r:03d}.tensors"
        tensorize_vllm(rank_model(hf_state_dict(seed=0), r, 2), tmp_path / "tp" / name)
        seaweed.upload(tmp_path / "tp" / name, f"vllm-gloo/tp/{name}")
        tensorize_vllm(rank_model(hf_state_dict(seed=10 + r), 0, 1), tmp_path / "pp" / name)
    _write_hf(tmp_path / "hf.tensors", hf_state_dict(seed=7))
    seaweed.upload(tmp_path / "hf.tensors", "vllm-gloo/hf/model.tensors")
    keys = {
        "s3_endpoint": seaweed.endpoint,
        "s3_access_key_id": seaweed.access_key,
        "s3_secret_access_key": seaweed.secret_key,
    }
    phases = [
        {"tensorizer_uri": f"{prefix}/tp/model-rank-%03d.tensors", **keys},
        {
            "tensorizer_uri": f"{prefix}/hf/model.tensors",
            "cooperative": True,
            "max_host_bytes": 4096,  # several shared batches
            **keys,
        },
        {"tensorizer_uri": str(tmp_path / "pp" / "model-rank-%03d.tensors")},
    ]
    here = Path(__file__).resolve().parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(here), str(PYTHON_DIR), os.environ.get("PYTHONPATH", "")]
        ),
    }
    port = str(_free_port())
    argv = [json.dumps(p) for p in phases]
    procs = [
        subprocess.Popen(
            [sys.executable, str(here / "vllm_tp_worker.py"), str(r), port, *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=400)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    fetched = received = 0
    for rc, out, err in outs:
        assert rc == 0, err[-4000:]
        lines = out.split("\n")
        assert lines[:3] == ["ok tp-per-rank", "ok tp-hf-cooperative", "ok pp-per-rank"]
        # Each rank checked that it received no more than its own share.
        words = lines[3].split()
        fetched, received = fetched + int(words[2]), received + int(words[4])
    # The HF file fetched once between the two ranks, and each rank received
    # about half of what the other fetched (its slices; the replicated norms
    # are 2 % of the file), not all of it.
    size = (tmp_path / "hf.tensors").stat().st_size
    assert 0 < fetched <= 1.02 * size, (fetched, size)
    assert received <= 0.6 * fetched, (received, fetched)


@pytest.mark.s3
def test_encrypted_rank_files_and_keyfile_on_s3(monkeypatch, model_dir, tmp_path: Path, seaweed):
    """tensorizer-style keys from vLLM's CLI: per-rank files and the key
    file on S3, credentials and endpoint in stream_kwargs."""
    key = EncryptionParams.random().key
    (tmp_path / "key").write_bytes(key)
    key_uri = seaweed.upload(tmp_path / "key", "vllm-enc/key")
    refs = [rank_model(hf_state_dict(seed=4), r, 2) for r in range(2)]
    for r in range(2):
        path = tmp_path / f"model-rank-{r:02d}.tensors"
        tensorize_vllm(refs[r], path, key=key)
        seaweed.upload(path, f"vllm-enc/model-rank-{r:02d}.tensors")
    extra = {
        "tensorizer_uri": f"s3://{seaweed.bucket}/vllm-enc/model-rank-%02d.tensors",
        "encryption_keyfile": key_uri,
        "stream_kwargs": {
            "s3_endpoint": seaweed.endpoint,
            "s3_access_key_id": seaweed.access_key,
            "s3_secret_access_key": seaweed.secret_key,
        },
        "deserialization_kwargs": {"verify_hash": True, "num_readers": 4},
    }
    lc = cli_load_config(
        model_dir, "--load-format", "tensorizer", "--model-loader-extra-config", json.dumps(extra)
    )
    assert_ranks_load(monkeypatch, "tensorizer", lc.model_loader_extra_config, refs)


def test_a_restarted_node_reads_its_weights_from_the_cache(monkeypatch, tmp_path: Path, seaweed):
    """cache_dir in the loader's config reaches every load: a second loader
    (a node restarting) reads the rank's file from local disk."""
    refs = [rank_model(hf_state_dict(seed=6), r, 2) for r in range(2)]
    for r in range(2):
        tensorize_vllm(refs[r], tmp_path / f"model-rank-{r:02d}.tensors")
        seaweed.upload(
            tmp_path / f"model-rank-{r:02d}.tensors", f"vllm-cache/model-rank-{r:02d}.tensors"
        )
    extra = {
        "uri": f"s3://{seaweed.bucket}/vllm-cache/model-rank-%02d.tensors",
        "cache_dir": str(tmp_path / "cache"),
        **seaweed.opts(),
    }
    seen: list[fastshard.LoadStats] = []
    monkeypatch.setattr(floader, "_summary", lambda plan, stats, *rest: seen.append(stats))
    for _ in range(2):
        set_ranks(monkeypatch, 1, 2)
        model = TinyForCausalLM(1, 2)
        loader_for("fastshard", extra).load_weights(model, ModelConfig())
        assert_same(model, refs[1])
    first, second = seen
    assert (first.bytes_from_cache, second.bytes_fetched) == (0, 0)
    assert second.bytes_from_cache >= first.bytes_wanted > 0
