"""Drain and graceful stop against live processes (design/control-plane.md, "Drain").

One cluster per module, as ``placectl up`` runs it (2 drivers, 4 agents, mutual TLS), on the
session etcd; a routing client writes throughout, retrying within its deadline:

* ``placectl node drain node-1``: its primary leases move first (every lease change of node-1
  in etcd comes before the first pending that moves a replica off it), then its replicas, and
  the command ends saying it may be stopped; node-1 holds nothing; not one write failed and
  every acknowledged value reads back; ``undrain`` gives it replicas again;
* ``placectl node cordon node-2``: it keeps (its share of) what it holds through ``R`` 3 → 2 →
  3 and takes nothing in a new zone; ``uncordon`` gives it its share there;
* SIGTERM of an agent that holds primary leases: they move to other in-sync members before its
  node record goes (etcd's order), no write fails, and the agent exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from rich.console import Console

from placement.data.client import DataClient
from placement.local.cluster import Cluster, UpOptions, start_cluster, wait_ready
from placement.metastore.codec import Assignment as AssignmentValue
from placement.metastore.codec import (
    LeaseTerm,
    PrimaryLease,
    ReplicaSize,
    decode_assignment,
    decode_primary,
    decode_size,
    decode_term,
)
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import AssignField, KeyKind, KeySpace, prefix_range_end

ZONE = "drained"
PARTITIONS = 8
EVENTUALLY = 90.0 * float(os.environ.get("CI_TIME_MULTIPLIER", "1"))


@pytest.fixture(scope="module")
def cluster(etcd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    prefix = f"/t{uuid.uuid4().hex[:12]}/placement"
    opts = UpOptions(nodes=4, drivers=2, etcd=etcd.endpoint, api_port=0, prefix=prefix)
    c = start_cluster(opts, tmp_path_factory.mktemp("drain"), Console(quiet=True))
    try:
        asyncio.run(wait_ready(c, opts, demo_zone=False))
        placectl(c, "zone", "create", ZONE, "--partitions", str(PARTITIONS), "--replicas", "3")
        asyncio.run(_ready(c))
        yield c
    finally:
        c.stop()


def placectl(
    cluster: Cluster, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "placement", "--endpoint", ",".join(cluster.driver_apis), *args],
        env={**os.environ, **cluster.env()},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result


async def _ready(cluster: Cluster, zone: str = ZONE) -> None:
    deadline = time.monotonic() + EVENTUALLY
    while True:
        out = await asyncio.to_thread(placectl, cluster, "zone", "status", zone, "--json")
        if json.loads(out.stdout)["state"] == "READY":
            return
        assert time.monotonic() < deadline, out.stdout
        await asyncio.sleep(0.3)


class Writers:
    """Two writer loops through the routing client; every failure is kept."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.acked: dict[bytes, bytes] = {}
        self.failed: list[str] = []
        self.slowest = 0.0
        self._stop = asyncio.Event()

    async def _loop(self, client: DataClient, worker: int) -> None:
        i = 0
        while not self._stop.is_set():
            key, value = f"w{worker}-{i % 64}".encode(), f"{worker}-{i}".encode()
            started = time.monotonic()
            try:
                await client.put(ZONE, key, value)
            except Exception as e:  # every failure is the test's finding
                self.failed.append(f"{key!r}: {type(e).__name__}: {e}")
            else:
                self.acked[key] = value
                self.slowest = max(self.slowest, time.monotonic() - started)
            i += 1

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        tls = self.cluster.tls("client")
        async with DataClient(self.cluster.driver_apis, tls=tls, deadline=15.0) as client:
            tasks = [asyncio.create_task(self._loop(client, w)) for w in range(2)]
            try:
                yield
            finally:
                self._stop.set()
                await asyncio.gather(*tasks)
            for key, value in self.acked.items():
                assert await client.get(ZONE, key) == value, key


class History:
    """Every change of the zone's primary leases and pending keys, and of node keys, in etcd's
    order: ``(revision, kind, partition or node, value)``."""

    def __init__(self, cluster: Cluster) -> None:
        self.keys = KeySpace(cluster.prefix)
        self.cluster = cluster
        self.events: list[tuple[int, str, str, Any]] = []

    async def record(self, client: EtcdClient, start: int) -> None:
        base = self.keys.prefix.encode() + b"/"
        async with client.watch(base, prefix_range_end(base), start_revision=start) as watch:
            async for batch in watch:
                for e in batch.events:
                    parsed = self.keys.parse(e.kv.key)
                    if parsed is None:
                        continue
                    rev = e.kv.mod_revision
                    if parsed.kind is KeyKind.PRIMARY and parsed.name == ZONE:
                        lease = decode_primary(e.kv.value) if e.kv.value else None
                        held = (
                            (lease.node, lease.lease_epoch)
                            if isinstance(lease, PrimaryLease)
                            else None
                        )
                        self.events.append((rev, "lease", str(parsed.partition), held))
                    elif parsed.kind is KeyKind.ASSIGN and parsed.field is AssignField.PENDING:
                        value = decode_assignment(e.kv.value) if e.kv.value else None
                        peers = value.peers if isinstance(value, AssignmentValue) else None
                        self.events.append((rev, "pending", str(parsed.partition), peers))
                    elif parsed.kind is KeyKind.DRAIN:
                        self.events.append((rev, "drain", parsed.name, bool(e.kv.value)))
                    elif parsed.kind is KeyKind.NODE:
                        self.events.append((rev, "node", parsed.name, bool(e.kv.value)))


