"""fastshard's vLLM plugin against vLLM's own plugin discovery and loader
registry. The rest of the plugin-contract tests: test_vllm_config.py (the
extra config), test_vllm_loader.py (layouts, ranks, errors, with vLLM-like
model classes), test_vllm_serialize.py, test_vllm_remote_model.py,
test_vllm_imports.py; real engines: test_vllm_engine.py, test_vllm_serve.py,
test_vllm_tp.py.

vLLM's config objects and argument parsing need VLLM_TARGET_DEVICE=cpu on a
machine without a GPU ("Failed to infer device type" otherwise).
"""

from __future__ import annotations

import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the plugin needs vLLM")  # conftest: VLLM_TARGET_DEVICE=cpu

from vllm_plugin_helpers import ROOT, loader_for, run_code

import fastshard.vllm as fv
from fastshard.vllm.loader import FastshardModelLoader

pytestmark = pytest.mark.usefixtures("vllm_registered")


# -- the entry point ---------------------------------------------------------


def _entry_point() -> EntryPoint:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    group = meta["project"]["entry-points"]["vllm.general_plugins"]
    assert group == {"fastshard": "fastshard.vllm:register"}
    return EntryPoint("fastshard", group["fastshard"], "vllm.general_plugins")


def test_entry_point_resolves_to_register():
    assert _entry_point().load() is fv.register


def test_vllm_discovers_and_runs_the_entry_point(tmp_path: Path):
    # A dist-info carrying pyproject's entry point (what an install of the
    # wheel writes) is enough for importlib.metadata, so vLLM's own plugin
    # loading finds and calls register() without building the package.
    ep = _entry_point()
    info = tmp_path / "fastshard-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fastshard\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[{ep.group}]\n{ep.name} = {ep.value}\n")
    out = run_code(
        """
        import sys
        import vllm.plugins
        from vllm.plugins import load_plugins_by_group
        print("found fastshard:", "fastshard" in load_plugins_by_group("vllm.general_plugins"))
        vllm.plugins.load_general_plugins()
        # register() defers until vLLM's loader registry is imported.
        print("registry imported:", "vllm.model_executor.model_loader" in sys.modules)
        from vllm.config import LoadConfig
        from vllm.model_executor.model_loader import get_model_loader
        for f in ("fastshard", "tensorizer"):
            extra = {"tensorizer_config": {"tensorizer_dir": "/m"}}
            print(f, type(get_model_loader(LoadConfig(load_format=f,
                  model_loader_extra_config=extra))).__name__)
        """,
        extra_path=str(tmp_path),
    )
    assert "found fastshard: True" in out
    assert "registry imported: False" in out
    assert "fastshard FastshardModelLoader" in out
    assert "tensorizer FastshardModelLoader" in out


# -- the registry ------------------------------------------------------------


def test_get_model_loader_gives_fastshard_for_both_formats():
    assert type(loader_for("fastshard")) is FastshardModelLoader
    assert type(loader_for("tensorizer", {"tensorizer_uri": "/m/model.tensors"})) is (
        FastshardModelLoader
    )


def test_register_is_idempotent():
    fv.register()
    fv.register()
    assert type(loader_for("fastshard")) is FastshardModelLoader


def test_takeover_off_keeps_vllms_tensorizer_loader():
    out = run_code(
        """
        import fastshard.vllm as fv
        from vllm.engine.arg_utils import EngineArgs
        from vllm.model_executor.model_loader import get_model_loader
        fv.register()
        lc = EngineArgs(model="/", load_format="tensorizer").create_load_config()
        print(type(get_model_loader(lc)).__module__, type(get_model_loader(lc)).__name__)
        print(type(get_model_loader(lc.__class__(load_format="fastshard"))).__name__)
        """,
        env={"FASTSHARD_TAKEOVER_TENSORIZER": "0"},
    )
    assert "vllm.model_executor.model_loader.tensorizer_loader TensorizerLoader" in out
    assert "FastshardModelLoader" in out
