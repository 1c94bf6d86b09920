"""Fault and misconfiguration scenarios against real etcd, a real driver and real agents, each with
the invariant it must keep.

* A zone whose node selector matches no registered node: its status says it cannot be placed and
  why, nothing is written for it, the driver keeps leading without spinning (passes stay at their
  idle rate, no traceback), and the zone is placed as soon as a matching node registers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from test_driver import Cluster, eventually, leader_fence, running_driver, settled

from placement import metrics
from placement.api.service import status_on_view
from placement.core.model import ZoneSpec
from placement.driver.core import build_view
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import AssignField, KeySpace


@pytest.fixture
async def agents(tmp_path: Path, client: EtcdClient, keys: KeySpace) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, client, keys)
    try:
        yield c
    finally:
        await c.close()


def passes() -> float:
    """Driver passes run so far in this process (the pass-duration histogram's count)."""
    for family in metrics.PASS_SECONDS.collect():
        for sample in family.samples:
            if sample.name.endswith("_count"):
                return sample.value
    return 0.0


async def test_a_zone_no_node_matches_says_so_and_is_placed_when_one_registers(
    etcd: object, agents: Cluster, keys: KeySpace
) -> None:
    cluster = agents
    for n in ("n1", "n2"):
        await cluster.start_agent(n, {"rack": "r1"})
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    async with running_driver(endpoint, keys) as driver:
        store = cluster.store
        fence = await leader_fence(driver)
        spec = ZoneSpec("lonely", partitions=2, replicas=1, node_selector={"rack": "r9"})
        assert (await store.create_zone(spec, fence)).applied
        before, started = passes(), time.monotonic()
        await asyncio.sleep(3.0)
        rate = (passes() - before) / (time.monotonic() - started)
        revision, kvs = await store.read_zone_snapshot("lonely")
        status = status_on_view(keys, build_view(keys, kvs, revision), kvs, "lonely", 0)
        assert status is not None
        text = "; ".join(status.details)
        assert "cannot be placed" in text, status
        assert not (await store.read_zone("lonely")).partitions, "nothing may be placed"
        assert driver.fence() is not None, "the driver stopped leading"
        assert rate <= 4.0, f"{rate:.1f} passes/s for a zone that cannot be placed"
        print(f"status: {status.state}: {text}; {rate:.1f} passes/s")

        await cluster.start_agent("n3", {"rack": "r9"})
        await eventually(lambda: settled(store, spec), "the zone to be placed on n3")
        zone = await store.read_zone("lonely")
        assert all(s.peers(AssignField.STABLE) == ("n3",) for s in zone.partitions.values())
