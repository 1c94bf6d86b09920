"""Chaos on the data plane: real etcd, real agents (subprocesses running the replicated data
plane), drivers in-process or as subprocesses, with signals thrown at all of them.

* writers run >= 30 s while a node joins, a node leaves, the primary of a busy partition is
  SIGKILLed (and restarted on its data), the driver leader is SIGKILLed and the zone goes
  R 3 -> 5 -> 3: no acknowledged write is lost or wrong, every replica of stable is identical;
* overlapping faults under writes: the driver leader SIGKILLed, and while nobody leads a node
  joins and a busy partition's primary is SIGKILLed — the same checks, and no write by the dead
  leader's epoch after its key was deleted;
* a SIGSTOPped primary: writes sent to it while stopped (and right after SIGCONT) are never
  acknowledged nor found on any replica, while the new primary takes writes;
* a replica SIGKILLed mid catch-up (throttled) resumes on restart and ends identical;
* the primary — the copy's source — SIGKILLed mid-rebalance with writes in flight: the copy
  completes from the new primary, nothing acknowledged is lost, replicas identical;
* clients routed by stable ∪ pending mid-move: only the primary serves, every other member —
  the learner still copying included — redirects to it;
* a cancelled rebalance leaves no copy (no replica, no kv rows) on the node it was copying to.

The chaos events come one at a time (each waits for the rebalances of the previous one): a node
that leaves while a pending naming it in both old and new is in flight stalls that partition
(``driver_core.aggregate`` waits for DONE from every member of new, and ``abandoned_moves`` only
cancels moves whose *joining* member left) — a driver limitation outside this file's subject.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from conftest import ChaosEtcd
from test_data_plane import (
    LEASES,
    Agents,
    all_in_sync,
    check_replicas,
    isr_of,
    primary_of,
    put,
    raw_replica,
    replica_items,
    stable_of,
)
from test_driver import (
    TIMEOUT,
    converged,
    eventually,
    leader_fence,
    running_driver,
    settled,
)
from test_driver_chaos import Drivers, drivers_on, no_deposed_write, wait_leader

from placement.core.model import ZoneSpec
from placement.data.partitioning import partition_of
from placement.driver.loop import Driver
from placement.local.certs import LocalPki
from placement.metastore.codec import PrimaryLease, decode_primary
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import AssignField, KeySpace, prefix_range_end
from placement.metastore.kv import EventKind, WatchEvent
from placement.metastore.store import Metastore
from placement.metastore.transitions import Fence
from placement.v1 import common_pb2, data_pb2
from replica.records import AgentStore

AGENT_SCRIPT = """
import asyncio, logging, os, sys
from pathlib import Path
from replica.server import serve
from replica.data.plane import DataConfig
# the product's logging (placement.logs), as `placectl agent run` sets it up
from placement.logs import configure_logging
configure_logging("INFO")
# The catch-up rate is fixed (catch_up_yields=False): the tests time their kills by it.
# AGENT_TLS_DIR (placement.local.certs): mutual TLS with the node's certificate, and etcd over
# TLS as the product's etcd user.
tls = creds = None
if os.environ.get("AGENT_TLS_DIR"):
    from placement.local.certs import LocalPki
    from placement.security.credentials import EtcdCredentials
    pki = LocalPki(Path(os.environ["AGENT_TLS_DIR"]))
    tls, creds = pki.material(sys.argv[1]), EtcdCredentials(pki.material("etcd-client"))
