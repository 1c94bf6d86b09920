"""TLS's cost: ``GetAssignments`` and data-plane writes with mutual TLS against plaintext, in one
run (design/deployment.md, "What TLS costs").

    .venv/bin/python bench/tls_bench.py [--rounds 2] [--seconds 10] [--writers 16]
        [--readers 4] [--partitions 64] [--out bench/results/tls.md]

    .venv/bin/python bench/tls_bench.py --quick       # one round of 3 s windows

Each round starts two clusters one after the other — plaintext (``placectl up --insecure``),
then secure (``placectl up``: mutual TLS on every gRPC call, etcd over TLS with auth on) — the
way ``placectl up`` starts them (``placement.local.cluster``: etcd, one driver, three agents),
so a drift of the machine's speed hits both modes alike. In each: zone ``bench`` of
``--partitions`` × 3 replicas; once every partition took a write,

1. **reads**: ``--readers`` callers each list the whole zone with ``GetAssignments`` (every
   page) in a loop for ``--seconds``: listings per second, and p50/p99 of one listing;
2. **writes**: ``--writers`` writers, one 100-byte ``put`` in flight each, through the routing
   ``DataClient`` for ``--seconds``: acknowledged writes per second, p50/p99;
3. the CPU seconds every process used in each window.

Ratios compare the two modes of one round. Writes the results (``--out``) and prints them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
for extra in (str(ROOT), str(ROOT / "bench")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

from data_plane_bench import cpu_seconds, load, machine  # noqa: E402

from placement.api.client import PlacementClient  # noqa: E402
from placement.data.client import DataClient  # noqa: E402
from placement.data.partitioning import partition_of  # noqa: E402
from placement.local.cluster import Cluster, UpOptions, start_cluster, wait_ready  # noqa: E402
from placement.v1 import driver_pb2  # noqa: E402

ZONE = "bench"


@dataclass
class Window:
    """One measured window: operations, their latencies (s) and CPU seconds per process."""

    ops: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def cpu_per_op_ms(self) -> float:
        return 1000 * sum(self.cpu.values()) / self.ops if self.ops else float("nan")


@dataclass
class ModeResult:
    mode: str
    reads: Window
    writes: Window


def _processes(cluster: Cluster) -> dict[str, psutil.Process]:
    procs = {c.name: psutil.Process(c.proc.pid) for c in cluster.children if c.proc}
    procs["bench"] = psutil.Process()
    return procs


async def _measure(cluster: Cluster, seconds: float, workers: int, op: object) -> Window:
    """Run ``workers`` copies of ``op()`` back to back for ``seconds``."""
    window = Window()
    procs = _processes(cluster)
    before = {name: cpu_seconds(p) for name, p in procs.items()}
    began = time.monotonic()
    stop_at = began + seconds

    async def worker(i: int) -> None:
        n = 0
        while time.monotonic() < stop_at:
            start = time.monotonic()
            await op(i, n)  # type: ignore[operator]
            window.latencies.append(time.monotonic() - start)
            window.ops += 1
            n += 1

    await asyncio.gather(*(worker(i) for i in range(workers)))
    window.seconds = time.monotonic() - began
    window.cpu = {name: cpu_seconds(p) - before[name] for name, p in procs.items()}
    return window


async def _bench_mode(args: argparse.Namespace, secure: bool, base: Path) -> ModeResult:
    mode = "TLS" if secure else "plaintext"
    opts = UpOptions(nodes=3, drivers=1, data_dir=base, api_port=0, live=False, insecure=not secure)
    cluster = start_cluster(opts, base, Console(quiet=True))
    try:
        await wait_ready(cluster, opts, demo_zone=False)
        async with (
            PlacementClient(cluster.driver_apis, deadline=30.0, tls=cluster.tls("reader")) as api,
            PlacementClient(cluster.driver_apis, deadline=30.0, tls=cluster.tls("admin")) as adm,
            DataClient(cluster.driver_apis, deadline=30.0, tls=cluster.tls("client")) as data,
        ):
            config = driver_pb2.ZoneConfig(partitions=args.partitions, replicas=3)
            request = driver_pb2.CreateZoneRequest(name=ZONE, config=config)
            await adm.call(lambda s, t: s.CreateZone(request, timeout=t))
            await _until_serving(data, args.partitions)

            async def list_zone(i: int, n: int) -> None:
                token = ""
                while True:
                    page_request = driver_pb2.GetAssignmentsRequest(zone=ZONE, page_token=token)
                    page = await api.call(
                        lambda s, t, r=page_request: s.GetAssignments(r, timeout=t)  # type: ignore[misc]
                    )
                    token = page.next_page_token
                    if not token:
                        return

            value = os.urandom(100)

            async def put(i: int, n: int) -> None:
                await data.put(ZONE, b"w%d-%d" % (i, n % 1000), value)

            await _measure(cluster, 2.0, args.writers, put)  # warm-up: channels, primaries
            reads = await _measure(cluster, args.seconds, args.readers, list_zone)
            writes = await _measure(cluster, args.seconds, args.writers, put)
    finally:
        cluster.stop()
    print(
        f"  {mode}: {reads.rate:.1f} listings/s (p50 {reads.pct(0.5):.1f} ms), "
        f"{writes.rate:.0f} writes/s (p50 {writes.pct(0.5):.1f} ms, p99 {writes.pct(0.99):.1f} ms)",
        flush=True,
    )
    return ModeResult(mode, reads, writes)


async def _until_serving(data: DataClient, partitions: int) -> None:
    keys: dict[int, bytes] = {}
    i = 0
    while len(keys) < partitions:
        keys.setdefault(partition_of(b"probe-%d" % i, partitions), b"probe-%d" % i)
        i += 1
    for key in keys.values():
        await data.put(ZONE, key, b"ready")


def _report(args: argparse.Namespace, rounds: list[tuple[ModeResult, ModeResult]]) -> str:
    lines = [
        "# TLS against plaintext (bench/tls_bench.py)",
        "",
        f"Command: `.venv/bin/python bench/tls_bench.py --rounds {args.rounds} --seconds "
        f"{args.seconds:g} --writers {args.writers} --readers {args.readers} --partitions "
        f"{args.partitions}`",
        "",
        *machine(),
        f"- load before the run: `{args.load}`",
        "",
        "Each round: a plaintext cluster, then a secure one (mutual TLS on every gRPC call, "
        "etcd over TLS with auth on), each etcd + 1 driver + 3 agents as `placectl up` starts "
        f"them; zone of {args.partitions} partitions × 3 replicas. Reads: `GetAssignments` "
        f"listings of the whole zone by {args.readers} callers; writes: 100-byte puts by "
        f"{args.writers} writers through the routing client. CPU: every process's, per "
        "operation.",
        "",
        "| round | mode | listings/s | listing p50 / p99 ms | CPU ms per listing | writes/s "
        "| write p50 / p99 ms | CPU ms per write |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, pair in enumerate(rounds, 1):
        for r in pair:
            lines.append(
                f"| {n} | {r.mode} | {r.reads.rate:.1f} | {r.reads.pct(0.5):.1f} / "
                f"{r.reads.pct(0.99):.1f} | {r.reads.cpu_per_op_ms:.1f} | {r.writes.rate:.0f} | "
                f"{r.writes.pct(0.5):.1f} / {r.writes.pct(0.99):.1f} | "
                f"{r.writes.cpu_per_op_ms:.2f} |"
            )
    lines += ["", "TLS ÷ plaintext, per round (same round, same machine state):", ""]
    for n, (plain, tls) in enumerate(rounds, 1):
        lines.append(
            f"- round {n}: listings/s ×{tls.reads.rate / plain.reads.rate:.2f}, "
            f"writes/s ×{tls.writes.rate / plain.writes.rate:.2f}, write p50 "
            f"×{tls.writes.pct(0.5) / plain.writes.pct(0.5):.2f}, CPU per write "
            f"×{tls.writes.cpu_per_op_ms / plain.writes.cpu_per_op_ms:.2f}"
        )
    write_cpu = statistics.mean(t.writes.cpu_per_op_ms / p.writes.cpu_per_op_ms for p, t in rounds)
    lines += ["", f"Mean CPU-per-write ratio over the rounds: ×{write_cpu:.2f}.", ""]
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> list[tuple[ModeResult, ModeResult]]:
    base = Path(tempfile.mkdtemp(prefix="tls-bench-"))
    rounds = []
    for n in range(args.rounds):
        print(f"round {n + 1}", flush=True)
        plain = await _bench_mode(args, False, base / f"r{n}-plain")
        tls = await _bench_mode(args, True, base / f"r{n}-tls")
        rounds.append((plain, tls))
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--out", default="bench/results/tls.md")
    parser.add_argument("--quick", action="store_true", help="1 round of 3 s windows")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 3.0
        args.out = args.out if args.out != "bench/results/tls.md" else ""
    args.load = load()
    text = _report(args, asyncio.run(main_async(args)))
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