async def _with_history(cluster: Cluster, body: Any) -> History:
    history = History(cluster)
    async with EtcdClient([cluster.etcd_endpoint], credentials=cluster.etcd_credentials()) as c:
        start = await c.current_revision(history.keys.zone(ZONE))
        task = asyncio.create_task(history.record(c, start + 1))
        try:
            await body()
            await asyncio.sleep(1.0)  # the watch catches up
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return history


async def _leases_of(cluster: Cluster, node: str) -> dict[int, int]:
    """Partition -> lease epoch of every unexpired primary lease ``node`` holds."""
    keys = KeySpace(cluster.prefix)
    async with EtcdClient([cluster.etcd_endpoint], credentials=cluster.etcd_credentials()) as c:
        found = await c.list_prefix(keys.zone_primary_prefix(ZONE))
        term_kv = (await c.get(keys.term(node))).first()
    term = decode_term(term_kv.value) if term_kv is not None else None
    until = term.until if isinstance(term, LeaseTerm) else 0
    now = time.time() * 1000
    held = {}
    for kv in found.kvs:
        lease = decode_primary(kv.value)
        if isinstance(lease, PrimaryLease) and lease.node == node and lease.until(until) > now:
            parsed = keys.parse(kv.key)
            assert parsed is not None
            assert parsed.partition is not None
            held[parsed.partition] = lease.lease_epoch
    return held


async def _stables(cluster: Cluster, zone: str = ZONE) -> dict[int, tuple[str, ...]]:
    """Partition -> its stable replica set, as etcd holds it now."""
    keys = KeySpace(cluster.prefix)
    async with EtcdClient([cluster.etcd_endpoint], credentials=cluster.etcd_credentials()) as c:
        found = await c.list_prefix(keys.zone_assign_prefix(zone))
    stables = {}
    for kv in found.kvs:
        parsed = keys.parse(kv.key)
        if parsed is not None and parsed.field is AssignField.STABLE:
            value = decode_assignment(kv.value)
            assert isinstance(value, AssignmentValue)
            assert parsed.partition is not None
            stables[parsed.partition] = tuple(value.peers)
    return stables


async def _sizes_reported(cluster: Cluster) -> None:
    """Until every partition of the zone has a replica whose reported size is not 0 (agents
    report sizes every 10 s): the writers' data, which a grow's dry run counts."""
    keys = KeySpace(cluster.prefix)
    prefix = keys.sizes_prefix() + ZONE.encode() + b"/"
    deadline = time.monotonic() + EVENTUALLY
    async with EtcdClient([cluster.etcd_endpoint], credentials=cluster.etcd_credentials()) as c:
        while True:
            found = await c.list_prefix(prefix)
            sized = set()
            for kv in found.kvs:
                parsed = keys.parse(kv.key)
                size = decode_size(kv.value)
                if parsed is not None and isinstance(size, ReplicaSize) and size.bytes > 0:
                    sized.add(parsed.partition)
            if len(sized) == PARTITIONS:
                return
            assert time.monotonic() < deadline, sorted(sized)
            await asyncio.sleep(0.5)


def _planned(
    before: dict[int, tuple[str, ...]], zone: dict[str, Any]
) -> dict[int, tuple[str, ...]]:
    """The final assignment a dry run's zone answer says: its moves' targets, the rest as is."""
    final = dict(before)
    final.update((m["partition"], tuple(m["after"])) for m in zone["moves"])
    return {p: peers for p, peers in final.items() if peers}


def _moved(history: History) -> set[int]:
    return {int(q) for _, kind, q, peers in history.events if kind == "pending" and peers}


def _check_loads(zone: dict[str, Any], final: dict[int, tuple[str, ...]]) -> None:
    counted = Counter(n for peers in final.values() for n in peers)
    planned = {n["node"]: n["replicas_after"] for n in zone["loads"] if n["replicas_after"]}
    assert planned == dict(counted), (planned, counted)