sys.exit(asyncio.run(serve(
    sys.argv[1], sys.argv[2], Path(sys.argv[3]), etcd=sys.argv[4], prefix=sys.argv[5],
    lease_ttl=2, data_config=DataConfig(
        isr_timeout=1.5, catch_up_bytes_per_s=float(sys.argv[6]), fetch_bytes=int(sys.argv[7]),
        catch_up_yields=False,
    ), tls=tls, etcd_credentials=creds,
)))
"""

T = TypeVar("T")

# Driver subprocesses (election TTL 2 s) with the in-process tests' 3 s primary leases.
PRIMARY_LEASE = str(LEASES.duration_ms / 1000)


class ChaosAgents(Agents):
    """``Agents`` whose script takes a catch-up throttle (bytes/s, 0 = none) and page size."""

    def __init__(
        self,
        tmp_path: Path,
        endpoint: str,
        keys: KeySpace,
        throttle: float = 0,
        fetch_bytes: int = 1 << 20,
        pki: LocalPki | None = None,
    ) -> None:
        super().__init__(tmp_path, endpoint, keys, pki)
        self.throttle, self.fetch_bytes = throttle, fetch_bytes

    def command(self, node: str) -> list[str]:
        return [
            sys.executable, "-c", AGENT_SCRIPT, node, "127.0.0.1:0", str(self.data_dir(node)),
            self.endpoint, self.keys.prefix, str(self.throttle), str(self.fetch_bytes),
        ]  # fmt: skip

    async def kill(self, node: str) -> None:
        proc = self.procs[node]
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        if proc.stdout is not None:
            await proc.stdout.read()
        # Its channel stays open (closed at teardown): closing it would cancel the in-flight
        # calls of concurrent writers locally (CancelledError instead of UNAVAILABLE).
        self.addresses.pop(node)


@contextlib.asynccontextmanager
async def data_agents_on(
    chaos_etcd: ChaosEtcd,
    tmp_path: Path,
    keys: KeySpace,
    throttle: float = 0,
    fetch_bytes: int = 1 << 20,
) -> AsyncIterator[ChaosAgents]:
    """Data-plane agents on ``chaos_etcd``: plaintext, or secure (their certificates, the
    product's etcd user, the test's channels as the ``client`` role)."""
    a = ChaosAgents(tmp_path, chaos_etcd.endpoints, keys, throttle, fetch_bytes, chaos_etcd.pki)
    try:
        yield a
    finally:
        await a.close()


@pytest.fixture
async def agents(
    chaos_etcd: ChaosEtcd, tmp_path: Path, keys: KeySpace
) -> AsyncIterator[ChaosAgents]:
    async with data_agents_on(chaos_etcd, tmp_path, keys) as a:
        yield a


@pytest.fixture
async def slow_agents(
    chaos_etcd: ChaosEtcd, tmp_path: Path, keys: KeySpace
) -> AsyncIterator[ChaosAgents]:
    """Catch-up throttled to 1 MB/s, in 256 KiB pages."""
    async with data_agents_on(chaos_etcd, tmp_path, keys, 1e6, 256 << 10) as a:
        yield a


@pytest.fixture
async def chaos_drivers(
    chaos_etcd: ChaosEtcd, tmp_path: Path, prefix: str
) -> AsyncIterator[Drivers]:
    async with drivers_on(chaos_etcd, tmp_path, prefix) as ds:
        yield ds


def _driver(chaos_etcd: ChaosEtcd, keys: KeySpace) -> AbstractAsyncContextManager[Driver]:
    """The in-process driver on ``chaos_etcd`` (its etcd credentials and ``d1``'s certificate
    when secure), with the tests' short primary leases."""
    return running_driver(
        chaos_etcd.endpoints,
        keys,
        leases=LEASES,
        credentials=chaos_etcd.credentials,
        tls=chaos_etcd.tls("d1"),
    )


def ref(zone: str, p: int) -> common_pb2.PartitionRef:
    return common_pb2.PartitionRef(zone=zone, partition=p)


async def node_gone(client: EtcdClient, keys: KeySpace, node: str) -> None:
    async def gone() -> bool:
        return (await client.get(keys.node(node))).first() is None

    await eventually(gone, f"{node}'s registration to expire")


async def read_through_primary(
    agents: Agents, client: EtcdClient, keys: KeySpace, zone: str, partitions: int, key: bytes
) -> bytes | None:
    p = partition_of(key, partitions)
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while True:
        lease = await primary_of(client, keys, zone, p)
        try:
            if lease is None or lease.node not in agents.addresses:
                raise LookupError("no primary yet")
            got = await agents.data(lease.node).Get(
                data_pb2.GetRequest(partition=ref(zone, p), key=key), timeout=5
            )
            return got.value if got.found else None
        except (grpc.aio.AioRpcError, LookupError):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)


async def no_pending(store: Metastore, zone: str) -> bool:
    state = await store.read_zone(zone)
    return all(
        s.pending is None and s.planned is None and s.cancel is None
        for s in state.partitions.values()
    )


async def dump_history(client: EtcdClient, keys: KeySpace) -> None:
    """Print every change of the primary leases and in-sync sets (diagnostics on failure)."""
    end = await client.current_revision(keys.zones_prefix())
    events: list[WatchEvent] = []
    lo, hi = keys.primary_prefix(), keys.isr_prefix()
    start, stop = min(lo, hi), max(lo, hi)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(3.0):
            async with client.watch(start, prefix_range_end(stop), start_revision=1) as watch:
                async for batch in watch:
                    events.extend(batch.events)
                    if events and events[-1].kv.mod_revision >= end:
                        break
    holders: dict[bytes, tuple[str, int] | None] = {}
    for e in events:
        if e.kv.key.startswith(lo):  # lease renewals are noise: print holder changes only
            lease = decode_primary(e.kv.value) if e.kind is EventKind.PUT else None
            holder = (lease.node, lease.lease_epoch) if isinstance(lease, PrimaryLease) else None
            if holders.get(e.kv.key, ()) == holder:
                continue
            holders[e.kv.key] = holder
        elif not e.kv.key.startswith(hi):
            continue
        value = e.kv.value.decode(errors="replace")
        print(f"  rev {e.kv.mod_revision} {e.kind.name} {e.kv.key.decode()} {value}")


