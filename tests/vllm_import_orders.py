"""For test_vllm_imports.py: import each fastshard.vllm module first thing
after one stage of vLLM's start-up, each in a child forked from a parent
that reached that stage, so every module is the first one imported there.

Usage: python vllm_import_orders.py STAGE; prints one JSON line
{"module": "ok" | "Type: message"}; stages:
  bare        nothing of vLLM imported yet
  plugins     vllm imported and its plugins loaded (fastshard's register()
              ran) but not its model-loader registry: vLLM's front end on a
              warm model-info cache
  registry    the registry imported too (an engine, a worker)
Then vLLM's plugins are loaded (if they were not), and where the registry
is imported by then (by the stage, or by the module itself), both of
fastshard's formats must be registered."""

from __future__ import annotations

import json
import os
import pkgutil
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

MODULES = sorted(
    f"fastshard.vllm.{m.name}"
    for m in pkgutil.iter_modules(
        [os.path.join(os.path.dirname(__import__("fastshard").__file__), "vllm")]
    )
)


def _stage(stage: str) -> None:
    if stage in ("plugins", "registry"):
        from vllm.plugins import load_general_plugins

        load_general_plugins()
        assert "fastshard.vllm" in sys.modules, "the entry point did not run"
        assert "vllm.model_executor.model_loader" not in sys.modules
    if stage == "registry":
        import vllm.model_executor.model_loader  # noqa: F401


def _child(module: str) -> str:
    import importlib

    try:
        importlib.import_module(module)
        from vllm.plugins import load_general_plugins

        load_general_plugins()  # vLLM's start-up, after the user's import (a no-op if done)
        if "vllm.model_executor.model_loader" not in sys.modules:
            return "ok"  # the registry's own import registers (stage "plugins")
        from vllm.config.load import LoadConfig
        from vllm.model_executor.model_loader import get_model_loader

        for fmt in ("fastshard", "tensorizer"):
            loader = get_model_loader(LoadConfig(load_format=fmt))
            got = type(loader).__qualname__
            assert got == "FastshardModelLoader", f"{fmt}: {got}"
        return "ok"
    except Exception as e:  # noqa: BLE001 (reported to the test)
        return f"{type(e).__name__}: {e}"


def main() -> None:
    _stage(sys.argv[1])
    results = {}
    for module in MODULES:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            os.write(write, _child(module).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as r:
            results[module] = r.read() or "child died"
        os.waitpid(pid, 0)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
