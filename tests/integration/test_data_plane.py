"""The data plane end to end: real etcd, the real driver (in-process), agents as subprocesses
running the real data plane (replication, ISR in etcd, catch-up by snapshot + log).

* writes are acknowledged by the primary and land on every replica of stable;
* a node joins: the rebalance copies the data to the new replicas before stable switches;
* the primary of a busy partition is SIGKILLed: a new primary (an ISR member) takes over after
  the lease expires and every acknowledged write is still there, on every replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from test_driver import (
    ROOT,
    SCALE,
    TIMEOUT,
    assert_clean_log,
    eventually,
    leader_fence,
    running_driver,
    settled,
)

from placement.core.model import ZoneSpec
from placement.data.partitioning import partition_of
from placement.driver.leases import LeaseConfig
from placement.driver.loop import Driver
from placement.local.certs import LocalPki
from placement.metastore.codec import (
    InSyncSet,
    LeaseTerm,
    NodeRecord,
    PrimaryLease,
    ReplicaSize,
    decode_isr,
    decode_primary,
    decode_size,
    decode_term,
)
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace
from placement.metastore.store import Metastore
from placement.metastore.txn import MAX_TXN_OPS
from placement.rpc import DATA_PROFILE, channel
from placement.v1 import common_pb2, data_pb2, data_pb2_grpc

AGENT = """
import asyncio, logging, sys
from pathlib import Path
from replica.server import serve
from replica.data.plane import DataConfig
# the product's logging (placement.logs), as `placectl agent run` sets it up
from placement.logs import configure_logging
configure_logging("INFO")
sys.exit(asyncio.run(serve(
    sys.argv[1], sys.argv[2], Path(sys.argv[3]), etcd=sys.argv[4], prefix=sys.argv[5],
    lease_ttl=2, data_config=DataConfig(isr_timeout=1.5, catch_up_bytes_per_s=0),
)))
"""

LEASES = LeaseConfig(duration_ms=3000, renew_before_ms=1500)


class Agents:
    def __init__(
        self, tmp_path: Path, endpoint: str, keys: KeySpace, pki: LocalPki | None = None
    ) -> None:
        self.tmp_path, self.endpoint, self.keys = tmp_path, endpoint, keys
        #: Secure runs: the test's channels present the ``client`` certificate.
        self.pki = pki
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.addresses: dict[str, str] = {}
        self.channels: dict[str, grpc.aio.Channel] = {}

    def data_dir(self, node: str) -> Path:
        return self.tmp_path / node

    def command(self, node: str) -> list[str]:
        """The agent's command line (subclasses pass their own script and settings)."""
        return [
            sys.executable, "-c", AGENT, node, "127.0.0.1:0", str(self.data_dir(node)),
            self.endpoint, self.keys.prefix,
        ]  # fmt: skip

    async def start(self, node: str, env: dict[str, str] | None = None) -> None:
        """Start agent ``node`` (``env`` added to its environment)."""
        log = self.tmp_path / f"agent-{node}.log"
        with log.open("ab") as err:
            secure = {"AGENT_TLS_DIR": str(self.pki.directory)} if self.pki is not None else {}
            proc = await asyncio.create_subprocess_exec(
                *self.command(node),
                cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=err,
                stdin=asyncio.subprocess.DEVNULL, env={**os.environ, **secure, **(env or {})},
            )  # fmt: skip
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), TIMEOUT)).decode()
        assert line.startswith(f"agent {node} listening on "), (line, log.read_text())
        self.procs[node] = proc
        self.addresses[node] = line.rsplit(" ", 1)[1].strip()

    def data(self, node: str) -> data_pb2_grpc.DataServiceAsyncStub:
        return data_pb2_grpc.DataServiceStub(self._channel(node))  # type: ignore[return-value]

    def replication(self, node: str) -> data_pb2_grpc.ReplicationServiceAsyncStub:
        return data_pb2_grpc.ReplicationServiceStub(self._channel(node))  # type: ignore[return-value]

    def _channel(self, node: str) -> grpc.aio.Channel:
        address = self.addresses[node]
        if address not in self.channels:
            tls = self.pki.material("client") if self.pki is not None else None
            self.channels[address] = channel(address, DATA_PROFILE, tls)
        return self.channels[address]

    async def close(self) -> None:
        for open_channel in self.channels.values():
            await open_channel.close()
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for node, proc in self.procs.items():
            await asyncio.wait_for(proc.wait(), TIMEOUT)
            if proc.stdout is not None:
                await proc.stdout.read()
            if proc.returncode != -signal.SIGKILL:
                assert_clean_log(self.tmp_path / f"agent-{node}.log")


