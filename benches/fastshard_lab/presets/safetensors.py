"""safetensors and Hugging Face checkpoints: fastshard reading the
``.safetensors`` file itself against the loaders people use for it
(``make``-free: ``python -m fastshard_lab --preset safetensors``).

One file of fp16 tensors of 16 MiB (--size, default 1 GiB) written by
safetensors' ``save_file``:

- file: fastshard, ``safetensors.load_file`` + clone, Run:ai's
  ``SafetensorsStreamer`` (+ clone), and the raw file read (the ceiling);
- s3 (SeaweedFS on 127.0.0.1): fastshard, Run:ai, and the raw ranged GETs;
- tp: the same tensors as an HF repo of --shards files with
  ``model.safetensors.index.json`` on S3, --world-size ranks started
  together, each getting its dim-0 slices: fastshard reads its rows of the
  repo (the prefix opens as one checkpoint), Run:ai streams every file and
  keeps the slices (what a rank does with it today).

Every load runs in a fresh process and is checked against the source
tensors; one warm-up round, then --runs rounds in alternating order.
Ratios from one run are what to compare (the targets print as PASS/FAIL).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .. import deps, machine, measure, report, sources
from ..params import BENCH_DIR, GiB, MiB, add_out, names, size_arg

CASES = ("file", "s3", "tp")
# fastshard ÷ peer: the targets.
TARGETS = {
    ("file", "safetensors"): 1.1,
    ("s3", "runai"): 2.0,
    ("s3", "ceiling"): 0.9,
    ("tp", "runai"): 3.0,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated: file,s3,tp")
    p.add_argument("--size", type=size_arg, default=GiB, help="tensor bytes (default 1GiB)")
    p.add_argument("--runs", type=int, default=3, help="measured rounds after the warm-up")
    measure.add_warmup_flag(p)
    p.add_argument("--shards", type=int, default=8, help="files of the HF repo (tp case)")
    p.add_argument("--world-size", type=int, default=4, help="ranks of the tp case")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scratch", type=Path, default=BENCH_DIR / "safetensors")
    add_out(p, str(BENCH_DIR / "safetensors"))


def requires(args: argparse.Namespace) -> list[str]:
    needs = ["torch", "safetensors"]
    return needs + (["boto3"] if set(names(args.cases)) & {"s3", "tp"} else [])


def write_repo(sd: dict[str, Any], folder: Path, shards: int) -> list[Path]:
    """``sd`` as an HF checkpoint of ``shards`` files of about equal size,
    with its index (written with safetensors' ``save_file``)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    items = list(sd.items())
    per = max(1, -(-len(items) // shards))
    groups = [items[i : i + per] for i in range(0, len(items), per)]
    files, weight_map = [], {}
    for i, group in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file(dict(group), str(folder / name), metadata={"format": "pt"})
        weight_map.update({k: name for k, _ in group})
        files.append(folder / name)
    total = sum(t.nbytes for t in sd.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return files


def single_cases(
    src: sources.Source, loaders: list[str], expect: dict[str, str]
) -> list[measure.Case]:
    cases = []
    for loader in loaders:
        if loader not in src.where:
            continue
        spec = {"loader": loader, "source": src.name, **src.where[loader]}
        case = measure.Case(src.name, loader, spec, env=src.env.get(loader, {}))
        if loader == "ceiling":
            case.expect = expect["object"]
            spec["streams"] = 16
        else:
            case.expect = expect["tensors"]
        case.server_pid = src.server_pid
        cases.append(case)
    return cases


def tp_cases(s3: Any, repo: list[Path], sd: dict[str, Any], args: argparse.Namespace) -> Any:
    """The repo uploaded; fastshard's and Run:ai's rank loads of it."""
    from .. import workload

    world = args.world_size
    prefix = f"s3://{s3.bucket}/bench-safetensors/repo/"
    for p in [*repo, repo[0].parent / "model.safetensors.index.json"]:
        s3.upload(p, f"bench-safetensors/repo/{p.name}")
    specs = workload.split_specs(sd, world, rule="dim0")
    wants = workload.rank_digests(sd, specs, world)
    uris = [prefix + p.name for p in repo]
    out = []
    for loader, spec, env in (
        ("fastshard", {"uri": prefix, "opts": s3.opts()}, {}),
        ("runai", {"uris": uris}, sources.runai_env(s3)),
    ):
        full = {"loader": loader, "source": "tp", "shard_specs": specs, **spec}
        case = measure.Case("tp", loader, full, env=env, server_pid=s3.proc.pid)
        case.world_size, case.expect_ranks = world, wants
        out.append(case)
    return out


def _measure(args: argparse.Namespace, cases: list[str], skipped: dict[str, str]) -> Any:
    from .. import workload

    sd = workload.state_dict("uniform", args.size, args.seed)
    folder = args.scratch / f"uniform-{args.size // MiB}MiB"
    objects = workload.write_objects(sd, folder, ("safetensors",))
    # fastshard reads the very same .safetensors file.
    objects.paths["fastshard"] = objects["safetensors"]
    expect = {"tensors": workload.digest(sd), "object": workload.file_digest(objects["fastshard"])}
    loaders = deps.runnable(
        ["fastshard", "safetensors", "fastsafetensors", "runai", "ceiling"], skipped
    )
    repo = write_repo(sd, folder / "repo", args.shards) if "tp" in cases else []
    todo: list[measure.Case] = []
    if "file" in cases:
        todo += single_cases(sources.file_source(objects), loaders, expect)
    root = Path(tempfile.mkdtemp(prefix="servers-", dir=args.scratch))
    try:
        programs = sources.find_servers({"s3"} if {"s3", "tp"} & set(cases) else set(), skipped)
        with sources.local_servers(root, programs) as up:
            if "s3" in up and "s3" in cases:
                todo += single_cases(sources.s3_source(up["s3"], objects, "st"), loaders, expect)
            if "s3" in up and "tp" in cases:
                todo += [c for c in tp_cases(up["s3"], repo, sd, args) if c.loader in loaders]
            del sd
            gc.collect()
            print(f"\n## loaders ({len(todo)}), alternating order", flush=True)
            return measure.rounds(todo, args.runs, args.seed, warmup=args.warmup)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)


def verdicts(recs: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    by = {(r["source"], r["loader"]): r for r in recs}
    out = []
    for (source, peer), want in TARGETS.items():
        fs, ref = by.get((source, "fastshard")), by.get((source, peer))
        if fs and ref:
            label = f"[{source}] fastshard >= {want:.1f}x {peer}"
            out.append(report.verdict(label, fs["gbps_median"], ref["gbps_median"], want))
    out += [(f"[{r['source']}] {r['loader']} data equal", r["verified"]) for r in recs]
    return out


def run(args: argparse.Namespace) -> int:
    cases = [c for c in names(args.cases) if c in CASES]
    if not cases or args.runs < 1 or args.world_size < 1 or args.shards < 1:
        raise SystemExit(f"--cases from {', '.join(CASES)}; --runs, --shards, --world-size >= 1")
    args.scratch.mkdir(parents=True, exist_ok=True)
    skipped: dict[str, str] = {}
    info = machine.describe()
    print("# fastshard safetensors benchmark\n" + "\n".join(machine.header(info)), flush=True)
    results = _measure(args, cases, skipped)
    recs = report.records(results)
    checks = verdicts(recs)
    text = report.table(recs) + "\n\n" + "\n".join(report.verdict_lines(checks))
    meta = {"machine": info, "args": vars(args), "skipped": skipped, "targets": checks}
    report.write(args.out, recs, meta, text, results)
    print("\n" + text + f"\n\nwrote {args.out}")
    return report.exit_code(recs)