# -- 1. chaos under writes ----------------------------------------------------------------------


@dataclass
class Writer:
    """Writes ``w{id}-{seq}`` to its own keys in turn; records every attempt and every ack."""

    ident: int
    keys: list[bytes]
    attempts: dict[bytes, list[bytes]] = field(default_factory=dict)
    acked: dict[bytes, int] = field(default_factory=dict)  # key -> index into attempts[key]
    acks: int = 0
    failures: int = 0

    async def run(
        self,
        agents: Agents,
        client: EtcdClient,
        keys: KeySpace,
        zone: str,
        partitions: int,
        stop: asyncio.Event,
    ) -> None:
        seq = 0
        while not stop.is_set():
            key = self.keys[seq % len(self.keys)]
            value = f"w{self.ident}-{seq}".encode() + b"." * 64
            seq += 1
            tried = self.attempts.setdefault(key, [])
            tried.append(value)
            try:
                await put(agents, client, keys, zone, partitions, key, value, deadline=3.0)
            except (grpc.aio.AioRpcError, LookupError):
                self.failures += 1
                continue
            self.acked[key] = len(tried) - 1
            self.acks += 1


async def zone_in_sync(
    agents: ChaosAgents,
    drivers: Drivers,
    client: EtcdClient,
    keys: KeySpace,
    nodes: int,
    spec: ZoneSpec,
) -> Metastore:
    """Agents ``n1``..``n{nodes}``, drivers d1 (leading) and d2, zone ``spec`` created and
    every partition's in-sync set equal to its stable."""
    for i in range(1, nodes + 1):
        await agents.start(f"n{i}")
    await drivers.start("d1", "--primary-lease", PRIMARY_LEASE)
    await wait_leader(client, keys)
    await drivers.start("d2", "--primary-lease", PRIMARY_LEASE)
    member, fence = await wait_leader(client, keys)
    assert member == "d1"
    store = Metastore(client, keys)
    assert (await store.create_zone(spec, fence)).applied
    await eventually(lambda: all_in_sync(client, keys, store, spec), "ISR = stable")
    return store


def start_writers(
    writers: list[Writer],
    agents: Agents,
    client: EtcdClient,
    keys: KeySpace,
    spec: ZoneSpec,
    stop: asyncio.Event,
) -> list[asyncio.Task[None]]:
    """Each of ``writers`` writing to ``spec``'s zone until ``stop`` is set."""
    return [
        asyncio.create_task(w.run(agents, client, keys, spec.name, spec.partitions, stop))
        for w in writers
    ]


async def check_writers(
    agents: Agents,
    client: EtcdClient,
    keys: KeySpace,
    store: Metastore,
    spec: ZoneSpec,
    writers: list[Writer],
    others: Mapping[bytes, bytes] | None = None,
) -> int:
    """Every acknowledged write of ``writers``, read through the primary, is its last ack or a
    later attempt (nothing never written is found); every replica of stable is identical and
    holds what the primary serves, plus ``others`` (the zone's other acknowledged values, which
    nothing overwrote). Returns the replicas checked."""
    zone, partitions = spec.name, spec.partitions
    # Every acknowledged write, read through the primary: the last ack or a later attempt.
    wrong: list[str] = []
    latest: dict[bytes, bytes] = dict(others or {})
    for w in writers:
        for key, tried in w.attempts.items():
            got = await read_through_primary(agents, client, keys, zone, partitions, key)
            if got is not None:
                latest[key] = got
            if key in w.acked:
                allowed = tried[w.acked[key] :]
                if got not in allowed:
                    wrong.append(f"{key!r}: read {got!r}, acked {tried[w.acked[key]]!r}")
            elif got is not None and got not in tried:
                wrong.append(f"{key!r}: read {got!r}, never written")
    assert not wrong, f"{len(wrong)} lost or wrong acknowledged writes: {wrong[:10]}"

    # Every replica of stable is identical and holds what the primary serves.
    stables = await stable_of(store, zone)
    checked = 0
    for p, peers in stables.items():
        want = {k: v for k, v in latest.items() if partition_of(k, partitions) == p}
        copies = {n: await replica_items(agents, n, zone, p) for n in peers}
        for node, copy in copies.items():
            assert copy == want, f"{zone}/{p}: {node}'s replica differs from the primary's reads"
            checked += 1
    await check_replicas(agents, store, spec, latest)
    return checked