@pytest.fixture
async def agents(etcd: object, tmp_path: Path, keys: KeySpace) -> AsyncIterator[Agents]:
    a = Agents(tmp_path, etcd.endpoint, keys)  # type: ignore[attr-defined]
    try:
        yield a
    finally:
        await a.close()


async def primary_of(client: EtcdClient, keys: KeySpace, zone: str, p: int) -> PrimaryLease | None:
    kv = (await client.get(keys.primary(zone, p))).first()
    lease = decode_primary(kv.value) if kv is not None else None
    return lease if isinstance(lease, PrimaryLease) else None


async def term_of(client: EtcdClient, keys: KeySpace, node: str) -> int:
    """``until`` of ``node``'s lease term (0: none): when every lease it holds ends."""
    kv = (await client.get(keys.term(node))).first()
    term = decode_term(kv.value) if kv is not None else None
    return term.until if isinstance(term, LeaseTerm) else 0


async def isr_of(client: EtcdClient, keys: KeySpace, zone: str, p: int) -> InSyncSet | None:
    kv = (await client.get(keys.isr(zone, p))).first()
    isr = decode_isr(kv.value) if kv is not None else None
    return isr if isinstance(isr, InSyncSet) else None


async def put(
    agents: Agents,
    client: EtcdClient,
    keys: KeySpace,
    zone: str,
    partitions: int,
    key: bytes,
    value: bytes,
    deadline: float = 20.0,
) -> data_pb2.WriteResponse:
    """Put through the partition's primary, following redirects and retrying while it moves."""
    p = partition_of(key, partitions)
    ref = common_pb2.PartitionRef(zone=zone, partition=p)
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while True:
        lease = await primary_of(client, keys, zone, p)
        try:
            if lease is None or lease.node not in agents.addresses:
                raise LookupError("no primary yet")
            return await agents.data(lease.node).Put(
                data_pb2.PutRequest(partition=ref, key=key, value=value), timeout=5
            )
        except (grpc.aio.AioRpcError, LookupError):
            if loop.time() > end:
                raise
            await asyncio.sleep(0.1)


async def stable_of(store: Metastore, zone: str) -> dict[int, tuple[str, ...]]:
    state = await store.read_zone(zone)
    return {
        p: s.stable.value.peers  # type: ignore[union-attr]
        for p, s in state.partitions.items()
        if s.stable is not None and s.pending is None
    }


async def all_in_sync(client: EtcdClient, keys: KeySpace, store: Metastore, spec: ZoneSpec) -> bool:
    stables = await stable_of(store, spec.name)
    if len(stables) != spec.partitions:
        return False
    for p, peers in stables.items():
        isr = await isr_of(client, keys, spec.name, p)
        if isr is None or set(isr.members) != set(peers):
            return False
    return True


#: ReadReplica page size (pages are also capped at about 1 MiB by the agent).
PAGE = 64


async def raw_replica(
    agents: Agents, node: str, zone: str, p: int
) -> tuple[bool, dict[bytes, bytes]]:
    """(hosted, items) of whatever ``node`` holds of zone/p (complete or not)."""
    out: dict[bytes, bytes] = {}
    after = b""
    while True:
        reply = await agents.replication(node).ReadReplica(
            data_pb2.ReadReplicaRequest(
                partition=common_pb2.PartitionRef(zone=zone, partition=p),
                start_after=after,
                limit=PAGE,
            ),
            timeout=5,
        )
        out.update((i.key, i.value) for i in reply.items)
        if not reply.more or not reply.items:
            return reply.hosted, out
        after = reply.items[-1].key


