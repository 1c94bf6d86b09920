"""Reads benchmark (issue 14, "reads from memory"): GetAssignments of a whole zone through the
API against a direct etcd read of the same keys from the same client process.

One run::

    .venv/bin/python bench/read_bench.py [--partitions 1000] [--calls 60] [--concurrency 8]

Starts a cluster as ``placectl up`` does (etcd, one driver, 3 agents, mutual TLS; secure by
default), creates zone ``bench`` (P partitions × 3 replicas), waits for READY, then times, at 1
and at ``--concurrency`` calls in flight:

* ``GetAssignments`` of the whole zone through the API (``PlacementClient``, pages of 1000) —
  answered from the driver's read cache;
* the same with ``read.linearizable`` (the driver asks etcd for its revision, then answers from
  the cache once it has applied it) — skipped on a tree without read options;
* a direct etcd read of the same keys (the assignment range and the primary range in one read-only
  transaction, decoded as the API decodes them): what the API did before the cache.

Appends the table, the command, the machine and its load to ``bench/results/reads.md`` (``--out``)
and prints it. Run it on the tree before and after a change for a before → after.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from control_plane_bench import (  # noqa: E402
    ZONE,
    Throughput,
    direct_txn,
    get_all_assignments,
    load,
    machine,
    run_calls,
    tree_state,
)
from rich.console import Console  # noqa: E402

from placement.api.client import PlacementClient  # noqa: E402
from placement.local.cluster import UpOptions, start_cluster, wait_ready  # noqa: E402
from placement.metastore.etcd import EtcdClient  # noqa: E402
from placement.metastore.keys import KeySpace  # noqa: E402
from placement.v1 import driver_pb2  # noqa: E402


async def linearizable_assignments(api: PlacementClient) -> int:
    token, count = "", 0
    while True:
        request = driver_pb2.GetAssignmentsRequest(
            zone=ZONE,
            page_token=token,
            read=driver_pb2.ReadOptions(linearizable=True),  # type: ignore[attr-defined]
        )
        page = await api.call(lambda s, t, r=request: s.GetAssignments(r, timeout=t))  # type: ignore[misc]
        count += len(page.assignments)
        token = page.next_page_token
        if not token:
            return count


async def wait_zone_ready(api: PlacementClient, partitions: int, within: float) -> None:
    deadline = time.monotonic() + within
    request = driver_pb2.GetZoneRequest(name=ZONE)
    while True:
        status = await api.call(lambda s, t: s.GetZoneStatus(request, timeout=t))
        if status.state == driver_pb2.READY and status.partitions_done == partitions:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"zone not READY after {within:.0f}s: {status}")
        await asyncio.sleep(1.0)


async def measure(args: argparse.Namespace, workdir: Path) -> list[Throughput]:
    opts = UpOptions(nodes=3, drivers=1, api_port=0)
    cluster = start_cluster(opts, workdir, Console(quiet=True))
    try:
        await wait_ready(cluster, opts, demo_zone=False)
        tls = cluster.tls()
        async with (
            PlacementClient(cluster.driver_apis, tls=tls) as api,
            EtcdClient([cluster.etcd_endpoint], credentials=cluster.etcd_credentials()) as etcd,
        ):
            config = driver_pb2.ZoneConfig(partitions=args.partitions, replicas=3)
            create = driver_pb2.CreateZoneRequest(name=ZONE, config=config)
            await api.call(lambda s, t: s.CreateZone(create, timeout=t))
            await wait_zone_ready(api, args.partitions, 600)
            await asyncio.sleep(args.settle)
            keys = KeySpace(cluster.prefix)
            variants = [
                ("API GetAssignments (gRPC → driver)", lambda: get_all_assignments(api)),
                (
                    "direct etcd txn (assign + primary ranges) + decode",
                    lambda: direct_txn(etcd, keys, args.partitions),
                ),
            ]
            if hasattr(driver_pb2, "ReadOptions"):
                variants.insert(
                    1,
                    ("API GetAssignments, linearizable", lambda: linearizable_assignments(api)),
                )
            out = []
            for concurrency in (1, args.concurrency):
                for name, call in variants:
                    out.append(await run_calls(name, call, args.calls, concurrency))
            return out
    finally:
        cluster.stop()


def report(rows: list[Throughput], args: argparse.Namespace, before: str) -> str:
    direct = {r.concurrency: r for r in rows if r.name.startswith("direct")}
    lines = [
        f"## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} — {tree_state()}",
        "",
        f"Command: `.venv/bin/python bench/read_bench.py --partitions {args.partitions}"
        f" --calls {args.calls} --concurrency {args.concurrency}`",
        "",
        f"Zone of {args.partitions} partitions × 3 replicas, READY, 1 driver, 3 agents, mutual "
        "TLS; each call reads the whole zone (every partition's stable/pending/planned and "
        "primary lease).",
        "",
        "| read | in flight | calls/s | partitions/s | × direct etcd |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r.calls_per_s / direct[r.concurrency].calls_per_s
        lines.append(
            f"| {r.name} | {r.concurrency} | {r.calls_per_s:.1f} | {r.partitions_per_s:,.0f}"
            f" | {ratio:.2f} |"
        )
    cpu, python = machine()
    lines += [
        "",
        f"Machine: Python {python}; load before: `{before}`",
        "",
        "```",
        cpu,
        "```",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=60, help="calls per row")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after READY")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "reads.md")
    args = parser.parse_args()
    before = load()
    with tempfile.TemporaryDirectory(prefix="read-bench-") as tmp:
        rows = asyncio.run(measure(args, Path(tmp)))
    text = report(rows, args, before)
    print(text)
    existing = args.out.read_text() if args.out.exists() else "# Reads: API vs direct etcd\n\n"
    args.out.write_text(existing + text + "\n")


if __name__ == "__main__":
    main()