async def test_chaos_under_writes_loses_no_acknowledged_write(
    chaos_etcd: ChaosEtcd,
    agents: ChaosAgents,
    chaos_drivers: Drivers,
    keys: KeySpace,
) -> None:
    drivers, client = chaos_drivers, chaos_etcd.client
    zone, partitions = "kv", 4
    start = await client.current_revision(keys.zone(zone))
    spec = ZoneSpec(zone, partitions=partitions, replicas=3)
    store = await zone_in_sync(agents, drivers, client, keys, 5, spec)
    writers = [Writer(w, [f"writer{w}/key{i:03d}".encode() for i in range(24)]) for w in range(6)]
    stop = asyncio.Event()
    tasks = start_writers(writers, agents, client, keys, spec, stop)
    started = time.monotonic()

    def acks() -> int:
        return sum(w.acks for w in writers)

    def stamp(what: str) -> None:
        print(f"[{time.monotonic() - started:5.1f}s] {what} (acks so far {acks()})")

    try:
        # A node joins.
        await asyncio.sleep(2)
        await agents.start("n6")
        stamp("n6 joined")

        async def n6_in_stable() -> bool:
            return any("n6" in peers for peers in (await stable_of(store, zone)).values())

        await eventually(n6_in_stable, "n6 to join stable", within=TIMEOUT * 2)
        # One event at a time (see the module docstring).
        await eventually(lambda: no_pending(store, zone), "the join's rebalance to finish")
        stamp("n6 holds replicas")

        # A node leaves (SIGTERM): one that is not the primary of partition 0.
        p0 = await primary_of(client, keys, zone, 0)
        assert p0 is not None
        leaver = next(n for n in ("n1", "n2", "n3", "n4", "n5") if n != p0.node)
        agents.procs[leaver].send_signal(signal.SIGTERM)
        await agents.procs[leaver].wait()
        stamp(f"{leaver} left (SIGTERM)")

        async def leaver_out() -> bool:
            state = await store.read_zone(zone)
            return len(state.partitions) == partitions and all(
                leaver not in (s.peers(AssignField.STABLE) or ())
                and s.pending is None
                and s.planned is None
                for s in state.partitions.values()
            )

        await eventually(leaver_out, f"{leaver} to be moved out", within=TIMEOUT * 2)
        agents.addresses.pop(leaver)
        stamp(f"{leaver} holds no replica in stable")

        # The primary of a busy partition is SIGKILLed; it comes back later on its data dir.
        p0 = await primary_of(client, keys, zone, 0)
        assert p0 is not None
        victim = p0.node
        before = acks()
        await agents.kill(victim)
        stamp(f"primary of {zone}/0 {victim} SIGKILLed")

        async def moved() -> bool:
            lease = await primary_of(client, keys, zone, 0)
            return lease is not None and lease.node != victim

        await eventually(moved, "the lease of partition 0 to move off the killed primary")
        stamp("partition 0 has a new primary")
        await node_gone(client, keys, victim)
        await agents.start(victim)
        stamp(f"{victim} restarted on its data")

        # The driver leader is SIGKILLed.
        drivers.procs["d1"].proc.send_signal(signal.SIGKILL)
        await drivers.procs["d1"].proc.wait()
        member, fence = await wait_leader(client, keys, other_than="d1")
        assert member == "d2"
        stamp("driver d1 SIGKILLed, d2 leads")

        # R 3 -> 5 -> 3 (5 live nodes now).
        for replicas in (5, 3):
            record = await store.get_zone(zone)
            assert record is not None
            spec = ZoneSpec(zone, partitions=partitions, replicas=replicas)
            assert (await store.update_zone(spec, record.mod_revision, fence)).applied
            await eventually(
                functools.partial(settled, store, spec),
                f"R={replicas} to settle",
                within=TIMEOUT * 2,
            )
            stamp(f"R={replicas} settled")

        left = 32 - (time.monotonic() - started)
        if left > 0:
            await asyncio.sleep(left)
        assert acks() > before, "writes went on after the chaos"
    except BaseException:
        stamp("failed; etcd history of leases and in-sync sets:")
        await dump_history(client, keys)
        raise
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    wrote_for = time.monotonic() - started
    stamp("writers stopped")
    assert wrote_for >= 30

    await eventually(lambda: no_pending(store, zone), "every pending to be empty")
    await eventually(lambda: all_in_sync(client, keys, store, spec), "ISR = stable", TIMEOUT * 2)
    assert await settled(store, spec)

    checked = await check_writers(agents, client, keys, store, spec, writers)
    stables = await stable_of(store, zone)

    await no_deposed_write(client, keys, start, terms_ended=1)
    total_acks = acks()
    acked_keys = sum(len(w.acked) for w in writers)
    print(
        f"chaos under writes: {total_acks} acknowledged writes ({sum(w.failures for w in writers)}"
        f" failed attempts) over {wrote_for:.1f}s, {acked_keys} keys, {len(stables)} partitions,"
        f" {checked} replicas checked identical"
    )
    assert total_acks > 0
    assert acked_keys > 0
    assert len(stables) == partitions
    assert checked > 0


