"""A throughput model for loading from an object store over a real network.

One request of a part of P bytes costs the store's first-byte latency L and
then P / b at the per-connection bandwidth b, so one connection delivers
r = P / (L + P / b). A node whose NIC carries R needs N = R / r requests in
flight; those hold R * (L + P / b) bytes in flight (bandwidth x latency:
the floor of the host memory a load needs when parts are staged rather than
streamed into place), and ask the store for R / P requests a second.

    python -m fastshard_lab --preset network-model [--latency-ms 50] [--conn-mbps 90]
        [--part-mib 16]

prints the table for a node of 8 GPUs with a 100, 200 and 400 Gb/s NIC and
70B / 405B models in bf16 and fp8 (each byte fetched once per node: tensor
parallelism over 8 ranks gives each rank 1/8). It loads nothing. The
network preset feeds it the rate and latency of the shaping proxy and sets
it beside what the loads achieved.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

MiB = 1 << 20
MODELS = {  # name -> parameters
    "70B": 70e9,
    "405B": 405e9,
}
DTYPES = {"bf16": 2, "fp8": 1}
NICS_GBPS = (100, 200, 400)
GPUS = 8
# S3 serves ~5,500 GET/s per prefix before it answers 503 SlowDown.
S3_GETS_PER_PREFIX = 5500


@dataclass
class Link:
    latency_s: float  # first byte, per request
    conn_bytes_s: float  # bandwidth of one connection
    part_bytes: int

    def per_request_rate(self) -> float:
        """Bytes a second one connection delivers, latency included."""
        p = self.part_bytes
        return p / (self.latency_s + p / self.conn_bytes_s)

    def in_flight(self, node_bytes_s: float) -> int:
        return math.ceil(node_bytes_s / self.per_request_rate())

    def in_flight_bytes(self, node_bytes_s: float) -> float:
        return node_bytes_s * (self.latency_s + self.part_bytes / self.conn_bytes_s)


def rows(link: Link) -> list[dict[str, object]]:
    out = []
    for nic in NICS_GBPS:
        rate = nic * 1e9 / 8
        n = link.in_flight(rate)
        for model, params in MODELS.items():
            for dtype, width in DTYPES.items():
                size = params * width
                out.append(
                    {
                        "nic_gbps": nic,
                        "model": f"{model} {dtype}",
                        "gb": size / 1e9,
                        "in_flight_node": n,
                        "in_flight_rank": math.ceil(n / GPUS),
                        "in_flight_gib": link.in_flight_bytes(rate) / (1 << 30),
                        "gets_per_s": rate / link.part_bytes,
                        "seconds": size / rate + link.latency_s,
                    }
                )
    return out


def table(link: Link) -> str:
    lines = [
        f"Link: first byte {link.latency_s * 1e3:.0f} ms, {link.conn_bytes_s / 1e6:.0f} MB/s "
        f"per connection, {link.part_bytes / MiB:.0f} MiB parts: "
        f"{link.per_request_rate() / 1e6:.0f} MB/s per request in flight",
        "",
        "| NIC | model | size | in flight (node / rank) | in-flight memory | GET/s | load time |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows(link):
        lines.append(
            f"| {r['nic_gbps']} Gb/s | {r['model']} | {r['gb']:.0f} GB "
            f"| {r['in_flight_node']} / {r['in_flight_rank']} | {r['in_flight_gib']:.1f} GiB "
            f"| {r['gets_per_s']:.0f} | {r['seconds']:.1f} s |"
        )
    over = [r for r in rows(link) if float(r["gets_per_s"]) > S3_GETS_PER_PREFIX]  # type: ignore[arg-type]
    if over:
        lines.append(
            f"\nAbove {S3_GETS_PER_PREFIX} GET/s for one prefix S3 throttles: use larger parts."
        )
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--conn-mbps", type=float, default=90.0, help="MB/s per connection")
    p.add_argument("--part-mib", type=float, default=16.0)


def requires(args: argparse.Namespace) -> list[str]:
    return []


def run(a: argparse.Namespace) -> int:
    print(table(Link(a.latency_ms / 1e3, a.conn_mbps * 1e6, int(a.part_mib * MiB))))
    return 0