def test_a_drain_moves_leases_first_then_replicas_and_loses_no_write(cluster: Cluster) -> None:
    victim = "node-1"
    led_before = asyncio.run(_leases_of(cluster, victim))
    assert led_before, "node-1 leads nothing: nothing to show"
    # The dry run first: it writes nothing, and says what the drain then does.
    before = asyncio.run(_stables(cluster))
    out = placectl(cluster, "node", "drain", victim, "--dry-run", "--json")
    (planned,) = json.loads(out.stdout)["zones"]
    assert planned["zone"] == ZONE
    status = json.loads(placectl(cluster, "node", "status", victim, "--json").stdout)
    assert not status["draining"]
    assert asyncio.run(_stables(cluster)) == before
    loads = {n["node"]: n for n in planned["loads"]}
    assert loads[victim]["replicas_after"] == 0
    assert loads[victim]["replicas_before"] == sum(victim in p for p in before.values())
    assert loads[victim]["leases_handed_over"] == len(led_before)
    assert {m["partition"] for m in planned["moves"]} == {
        p for p, peers in before.items() if victim in peers
    }
    writers = Writers(cluster)
    lines: list[dict[str, Any]] = []

    async def body() -> None:
        async with writers.running():
            await asyncio.sleep(1.0)
            out = await asyncio.to_thread(placectl, cluster, "node", "drain", victim, "--json")
            lines.extend(json.loads(line) for line in out.stdout.splitlines())
            await asyncio.sleep(1.0)

    history = asyncio.run(_with_history(cluster, body))
    assert not writers.failed, writers.failed[:5]
    assert writers.acked
    assert lines[-1]["safe_to_stop"], lines
    assert (lines[-1]["replicas"], lines[-1]["primaries"]) == (0, 0)

    # Leases first, per partition node-1 led: its lease went to another node (a new holder, not
    # a renewal) before the first pending that moves the partition off node-1; and no new lease
    # went to node-1 once it was drained.
    drained_at = min(r for r, kind, name, on in history.events if kind == "drain" and on)
    after = [e for e in history.events if e[0] > drained_at]
    for p in led_before:
        handed = [
            r for r, k, q, h in after if k == "lease" and q == str(p) and h and h[0] != victim
        ]
        moved = [
            r
            for r, k, q, peers in after
            if k == "pending" and q == str(p) and peers is not None and victim not in peers
        ]
        assert handed, f"p{p}: its lease never left {victim}"
        assert moved, f"p{p}: no replica moved off {victim}"
        assert min(handed) < min(moved), (p, handed, moved)
    to_victim = [(int(q), h[1]) for _, k, q, h in after if k == "lease" and h and h[0] == victim]
    new = [(p, epoch) for p, epoch in to_victim if led_before.get(p) != epoch]
    assert not new, f"{victim} was granted leases while drained: {new}"  # renewals only
    assert asyncio.run(_leases_of(cluster, victim)) == {}
    # What the dry run said: the same partitions moved, to the same final assignment.
    final = asyncio.run(_stables(cluster))
    assert final == _planned(before, planned)
    assert _moved(history) == {m["partition"] for m in planned["moves"]}
    _check_loads(planned, final)

    # Undrain: it takes replicas again.
    placectl(cluster, "node", "undrain", victim)
    deadline = time.monotonic() + EVENTUALLY
    while True:
        out = placectl(cluster, "node", "status", victim, "--json")
        status = json.loads(out.stdout)
        if status["replicas"] > 0 and not status["draining"]:
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.3)
    asyncio.run(_ready(cluster))


def test_a_zone_alter_dry_run_is_what_the_alter_then_does(cluster: Cluster) -> None:
    asyncio.run(_ready(cluster))
    asyncio.run(_sizes_reported(cluster))
    for replicas in (2, 3):
        before = asyncio.run(_stables(cluster))
        out = placectl(
            cluster, "zone", "alter", ZONE, "--replicas", str(replicas), "--dry-run", "--json"
        )
        (planned,) = json.loads(out.stdout)["zones"]
        assert planned["replicas"] == replicas
        zone = json.loads(placectl(cluster, "zone", "get", ZONE, "--json").stdout)
        assert zone["replicas"] == 5 - replicas  # the dry run wrote nothing
        assert asyncio.run(_stables(cluster)) == before
        assert len(planned["moves"]) == PARTITIONS  # every partition gains or loses one
        if replicas == 3:  # a grow copies each partition once more: the writers' data
            assert planned["bytes_to_move"] == sum(m["bytes"] for m in planned["moves"]) > 0

        async def body(count: int = replicas) -> None:
            await asyncio.to_thread(
                placectl, cluster, "zone", "alter", ZONE, "--replicas", str(count)
            )
            await _ready(cluster)

        history = asyncio.run(_with_history(cluster, body))
        final = asyncio.run(_stables(cluster))
        assert final == _planned(before, planned), replicas
        assert _moved(history) == {m["partition"] for m in planned["moves"]}
        _check_loads(planned, final)


