"""fastshard demo: a ~1 GiB model written by the real tensorizer, loaded three ways.

1. Builds a seeded, Llama-shaped fp16 state dict of about --size-gib GiB.
2. Writes it with tensorizer's TensorSerializer (model.tensors) and with safetensors'
   save_file (model.safetensors) into a scratch folder (.bench/demo).
3. Loads it with fastshard, with tensorizer's TensorDeserializer(device="cpu") (every tensor
   materialised) and with safetensors' load_file + clone() of every tensor, each load in a
   fresh Python process (as a model is loaded in real life): one warm-up load per loader,
   then --rounds rounds in alternating order, every load checked bit for bit against the
   source.
4. Prints GB/s per loader and fastshard's speed relative to each.

Exits non-zero when what any loader returned differs from the source in any bit.
The benchmark lab (python -m fastshard_lab --preset local) measures more cases and loaders.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

import fastshard
from fastshard_lab import loaders, measure, report, workload
from fastshard_lab.params import BENCH_DIR, GiB, MiB

ORDER = ("fastshard", "tensorizer", "safetensors")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--size-gib", type=float, default=1.0, help="model size (default 1 GiB)")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds after the warm-up")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scratch", type=Path, default=BENCH_DIR / "demo")
    p.add_argument(
        "--no-thp", action="store_true", help="disable transparent huge pages in the loaders"
    )
    args = p.parse_args(argv)

    print(f"fastshard {fastshard.__version__}, torch {torch.__version__}")
    print(f"\nbuilding a ~{args.size_gib:g} GiB Llama-shaped fp16 state dict (seed {args.seed})")
    start = time.perf_counter()
    sd = workload.state_dict("llm", int(args.size_gib * GiB), args.seed)
    model_bytes = workload.total_bytes(sd)
    print(
        f"  {len(sd)} tensors, {model_bytes / GiB:.3f} GiB in {time.perf_counter() - start:.1f} s"
    )
    print("\nwriting")
    objects = workload.write_objects(sd, args.scratch, ("tensorizer", "safetensors"))
    expect = workload.digest(sd)
    del sd
    gc.collect()

    files = {"fastshard": objects["tensorizer"], **objects.paths}
    cases = [
        measure.Case("file", name, {"loader": name, "uri": str(files[name]),
                                    "path": str(files[name]), "no_thp": args.no_thp}, expect)
        for name in ORDER
    ]  # fmt: skip
    print(f"\nloading: each load in a fresh process; 1 warm-up + {args.rounds} rounds")
    recs = {r["loader"]: r for r in report.records(measure.rounds(cases, args.rounds, args.seed))}

    with fastshard.open(str(objects["tensorizer"])) as f:
        f.load_state_dict()
        st = f.stats
    print(
        f"\nfastshard.open(...).stats after one more load in this process: "
        f"{st.bytes_fetched:,} bytes in {st.requests} reads, concurrency {st.concurrency}, "
        f"{st.seconds:.3f} s, {st.gbps:.2f} GB/s"
    )
    fs = recs["fastshard"]["seconds_median"]
    print(f"\n### {model_bytes / 1e9:.2f} GB model written by tensorizer, local file, warm cache\n")
    print("| loader | file | median s | GB/s | fastshard / loader (speed) | peak RSS growth (MiB) "
          "| data equal to source |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---|")
    for name in ORDER:
        r = recs[name]
        print(
            f"| {loaders.DESCRIBE[name]} | {files[name].name} | {r['seconds_median']:.3f} "
            f"| {r['gbps_median']:.2f} | {r['seconds_median'] / fs:.2f}x "
            f"| {r['rss_growth_bytes'] / MiB:,.0f} | {'yes' if r['verified'] else 'NO'} |"
        )
    print(
        "\nGB/s = 10^9 bytes/s; fastshard / loader = the loader's median time / fastshard's; "
        "peak RSS growth = the loading process's peak RSS during the load minus its RSS before."
    )
    if report.exit_code(list(recs.values())):
        return 1
    print("Every loader's state dict equals the source, bit for bit.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
