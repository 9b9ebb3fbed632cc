"""fastshard demo: a ~1 GiB model written by the real tensorizer, loaded three ways.

1. Builds a seeded, Llama-shaped fp16 state dict of about --size-gib GiB.
2. Writes it with tensorizer's TensorSerializer (model.tensors) and, once, with
   safetensors' save_file (model.safetensors), into a scratch folder (.bench/demo).
3. Loads it with fastshard.load_state_dict, with tensorizer's TensorDeserializer(device="cpu")
   (every tensor materialised) and with safetensors' load_file + clone() of every tensor,
   each load in a fresh Python process (as a model is loaded in real life): one warm-up load
   per loader, which also checks what it returned against the source bit for bit, then
   --rounds rounds in which the loaders take turns.
4. Prints GB/s per loader and fastshard's speed relative to each.

Exits non-zero when what fastshard loaded differs from the source in any bit.
benches/bench_local.py is the fuller benchmark (more cases and loaders, memory targets).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benches"))

from loaders import describe, run_child  # noqa: E402
from workloads import (  # noqa: E402
    SCRATCH,
    GiB,
    MiB,
    StateDict,
    digest,
    model_like_state_dict,
    total_bytes,
    write_safetensors,
    write_tensorizer,
)


class LocalStore:
    """Where the demo's files live: a local folder. ``put`` writes, ``uri`` names a file.

    A store backed by a local S3 server will offer the same two methods, so the rest of
    the demo (loaders take a URI) stays as it is.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def uri(self, name: str) -> str:
        return str(self.root / name)

    def put(self, name: str, writer: Callable[[StateDict, Path], str], sd: StateDict) -> str:
        path = self.root / name
        path.unlink(missing_ok=True)
        start = time.perf_counter()
        who = writer(sd, path)
        secs = time.perf_counter() - start
        size = path.stat().st_size
        print(f"  wrote {path} ({size / MiB:,.0f} MiB) with {who} in {secs:.1f} s")
        return self.uri(name)


@dataclass
class Contender:
    name: str  # a loader in benches/loaders.py
    uri: str
    runs: list[dict] = field(default_factory=list)
    equal: bool | None = None


def run(contenders: list[Contender], source_digest: str, rounds: int, no_thp: bool) -> None:
    for rnd in range(1 + rounds):
        shift = rnd % len(contenders)
        for c in contenders[shift:] + contenders[:shift]:
            res = run_child(c.name, c.uri, want_digest=rnd == 0, no_thp=no_thp)
            if rnd == 0:
                c.equal = res["digest"] == source_digest
                label = "warm-up"
            else:
                c.runs.append(res)
                label = f"run {rnd}/{rounds}"
            gbps = res["bytes"] / res["seconds"] / 1e9
            print(f"  {label:>9} {c.name:<12} {res['seconds']:6.3f} s {gbps:6.2f} GB/s", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--size-gib", type=float, default=1.0, help="model size (default 1 GiB)")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds after the warm-up")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scratch", type=Path, default=SCRATCH / "demo")
    p.add_argument(
        "--no-thp", action="store_true", help="disable transparent huge pages in the loaders"
    )
    args = p.parse_args(argv)

    import fastshard

    print(f"fastshard {fastshard.__version__}, torch {torch.__version__}")
    print(f"\nbuilding a ~{args.size_gib:g} GiB Llama-shaped fp16 state dict (seed {args.seed})")
    start = time.perf_counter()
    source = model_like_state_dict(int(args.size_gib * GiB), seed=args.seed)
    model_bytes = total_bytes(source)
    print(
        f"  {len(source)} tensors, {model_bytes / GiB:.3f} GiB ({model_bytes / 1e9:.3f} GB) "
        f"in {time.perf_counter() - start:.1f} s"
    )

    store = LocalStore(args.scratch)
    print("\nwriting")
    tensors_uri = store.put("model.tensors", write_tensorizer, source)
    safetensors_uri = store.put("model.safetensors", write_safetensors, source)

    source_digest = digest(source)
    del source
    gc.collect()

    contenders = [
        Contender("fastshard", tensors_uri),
        Contender("tensorizer", tensors_uri),
        Contender("safetensors", safetensors_uri),
    ]
    print(f"\nloading: each load in a fresh process; 1 warm-up + {args.rounds} rounds")
    run(contenders, source_digest, args.rounds, args.no_thp)

    with fastshard.open(tensors_uri) as f:
        f.load_state_dict()
        st = f.stats
    print(
        f"\nfastshard.open(...).stats after one more load in this process: "
        f"{st.bytes_fetched:,} bytes in {st.requests} reads, concurrency {st.concurrency}, "
        f"{st.seconds:.3f} s, {st.gbps:.2f} GB/s"
    )

    def median(c: Contender, key: str) -> float:
        return statistics.median(r[key] for r in c.runs)

    fs = median(contenders[0], "seconds")
    print(f"\n### {model_bytes / 1e9:.2f} GB model written by tensorizer, local file, warm cache\n")
    print(
        "| loader | file | median s | GB/s | fastshard / loader (speed) | peak RSS growth (MiB) "
        "| data equal to source |"
    )
    print("|---|---|---:|---:|---:|---:|---|")
    for c in contenders:
        med = median(c, "seconds")
        gbps = model_bytes / med / 1e9
        growth = max(r["peak_rss"] - r["rss_before"] for r in c.runs)
        print(
            f"| {describe(c.name)} | {Path(c.uri).name} | {med:.3f} | {gbps:.2f} "
            f"| {med / fs:.2f}x | {growth / MiB:,.0f} | {'yes' if c.equal else 'NO'} |"
        )
    print(
        "\nGB/s = 10^9 bytes/s; fastshard / loader = the loader's median time / fastshard's; "
        "peak RSS growth = the loading process's peak RSS during the load minus its RSS before."
    )
    if not contenders[0].equal:
        print("error: fastshard's state dict differs from the source", file=sys.stderr)
        return 1
    print("fastshard's state dict equals the source, bit for bit.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