def test_a_dry_run_of_bad_input_is_one_line_naming_it(cluster: Cluster) -> None:
    for args, field in (
        (("node", "drain", "no-such-node", "--dry-run"), "node"),
        (("zone", "alter", "no-such-zone", "--replicas", "2", "--dry-run"), "no-such-zone"),
        (("zone", "alter", ZONE, "--replicas", "0", "--dry-run"), "replicas"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "placement", "--endpoint", ",".join(cluster.driver_apis), *args],
            env={**os.environ, **cluster.env()},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert field in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_a_cordoned_node_keeps_what_it_holds_and_takes_no_new_replica(cluster: Cluster) -> None:
    """Cordon node-2: ``R`` 3 → 2 → 3 leaves it a subset of what it held (its share of it,
    the dry run saying so first), a new zone gives it nothing, and ``uncordon`` gives it its
    share of the new zone again — the cordon in etcd, read by the leader's passes."""
    asyncio.run(_ready(cluster))
    victim, side = "node-2", "side"

    def mine(stables: dict[int, tuple[str, ...]]) -> set[int]:
        return {p for p, peers in stables.items() if victim in peers}

    held = mine(asyncio.run(_stables(cluster)))
    assert held, "node-2 holds nothing: nothing to show"
    status = json.loads(placectl(cluster, "node", "cordon", victim, "-o", "json").stdout)
    assert status["cordoned"], status
    assert not status["draining"], status
    assert "cordoned" in placectl(cluster, "node", "status", victim).stdout
    for replicas in (2, 3):
        before = asyncio.run(_stables(cluster))
        out = placectl(
            cluster, "zone", "alter", ZONE, "--replicas", str(replicas), "--dry-run", "--json"
        )
        (planned,) = json.loads(out.stdout)["zones"]
        gains = [m for m in planned["moves"] if victim in m["after"] and victim not in m["before"]]
        assert not gains, gains
        placectl(cluster, "zone", "alter", ZONE, "--replicas", str(replicas))
        asyncio.run(_ready(cluster))
        final = asyncio.run(_stables(cluster))
        assert final == _planned(before, planned), replicas
        assert mine(final) <= mine(before), (replicas, mine(before), mine(final))
        if replicas == 2:
            assert len(mine(final)) == PARTITIONS * 2 // 4  # its share, all from what it held
    assert mine(asyncio.run(_stables(cluster))) <= held
    placectl(cluster, "zone", "create", side, "--partitions", "6", "--replicas", "2")
    try:
        asyncio.run(_ready(cluster, side))
        assert mine(asyncio.run(_stables(cluster, side))) == set()
        status = json.loads(placectl(cluster, "node", "uncordon", victim, "-o", "json").stdout)
        assert not status["cordoned"], status
        deadline = time.monotonic() + EVENTUALLY
        while len(mine(asyncio.run(_stables(cluster, side)))) != 6 * 2 // 4:
            assert time.monotonic() < deadline, asyncio.run(_stables(cluster, side))
            time.sleep(0.3)
        asyncio.run(_ready(cluster, side))
    finally:
        placectl(cluster, "node", "uncordon", victim)
        placectl(cluster, "zone", "drop", side)
    asyncio.run(_ready(cluster))


def test_a_sigterm_hands_the_agent_s_leases_over_before_it_leaves(cluster: Cluster) -> None:
    leaders = {n: asyncio.run(_leases_of(cluster, n)) for n in ("node-2", "node-3", "node-4")}
    victim = max(leaders, key=lambda n: len(leaders[n]))
    assert leaders[victim], leaders
    child = next(c for c in cluster.children if c.name == victim)
    assert child.proc is not None
    writers = Writers(cluster)

    async def body() -> None:
        async with writers.running():
            await asyncio.sleep(1.0)
            assert child.proc is not None
            child.proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(child.proc.wait, 30)
            assert code == 0
            await asyncio.sleep(1.0)

    history = asyncio.run(_with_history(cluster, body))
    assert not writers.failed, writers.failed[:5]
    gone = [rev for rev, kind, name, present in history.events if kind == "node" and name == victim]
    assert gone, "the node record never changed"
    left = max(gone)  # the record deleted (after it said it stops)
    first_handed = {}
    for rev, kind, p, held in history.events:
        if kind == "lease" and held and held[0] != victim and int(p) in leaders[victim]:
            first_handed.setdefault(int(p), rev)
    assert set(first_handed) == set(leaders[victim]), history.events
    assert max(first_handed.values()) < left, (first_handed, left)
    print(f"slowest write across the SIGTERM: {writers.slowest:.3f}s")
