"""Chaos on etcd itself, with the product running secure — a cluster as ``placectl up
--etcd-members 3`` starts it: three etcd members with TLS and auth on, two drivers, three
agents, mutual TLS everywhere (design/deployment.md).

Under recorded writes and a rebalance (replicas 2 → 3), one fault each:

* SIGKILL of the etcd leader member (then it is started again);
* SIGSTOP of the etcd leader member for a few seconds (then SIGCONT);
* loss of quorum — two members frozen — for longer than the drivers' lease TTL, then its
  return;
* defragmentation of every member in turn, after 24 MiB of history was deleted and compacted
  (each member answers nothing while it rewrites its database).

Each ends with every partition stable on three replicas, no acknowledged write lost (the
workload checker reads every key and every replica), and — on etcd's history — no write by a
driver with its epoch after its leader key was deleted.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from rich.console import Console
from test_driver import assert_clean_log

from placement.api.client import PlacementClient
from placement.data.checker import check_workload
from placement.data.client import DataClient
from placement.data.partitioning import partition_of
from placement.data.workload import run_writers
from placement.local.cluster import Cluster, UpOptions, start_cluster, wait_ready
from placement.local.etcd import EtcdMember
from placement.metastore.audit import audit_deposed_writes
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace, prefix_range_end
from placement.v1 import driver_pb2

pytestmark = pytest.mark.integration

ZONE = "chaos"
PARTITIONS = 8
TTL = 3  # the drivers' election lease and the agents' registration lease, seconds
BALLAST = b"/ballast/"  # outside the product's prefix
EVENTUALLY = 120.0 * float(os.environ.get("CI_TIME_MULTIPLIER", "1"))


@pytest.fixture
def secure3(tmp_path: Path) -> Iterator[Cluster]:
    opts = UpOptions(nodes=3, drivers=2, api_port=0, etcd_members=3, lease_ttl=TTL)
    cluster = start_cluster(opts, tmp_path / "cluster", Console(quiet=True))
    try:
        assert cluster.etcd_secured
        assert len(cluster.etcd_members) == 3
        asyncio.run(wait_ready(cluster, opts, demo_zone=False))
        yield cluster
        for log in (tmp_path / "cluster" / "logs").glob("*.log"):
            assert_clean_log(log)
    finally:
        cluster.stop()


def _leader(cluster: Cluster) -> EtcdMember:
    deadline = time.monotonic() + EVENTUALLY
    while True:
        leaders = [m for m in cluster.etcd_members if m.alive and m.is_leader()]
        if len(leaders) == 1:
            return leaders[0]
        assert time.monotonic() < deadline, "no etcd leader"
        time.sleep(0.1)


async def _kill_leader(cluster: Cluster) -> None:
    leader = _leader(cluster)
    leader.kill()
    await asyncio.sleep(2 * TTL)
    cluster.restart_etcd_member(leader)
    await asyncio.to_thread(leader.wait_healthy)


async def _pause_leader(cluster: Cluster) -> None:
    leader = _leader(cluster)
    leader.pause()
    try:
        await asyncio.sleep(2 * TTL)
    finally:
        leader.resume()


async def _lose_quorum(cluster: Cluster) -> None:
    """Two of three members frozen for three lease TTLs: no quorum, no lease can be renewed."""
    frozen = cluster.etcd_members[1:]
    for member in frozen:
        member.pause()
    try:
        await asyncio.sleep(3 * TTL)
    finally:
        for member in frozen:
            member.resume()


async def _defragment(cluster: Cluster) -> None:
    """Defragmentation under load: 24 MiB of history written, deleted and compacted outside the
    product's prefix, so every member has a database to rewrite; then each member defragmented
    in turn, twice (a member answers nothing while it defragments), as etcd's root must do it."""
    root_credentials = cluster.etcd_credentials("etcd-root")
    async with EtcdClient(cluster.etcd_endpoint.split(","), credentials=root_credentials) as root:
        ballast = b"b" * (1 << 20)
        for i in range(24):
            await root.put(BALLAST + b"%02d" % i, ballast)
        await root.delete(BALLAST, prefix_range_end(BALLAST))
        await root.compact(await root.current_revision())
        for _ in range(2):
            await root.defragment()