async def replica_items(agents: Agents, node: str, zone: str, p: int) -> dict[bytes, bytes]:
    hosted, items = await raw_replica(agents, node, zone, p)
    assert hosted, f"{node} holds no complete replica of {zone}/{p}"
    return items


async def check_replicas(
    agents: Agents, store: Metastore, spec: ZoneSpec, acked: dict[bytes, bytes]
) -> int:
    """Every replica of stable is identical and holds ``acked``; returns the replicas read."""
    stables = await stable_of(store, spec.name)
    assert len(stables) == spec.partitions
    checked = 0
    for p, peers in stables.items():
        want = {k: v for k, v in acked.items() if partition_of(k, spec.partitions) == p}
        copies = [await replica_items(agents, n, spec.name, p) for n in peers]
        for node, copy in zip(peers, copies, strict=True):
            assert copy == copies[0], f"{spec.name}/{p}: {node} differs from {peers[0]}"
            missing = {k for k, v in want.items() if copy.get(k) != v}
            assert not missing, f"{spec.name}/{p} on {node}: {len(missing)} acknowledged lost"
            checked += 1
    return checked


@contextlib.asynccontextmanager
async def zone_in_sync_on_three(
    etcd: object,
    agents: Agents,
    client: EtcdClient,
    keys: KeySpace,
    spec: ZoneSpec,
    leases: LeaseConfig = LEASES,
) -> AsyncIterator[tuple[Driver, Metastore]]:
    """Agents n1..n3 and an in-process driver with ``leases``; zone ``spec`` created and every
    in-sync set equal to its stable. Yields the driver (running until the block ends) and the
    store."""
    for n in ("n1", "n2", "n3"):
        await agents.start(n)
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    async with running_driver(endpoint, keys, leases=leases) as driver:
        store = Metastore(client, keys)
        assert (await store.create_zone(spec, await leader_fence(driver))).applied
        await eventually(lambda: all_in_sync(client, keys, store, spec), "ISR = stable")
        yield driver, store


async def test_writes_reach_every_replica_and_a_joining_node_gets_the_data(
    etcd: object, agents: Agents, client: EtcdClient, keys: KeySpace
) -> None:
    spec = ZoneSpec("kv", partitions=4, replicas=3)
    async with zone_in_sync_on_three(etcd, agents, client, keys, spec, LEASES) as (_, store):
        acked: dict[bytes, bytes] = {}
        for i in range(120):
            key, value = f"k{i:04d}".encode(), f"v{i}".encode() * 20
            reply = await put(agents, client, keys, "kv", 4, key, value)
            assert reply.index > 0
            assert reply.lease_epoch >= 1
            acked[key] = value
        # Reads through the primary see every acknowledged write.
        for key, value in list(acked.items())[:20]:
            p = partition_of(key, 4)
            lease = await primary_of(client, keys, "kv", p)
            assert lease is not None
            got = await agents.data(lease.node).Get(
                data_pb2.GetRequest(
                    partition=common_pb2.PartitionRef(zone="kv", partition=p), key=key
                )
            )
            assert got.found
            assert got.value == value
        await check_replicas(agents, store, spec, acked)

        # A non-primary answers FAILED_PRECONDITION naming the primary.
        lease = await primary_of(client, keys, "kv", 0)
        assert lease is not None
        other = next(n for n in ("n1", "n2", "n3") if n != lease.node)
        key0 = next(k for k in acked if partition_of(k, 4) == 0)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await agents.data(other).Put(
                data_pb2.PutRequest(
                    partition=common_pb2.PartitionRef(zone="kv", partition=0), key=key0, value=b"x"
                )
            )
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        metadata = dict(e.value.trailing_metadata() or ())
        assert metadata.get("x-primary", "").startswith(f"{lease.node}@")

        # A fourth node joins; writes continue meanwhile; the new replicas hold everything.
        await agents.start("n4")
        for i in range(120, 200):
            key, value = f"k{i:04d}".encode(), f"w{i}".encode()
            await put(agents, client, keys, "kv", 4, key, value)
            acked[key] = value

        async def n4_holds_replicas() -> bool:
            stables = await stable_of(store, "kv")
            return len(stables) == 4 and any("n4" in peers for peers in stables.values())

        await eventually(n4_holds_replicas, "n4 to join stable", within=TIMEOUT * 2)
        await eventually(lambda: all_in_sync(client, keys, store, spec), "ISR = stable again")
        await check_replicas(agents, store, spec, acked)


