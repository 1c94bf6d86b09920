"""Crashes at named failpoints (placement/failpoints.py, design/architecture.md "Failpoints"):
real etcd, real driver and agent subprocesses, each made to SIGKILL itself at one exact step by
``PLACEMENT_FAILPOINTS``, then what must hold once the rest of the system (or the restarted
process) has recovered:

* a driver leader dead right after a trigger transaction, or right after a move's end committed
  (before it handled the result or retired anyone): the other driver completes the join, no
  agent applied anything twice, and the agents hold exactly the replicas stable names;
* an agent dead right after persisting a Rebalance decision, before starting its catch-up or
  answering: restarted on its data, it answers the resend from its record and the move
  completes, each effect applied once;
* a primary dead right after appending a write to its own log, before replicating it: the write
  is not acknowledged, and once the node is back no replica holds it, while every acknowledged
  write is on every replica (the undo of design/data-plane.md, "A new primary");
* a learner dead after its second snapshot page: restarted, it resumes and ends identical;
* a transaction ending moves that commits but whose reply is lost: the leader retries, counts
  each switch applied once (a retry that counted it stale was caught: the mutation was tried),
  and the join completes with nothing applied twice.

Each runs in plaintext and secure (``chaos_etcd``). Teardown fails on a traceback in any log.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from conftest import ChaosEtcd
from test_data_chaos import (
    ChaosAgents,
    _driver,
    data_agents_on,
    eventually_in_sync,
    load,
    node_gone,
    ref,
)
from test_data_plane import (
    all_in_sync,
    check_replicas,
    isr_of,
    primary_of,
    put,
    raw_replica,
    stable_of,
)
from test_driver import TIMEOUT, Cluster, converged, eventually, hosting, leader_fence, settled
from test_driver_chaos import (
    Drivers,
    agents_on,
    drivers_on,
    journal_effects,
    leader,
    no_deposed_write,
    wait_leader,
)

from placement.core.model import ZoneSpec
from placement.data.partitioning import partition_of
from placement.failpoints import ENV
from placement.metastore.keys import KeySpace
from placement.metastore.store import Metastore
from placement.v1 import data_pb2
from replica.records import AgentStore


@pytest.fixture
async def drivers(chaos_etcd: ChaosEtcd, tmp_path: Path, prefix: str) -> AsyncIterator[Drivers]:
    async with drivers_on(chaos_etcd, tmp_path, prefix) as ds:
        yield ds


@pytest.fixture
async def cluster(tmp_path: Path, chaos_etcd: ChaosEtcd, keys: KeySpace) -> AsyncIterator[Cluster]:
    async with agents_on(chaos_etcd, tmp_path, keys, catchup_delay=0.3) as c:
        yield c


@pytest.fixture
async def agents(
    chaos_etcd: ChaosEtcd, tmp_path: Path, keys: KeySpace
) -> AsyncIterator[ChaosAgents]:
    async with data_agents_on(chaos_etcd, tmp_path, keys) as a:
        yield a


def crash_at(point: str, hit: int = 1) -> dict[str, str]:
    return {ENV: f"{point}={hit}*crash"}


def _read(log: Path) -> str:
    return log.read_text(errors="replace")


async def died_at(proc: asyncio.subprocess.Process, log: Path, point: str) -> None:
    """``proc`` killed itself with SIGKILL at ``point`` (its log names the point)."""
    code = await asyncio.wait_for(proc.wait(), TIMEOUT)
    if proc.stdout is not None:
        await proc.stdout.read()
    text = _read(log)
    assert code == -9, f"exited {code}, not by its failpoint:\n{text[-2000:]}"
    assert f"failpoint {point}: crash" in text


async def agents_hold_stable(cluster: Cluster, stables: dict[int, tuple[str, ...]]) -> None:
    """Wait until the agents hold exactly the replicas ``stables`` names (the replicas a
    finished move retires go on the driver's sweep); fail naming the differences."""

    def wrong() -> dict[int, tuple[list[str], list[str]]]:
        held = hosting(cluster, "fp", len(stables))
        return {p: (sorted(held[p]), sorted(s)) for p, s in stables.items() if held[p] != set(s)}

    async def agree() -> bool:
        return not wrong()

    await eventually(agree, "the agents to hold exactly stable's replicas")
    assert not wrong()


@pytest.mark.parametrize("point", ["driver.after-trigger", "driver.after-finish"])
async def test_a_leader_crashed_at_a_failpoint_is_replaced_and_the_join_completes(
    drivers: Drivers, cluster: Cluster, keys: KeySpace, point: str
) -> None:
    client = cluster.client
    for i in range(4):
        await cluster.start_agent(f"n{i}")
    start = await client.current_revision(keys.leader_prefix())
    d1 = await drivers.start("d1", env=crash_at(point))
    await wait_leader(client, keys)
    await drivers.start("d2")
    found = await leader(client, keys)
    assert found is not None
    assert found[0] == "d1"
    spec = ZoneSpec("fp", partitions=8, replicas=3)
    assert (await cluster.store.create_zone(spec, found[1])).applied
    # A node joins: the leader triggers moves onto it (then ends them), and dies at the point.
    await cluster.start_agent("n4")
    await died_at(d1.proc, d1.log, point)
    await wait_leader(client, keys, other_than="d1")
    await eventually(lambda: converged(cluster.store, spec), "the join to complete on d2")
    stables = await stable_of(cluster.store, "fp")
    assert any("n4" in peers for peers in stables.values())
    await agents_hold_stable(cluster, stables)
    repeated = {k: n for k, n in journal_effects(cluster).items() if n > 1}
    assert not repeated, f"effects applied more than once: {repeated}"
    await no_deposed_write(client, keys, start, terms_ended=1)


async def test_an_agent_crashed_after_persisting_a_decision_completes_the_move_on_restart(
    drivers: Drivers, cluster: Cluster, keys: KeySpace
) -> None:
    client = cluster.client
    for i in range(3):
        await cluster.start_agent(f"n{i}")
    await drivers.start("d1")
    _, fence = await wait_leader(client, keys)
    spec = ZoneSpec("fp", partitions=6, replicas=2)
    assert (await cluster.store.create_zone(spec, fence)).applied
    await eventually(lambda: settled(cluster.store, spec), "zone creation")
    joining = await cluster.start_agent("n3", env=crash_at("agent.after-decision"))
    await died_at(joining.proc, joining.log, "agent.after-decision")
    # The decision is on disk; its catch-up never started, and the driver got no answer.
    db = AgentStore.inspect(joining.data_dir)
    try:
        records = db.records()
    finally:
        db.close()
    assert records, "the failpoint is after the decision's commit: a record must be on disk"
    await cluster.start_agent("n3")  # on the same data, registered at its new address
    await eventually(lambda: converged(cluster.store, spec), "the move onto n3 to complete")
    stables = await stable_of(cluster.store, "fp")
    assert any("n3" in peers for peers in stables.values())
    repeated = {k: n for k, n in journal_effects(cluster).items() if n > 1}
    assert not repeated, f"effects applied more than once: {repeated}"
    await agents_hold_stable(cluster, stables)


async def test_a_primary_crashed_after_its_local_append_keeps_nothing_unacknowledged(
    chaos_etcd: ChaosEtcd, agents: ChaosAgents, keys: KeySpace
) -> None:
    client, zone = chaos_etcd.client, "fp"
    # Each agent counts its own appends: only partition 0's primary appends (one partition),
    # so it dies at its 6th batch; the next primary takes fewer than 6 afterwards.
    for n in ("n1", "n2", "n3"):
        await agents.start(n, env=crash_at("primary.after-append", 6))
    async with _driver(chaos_etcd, keys) as driver:
        store = Metastore(client, keys)
        # A scale-down delay: the dead node stays in stable, and comes back as its replica.
        spec = ZoneSpec(zone, partitions=1, replicas=3, scale_down_delay=60)
        assert (await store.create_zone(spec, await leader_fence(driver))).applied
        await eventually(lambda: all_in_sync(client, keys, store, spec), "ISR = stable")
        acked: dict[bytes, bytes] = {}
        for i in range(5):
            key = f"k{i}".encode()
            await put(agents, client, keys, zone, 1, key, b"before")
            acked[key] = b"before"
        lease = await primary_of(client, keys, zone, 0)
        assert lease is not None
        victim = lease.node
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await agents.data(victim).Put(
                data_pb2.PutRequest(partition=ref(zone, 0), key=b"k0", value=b"never-acked"),
                timeout=10,
            )
        print(f"the write to {victim} failed: {refused.value.code().name}")
        await died_at(agents.procs[victim], agents.tmp_path / f"agent-{victim}.log",
                      "primary.after-append")  # fmt: skip
        agents.addresses.pop(victim)
        # The next primary takes writes (a few: it dies at its own 6th batch).
        for i in range(3):
            key = f"k{i}".encode()
            await put(agents, client, keys, zone, 1, key, b"after", deadline=TIMEOUT)
            acked[key] = b"after"
        await node_gone(client, keys, victim)
        await agents.start(victim)  # on its data, without the failpoint

        async def back_in_sync() -> bool:
            isr = await isr_of(client, keys, zone, 0)
            return isr is not None and victim in isr.members

        await eventually(back_in_sync, f"{victim} to rejoin the in-sync set")
        await eventually_in_sync(client, keys, store, spec)
        assert victim in (await stable_of(store, zone))[0]
        for node in ("n1", "n2", "n3"):
            _, items = await raw_replica(agents, node, zone, 0)
            kept = {k: v for k, v in items.items() if v == b"never-acked"}
            assert not kept, f"{node} holds a write that was never acknowledged: {kept}"
        await check_replicas(agents, store, spec, acked)
        assert partition_of(b"k0", 1) == 0


async def test_a_learner_crashed_after_its_second_page_resumes_and_ends_identical(
    chaos_etcd: ChaosEtcd, agents: ChaosAgents, keys: KeySpace
) -> None:
    client, zone = chaos_etcd.client, "big"
    for n in ("n1", "n2"):
        await agents.start(n)
    async with _driver(chaos_etcd, keys) as driver:
        store = Metastore(client, keys)
        fence = await leader_fence(driver)
        spec = ZoneSpec(zone, partitions=1, replicas=2, scale_down_delay=60)
        assert (await store.create_zone(spec, fence)).applied
        await eventually(lambda: all_in_sync(client, keys, store, spec), "ISR = stable")
        acked = await load(agents, client, keys, zone, 1 << 20)
        await agents.start("n3", env=crash_at("agent.mid-catch-up", 2))
        record = await store.get_zone(zone)
        assert record is not None
        bigger = ZoneSpec(zone, partitions=1, replicas=3, scale_down_delay=60)
        assert (await store.update_zone(bigger, record.mod_revision, fence)).applied
        await died_at(agents.procs["n3"], agents.tmp_path / "agent-n3.log", "agent.mid-catch-up")
        agents.addresses.pop("n3")
        db = AgentStore.inspect(agents.data_dir("n3"))
        try:
            _bytes, count = db.data.size(zone, 0)
            row = db.replica(zone, 0)
        finally:
            db.close()
        assert row is not None
        assert not row.complete
        assert 0 < count < len(acked), f"two pages hold {count} of {len(acked)} keys"
        await node_gone(client, keys, "n3")
        restarted = time.monotonic()
        await agents.start("n3")
        await eventually(lambda: settled(store, bigger), "the catch-up to complete", TIMEOUT * 2)
        await eventually_in_sync(client, keys, store, bigger)
        print(f"n3 crashed holding {count} keys; done {time.monotonic() - restarted:.1f}s later")
        assert "n3" in (await stable_of(store, zone))[0]
        await check_replicas(agents, store, bigger, acked)


async def test_a_move_end_whose_reply_is_lost_is_retried_and_applied_once(
    drivers: Drivers, cluster: Cluster, keys: KeySpace
) -> None:
    """The first transaction that ends moves commits, and its reply is lost (the failpoint
    raises an unavailable store after the commit): the leader retries, reads the switch it
    made, counts it applied — once — and the join completes with nothing applied twice."""
    client = cluster.client
    for i in range(4):
        await cluster.start_agent(f"n{i}")
    point = "metastore.end-moves-reply-lost"
    d1 = await drivers.start("d1", env={ENV: f"{point}=1*error"})
    member, fence = await wait_leader(client, keys)
    spec = ZoneSpec("fp", partitions=8, replicas=3)
    assert (await cluster.store.create_zone(spec, fence)).applied
    await cluster.start_agent("n4")

    async def joined() -> bool:
        placed = await stable_of(cluster.store, "fp")
        return any("n4" in p for p in placed.values()) and await converged(cluster.store, spec)

    await eventually(joined, "the join to complete")
    stables = await stable_of(cluster.store, "fp")
    await agents_hold_stable(cluster, stables)
    text = d1.text()
    assert f"failpoint {point}: error (hit 1" in text
    ends = re.findall(r"(fp/\d+): finish of revision (\d+) -> (\w+)", text)
    assert ends, text[-2000:]
    outcomes = Counter((p, rev) for p, rev, outcome in ends if outcome == "applied")
    assert all(n == 1 for n in outcomes.values()), outcomes
    assert not [e for e in ends if e[2] != "applied"], ends
    assert await leader(client, keys) == (member, fence)  # no new term: the same leader retried
    repeated = {k: n for k, n in journal_effects(cluster).items() if n > 1}
    assert not repeated, f"effects applied more than once: {repeated}"
