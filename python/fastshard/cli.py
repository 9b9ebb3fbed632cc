"""``fastshard inspect``, ``fastshard verify``, ``fastshard bench``, and
``fastshard serve`` / ``fastshard serialize`` (fastshard/vllm/).

Uses the native reader directly (no torch import): inspecting or verifying a
file should start in milliseconds and work where torch is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from . import _native, packed, shard
from ._engine import progress as _progress
from ._layouts import hf as _hf
from .benchmark import command as bench_command
from .crypt import EncryptionKey, NativeKey
from .errors import FastshardError, FormatError, IntegrityError, InvalidArgumentError

# verify reuses one buffer of this size, so memory stays bounded whatever the
# file size (a single larger tensor gets a buffer of its own size).
VERIFY_BATCH_BYTES = 256 << 20
TYPES = {0: "param", 1: "buffer", 2: "state_dict"}

EXIT_OK, EXIT_MISMATCH, EXIT_ERROR = 0, 1, 2


def _nbytes(dtype: str, shape: Sequence[int]) -> int:
    n = _native.dtype_itemsize(dtype)
    for dim in shape:
        n *= dim
    return n


def _entries(reader: _native.Reader) -> list[dict[str, Any]]:
    out = []
    for name, path, ttype, dtype, shape, hoff, doff, dlen in reader.entries():
        out.append(
            {
                "name": name,
                "path": path,
                "tensor_type": TYPES.get(ttype, str(ttype)),
                "dtype": dtype,
                "shape": list(shape),
                "nbytes": _nbytes(dtype, shape),
                "stored_bytes": dlen,
                "header_offset": hoff,
                "offset": doff,
            }
        )
    return out


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _open(uri: str) -> _native.Reader:
    """The file at ``uri``, or every shard of the HF checkpoint there."""
    return _hf.open_reader(shard.resolve(uri, None, None), {})[0]


def cmd_inspect(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    reader = _open(args.uri)
    opened = time.perf_counter() - started
    tensors = _entries(reader)
    summary = {
        "uri": reader.uri,
        "format": reader.format,
        "version": reader.version,
        "file_size": reader.file_size,
        "encrypted": reader.encrypted,
        "metadata": dict(reader.metadata),
        "files": [{"uri": u, "size": size, "count": n} for u, size, n in reader.members()],
        "count": len(tensors),
        "tensor_bytes": sum(t["nbytes"] for t in tensors),
    }
    try:
        layout = packed.detect([t["name"] for t in tensors], uri=reader.uri)
        packed_line = packed.describe(layout) if layout else None
    except FormatError as err:  # still worth listing: that is how one finds the bad name
        layout, packed_line = None, f"packed: invalid: {err}"
    summary["packed"] = packed.summary(layout)
    if args.json:
        json.dump({**summary, "tensors": tensors}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return EXIT_OK
    kind = (
        f"tensorizer data version {reader.version}" if reader.version is not None else reader.format
    )
    print(
        f"{reader.uri}: {kind}, "
        f"{reader.file_size} bytes ({_human(reader.file_size)}), {len(tensors)} tensors, "
        f"{_human(summary['tensor_bytes'])} of tensor data"
        + (", encrypted" if reader.encrypted else "")
    )
    if packed_line:
        print(packed_line)
    if reader.metadata:
        print("metadata: " + ", ".join(f"{k}={v}" for k, v in reader.metadata))
    members = reader.members()
    if len(members) > 1:
        print(f"{len(members)} files: " + ", ".join(f"{u} ({n} tensors)" for u, _, n in members))
    rows = [("name", "dtype", "shape", "bytes", "offset")]
    for t in tensors:
        shape = "(" + ", ".join(str(d) for d in t["shape"]) + ")"
        rows.append((t["name"], t["dtype"], shape, str(t["nbytes"]), str(t["offset"])))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
    print(
        f"{len(tensors)} tensors, {_human(summary['tensor_bytes'])}; header and index: "
        f"{reader.discovery_bytes} bytes read in {opened:.3f} s"
    )
    return EXIT_OK


def _batches(sizes: list[int], limit: int) -> Iterator[list[int]]:
    batch: list[int] = []
    total = 0
    for i, size in enumerate(sizes):
        if batch and total + size > limit:
            yield batch
            batch, total = [], 0
        batch.append(i)
        total += size
    if batch:
        yield batch


def _verify(
    reader: _native.Reader,
    indices: list[int],
    sizes: list[int],
    pool: bytearray,
    progress: _native.Progress | None = None,
    key: NativeKey | None = None,
    hashes: bool = True,
) -> None:
    need = sum(sizes[i] for i in indices)
    mem = memoryview(pool if need <= len(pool) else bytearray(need))
    views = []
    pos = 0
    for i in indices:
        views.append(mem[pos : pos + sizes[i]])
        pos += sizes[i]
    reader.load(indices, views, verify_hash=hashes, progress=progress, encryption=key)


def _key(args: argparse.Namespace) -> NativeKey | None:
    """The key of ``--key-file`` or ``--passphrase-env``: never a command-line
    value, which other users of the machine could read in the process list."""
    if args.key_file:
        return EncryptionKey.from_file(args.key_file).native()
    if args.passphrase_env:
        value = os.environ.get(args.passphrase_env)
        if not value:
            raise InvalidArgumentError(f"environment variable {args.passphrase_env} is not set")
        return EncryptionKey.from_passphrase(value).native()
    return None


def cmd_verify(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    key = _key(args)
    reader = _open(args.uri)
    # Safetensors files store no hashes: reading every tensor through a
    # plain load still checks what can be checked, the header and index (on
    # open) and that every tensor's bytes are in the file and readable.
    hashes = reader.format != "safetensors"
    entries = reader.entries()
    sizes = [_nbytes(e[3], e[4]) for e in entries]
    pool = bytearray(min(args.batch_bytes, sum(sizes)))
    bad: list[IntegrityError] = []
    show = True if args.progress else None
    with _progress.Bar(reader.uri, sum(sizes), show) as bar:
        for batch in _batches(sizes, args.batch_bytes):
            try:
                _verify(reader, batch, sizes, pool, bar.counter, key, hashes)
            except IntegrityError as err:
                # A batch stops at its first mismatch; recheck its tensors
                # one by one so every bad tensor is reported.
                if len(batch) == 1:
                    bad.append(err)
                    continue
                for i in batch:
                    try:
                        _verify(reader, [i], sizes, pool, key=key)
                    except IntegrityError as one:
                        bad.append(one)
    seconds = time.perf_counter() - started
    for mismatch in bad:
        print(f"MISMATCH {mismatch}", file=sys.stderr)
    if bad:
        print(f"{reader.uri}: {len(bad)} of {len(entries)} tensors failed verification")
        return EXIT_MISMATCH
    rate = sum(sizes) / seconds / 1e9 if seconds > 0 else 0.0
    checked = (
        "hashes match"
        if hashes
        else f"{reader.format} files store no hashes, so structure and bounds were checked"
    )
    print(
        f"OK {reader.uri}: {len(entries)} tensors, {sum(sizes)} bytes, {checked} "
        f"({seconds:.2f} s, {rate:.2f} GB/s)"
    )
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastshard",
        description="Inspect, verify and benchmark .tensors and .safetensors files; serve "
        "them with vLLM.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="list the tensors in a file")
    p.add_argument("uri")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--progress",
        action="store_true",
        help="accepted for symmetry with verify: inspect reads only the header and index, "
        "and its last line says how many bytes that took and how long",
    )
    p.set_defaults(func=cmd_inspect)
    p = sub.add_parser(
        "verify",
        help="check every tensor's CRC32 and SHA-256 (safetensors, which stores no hashes: "
        "the structure and bounds)",
    )
    p.add_argument("uri")
    p.add_argument(
        "--batch-bytes",
        type=int,
        default=VERIFY_BATCH_BYTES,
        help="bytes of tensors read per batch (bounds memory; default 256 MiB)",
    )
    p.add_argument(
        "--progress",
        action="store_true",
        help="show a progress bar (default: only on a terminal, for files of 1 GiB or more)",
    )
    keys = p.add_mutually_exclusive_group()
    keys.add_argument(
        "--key-file",
        metavar="PATH",
        help="encrypted files: a file holding the raw 32-byte key (vLLM's encryption_keyfile)",
    )
    keys.add_argument(
        "--passphrase-env",
        metavar="VAR",
        help="encrypted files: the name of an environment variable holding the passphrase",
    )
    p.set_defaults(func=cmd_verify)
    bench_command.add_parser(sub)
    from .vllm import serialize_cli, serve  # import neither torch nor vLLM until run

    serve.add_parser(sub)
    serialize_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if bench_command.asks_for_a_preset(argv):
        print(bench_command.PRESETS_MOVED, file=sys.stderr)
        return EXIT_ERROR
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except BrokenPipeError:
        # `fastshard inspect … | head`: the reader left; that is not an error.
        # (Caught before OSError, of which it is a subclass.)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except IntegrityError as err:
        print(f"fastshard: {err}", file=sys.stderr)
        return EXIT_MISMATCH
    except (FastshardError, OSError) as err:
        print(f"fastshard: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
