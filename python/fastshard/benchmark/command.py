"""``fastshard bench URI [URI ...]``: load the user's own objects with
fastshard and every other loader that can read them here, in rounds whose
order alternates, check that they all got the same tensors, and print one
row per loader: GB/s, seconds and client CPU seconds (medians over the
rounds), and whether its data agree with fastshard's.

Torch is imported when the run starts, not at ``--help``.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from . import loaders
from .report import Row, plot, table

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
GiB = 1 << 30
EXIT_OK, EXIT_MISMATCH, EXIT_ERROR = 0, 1, 2
DESCRIPTION = (
    "Load your own objects with fastshard and every other loader that can read them here, in "
    "rounds whose order alternates, check that they all got the same tensors, and print one "
    "row per loader: GB/s, seconds and client CPU seconds (medians over the rounds), and "
    "whether its data agree with fastshard's. S3 objects use the AWS environment "
    "(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_PROFILE) for "
    "every loader; a loader whose package is not installed, or that cannot read that format "
    "or store, gets a row saying so. The loaders: "
    + "; ".join(f"{k}: {v}" for k, v in loaders.DESCRIBE.items())
    + "."
)

# What `fastshard bench --preset NAME` says since the presets (with the
# servers they start) left the wheel for the development lab in benches/.
PRESETS_MOVED = (
    "fastshard bench: --preset moved to the development lab: in a fastshard checkout, after "
    "`make setup`, run `python -m fastshard_lab --preset NAME`; `fastshard bench URI [URI ...]` "
    "measures your own objects"
)


def asks_for_a_preset(argv: Sequence[str]) -> bool:
    """Whether ``argv`` (the command line after ``fastshard``) is ``bench``
    with a ``--preset`` option, as the lab's presets were run before they
    left the wheel."""
    return (
        bool(argv)
        and argv[0] == "bench"
        and any(a == "--preset" or a.startswith("--preset=") for a in argv[1:])
    )


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "bench",
        help="measure how fast your own objects load, fastshard against the other loaders",
        description=DESCRIPTION,
    )
    p.add_argument(
        "uris", nargs="+", metavar="URI", help="a local path, s3://, gs:// or http(s)://"
    )
    p.add_argument("--repeat", type=int, default=1, help="rounds of every loader (default 1)")
    p.add_argument(
        "--loaders",
        default=",".join(loaders.LOADERS),
        help=f"comma-separated subset of {','.join(loaders.LOADERS)} (default: all)",
    )
    p.add_argument(
        "--plot", default="fastshard-bench.png", help="where the plot goes (PNG; needs matplotlib)"
    )
    p.add_argument("--no-plot", action="store_true", help="write no plot")
    p.add_argument(
        "--progress",
        action="store_true",
        help="show a progress bar (default: on a terminal, when the run reads 1 GiB or more)",
    )
    p.set_defaults(func=run)


@dataclass
class Target:
    """One URI, as fastshard's open saw it (off the clock)."""

    uri: str
    size: int
    encrypted: bool
    single_file: bool
    offsets: dict[str, tuple[int, int]]  # name → (data offset, bytes)


@dataclass
class Outcome:
    loader: str
    seconds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    skipped: str = ""
    failed: str = ""
    mismatch: str = ""
    checked: bool = False


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _target(uri: str) -> Target:
    import fastshard

    with fastshard.open(uri) as f:
        offsets = {i.name: (i.offset, i.nbytes) for i in f.infos() if not i.meta}
        return Target(uri, f.file_size, f.encrypted, f.checkpoint is None, offsets)


def _digest(data: Any) -> str:
    return hashlib.sha256(data).hexdigest()


def _digests(loaded: Any) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """name → (dtype, shape, SHA-256 of its bytes) of a state dict."""
    import torch

    out = {}
    for name, t in loaded.items():
        flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
        out[name] = (str(t.dtype), tuple(t.shape), _digest(flat.numpy()))
    return out


def _compare(loaded: Any, ref: dict[str, Any], target: Target, raw: bool) -> str:
    """ "" when ``loaded`` holds fastshard's tensors bit for bit, else what differs."""
    if raw:
        if target.encrypted:
            return ""  # the raw bytes are ciphertext: nothing to compare
        view = memoryview(loaded)
        for name, (offset, nbytes) in target.offsets.items():
            if name in ref and _digest(view[offset : offset + nbytes]) != ref[name][2]:
                return f"{name}: bytes at offset {offset} differ"
        return ""
    got = _digests(loaded)
    if set(got) != set(ref):
        return f"names differ ({len(got)} tensors, fastshard {len(ref)})"
    for name, want in ref.items():
        if got[name] != want:
            return f"{name}: {got[name][:2]} differs from fastshard's {want[:2]} or its bytes do"
    return ""


