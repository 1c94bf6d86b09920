"""The placement driver's cost at rest, alone: CPU and etcd writes of a READY zone, no agents.

    .venv/bin/python bench/driver_idle_bench.py [--partitions 1000] [--agents 5] [--replicas 3]
        [--window 30] [--settle 15] [--profile FILE]

``bench/idle_bench.py`` measures a whole cluster, whose real agents (and their ISR churn) load
the machine and wake the driver. This one isolates the driver: etcd and one driver as
subprocesses (``placement.local.cluster.launch`` with no agents), and in this process ``--agents``
fake agents — a ``ReplicaService`` that answers every Rebalance DONE, plus a registration under a
lease each. A zone of P×R is created through ``placectl``; once every partition has its primary
lease, each partition gets an in-sync set (= stable) and every replica a size key, as real agents
would write them. After ``--settle`` seconds nothing else writes for ``--window`` seconds, during
which it measures the driver's and etcd's CPU (``psutil``, % of one core), etcd write revisions
and the keys changed, by kind (a watch of the prefix). ``--profile FILE``: ``py-spy record`` of
the driver over the window (speedscope JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import psutil
from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from placement.local.cluster import Cluster, UpOptions, start_cluster  # noqa: E402
from placement.metastore.codec import (  # noqa: E402
    Assignment,
    InSyncSet,
    NodeRecord,
    PrimaryLease,
    ReplicaSize,
    decode_assignment,
    decode_primary,
    encode_isr,
    encode_size,
)
from placement.metastore.etcd import EtcdClient  # noqa: E402
from placement.metastore.keys import AssignField, KeySpace  # noqa: E402
from placement.v1 import replica_pb2, replica_pb2_grpc  # noqa: E402
from replica.registration import Registration  # noqa: E402

ZONE = "idle"


class FakeAgent(replica_pb2_grpc.ReplicaServiceServicer):
    """Answers like an agent whose every catch-up is already done."""

    def __init__(self) -> None:
        self.hosted: set[int] = set()
        self.calls = 0

    async def Rebalance(self, request: Any, context: Any) -> Any:
        self.calls += 1
        self.hosted.add(request.partition.partition)
        return replica_pb2.RebalanceResponse(
            outcome=replica_pb2.DONE,
            accepted_revision=request.revision,
            accepted_epoch=request.epoch,
        )

    async def CancelRebalance(self, request: Any, context: Any) -> Any:
        return replica_pb2.CancelRebalanceResponse(
            outcome=replica_pb2.CANCELLED,
            accepted_revision=request.revision,
            accepted_epoch=request.epoch,
        )

    async def GetPartitionState(self, request: Any, context: Any) -> Any:
        return replica_pb2.GetPartitionStateResponse(
            hosted=request.partition.partition in self.hosted
        )

    async def Retire(self, request: Any, context: Any) -> Any:
        self.hosted.discard(request.partition.partition)
        return replica_pb2.RetireResponse(
            outcome=replica_pb2.RETIRED,
            accepted_revision=request.revision,
            accepted_epoch=request.epoch,
        )


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def kind_of(keys: KeySpace, key: bytes) -> str:
    parsed = keys.parse(key)
    return parsed.kind.value if parsed is not None else "other"


def create_zone(cluster: Cluster, args: argparse.Namespace) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "placement",
            "--endpoint",
            ",".join(cluster.driver_apis),
            *("zone", "create", ZONE, "--partitions", str(args.partitions)),
            *("--replicas", str(args.replicas)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def wait_for(check: Any, limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while not await check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.5)


async def run(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    keys = KeySpace(cluster.prefix)
    client = EtcdClient([cluster.etcd_endpoint], call_timeout=20.0)
    servers: list[grpc.aio.Server] = []
    registrations: list[Registration] = []
    agents: dict[str, FakeAgent] = {}
    try:
        for i in range(args.agents):
            name = f"node-{i + 1}"
            server = grpc.aio.server()
            agents[name] = FakeAgent()
            replica_pb2_grpc.add_ReplicaServiceServicer_to_server(agents[name], server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            servers.append(server)
            record = NodeRecord(name, f"127.0.0.1:{port}", {"rack": f"r{i % 3 + 1}"})
            registration = Registration(client, keys, record, ttl=5)
            await registration.start()
            registrations.append(registration)
        created = await asyncio.to_thread(create_zone, cluster, args)
        if created.returncode != 0:
            raise SystemExit(created.stderr)
        started = time.monotonic()

        async def leased() -> bool:
            found = await client.list_prefix(keys.zone_primary_prefix(ZONE))
            return len(found.kvs) >= args.partitions

        await wait_for(leased, 300, "every primary lease")
        ready_s = time.monotonic() - started
        # In-sync sets and replica sizes, as real agents write them once a zone is READY.
        stables = await client.list_prefix(keys.zone_assign_prefix(ZONE))
        leases = await client.list_prefix(keys.zone_primary_prefix(ZONE))
        holders: dict[int, PrimaryLease] = {}
        for kv in leases.kvs:
            parsed = keys.parse(kv.key)
            lease = decode_primary(kv.value)
            if (
                parsed is not None
                and parsed.partition is not None
                and isinstance(lease, PrimaryLease)
            ):
                holders[parsed.partition] = lease
        now = int(time.time() * 1000)
        by_node = {r.record.name: r for r in registrations}
        for kv in stables.kvs:
            parsed = keys.parse(kv.key)
            if parsed is None or parsed.partition is None or parsed.field is not AssignField.STABLE:
                continue
            stable = decode_assignment(kv.value)
            if not isinstance(stable, Assignment):
                continue
            p = parsed.partition
            lease = holders.get(p)
            primary = lease.node if lease is not None else stable.peers[0]
            epoch = lease.lease_epoch if lease is not None else 1
            members = tuple(sorted(stable.peers))
            await client.put(keys.isr(ZONE, p), encode_isr(InSyncSet(members, primary, epoch, now)))
            for node in stable.peers:
                size = encode_size(ReplicaSize(0, 0, now))
                await by_node[node].put_owned(keys.size(ZONE, p, node), size)
        await asyncio.sleep(args.settle)

        driver = next(c for c in cluster.children if c.name == "driver-1")
        etcd = next(c for c in cluster.children if c.name == "etcd")
        assert driver.proc is not None
        assert etcd.proc is not None
        procs = {"driver": psutil.Process(driver.proc.pid), "etcd": psutil.Process(etcd.proc.pid)}
        changed: Counter[str] = Counter()
        events = 0
        first = await client.current_revision()

        async def count() -> None:
            nonlocal events
            prefix = keys.prefix.encode() + b"/"
            end = prefix[:-1] + b"0"
            async with client.watch(prefix, end, start_revision=first + 1) as watch:
                async for batch in watch:
                    for event in batch.events:
                        events += 1
                        changed[kind_of(keys, event.kv.key)] += 1

        watcher = asyncio.create_task(count())
        spy: asyncio.subprocess.Process | None = None
        if args.profile:
            py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            spy = await asyncio.create_subprocess_exec(
                *(py_spy, "record", "--pid", str(driver.proc.pid), "--nonblocking"),
                *("--duration", str(int(args.window)), "--format", "speedscope"),
                *("--output", args.profile),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
        before = {n: cpu_seconds(p) for n, p in procs.items()}
        t0 = time.monotonic()
        await asyncio.sleep(args.window)
        after = {n: cpu_seconds(p) for n, p in procs.items()}
        elapsed = time.monotonic() - t0
        last = await client.current_revision()
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        if spy is not None:
            await asyncio.wait_for(spy.wait(), 60)
        return {
            "ready_s": ready_s,
            "cpu": {n: 100.0 * (after[n] - before[n]) / elapsed for n in procs},
            "revisions_per_s": (last - first) / elapsed,
            "events_per_s": events / elapsed,
            "changed": {k: v / elapsed for k, v in sorted(changed.items())},
            "load": os.getloadavg(),
            "elapsed": elapsed,
        }
    finally:
        for registration in registrations:
            await registration.stop()
        for server in servers:
            await server.stop(0)
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--agents", type=int, default=5)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=15.0)
    parser.add_argument("--profile", default="")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="driver-idle-bench-"))
    # plaintext, as the recorded figures were measured (TLS's cost: bench/tls_bench.py)
    opts = UpOptions(nodes=0, drivers=1, data_dir=base, api_port=0, live=False, insecure=True)
    cluster = start_cluster(opts, base, Console(quiet=True))
    try:
        result = asyncio.run(run(cluster, args))
    finally:
        cluster.stop()
    print(
        f"`python bench/driver_idle_bench.py --partitions {args.partitions} --agents "
        f"{args.agents} --replicas {args.replicas} --window {args.window} --settle {args.settle}`"
    )
    print(f"machine: {os.cpu_count()} CPU(s); Python {platform.python_version()}")
    print(f"all primary leases {result['ready_s']:.1f} s after zone create")
    load = " / ".join(f"{x:.2f}" for x in result["load"])
    print(f"window {result['elapsed']:.1f} s; load {load}")
    for name, pct in result["cpu"].items():
        print(f"{name}: {pct:.1f} % of a core")
    print(f"etcd revisions/s: {result['revisions_per_s']:.2f}")
    print(f"key events/s: {result['events_per_s']:.1f}")
    for kind, rate in result["changed"].items():
        print(f"  {kind}: {rate:.1f}/s")


if __name__ == "__main__":
    main()