async def test_sigkill_of_a_busy_primary_loses_no_acknowledged_write(
    etcd: object, agents: Agents, client: EtcdClient, keys: KeySpace
) -> None:
    spec = ZoneSpec("kv", partitions=2, replicas=3)
    async with zone_in_sync_on_three(etcd, agents, client, keys, spec, LEASES):
        victim_lease = await primary_of(client, keys, "kv", 0)
        assert victim_lease is not None
        victim = victim_lease.node
        acked: dict[bytes, bytes] = {}
        keys0 = [k for k in (f"key{i}".encode() for i in range(400)) if partition_of(k, 2) == 0]
        stop = asyncio.Event()
        acks = [0]

        async def writer(offset: int) -> None:
            seq = 0
            while not stop.is_set():
                key = keys0[(offset + seq * 4) % len(keys0)]
                value = f"{offset}-{seq}".encode()
                seq += 1
                with contextlib.suppress(grpc.aio.AioRpcError, LookupError):
                    await put(agents, client, keys, "kv", 2, key, value, deadline=0.5)
                    acked[key] = value
                    acks[0] += 1

        writers = [asyncio.create_task(writer(i)) for i in range(4)]
        await asyncio.sleep(2)
        before = acks[0]
        agents.procs[victim].send_signal(signal.SIGKILL)

        async def moved() -> bool:
            lease = await primary_of(client, keys, "kv", 0)
            return lease is not None and lease.node != victim

        await eventually(moved, "the lease to move off the killed primary")
        await asyncio.sleep(2)
        stop.set()
        await asyncio.gather(*writers)
        assert before > 0, "writes were acknowledged before the kill"
        assert acks[0] > before, "writes resumed on the new primary"
        new = await primary_of(client, keys, "kv", 0)
        isr = await isr_of(client, keys, "kv", 0)
        assert new is not None
        assert isr is not None
        assert new.node in isr.members
        for key, value in acked.items():
            p = partition_of(key, 2)
            lease = await primary_of(client, keys, "kv", p)
            assert lease is not None
            got = await agents.data(lease.node).Get(
                data_pb2.GetRequest(
                    partition=common_pb2.PartitionRef(zone="kv", partition=p), key=key
                )
            )
            assert got.found, f"acknowledged {key!r} lost"
            assert got.value == value, f"acknowledged {key!r}={value!r} lost"
        for node in isr.members:
            copy = await replica_items(agents, node, "kv", 0)
            for key, value in acked.items():
                if partition_of(key, 2) == 0:
                    assert copy.get(key) == value, f"{node} lacks acknowledged {key!r}"