async def test_overlapping_faults_a_join_while_the_leader_is_down_and_a_primary_dies(
    chaos_etcd: ChaosEtcd,
    agents: ChaosAgents,
    chaos_drivers: Drivers,
    keys: KeySpace,
) -> None:
    """Three faults at once under writes: the driver leader SIGKILLed, and while nobody leads a
    node joins and the primary of a busy partition is SIGKILLed (restarted on its data once its
    registration expired). The other driver takes over, the lease moves, the join completes onto
    the placement function's target; no acknowledged write is lost, every replica of stable is
    identical, and etcd's history shows no write by the dead leader's epoch after its key went."""
    drivers, client = chaos_drivers, chaos_etcd.client
    zone, partitions = "ov", 4
    start = await client.current_revision(keys.zone(zone))
    spec = ZoneSpec(zone, partitions=partitions, replicas=3)
    store = await zone_in_sync(agents, drivers, client, keys, 4, spec)
    writers = [Writer(w, [f"writer{w}/key{i:03d}".encode() for i in range(16)]) for w in range(4)]
    stop = asyncio.Event()
    tasks = start_writers(writers, agents, client, keys, spec, stop)
    try:
        await asyncio.sleep(2)
        p0 = await primary_of(client, keys, zone, 0)
        assert p0 is not None
        victim = p0.node
        drivers.procs["d1"].proc.send_signal(signal.SIGKILL)
        await drivers.procs["d1"].proc.wait()
        await agents.start("n5")
        await agents.kill(victim)
        before = sum(w.acks for w in writers)
        member, _ = await wait_leader(client, keys, other_than="d1")
        assert member == "d2"

        async def moved() -> bool:
            lease = await primary_of(client, keys, zone, 0)
            return lease is not None and lease.node != victim

        await eventually(moved, "the lease of partition 0 to move off the killed primary")
        await node_gone(client, keys, victim)
        await agents.start(victim)

        async def joined() -> bool:
            in_stable = any("n5" in peers for peers in (await stable_of(store, zone)).values())
            return in_stable and await converged(store, spec)

        await eventually(joined, "the join to complete onto the target", within=TIMEOUT * 2)
        await asyncio.sleep(1.0)  # writes on the converged zone too
        assert sum(w.acks for w in writers) > before, "writes went on after the faults"
    except BaseException:
        await dump_history(client, keys)
        raise
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    await eventually(lambda: all_in_sync(client, keys, store, spec), "ISR = stable", TIMEOUT * 2)
    checked = await check_writers(agents, client, keys, store, spec, writers)
    await no_deposed_write(client, keys, start, terms_ended=1)
    acks = sum(w.acks for w in writers)
    print(f"overlapping faults: {acks} acknowledged writes, {checked} replicas identical")
    assert checked >= partitions * spec.replicas


# -- 2. a SIGSTOPped primary ----------------------------------------------------------------