class Run:
    """Rounds of every loader over every target, with digests to compare."""

    def __init__(self, targets: list[Target], names: list[str], bar: Any) -> None:
        self.targets = targets
        self.bar = bar
        self.refs: dict[str, dict[str, Any]] = {}
        self.outcomes = {n: Outcome(n) for n in names}
        for name, out in self.outcomes.items():
            for t in targets:
                why = "a checkpoint directory" if not t.single_file else loaders.plan(name, t.uri)
                if name != "fastshard" and why:
                    out.skipped = why
                    break

    def round(self, order: list[str]) -> None:
        for name in order:
            out = self.outcomes[name]
            if out.skipped or out.failed:
                if self.bar is not None:
                    self.bar.update(sum(t.size for t in self.targets))
                continue
            try:
                self._one(out)
            except Exception as e:  # noqa: BLE001 (a peer's failure is its row, not the run's)
                if name == "fastshard":
                    raise
                out.failed = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"

    def _one(self, out: Outcome) -> None:
        seconds = cpu = 0.0
        for t in self.targets:
            load = loaders.prepare(out.loader, t.uri)
            gc.collect()
            c0, w0 = _cpu(), time.perf_counter()
            loaded = load()
            seconds += time.perf_counter() - w0
            cpu += _cpu() - c0
            if out.loader == "fastshard" and t.uri not in self.refs:
                self.refs[t.uri] = _digests(loaded)
            elif not out.checked:
                why = _compare(loaded, self.refs[t.uri], t, out.loader == "raw")
                out.mismatch = out.mismatch or (f"{t.uri}: {why}" if why else "")
            del loaded
            if self.bar is not None:
                self.bar.update(t.size)
        out.checked = True
        out.seconds.append(seconds)
        out.cpu.append(cpu)


def _rows(run: Run, total: int) -> list[Row]:
    rows = []
    for out in run.outcomes.values():
        if out.seconds and not out.failed:
            sec = statistics.median(out.seconds)
            verified = "reference" if out.loader == "fastshard" else "yes"
            if out.mismatch:
                verified = f"NO: {out.mismatch}"
            rows.append(
                Row(out.loader, total / sec / 1e9, sec, statistics.median(out.cpu), verified)
            )
        else:
            rows.append(Row(out.loader, None, None, None, out.failed and f"failed: {out.failed}"
                            or f"skipped: {out.skipped}"))  # fmt: skip
    return rows


def _bar(args: argparse.Namespace, total: int) -> Any:
    if not (args.progress or (total >= GiB and sys.stderr.isatty())):
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1000, desc="bench",
                dynamic_ncols=True, leave=False)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    names = [n for n in args.loaders.split(",") if n]
    unknown = [n for n in names if n not in loaders.LOADERS]
    if unknown:
        known = ", ".join(loaders.LOADERS)
        print(
            f"fastshard bench: unknown loader {', '.join(unknown)} (known: {known})",
            file=sys.stderr,
        )
        return EXIT_ERROR
    if args.repeat < 1:
        print("fastshard bench: --repeat must be at least 1", file=sys.stderr)
        return EXIT_ERROR
    try:
        import torch  # noqa: F401
    except ImportError:
        print("fastshard bench: needs torch (pip install torch)", file=sys.stderr)
        return EXIT_ERROR
    names = ["fastshard"] + [n for n in names if n != "fastshard"]  # the reference
    targets = [_target(u) for u in args.uris]
    size = sum(t.size for t in targets)
    bar = _bar(args, size * len(names) * args.repeat)
    bench = Run(targets, names, bar)
    try:
        for i in range(args.repeat):
            # fastshard first in round one (the reference); the order turns after.
            order = names if i == 0 else names[i % len(names) :] + names[: i % len(names)]
            bench.round(order)
    finally:
        if bar is not None:
            bar.close()
    rows = _rows(bench, size)
    print(f"fastshard bench: {len(targets)} object(s), {size / 1e9:.3f} GB, {args.repeat} round(s)")
    print(table(rows))
    if not args.no_plot:
        print(plot(rows, args.plot, f"{len(targets)} object(s), {size / 1e9:.3f} GB"))
    return EXIT_MISMATCH if any(r.verified.startswith("NO") for r in rows) else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fastshard")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))