async def _status(api: PlacementClient) -> driver_pb2.ZoneStatus:
    request = driver_pb2.GetZoneRequest(name=ZONE)
    status: driver_pb2.ZoneStatus = await api.call(lambda s, t: s.GetZoneStatus(request, timeout=t))
    return status


async def _stable_on_three(api: PlacementClient) -> None:
    deadline = time.monotonic() + EVENTUALLY
    while True:
        try:
            status = await _status(api)
            request = driver_pb2.GetAssignmentsRequest(zone=ZONE)
            page = await api.call(
                lambda s, t, r=request: s.GetAssignments(r, timeout=t)  # type: ignore[misc]
            )
            stables = [len(a.stable.names) for a in page.assignments]
            if driver_pb2.ZoneState.Name(status.state) == "READY" and stables == [3] * PARTITIONS:
                return
        except Exception as e:  # etcd or the leader still recovering: ask again
            status = e  # type: ignore[assignment]
        assert time.monotonic() < deadline, f"not stable on three replicas: {status}"
        await asyncio.sleep(0.5)


async def _no_write_after_deposal(etcd: EtcdClient, keys: KeySpace, start: int) -> int:
    """Every leader key deleted since ``start`` (its lease expired or resigned): no value the
    leader writes carries its epoch after the deletion. Returns how many leader keys were
    deleted."""
    audit = await audit_deposed_writes(etcd, keys, start)
    assert not audit.stale, f"writes by a deposed leader after its key was deleted: {audit.stale}"
    return audit.terms_ended


@pytest.mark.parametrize(
    "fault",
    [_kill_leader, _pause_leader, _lose_quorum, _defragment],
    ids=["sigkill-etcd-leader", "sigstop-etcd-leader", "quorum-lost-past-ttl", "defragment"],
)
async def test_etcd_faults_mid_rebalance_lose_nothing(
    secure3: Cluster, tmp_path: Path, fault: Callable[[Cluster], Awaitable[None]]
) -> None:
    c = secure3
    keys = KeySpace(c.prefix)
    record = tmp_path / "writes.jsonl"
    async with (
        PlacementClient(c.driver_apis, deadline=60.0, tls=c.tls("admin")) as api,
        DataClient(c.driver_apis, deadline=60.0, tls=c.tls("client")) as data,
        EtcdClient(c.etcd_endpoint.split(","), credentials=c.etcd_credentials()) as etcd,
    ):
        start = await etcd.current_revision(keys.zone(ZONE))
        config = driver_pb2.ZoneConfig(partitions=PARTITIONS, replicas=2)
        create = driver_pb2.CreateZoneRequest(name=ZONE, config=config)
        await api.call(lambda s, t: s.CreateZone(create, timeout=t))
        probes: dict[int, bytes] = {}
        for i in range(1000):
            probes.setdefault(partition_of(b"p%d" % i, PARTITIONS), b"p%d" % i)
        for key in probes.values():
            await data.put(ZONE, key, b"serving")
        stop = asyncio.Event()
        writers = asyncio.create_task(
            run_writers(data, ZONE, 4, 20, EVENTUALLY, record, stop, seed=7, readers=2)
        )
        try:
            await asyncio.sleep(1.0)
            alter = driver_pb2.AlterZoneRequest(
                name=ZONE,
                config=driver_pb2.ZoneConfig(replicas=3),
                update_fields=["replicas"],
            )
            await api.call(lambda s, t: s.AlterZone(alter, timeout=t))
            await fault(c)
            await _stable_on_three(api)
            await asyncio.sleep(1.0)  # writes on the settled zone too
        finally:
            stop.set()
            stats = await writers
        assert stats.acked > 0
        result = await check_workload(data, ZONE, record)
        assert result.ok, result
        assert result.acked_writes == stats.acked
        assert result.reads == stats.reads > 0  # linearizable through every etcd fault
        await _no_write_after_deposal(etcd, keys, start)