async def test_writes_to_a_sigstopped_primary_are_never_acknowledged_nor_kept(
    chaos_etcd: ChaosEtcd, agents: ChaosAgents, keys: KeySpace
) -> None:
    client = chaos_etcd.client
    zone, partitions = "kv", 2
    for n in ("n1", "n2", "n3"):
        await agents.start(n)
    async with _driver(chaos_etcd, keys) as driver:
        store = Metastore(client, keys)
        spec = ZoneSpec(zone, partitions=partitions, replicas=3)
        assert (await store.create_zone(spec, await leader_fence(driver))).applied
        await eventually(lambda: all_in_sync(client, keys, store, spec), "ISR = stable")
        keys0 = [k for k in (f"key{i}".encode() for i in range(200)) if partition_of(k, 2) == 0]
        acked: dict[bytes, bytes] = {}
        for key in keys0[:20]:
            await put(agents, client, keys, zone, partitions, key, b"before-" + key)
            acked[key] = b"before-" + key

        lease = await primary_of(client, keys, zone, 0)
        assert lease is not None
        victim = lease.node
        stale_values: set[bytes] = set()

        async def direct(i: int) -> grpc.StatusCode:
            key = keys0[i % len(keys0)]
            value = f"stale-{i}".encode()
            stale_values.add(value)
            try:
                await agents.data(victim).Put(
                    data_pb2.PutRequest(partition=ref(zone, 0), key=key, value=value), timeout=40
                )
            except grpc.aio.AioRpcError as e:
                return e.code()
            return grpc.StatusCode.OK

        agents.procs[victim].send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            blocked = [asyncio.create_task(direct(i)) for i in range(10)]

            async def moved() -> bool:
                now = await primary_of(client, keys, zone, 0)
                return now is not None and now.node != victim

            await eventually(moved, "the lease to move off the stopped primary")
            new = await primary_of(client, keys, zone, 0)
            assert new is not None
            print(
                f"lease moved {victim} -> {new.node}"
                f" {time.monotonic() - stopped_at:.1f}s after SIGSTOP"
            )
            # Writes through the new primary succeed while the old one is still stopped.
            for key in keys0[20:40]:
                await put(agents, client, keys, zone, partitions, key, b"new-" + key)
                acked[key] = b"new-" + key
            # None is acknowledged. (One may fail already: past the channel's keep-alive, 13 s,
            # the client gives up on a frozen peer with UNAVAILABLE — a loaded machine gets there.)
            acknowledged = [t for t in blocked if t.done() and t.result() is grpc.StatusCode.OK]
            assert not acknowledged, "a stopped agent acknowledged a write"
        finally:
            agents.procs[victim].send_signal(signal.SIGCONT)
        after = [asyncio.create_task(direct(i)) for i in range(10, 20)]
        codes = await asyncio.gather(*blocked, *after)
        print(f"writes to the stopped primary answered: {sorted(c.name for c in codes)}")
        assert all(
            c in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE) for c in codes
        ), codes

        # More writes through the new primary, then the old one comes back in sync.
        for key in keys0[:10]:
            await put(agents, client, keys, zone, partitions, key, b"later-" + key)
            acked[key] = b"later-" + key
        await eventually_in_sync(client, keys, store, spec)
        isr = await isr_of(client, keys, zone, 0)
        assert isr is not None
        assert victim in isr.members
        checked = 0
        for node in ("n1", "n2", "n3"):
            for p in range(partitions):
                _, items = await raw_replica(agents, node, zone, p)
                kept = {k: v for k, v in items.items() if v in stale_values}
                assert not kept, f"{node} holds unacknowledged writes of {zone}/{p}: {kept}"
                checked += 1
        await check_replicas(agents, store, spec, acked)
        print(f"sigstop: {len(codes)} refused writes, {len(acked)} acked keys, {checked} replicas")
        assert checked == 6
        assert len(acked) == 40


async def eventually_in_sync(
    client: EtcdClient, keys: KeySpace, store: Metastore, spec: ZoneSpec
) -> None:
    await eventually(lambda: all_in_sync(client, keys, store, spec), "ISR = stable", TIMEOUT * 2)


# -- 3 / 4. throttled catch-ups ---------------------------------------------------------------


async def load(
    agents: Agents, client: EtcdClient, keys: KeySpace, zone: str, total: int
) -> dict[bytes, bytes]:
    """``total`` bytes in ~8 KiB values into partition 0 of a 1-partition zone."""
    acked: dict[bytes, bytes] = {}
    count = total // 8192
    queue = list(range(count))

    async def worker() -> None:
        while queue:
            i = queue.pop()
            key, value = f"big{i:05d}".encode(), (f"{i:05d}".encode() * 1640)[:8192]
            await put(agents, client, keys, zone, 1, key, value)
            acked[key] = value

    await asyncio.gather(*(worker() for _ in range(8)))
    return acked


async def grow_to_new_node(
    agents: ChaosAgents, client: EtcdClient, keys: KeySpace, store: Metastore, fence: Fence
) -> tuple[ZoneSpec, dict[bytes, bytes]]:
    """Zone "big" (P=1, R=2 on n1, n2) with ~4 MB; n3 starts; R := 3; returns once n3 holds
    part of the copy (complete=False)."""
    # A scale-down delay, as operators set one: a node that restarts within it is not "gone",
    # so its unfinished move resumes instead of being abandoned and re-planned.
    spec = ZoneSpec("big", partitions=1, replicas=2, scale_down_delay=60)
    assert (await store.create_zone(spec, fence)).applied
    await eventually(lambda: all_in_sync(client, keys, store, spec), "ISR = stable")
    loaded_at = time.monotonic()
    acked = await load(agents, client, keys, "big", 4 << 20)
    print(
        f"loaded {len(acked)} values ({sum(map(len, acked.values())) >> 10} KiB) in"
        f" {time.monotonic() - loaded_at:.1f}s"
    )
    await agents.start("n3")
    record = await store.get_zone("big")
    assert record is not None
    bigger = ZoneSpec("big", partitions=1, replicas=3, scale_down_delay=60)
    assert (await store.update_zone(bigger, record.mod_revision, fence)).applied

    async def partial() -> bool:
        hosted, items = await raw_replica(agents, "n3", "big", 0)
        return not hosted and len(items) > 0

    await eventually(partial, "n3 to hold part of the copy")
    state = await store.read_partition("big", 0)
    assert state.pending is not None
    assert "n3" in (state.peers(AssignField.PENDING) or ())
    return bigger, acked