async def test_a_write_is_acknowledged_only_once_the_in_sync_set_holds_it(
    etcd: object, agents: Agents, client: EtcdClient, keys: KeySpace
) -> None:
    """R=3, at least 2 in sync: with both followers frozen (SIGSTOP) the primary has no one to
    replicate to and may not shrink its in-sync set below 2 — a write to it is never
    acknowledged (it fails or times out), however long the client waits; once they resume, a
    write is acknowledged and is on every replica of the in-sync set."""
    spec = ZoneSpec("ack", partitions=1, replicas=3)
    async with zone_in_sync_on_three(etcd, agents, client, keys, spec, LEASES):
        lease = await primary_of(client, keys, "ack", 0)
        assert lease is not None
        followers = [n for n in ("n1", "n2", "n3") if n != lease.node]
        request = data_pb2.PutRequest(
            partition=common_pb2.PartitionRef(zone="ack", partition=0), key=b"k", value=b"v1"
        )
        assert (await agents.data(lease.node).Put(request, timeout=10)).index > 0
        for node in followers:
            agents.procs[node].send_signal(signal.SIGSTOP)
        try:
            frozen = data_pb2.PutRequest(
                partition=common_pb2.PartitionRef(zone="ack", partition=0), key=b"k", value=b"v2"
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await agents.data(lease.node).Put(frozen, timeout=4)
            print(f"with both followers frozen: {refused.value.code().name}")
        finally:
            for node in followers:
                agents.procs[node].send_signal(signal.SIGCONT)
        acked = await put(agents, client, keys, "ack", 1, b"k", b"v3")
        assert acked.index > 0
        isr = await isr_of(client, keys, "ack", 0)
        assert isr is not None
        for node in isr.members:
            assert (await replica_items(agents, node, "ack", 0)).get(b"k") == b"v3", node


async def test_a_primary_that_dies_with_its_isr_at_the_minimum_is_replaced_and_writes_resume(
    etcd: object, agents: Agents, client: EtcdClient, keys: KeySpace
) -> None:
    """R=2 with 2 in sync (the ISR is at its minimum): the primary of partition 0 dies for good
    (SIGKILL, never restarted). Its lease expires and moves to the other member, whose
    reconcile finds the ISR naming a node no append can reach. Once the move replacing it is
    under way (its registration expired: scale-down delay 0) the survivor drops it — below the
    minimum, writes still refused — and serves the new replica's copy; the replica joins, the
    move completes and writes resume, nothing acknowledged lost. (Kept, the departed member
    blocked the partition for good: the chaos campaign's stuck node-leave.)"""
    spec = ZoneSpec("leave", partitions=2, replicas=2)
    async with zone_in_sync_on_three(etcd, agents, client, keys, spec) as (_, store):
        acked: dict[bytes, bytes] = {}
        for i in range(40):
            key, value = f"k{i:03d}".encode(), f"v{i}".encode()
            await put(agents, client, keys, "leave", 2, key, value)
            acked[key] = value
        lease = await primary_of(client, keys, "leave", 0)
        assert lease is not None
        leaver = lease.node
        isr = await isr_of(client, keys, "leave", 0)
        assert isr is not None
        assert len(isr.members) == 2, isr
        agents.procs[leaver].send_signal(signal.SIGKILL)
        await agents.procs[leaver].wait()
        agents.addresses.pop(leaver)

        async def replaced() -> bool:
            stables = await stable_of(store, "leave")
            return all(leaver not in peers and len(peers) == 2 for peers in stables.values())

        await eventually(replaced, f"{leaver}'s replicas to be replaced")
        await eventually(lambda: settled(store, spec), "the zone to settle")
        await eventually(lambda: all_in_sync(client, keys, store, spec), "ISR = stable")
        for i in range(40, 60):
            key, value = f"k{i:03d}".encode(), f"v{i}".encode()
            await put(agents, client, keys, "leave", 2, key, value)
            acked[key] = value
        await check_replicas(agents, store, spec, acked)


LONG_REGISTRATION_AGENT = AGENT.replace("lease_ttl=2,", "lease_ttl=9,")


class LongRegistrationAgents(Agents):
    """Agents whose node record outlives them by 6-9 s (a killed one stays registered)."""

    def command(self, node: str) -> list[str]:
        return [
            sys.executable, "-c", LONG_REGISTRATION_AGENT, node, "127.0.0.1:0",
            str(self.data_dir(node)), self.endpoint, self.keys.prefix,
        ]  # fmt: skip


async def test_a_killed_holders_leases_are_not_renewed_while_its_node_record_lingers(
    etcd: object, tmp_path: Path, client: EtcdClient, keys: KeySpace
) -> None:
    """placement/driver/liveness.py: the holder is SIGKILLed right after a renewal of its lease
    term; the next renewal falls due 1 s later, while its node record still stands
    (registration TTL 9 s). The leader's health check finds it gone: its term is not renewed
    again, so none of its leases lasts longer, and each moves to a live member as soon as the
    term ends. Without the check the renewal goes through and the partitions wait a whole lease
    more (failover_bench: 15.1 s instead of 10.1 s)."""
    leases = LeaseConfig(duration_ms=4000, renew_before_ms=3000)
    agents = LongRegistrationAgents(tmp_path, etcd.endpoint, keys)  # type: ignore[attr-defined]
    try:
        spec = ZoneSpec("kv", partitions=3, replicas=3)
        async with zone_in_sync_on_three(etcd, agents, client, keys, spec, leases) as (driver, _):
            first = await primary_of(client, keys, "kv", 0)
            assert first is not None
            victim = first.node
            term = await term_of(client, keys, victim)
            assert term > 0, "a holder has a lease term"

            async def renewed() -> bool:
                return await term_of(client, keys, victim) > term

            await eventually(renewed, f"a renewal of {victim}'s lease term")
            agents.procs[victim].send_signal(signal.SIGKILL)
            killed_ms = int(time.time() * 1000)
            ends = await term_of(client, keys, victim)
            held = {
                p: lease
                for p in range(spec.partitions)
                if (lease := await primary_of(client, keys, "kv", p)) is not None
                and lease.node == victim
            }
            assert 0 in held
            moved: dict[int, int] = {}

            async def all_moved() -> bool:
                for p, before in held.items():
                    lease = await primary_of(client, keys, "kv", p)
                    assert lease is not None
                    if lease.node == victim:
                        assert lease.lease_epoch == before.lease_epoch
                        until = lease.until(await term_of(client, keys, victim))
                        assert until <= ends, f"p{p}: renewed after the kill"
                    elif p not in moved:
                        moved[p] = int(time.time() * 1000)
                        assert lease.lease_epoch == before.lease_epoch + 1
                return len(moved) == len(held)

            await eventually(all_moved, "the killed holder's leases to move")
            registered = await client.get(keys.node(victim))
            assert registered.first() is not None, "the test needs the node record to linger"
            assert ends - killed_ms <= leases.duration_ms
            for p, at in moved.items():
                # moved within a second of the term's end (the pass at that time and its write)
                assert at - ends < 1000 * SCALE, (p, at, ends)
                assert at >= ends, (p, at, ends)
            assert driver.liveness.found_silent >= 1
    finally:
        await agents.close()


SIZED_AGENT = AGENT.replace("catch_up_bytes_per_s=0)", "catch_up_bytes_per_s=0, size_interval=0.5)")


class SizedAgents(Agents):
    """Agents reporting replica sizes every 0.5 s."""

    def command(self, node: str) -> list[str]:
        return [
            sys.executable, "-c", SIZED_AGENT, node, "127.0.0.1:0", str(self.data_dir(node)),
            self.endpoint, self.keys.prefix,
        ]  # fmt: skip


async def test_an_agent_reports_every_replicas_size_in_few_transactions(
    etcd: object, tmp_path: Path, client: EtcdClient, keys: KeySpace
) -> None:
    assert "size_interval=0.5" in SIZED_AGENT
    partitions = 300
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    agents = SizedAgents(tmp_path, endpoint, keys)
    try:
        await agents.start("n1")
        async with running_driver(endpoint, keys, leases=LEASES) as driver:
            store = Metastore(client, keys)
            # the node stays a data node while it restarts: nothing moves meanwhile
            spec = ZoneSpec("sz", partitions=partitions, replicas=1, scale_down_delay=600)
            assert (await store.create_zone(spec, await leader_fence(driver))).applied
            await eventually(
                lambda: all_in_sync(client, keys, store, spec), "ISR = stable", within=TIMEOUT * 2
            )
            expected = dict.fromkeys(range(partitions), (0, 0))
            for i in range(60):
                key, value = f"s{i:03d}".encode(), f"value-{i}".encode() * (i % 5 + 1)
                await put(agents, client, keys, "sz", partitions, key, value)
                p = partition_of(key, partitions)
                expected[p] = (expected[p][0] + len(key) + len(value), expected[p][1] + 1)

            async def sizes() -> dict[int, tuple[tuple[int, int], int, int]]:
                """partition -> ((bytes, keys), mod revision, lease) of n1's size keys."""
                found = await client.list_prefix(keys.sizes_prefix())
                out = {}
                for kv in found.kvs:
                    parsed = keys.parse(kv.key)
                    assert parsed is not None
                    assert parsed.partition is not None
                    assert parsed.node == "n1"
                    size = decode_size(kv.value)
                    assert isinstance(size, ReplicaSize)
                    out[parsed.partition] = ((size.bytes, size.keys), kv.mod_revision, kv.lease)
                return out

            async def reported() -> bool:
                return {p: s[0] for p, s in (await sizes()).items()} == expected

            await eventually(reported, "every replica's size")
            # A restart forgets what was reported (and the keys go with the revoked lease): its
            # first report carries all 300 replicas at once, in ceil(300 / 128) transactions.
            proc = agents.procs["n1"]
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), TIMEOUT)
            assert proc.stdout is not None
            await proc.stdout.read()
            await agents.start("n1")
            await eventually(reported, "every replica's size after the restart")
            found = await sizes()
            assert all(lease != 0 for _, _, lease in found.values())  # the registration's
            transactions = {revision for _, revision, _ in found.values()}
            assert len(transactions) <= math.ceil(partitions / MAX_TXN_OPS)
    finally:
        await agents.close()


