"""Re-sharding with real etcd, a real driver and real agents (design/resharding.md): a zone's
partition count changed under concurrent writers moves the data — grow and shrink — and the
workload checker finds every acknowledged write readable with its value and every replica
identical."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from placement.api.client import PlacementClient
from placement.data.checker import check_workload
from placement.data.client import DataClient
from placement.data.partitioning import partition_of
from placement.data.workload import run_writers
from placement.local.cluster import Cluster, UpOptions, start_cluster, wait_ready
from placement.v1 import driver_pb2

pytestmark = pytest.mark.integration

ZONE = "kv"
EVENTUALLY = 120.0


@pytest.fixture
def cluster(etcd: Any, tmp_path: Path) -> Iterator[Cluster]:
    prefix = f"/t{uuid.uuid4().hex[:12]}/placement"
    opts = UpOptions(nodes=3, drivers=1, etcd=etcd.endpoint, api_port=0, prefix=prefix)
    c = start_cluster(opts, tmp_path / "cluster", Console(quiet=True))
    try:
        asyncio.run(wait_ready(c, opts, demo_zone=False))
        yield c
        for log in (tmp_path / "cluster" / "logs").glob("*.log"):
            text = log.read_text(errors="replace")
            assert "Traceback" not in text, f"unexpected traceback in {log}:\n{text[-4000:]}"
    finally:
        c.stop()


async def _zone(api: PlacementClient) -> driver_pb2.Zone:
    return await api.call(lambda s, t: s.GetZone(driver_pb2.GetZoneRequest(name=ZONE), timeout=t))


async def _create(api: PlacementClient, partitions: int) -> None:
    config = driver_pb2.ZoneConfig(partitions=partitions, replicas=3)
    await api.call(
        lambda s, t: s.CreateZone(driver_pb2.CreateZoneRequest(name=ZONE, config=config), timeout=t)
    )


async def _alter(api: PlacementClient, partitions: int) -> None:
    request = driver_pb2.AlterZoneRequest(
        name=ZONE,
        config=driver_pb2.ZoneConfig(partitions=partitions),
        update_fields=["partitions"],
    )
    await api.call(lambda s, t: s.AlterZone(request, timeout=t))


async def _settled_layout(api: PlacementClient, partitions: int) -> driver_pb2.ZoneLayout:
    """Wait until the layout in force has ``partitions`` and no reshard runs."""
    deadline = time.monotonic() + EVENTUALLY
    while True:
        zone = await _zone(api)
        layout = zone.layout
        if layout.partitions == partitions and not layout.HasField("reshard"):
            return layout
        if time.monotonic() > deadline:
            pytest.fail(f"the layout never settled on {partitions}: {layout}")
        await asyncio.sleep(0.2)


async def _serving(client: DataClient, partitions: int) -> None:
    """Every partition takes a write."""
    probes: dict[int, bytes] = {}
    i = 0
    while len(probes) < partitions:
        key = f"probe-{i}".encode()
        probes.setdefault(partition_of(key, partitions), key)
        i += 1
    deadline = time.monotonic() + EVENTUALLY
    for key in probes.values():
        while True:
            try:
                await client.put(ZONE, key, b"ready")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.3)


async def _reshard_under_writers(
    c: Cluster, api: PlacementClient, before: int, after: int, record: Path
) -> None:
    async with DataClient(c.driver_apis, deadline=30.0) as client:
        old = await _settled_layout(api, before)
        stop = asyncio.Event()
        writers = asyncio.create_task(
            run_writers(client, ZONE, 6, 40, 600.0, record, stop, seed=after)
        )
        await asyncio.sleep(1.5)
        await _alter(api, after)
        new = await _settled_layout(api, after)
        assert new.generation == old.generation + 1
        await asyncio.sleep(1.0)  # writes under the new layout too
        stop.set()
        stats = await writers
        assert stats.acked > 0
        result = await check_workload(client, ZONE, record, settle=20.0)
    assert result.ok, result.as_json()
    assert result.partitions_checked == after


async def test_grow_then_shrink_under_writers_loses_no_acknowledged_write(
    cluster: Cluster, tmp_path: Path
) -> None:
    async with PlacementClient(cluster.driver_apis, deadline=30.0) as api:
        await _create(api, 4)
        async with DataClient(cluster.driver_apis, deadline=30.0) as client:
            await _settled_layout(api, 4)
            await _serving(client, 4)
        await _reshard_under_writers(cluster, api, 4, 8, tmp_path / "grow.jsonl")
        await _reshard_under_writers(cluster, api, 8, 3, tmp_path / "shrink.jsonl")