@contextlib.asynccontextmanager
async def growing_onto_n3(
    chaos_etcd: ChaosEtcd, agents: ChaosAgents, keys: KeySpace
) -> AsyncIterator[tuple[Fence, Metastore, ZoneSpec, dict[bytes, bytes]]]:
    """Agents n1, n2 and the in-process driver, zone "big" growing onto n3 mid-copy
    (:func:`grow_to_new_node`): yields the driver's fence, the store, the grown spec and the
    loaded values."""
    for n in ("n1", "n2"):
        await agents.start(n)
    async with _driver(chaos_etcd, keys) as driver:
        store = Metastore(chaos_etcd.client, keys)
        fence = await leader_fence(driver)
        spec, acked = await grow_to_new_node(agents, chaos_etcd.client, keys, store, fence)
        yield fence, store, spec, acked


async def test_a_replica_sigkilled_mid_catch_up_resumes_and_ends_identical(
    chaos_etcd: ChaosEtcd, slow_agents: ChaosAgents, keys: KeySpace
) -> None:
    agents, client = slow_agents, chaos_etcd.client
    async with growing_onto_n3(chaos_etcd, agents, keys) as (_, store, spec, acked):
        _, items = await raw_replica(agents, "n3", "big", 0)
        await agents.kill("n3")
        print(f"n3 SIGKILLed holding {len(items)}/{len(acked)} items of the copy")
        assert len(items) < len(acked)
        # The partial copy survived the kill.
        db = AgentStore.inspect(agents.data_dir("n3"))
        try:
            _bytes, count = db.data.size("big", 0)
            assert count > 0
        finally:
            db.close()
        await node_gone(client, keys, "n3")
        restarted = time.monotonic()
        await agents.start("n3")
        await eventually(lambda: settled(store, spec), "the rebalance to complete", TIMEOUT * 2)
        await eventually_in_sync(client, keys, store, spec)
        print(f"catch-up completed {time.monotonic() - restarted:.1f}s after the restart")
        assert "n3" in (await stable_of(store, "big"))[0]
        await check_replicas(agents, store, spec, acked)
        copy = await replica_items(agents, "n3", "big", 0)
        assert copy == acked
        print(f"catch-up after SIGKILL: {len(copy)} items on n3 identical to n1, n2")


async def test_a_primary_sigkilled_mid_rebalance_with_writes_in_flight(
    chaos_etcd: ChaosEtcd, slow_agents: ChaosAgents, keys: KeySpace
) -> None:
    """Zone "big" grows onto n3 (a throttled copy of ~4 MB from the primary) while writers
    write; the primary — the copy's source — is SIGKILLed mid-copy with writes in flight, and
    restarted on its data once its registration expired. The lease moves, n3's copy completes
    from the new primary, the rebalance settles; every acknowledged write and every loaded value
    is on every replica of stable, identical."""
    agents, client = slow_agents, chaos_etcd.client
    async with growing_onto_n3(chaos_etcd, agents, keys) as (_, store, spec, loaded):
        writers = [Writer(w, [f"mid{w}/k{i:02d}".encode() for i in range(8)]) for w in range(3)]
        stop = asyncio.Event()
        tasks = start_writers(writers, agents, client, keys, spec, stop)
        try:
            await asyncio.sleep(0.5)
            lease = await primary_of(client, keys, "big", 0)
            assert lease is not None
            victim = lease.node
            await agents.kill(victim)
            before = sum(w.acks for w in writers)
            hosted, items = await raw_replica(agents, "n3", "big", 0)
            assert not hosted, "the copy ended before the primary was killed"
            print(f"primary {victim} SIGKILLed; n3 held {len(items)}/{len(loaded)} loaded items")

            async def moved() -> bool:
                now = await primary_of(client, keys, "big", 0)
                return now is not None and now.node != victim

            await eventually(moved, "the lease to move off the killed primary")
            await node_gone(client, keys, victim)
            await agents.start(victim)
            await eventually(lambda: settled(store, spec), "the rebalance to settle", TIMEOUT * 2)
            await eventually_in_sync(client, keys, store, spec)
            await asyncio.sleep(1.0)  # writes on the settled zone too
            assert sum(w.acks for w in writers) > before, "writes went on after the kill"
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        assert "n3" in (await stable_of(store, "big"))[0]
        checked = await check_writers(agents, client, keys, store, spec, writers, loaded)
        print(f"{sum(w.acks for w in writers)} acknowledged writes; {checked} replicas identical")