async def test_a_learner_joins_the_in_sync_set_only_once_it_holds_the_last_entry(
    etcd: object, agents: Agents, client: EtcdClient, keys: KeySpace
) -> None:
    """A Fetch answer carrying the last entries does not make the learner an ISR member (it has
    not written them, and may never); a Fetch for what follows the last entry does. Node n9 is
    registered by the test with no agent behind it, so the test can fetch in its name."""
    for n in ("n1", "n2", "n3"):
        await agents.start(n)
    registration = await client.grant_lease(5)
    store = Metastore(client, keys)
    await store.register_node(NodeRecord("n9", "127.0.0.1:1", {}), registration)
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    try:
        async with running_driver(endpoint, keys, leases=LEASES) as driver:
            spec = ZoneSpec("kv", partitions=2, replicas=4, min_in_sync=2)
            assert (await store.create_zone(spec, await leader_fence(driver))).applied

            async def leader_on_an_agent_and_n9_dropped() -> bool:
                for p in range(2):
                    lease = await primary_of(client, keys, "kv", p)
                    isr = await isr_of(client, keys, "kv", p)
                    if (
                        lease is not None
                        and lease.node in agents.addresses
                        and isr is not None
                        and "n9" not in isr.members
                    ):
                        found.append(p)
                        return True
                return False

            found: list[int] = []
            await eventually(leader_on_an_agent_and_n9_dropped, "n9 out of an agent's ISR")
            p = found[-1]
            key_of_p = [
                k for k in (f"key{i}".encode() for i in range(100)) if partition_of(k, 2) == p
            ]
            last = 0
            for key in key_of_p[:5]:
                last = (await put(agents, client, keys, "kv", 2, key, b"v" * 100)).index
            lease = await primary_of(client, keys, "kv", p)
            assert lease is not None
            primary = agents.replication(lease.node)
            ref = common_pb2.PartitionRef(zone="kv", partition=p)
            carrying = await primary.Fetch(
                data_pb2.FetchRequest(partition=ref, node="n9", after_index=0), timeout=5
            )
            assert carrying.entries
            assert carrying.entries[-1].index == last
            isr = await isr_of(client, keys, "kv", p)
            assert isr is not None
            assert "n9" not in isr.members, "n9 joined on the answer carrying the entries"
            holding = await primary.Fetch(
                data_pb2.FetchRequest(partition=ref, node="n9", after_index=last), timeout=5
            )
            assert not holding.entries
            isr = await isr_of(client, keys, "kv", p)
            assert isr is not None
            assert "n9" in isr.members, "n9 holds the last entry but did not join"
    finally:
        await registration.revoke()