async def _answer(call: Awaitable[T]) -> tuple[T | None, grpc.aio.AioRpcError | None]:
    """The reply of ``call``, or the error it ended with."""
    try:
        return await call, None
    except grpc.aio.AioRpcError as e:
        return None, e


async def test_clients_routed_by_stable_and_pending_mid_move_reach_only_the_primary(
    chaos_etcd: ChaosEtcd, slow_agents: ChaosAgents, keys: KeySpace
) -> None:
    """A client may route by an assignment's stable ∪ pending — the old members and the new — in
    the middle of a move. Every one of them answers a write or a read only as the primary does:
    the primary serves it, every other member (a follower, the learner still copying) refuses
    with FAILED_PRECONDITION naming the primary — no acknowledgement and no stale or partial
    read from a member that is not the primary. What the primary acknowledged is on every
    replica once the move ends."""
    agents, client = slow_agents, chaos_etcd.client
    async with growing_onto_n3(chaos_etcd, agents, keys) as (_, store, spec, acked):
        state = await store.read_partition("big", 0)
        members = {
            *(state.peers(AssignField.STABLE) or ()),
            *(state.peers(AssignField.PENDING) or ()),
        }
        assert members == {"n1", "n2", "n3"}, members
        lease = await primary_of(client, keys, "big", 0)
        assert lease is not None
        _, copied = await raw_replica(agents, "n3", "big", 0)
        uncopied = next(k for k in acked if k not in copied)
        served: dict[str, str] = {}
        for node in sorted(members):
            key = f"routed/{node}".encode()
            for op, call in (
                ("put", agents.data(node).Put(
                    data_pb2.PutRequest(partition=ref("big", 0), key=key, value=b"v-" + key)
                )),
                ("get", agents.data(node).Get(
                    data_pb2.GetRequest(partition=ref("big", 0), key=uncopied)
                )),
            ):  # fmt: skip
                reply, refused = await _answer(call)
                if refused is not None:
                    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION, (node, op)
                    named = dict(refused.trailing_metadata() or ()).get("x-primary", "")
                    assert named.startswith(f"{lease.node}@"), (node, op, named)
                    served[f"{node} {op}"] = "redirected"
                    continue
                assert node == lease.node, f"{node} (not the primary) answered a {op}"
                if op == "get":
                    assert reply.found, "the primary lost a loaded value"
                    assert reply.value == acked[uncopied]
                else:
                    acked[key] = b"v-" + key
                served[f"{node} {op}"] = "served"
        print(f"mid-move routing (primary {lease.node}): {served}")
        assert served[f"{lease.node} put"] == "served"
        assert list(served.values()).count("served") == 2, served
        await eventually(lambda: settled(store, spec), "the move to settle", TIMEOUT * 2)
        await eventually_in_sync(client, keys, store, spec)
        await check_replicas(agents, store, spec, acked)


async def test_a_cancelled_rebalance_leaves_no_copy(
    chaos_etcd: ChaosEtcd, slow_agents: ChaosAgents, keys: KeySpace
) -> None:
    agents, client = slow_agents, chaos_etcd.client
    async with growing_onto_n3(chaos_etcd, agents, keys) as (fence, store, _, acked):
        # Back to R=2 first (the driver plans nothing for a partition with a pending), then cancel.
        record = await store.get_zone("big")
        assert record is not None
        spec = ZoneSpec("big", partitions=1, replicas=2, scale_down_delay=60)
        assert (await store.update_zone(spec, record.mod_revision, fence)).applied
        state = await store.read_partition("big", 0)
        assert state.pending is not None
        result = await store.cancel(
            "big", 0, state.pending.mod_revision, fence, int(time.time() * 1000)
        )
        print(f"cancel: {result.outcome}")
        await eventually(lambda: no_pending(store, "big"), "the cancel to finish")
        await eventually(lambda: settled(store, spec), "R=2")
        assert set((await stable_of(store, "big"))[0]) == {"n1", "n2"}
        hosted, items = await raw_replica(agents, "n3", "big", 0)
        assert not hosted
        assert not items, f"n3 still holds {len(items)} items"
        db = AgentStore.inspect(agents.data_dir("n3"))
        try:
            assert db.data.size("big", 0) == (0, 0)
            assert db.data.state("big", 0) is None
            assert db.replica("big", 0) is None
        finally:
            db.close()
        await eventually_in_sync(client, keys, store, spec)
        await check_replicas(agents, store, spec, acked)
        print(f"cancelled rebalance: n3 holds nothing; {len(acked)} items intact on n1, n2")
