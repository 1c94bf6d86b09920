"""The placement driver against a real etcd and real replica-agent subprocesses.

The driver runs in-process (the real :class:`~placement.driver.loop.Driver`: election, list-watch,
movers, gRPC to the agents); agents are ``serve()`` processes whose catch-up takes
``CATCHUP_DELAY`` seconds (a stand-in for copying data, so rebalances stay in flight long enough
to race with). The test registers the agents' node records itself (``Metastore.register_node``
under a lease), as ``replica/registration.py`` will.

Deadlines scale with ``PLACEMENT_TEST_TIME_SCALE`` (default 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from placement.core.model import ZoneSpec
from placement.core.retry import RetryPolicy
from placement.driver.agents import AgentClient
from placement.driver.core import build_view, zone_outlook
from placement.driver.leases import LeaseConfig
from placement.driver.loop import Driver, DriverConfig
from placement.driver.status import ZoneStatusState, zone_status
from placement.metastore.codec import (
    InSyncSet,
    LeaseTerm,
    NodeRecord,
    PrimaryLease,
    ReplicaSize,
    decode_datanodes,
    decode_primary,
    decode_term,
    encode_isr,
    encode_size,
)
from placement.metastore.etcd import EtcdClient, Lease, read_history
from placement.metastore.keys import AssignField, KeyKind, KeySpace, prefix_range_end
from placement.metastore.kv import EventKind, TxnResult
from placement.metastore.store import Metastore
from placement.metastore.transitions import Fence, Outcome
from placement.metastore.txn import Compare, Op, Put
from placement.metrics import REGISTRY
from placement.security.credentials import EtcdCredentials
from placement.security.tls import TlsMaterial
from replica.records import AgentStore

ROOT = Path(__file__).resolve().parents[2]
SCALE = float(os.environ.get("PLACEMENT_TEST_TIME_SCALE", "1"))
TIMEOUT = 30.0 * SCALE

AGENT_SCRIPT = """
import asyncio, logging, os, sys
from pathlib import Path
from replica.server import serve
from replica.service import record_catch_up

# the product's logging (placement.logs), as `placectl agent run` sets it up
from placement.logs import configure_logging
configure_logging("INFO")
delay = float(os.environ.get("CATCHUP_DELAY", "0"))

async def slow_catch_up(job, db):
    await record_catch_up(job, db)
    await asyncio.sleep(delay)

# With AGENT_ETCD the agent registers itself (and pushes move reports under its lease).
etcd = os.environ.get("AGENT_ETCD") or None
prefix = os.environ.get("AGENT_PREFIX", "/placement")
# With AGENT_TLS_DIR it serves mutual TLS with DIR/ca.crt and DIR/NODE.crt (placement.local.certs).
tls = None
if os.environ.get("AGENT_TLS_DIR"):
    from placement.local.certs import LocalPki
    tls = LocalPki(Path(os.environ["AGENT_TLS_DIR"])).material(sys.argv[1])
sys.exit(asyncio.run(serve(
    sys.argv[1], sys.argv[2], Path(sys.argv[3]), catch_up=slow_catch_up, etcd=etcd, prefix=prefix,
    tls=tls,
)))
"""


async def eventually(
    check: Callable[[], Awaitable[bool]], what: str, within: float = TIMEOUT
) -> None:
    """Poll ``check`` until true, failing after ``within`` seconds (already scaled)."""
    timeout = within
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.05)


async def counted(driver: Driver, name: str, at_least: int) -> int:
    """``driver.stats[name]`` once it reached ``at_least``: a counter is bumped after the
    transaction it counts returns, so a test that saw the etcd effect may still be ahead of it."""

    async def reached() -> bool:
        return driver.stats[name] >= at_least

    await eventually(reached, f"stats[{name!r}] to reach {at_least} ({driver.stats})")
    return driver.stats[name]


def assert_clean_log(path: Path) -> None:
    text = path.read_text(errors="replace") if path.exists() else ""
    assert "Traceback" not in text, f"unexpected traceback in {path}:\n{text[-4000:]}"


@dataclass
class AgentProc:
    node: str
    proc: asyncio.subprocess.Process
    address: str
    data_dir: Path
    log: Path


@dataclass
class Cluster:
    """Agents (subprocesses) and their registrations; stopped and log-checked at teardown."""

    tmp_path: Path
    client: EtcdClient
    keys: KeySpace
    catchup_delay: float = 0.3
    #: A ``placement.local.certs`` directory: agents serve mutual TLS with their node's
    #: certificate (None: plaintext).
    tls_dir: Path | None = None
    agents: dict[str, AgentProc] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)

    @property
    def store(self) -> Metastore:
        return Metastore(self.client, self.keys)

    async def start_agent(
        self,
        node: str,
        attributes: dict[str, str] | None = None,
        *,
        etcd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> AgentProc:
        """Start an agent (``env`` added to its environment); the test registers it, unless
        ``etcd`` is given: then the agent registers itself there (``serve(etcd=...)``) and
        pushes its move reports."""
        data_dir = self.tmp_path / f"data-{node}"
        log = self.tmp_path / f"agent-{node}.log"
        env = {**os.environ, "CATCHUP_DELAY": str(self.catchup_delay), **(env or {})}
        if self.tls_dir is not None:
            env["AGENT_TLS_DIR"] = str(self.tls_dir)
        if etcd is not None:
            env.update(AGENT_ETCD=etcd, AGENT_PREFIX=self.keys.prefix)
        with log.open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                AGENT_SCRIPT,
                node,
                "127.0.0.1:0",
                str(data_dir),
                cwd=ROOT,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                stdin=asyncio.subprocess.DEVNULL,
            )
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), TIMEOUT)).decode()
        assert line.startswith(f"agent {node} listening on "), (line, log.read_text())
        agent = AgentProc(node, proc, line.rsplit(" ", 1)[1].strip(), data_dir, log)
        self.agents[node] = agent
        if etcd is None:
            await self.register(node, attributes)
        return agent

    async def register(self, node: str, attributes: dict[str, str] | None = None) -> None:
        """Register ``node`` at its agent's address (a restarted agent: under the same lease)."""
        lease = self.leases.get(node) or await self.client.grant_lease(5)
        record = NodeRecord(node, self.agents[node].address, attributes or {})
        await self.store.register_node(record, lease)
        self.leases[node] = lease

    async def unregister(self, node: str) -> None:
        lease = self.leases.pop(node)
        await lease.revoke()

    async def close(self) -> None:
        for lease in self.leases.values():
            with contextlib.suppress(Exception):
                await lease.revoke()
        for agent in self.agents.values():
            if agent.proc.returncode is None:
                agent.proc.send_signal(signal.SIGTERM)
        for agent in self.agents.values():
            await asyncio.wait_for(agent.proc.wait(), TIMEOUT)
            if agent.proc.stdout is not None:
                await agent.proc.stdout.read()
        for agent in self.agents.values():
            assert_clean_log(agent.log)


@pytest.fixture
async def cluster(tmp_path: Path, client: EtcdClient, keys: KeySpace) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, client, keys)
    try:
        yield c
    finally:
        await c.close()


@contextlib.asynccontextmanager
async def running_driver(
    endpoint: str,
    keys: KeySpace,
    member: str = "d1",
    api: str = "127.0.0.1:1",
    credentials: EtcdCredentials | None = None,
    tls: TlsMaterial | None = None,
    **options: object,
) -> AsyncIterator[Driver]:
    """An in-process driver on ``endpoint`` (comma-separated members), presenting
    ``credentials`` to etcd and ``tls`` to the agents when given."""
    handler = _Tracebacks()
    logging.getLogger("placement").addHandler(handler)
    async with EtcdClient(endpoint.split(","), credentials=credentials) as own:
        config = DriverConfig(member_id=member, api_address=api, lease_ttl=3, **options)  # type: ignore[arg-type]
        driver = Driver(own, keys, config, tls=tls)
        task = asyncio.create_task(driver.run())
        try:
            yield driver
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await driver.agents.close()
            logging.getLogger("placement").removeHandler(handler)
    assert not handler.records, f"unexpected tracebacks: {handler.records}"


class _Tracebacks(logging.Handler):
    """Collects log records that carry a traceback (the in-process driver's "log")."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info is not None:
            self.records.append(self.format(record))


async def leader_fence(driver: Driver) -> Fence:
    async def leads() -> bool:
        return driver.fence() is not None

    await eventually(leads, "the driver to lead")
    fence = driver.fence()
    assert fence is not None
    return fence


async def settled(store: Metastore, spec: ZoneSpec) -> bool:
    """Every partition 0..P-1 has stable with R peers, and no pending/planned/cancel."""
    zone = await store.read_zone(spec.name)
    for p in range(spec.partitions):
        state = zone.partition(p)
        peers = state.peers(AssignField.STABLE)
        if peers is None or len(peers) != spec.replicas:
            return False
        if state.pending or state.planned or state.cancel:
            return False
    return True


async def converged(store: Metastore, spec: ZoneSpec) -> bool:
    """:func:`settled`, and every partition's stable is the placement function's target on
    the zone's current data nodes (``zone_outlook``: nothing a pass would still move) — the
    convergence a rebalance promises, not only the replica counts."""
    if not await settled(store, spec):
        return False
    revision, kvs = await store.read_zone_snapshot(spec.name)
    view = build_view(store.keys, kvs, revision)
    outlook = zone_outlook(view, spec.name, int(time.time() * 1000))
    return outlook is not None and not outlook.off_target and not outlook.datanodes_due


async def history(client: EtcdClient, prefix: bytes, start: int) -> list[tuple[str, bytes]]:
    """(event kind, key) of every change under ``prefix`` from ``start`` to now — all of it:
    ``read_history`` checks the events against the range's keys read at the end, and raises
    rather than return a truncated history."""
    found = await read_history(
        client, prefix, prefix_range_end(prefix), from_revision=start, catch_up_within=TIMEOUT
    )
    return [(e.kind.value, e.kv.key) for e in found.events]


def hosting(cluster: Cluster, zone: str, partitions: int) -> dict[int, frozenset[str]]:
    """Per partition, the agents holding a replica record of it (read from their databases);
    a partial replica shows as ``node?`` (it must not outlive its move)."""
    held: dict[int, set[str]] = {p: set() for p in range(partitions)}
    for node, agent in cluster.agents.items():
        if not (agent.data_dir / "agent.db").exists():
            continue
        store = AgentStore.inspect(agent.data_dir)
        try:
            for p in range(partitions):
                row = store.replica(zone, p)
                if row is not None:
                    held[p].add(node if row.complete else f"{node}?")
        finally:
            store.close()
    return {p: frozenset(nodes) for p, nodes in held.items()}


def loads(stables: list[tuple[str, ...]]) -> Counter[str]:
    return Counter(n for peers in stables for n in peers)


async def test_create_then_alter_replicas_3_5_4_ends_on_the_4_replica_target_via_planned(
    etcd: object, cluster: Cluster, client: EtcdClient, keys: KeySpace
) -> None:
    for i in range(5):
        await cluster.start_agent(f"n{i}")
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    async with running_driver(endpoint, keys) as driver:
        fence = await leader_fence(driver)
        store = cluster.store
        spec = ZoneSpec("orders", partitions=8, replicas=3)
        assert (await store.create_zone(spec, fence)).applied
        await eventually(lambda: settled(store, spec), "zone creation")
        created = await store.read_zone("orders")
        assert all(s.trigger is not None for s in created.partitions.values())
        start = await client.current_revision() + 1

        record = await store.get_zone("orders")
        assert record is not None
        five = ZoneSpec("orders", partitions=8, replicas=5)
        write = await store.update_zone(five, record.mod_revision, fence)
        assert write.applied

        async def pending_written() -> bool:
            zone = await store.read_zone("orders")
            return any(s.pending is not None for s in zone.partitions.values())

        await eventually(pending_written, "the 3->5 rebalance to start")
        four = ZoneSpec("orders", partitions=8, replicas=4)
        assert (await store.update_zone(four, write.revision, fence)).applied
        await eventually(lambda: settled(store, four), "the 4-replica target to be stable")

        final = await store.read_zone("orders")
        stables = [final.partition(p).peers(AssignField.STABLE) or () for p in range(8)]
        counts = loads(stables)
        assert all(len(set(s)) == 4 for s in stables)
        assert max(counts.values()) - min(counts.values()) <= 1, counts
        events = await history(client, keys.zone_assign_prefix("orders"), start)
        planned_puts = [k for kind, k in events if kind == "put" and k.endswith(b"/planned")]
        assert planned_puts, "the second alter must have queued its target in planned"

        async def primaries_granted() -> bool:
            found = await client.list_prefix(keys.zone_primary_prefix("orders"))
            holders = {}
            for kv in found.kvs:
                lease = decode_primary(kv.value)
                assert isinstance(lease, PrimaryLease)
                holders[int(kv.key.rsplit(b"/", 1)[1])] = lease.node
            return len(holders) == 8 and all(holders[p] in stables[p] for p in range(8))

        await eventually(primaries_granted, "a primary lease on a member of stable per partition")
        status = zone_status(four, final.partitions, None, 0.0)
        assert status.state is ZoneStatusState.READY
        assert status.partitions_done == 8
        assert await counted(driver, "finished", 8) >= 8

        async def replicas_follow_stable() -> bool:
            return hosting(cluster, "orders", 8) == {p: frozenset(stables[p]) for p in range(8)}

        # Make-before-break: every member of stable holds a complete replica record, and the
        # node each partition dropped (5 -> 4) was told to Retire and holds none.
        await eventually(replicas_follow_stable, "replicas on exactly the members of stable")
        assert await counted(driver, "retired", 8) >= 8

        record = await store.get_zone("orders")
        assert record is not None
        assert (await store.delete_zone("orders", record.mod_revision, fence)).applied

        async def leftovers_gone() -> bool:
            dn = await client.get(keys.datanodes("orders"))
            primaries = await client.list_prefix(keys.zone_primary_prefix("orders"))
            return not dn.kvs and not primaries.kvs

        await eventually(leftovers_gone, "the dropped zone's datanodes and primary keys to go")


async def test_a_new_zone_gives_its_first_members_their_replica_records(
    etcd: object, cluster: Cluster, client: EtcdClient, keys: KeySpace
) -> None:
    """... and the move reports of those catch-ups (pushed by agents registered with --etcd)
    do not stay behind in etcd: nothing waits for them."""
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    for i in range(4):
        await cluster.start_agent(f"n{i}", etcd=endpoint)
    async with running_driver(endpoint, keys) as driver:
        fence = await leader_fence(driver)
        store = cluster.store
        spec = ZoneSpec("fresh", partitions=6, replicas=3)
        assert (await store.create_zone(spec, fence)).applied
        await eventually(lambda: settled(store, spec), "zone creation")
        zone = await store.read_zone("fresh")
        stables = [zone.partition(p).peers(AssignField.STABLE) or () for p in range(6)]
        assert all(len(s) == 3 for s in stables)

        async def members_host() -> bool:
            return hosting(cluster, "fresh", 6) == {p: frozenset(stables[p]) for p in range(6)}

        # Stable was written directly (nothing to move for an empty zone), yet every member of
        # it holds a complete replica record, and nobody else holds one.
        await eventually(members_host, "every first member to hold its replica record")

        async def all_adopted() -> bool:
            return driver.stats["adopted"] == 6 * 3

        await eventually(all_adopted, "every adopt Rebalance to be answered DONE")

        # An adopt is resent until DONE: its catch-up writes no move report (a zone creation
        # would otherwise write, and the driver delete, one per replica).
        found = await client.list_prefix(keys.progress_prefix())
        assert not found.kvs, [kv.key for kv in found.kvs]
        assert driver.stats["finished"] == 0
        after = await store.read_zone("fresh")
        assert [after.partition(p).peers(AssignField.STABLE) for p in range(6)] == stables
        assert all(s.pending is None for s in after.partitions.values())


def _deferred_zones() -> float:
    return REGISTRY.get_sample_value("placement_driver_zones_deferred_total") or 0.0


async def test_zones_created_at_once_beyond_a_pass_s_budget_are_all_placed_in_turn(
    etcd: object, cluster: Cluster, client: EtcdClient, keys: KeySpace
) -> None:
    """With a budget of one zone's partitions per pass, five zones created at once are decided
    in turn (the passes defer the others, counted by the metric) and each ends on its target,
    its first members holding their replica records, every primary lease granted."""
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    for i in range(3):
        await cluster.start_agent(f"n{i}", etcd=endpoint)
    deferred = _deferred_zones()
    specs = [ZoneSpec(f"burst{z}", partitions=4, replicas=2) for z in range(5)]
    async with running_driver(endpoint, keys, pass_budget=4) as driver:
        fence = await leader_fence(driver)
        store = cluster.store
        for spec in specs:
            assert (await store.create_zone(spec, fence)).applied
        for spec in specs:
            await eventually(lambda spec=spec: converged(store, spec), f"{spec.name} placed")

        async def adopted_and_led() -> bool:
            if driver.stats["adopted"] != 5 * 4 * 2:
                return False
            found = await client.list_prefix(keys.primary_prefix())
            return len([kv for kv in found.kvs if b"/@term/" not in kv.key]) == 5 * 4

        await eventually(adopted_and_led, "every first member adopted, every lease granted")
    assert _deferred_zones() > deferred


async def test_a_node_that_leaves_and_returns_within_the_scale_down_delay_moves_nothing(
    etcd: object, cluster: Cluster, client: EtcdClient, keys: KeySpace
) -> None:
    for i in range(4):
        await cluster.start_agent(f"n{i}")
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    delay = 4.0 * SCALE
    async with running_driver(endpoint, keys) as driver:
        fence = await leader_fence(driver)
        store = cluster.store
        spec = ZoneSpec("z", partitions=12, replicas=2, scale_down_delay=delay)
        assert (await store.create_zone(spec, fence)).applied
        await eventually(lambda: settled(store, spec), "zone creation")
        before = await store.read_zone("z")
        start = await client.current_revision() + 1

        await cluster.unregister("n3")

        async def held_down() -> bool:
            zone = await store.read_zone("z")
            raw = (await client.get(keys.datanodes("z"))).first()
            dn = decode_datanodes(raw.value) if raw is not None else None
            now = asyncio.get_running_loop().time()  # only the state matters here
            status = zone_status(spec, zone.partitions, dn, now)
            return status.state is ZoneStatusState.HOLDDOWN

        await eventually(held_down, "HOLDDOWN after n3 left", within=delay)
        await cluster.register("n3")
        await asyncio.sleep(delay + 1.5)  # past the delay: nothing may have been applied

        after = await store.read_zone("z")
        assert {p: s.peers(AssignField.STABLE) for p, s in after.partitions.items()} == {
            p: s.peers(AssignField.STABLE) for p, s in before.partitions.items()
        }
        events = await history(client, keys.zone_assign_prefix("z"), start)
        assert not [k for kind, k in events if k.endswith((b"/pending", b"/planned"))]
        raw = (await client.get(keys.datanodes("z"))).first()
        assert raw is not None
        record = decode_datanodes(raw.value)
        assert not isinstance(record, type(None))
        assert getattr(record, "applied", None) == ("n0", "n1", "n2", "n3")
        assert getattr(record, "down_since", 1) is None


@pytest.mark.parametrize("adopted_first", [True, False], ids=["adopted", "racing-the-adopts"])
async def test_cancel_racing_completion_exactly_one_wins(
    etcd: object, cluster: Cluster, client: EtcdClient, keys: KeySpace, adopted_first: bool
) -> None:
    """Cancels racing the moves' completion: exactly one of cancel and finish wins each
    partition, and every agent ends holding exactly what final stable names — also when the
    moves (and their cancels) overtook the zone creation's adopts (``racing-the-adopts``: the
    members of old are adopted again after a reverted cancel)."""
    cluster.catchup_delay = 0.2
    for i in range(4):
        await cluster.start_agent(f"n{i}")
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    async with running_driver(endpoint, keys) as driver:
        fence = await leader_fence(driver)
        store = cluster.store
        spec = ZoneSpec("c", partitions=16, replicas=2)
        assert (await store.create_zone(spec, fence)).applied
        await eventually(lambda: settled(store, spec), "zone creation")
        created = await store.read_zone("c")
        first = {
            p: frozenset(created.partition(p).peers(AssignField.STABLE) or ()) for p in range(16)
        }

        async def adopted() -> bool:
            return hosting(cluster, "c", 16) == first

        if adopted_first:
            try:
                await eventually(adopted, "the first members to hold their replica records")
            except pytest.fail.Exception:
                pytest.fail(f"not adopted: held {hosting(cluster, 'c', 16)}, stable {first}")
        record = await store.get_zone("c")
        assert record is not None
        three = ZoneSpec("c", partitions=16, replicas=3)
        assert (await store.update_zone(three, record.mod_revision, fence)).applied

        async def all_pending() -> bool:
            zone = await store.read_zone("c")
            return sum(s.pending is not None for s in zone.partitions.values()) >= 8

        await eventually(all_pending, "the rebalance to start")
        zone = await store.read_zone("c")
        cancels: dict[int, tuple[Outcome, tuple[str, ...], tuple[str, ...]]] = {}
        for p in range(16):
            state = zone.partition(p)
            if state.pending is None:
                continue
            old = state.peers(AssignField.STABLE) or ()
            new = state.peers(AssignField.PENDING) or ()
            result = await store.cancel("c", p, state.pending.mod_revision, fence, 1)
            cancels[p] = (result.outcome, old, new)
            await asyncio.sleep(0.02)

        async def quiet() -> bool:
            z = await store.read_zone("c")
            return all(s.pending is None and s.cancel is None for s in z.partitions.values())

        await eventually(quiet, "every cancel and finish to be resolved")
        final = await store.read_zone("c")
        outcomes = Counter(o for o, _, _ in cancels.values())
        for p, (outcome, old, new) in cancels.items():
            stable = final.partition(p).peers(AssignField.STABLE)
            if outcome is Outcome.APPLIED:
                assert stable in (old, new), (p, stable, old, new)
            else:
                assert outcome is Outcome.STALE
                assert stable == new, (p, stable, new)
        assert outcomes[Outcome.APPLIED] >= 1, outcomes
        applied = outcomes[Outcome.APPLIED]
        assert await counted(driver, "cancel_finished", applied) == applied
        # Agents agree with etcd: every agent ends holding complete replicas of exactly the
        # partitions final stable names it — a cancelled copy is discarded, a finished one kept.
        want = {p: frozenset(final.partition(p).peers(AssignField.STABLE) or ()) for p in range(16)}
        assert all(len(nodes) in (2, 3) for nodes in want.values()), want  # old or new

        async def agree() -> bool:
            return hosting(cluster, "c", 16) == want

        try:
            await eventually(agree, "the agents to hold what stable names")
        except pytest.fail.Exception:
            got = hosting(cluster, "c", 16)
            differ = {p: (sorted(got[p]), sorted(want[p])) for p in want if got[p] != want[p]}
            pytest.fail(f"agents (held, stable) differ: {differ}; cancels: {cancels}")


async def test_pause_stops_driving_and_resume_completes(
    etcd: object, cluster: Cluster, client: EtcdClient, keys: KeySpace
) -> None:
    cluster.catchup_delay = 0.0
    for i in range(4):
        await cluster.start_agent(f"n{i}")
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    async with running_driver(endpoint, keys) as driver:
        fence = await leader_fence(driver)
        store = cluster.store
        spec = ZoneSpec("p", partitions=6, replicas=2)
        assert (await store.create_zone(spec, fence)).applied
        await eventually(lambda: settled(store, spec), "zone creation")
        await driver.set_paused(True)
        record = await store.get_zone("p")
        assert record is not None
        three = ZoneSpec("p", partitions=6, replicas=3)
        assert (await store.update_zone(three, record.mod_revision, fence)).applied

        async def all_pending() -> bool:
            zone = await store.read_zone("p")
            return all(zone.partition(p).pending is not None for p in range(6))

        await eventually(all_pending, "pending written while paused")
        rpcs = driver.stats["rpcs"]
        await asyncio.sleep(1.5 * SCALE)
        assert driver.stats["rpcs"] == rpcs, "nothing may be sent while paused"
        assert await all_pending()
        await driver.set_paused(False)
        await eventually(lambda: settled(store, three), "the rebalance after resume")


async def test_moves_are_throttled_globally_and_per_node(
    etcd: object, cluster: Cluster, client: EtcdClient, keys: KeySpace
) -> None:
    cluster.catchup_delay = 0.2
    for i in range(5):
        await cluster.start_agent(f"n{i}")
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    async with running_driver(endpoint, keys, max_moves_global=3, max_moves_per_node=1) as driver:
        fence = await leader_fence(driver)
        store = cluster.store
        spec = ZoneSpec("t", partitions=20, replicas=2)
        assert (await store.create_zone(spec, fence)).applied
        await eventually(lambda: settled(store, spec), "zone creation")
        record = await store.get_zone("t")
        assert record is not None
        three = ZoneSpec("t", partitions=20, replicas=3)
        assert (await store.update_zone(three, record.mod_revision, fence)).applied
        await eventually(lambda: settled(store, three), "the throttled rebalance")
        assert await counted(driver, "finished", 20) == 20
        assert 1 <= driver.stats["max_moves"] <= 3, driver.stats
        assert driver.stats["max_moves_per_node"] == 1, driver.stats


async def test_moves_onto_a_node_are_throttled_by_the_bytes_they_copy(
    etcd: object, cluster: Cluster, client: EtcdClient, keys: KeySpace
) -> None:
    """Replicas of 1.5 MiB against a budget of 4 MiB per joining node: at most two moves copy
    onto a node at once, though the per-node move count would allow twenty; partitions without
    a size report count 1 MiB (the floor): four of them at once. (Catch-ups of 1 s: the moves
    a budget admits together overlap even on a loaded machine.)"""
    cluster.catchup_delay = 1.0
    for i in range(3):
        await cluster.start_agent(f"n{i}")
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    options = {"max_moves_per_node": 20, "max_bytes_per_node": 4 * 2**20}
    async with running_driver(endpoint, keys, **options) as driver:
        fence = await leader_fence(driver)
        store = cluster.store
        spec = ZoneSpec("b", partitions=8, replicas=3)
        assert (await store.create_zone(spec, fence)).applied
        await eventually(lambda: settled(store, spec), "zone creation")
        size = encode_size(ReplicaSize(3 * 2**19, 10, 1))  # 1.5 MiB
        for p in range(8):
            for node in ("n0", "n1", "n2"):
                await client.put(keys.size("b", p, node), size)

        async def joined(node: str) -> bool:
            zone = await store.read_zone(spec.name)
            return await settled(store, spec) and any(
                node in (s.peers(AssignField.STABLE) or ()) for s in zone.partitions.values()
            )

        await cluster.start_agent("n3")  # takes about a quarter of the replicas
        await eventually(lambda: joined("n3"), "the join of n3")
        assert driver.stats["max_moves_per_node"] == 2, driver.stats
        await client.delete(keys.sizes_prefix(), prefix_range_end(keys.sizes_prefix()))
        await cluster.start_agent("n4")
        await eventually(lambda: joined("n4"), "the join of n4")
        assert driver.stats["max_moves_per_node"] == 4, driver.stats


@contextlib.asynccontextmanager
async def leader_and_follower(
    endpoint: str, keys: KeySpace
) -> AsyncIterator[tuple[Driver, Driver]]:
    """Two in-process drivers, ``d1`` and ``d2``, once one of them leads: (leader, follower)."""
    async with (
        running_driver(endpoint, keys, "d1", "127.0.0.1:11") as d1,
        running_driver(endpoint, keys, "d2", "127.0.0.1:12") as d2,
    ):

        async def one_leads() -> bool:
            return (d1.fence() is None) != (d2.fence() is None)

        await eventually(one_leads, "one of two drivers to lead")
        yield (d1, d2) if d1.fence() is not None else (d2, d1)


async def test_followers_know_the_leader_and_a_deleted_leader_key_starts_a_new_term(
    etcd: object, client: EtcdClient, keys: KeySpace
) -> None:
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    async with leader_and_follower(endpoint, keys) as (leader, follower):
        fence = leader.fence()
        assert fence is not None

        async def follower_knows() -> bool:
            return follower.fence() is None and (follower.leader_api() == leader.config.api_address)

        await eventually(follower_knows, "d2 to learn the leader's API address")
        await client.delete(fence.leader_key)  # as if an operator or a bug removed it

        async def new_term() -> bool:
            for d in (leader, follower):
                f = d.fence()
                if f is not None and f.epoch > fence.epoch:
                    return True
            return False

        await eventually(new_term, "a new term after the leader key was deleted")
        assert leader.stats["terms"] + follower.stats["terms"] >= 2


async def test_a_leader_whose_loop_is_blocked_for_three_lease_ttls_keeps_its_term(
    etcd: object, keys: KeySpace
) -> None:
    """A pass that holds the event loop for 3 x the election lease's TTL (3 s here) costs no
    term: the lease is refreshed on the client's keep-alive thread meanwhile, so neither driver
    sees the leader key go, and the same term goes on leading."""
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    async with leader_and_follower(endpoint, keys) as (leader, follower):
        fence = leader.fence()
        # The loop runs nothing meanwhile: blocking it is the point.
        time.sleep(3 * leader.config.lease_ttl)  # noqa: ASYNC251
        await asyncio.sleep(1.0 * SCALE)  # it runs again: a lost lease or key would show now
        assert leader.fence() == fence
        assert follower.fence() is None
        assert (leader.stats["terms"], follower.stats["terms"]) == (1, 0)


async def test_a_joining_node_that_dies_mid_rebalance_is_routed_around_via_cancel_and_planned(
    etcd: object, cluster: Cluster, client: EtcdClient, keys: KeySpace
) -> None:
    cluster.catchup_delay = 1.5
    for i in range(4):
        await cluster.start_agent(f"n{i}")
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    async with running_driver(endpoint, keys, max_moves_per_node=1) as driver:
        fence = await leader_fence(driver)
        store = cluster.store
        spec = ZoneSpec("j", partitions=10, replicas=3)
        assert (await store.create_zone(spec, fence)).applied
        await eventually(lambda: settled(store, spec), "zone creation")

        joiner = await cluster.start_agent("n4")

        async def n4_joining() -> bool:
            zone = await store.read_zone("j")
            return any(
                "n4" in (s.peers(AssignField.PENDING) or ()) for s in zone.partitions.values()
            )

        await eventually(n4_joining, "a rebalance onto n4")
        joiner.proc.send_signal(signal.SIGKILL)
        await joiner.proc.wait()
        await cluster.unregister("n4")  # its registration goes (lease revoked)

        async def without_n4() -> bool:
            if not await settled(store, spec):
                return False
            zone = await store.read_zone("j")
            return all(
                "n4" not in (s.peers(AssignField.STABLE) or ()) for s in zone.partitions.values()
            )

        await eventually(without_n4, "every partition stable on n0..n3 again")
        assert await counted(driver, "cancel_finished", 1) >= 1


async def test_a_new_term_retires_a_replica_that_stable_does_not_name(
    etcd: object, cluster: Cluster, client: EtcdClient, keys: KeySpace
) -> None:
    """A Retire lost with the previous leader's term: the replica ``n3`` still hosts (made
    here by a direct Rebalance, as if it had left stable under a leader that died before its
    Retire got through) is found by the new term's sweep and retired; members of stable keep
    theirs — and a member whose disk was replaced (``n1`` restarted on an empty data dir)
    gets its replicas back by the sweep's adopt."""
    for i in range(3):
        await cluster.start_agent(f"n{i}", {"rack": "a"})
    outsider = await cluster.start_agent("n3", {"rack": "b"})
    direct = AgentClient(timeout=5.0)
    try:
        answer = await direct.rebalance(outsider.address, "sw", 0, ("n3",), ("n3",), 3, 1)
        assert answer.outcome in ("ACCEPTED", "DONE")

        async def outsider_hosts() -> bool:
            return await direct.hosted(outsider.address, "sw", 0)

        await eventually(outsider_hosts, "n3 to host partition 0")
        async with running_driver(etcd.endpoint, keys) as driver:  # type: ignore[attr-defined]
            fence = await leader_fence(driver)
            spec = ZoneSpec(
                "sw", partitions=2, replicas=2, node_selector={"rack": "a"}, scale_down_delay=60
            )
            assert (await cluster.store.create_zone(spec, fence)).applied
            await eventually(lambda: settled(cluster.store, spec), "zone creation")

            # n1's disk is replaced: it comes back holding nothing (within the zone's scale-down
            # delay: its replicas stay where they are)
            await cluster.unregister("n1")
            n1 = cluster.agents["n1"]
            n1.proc.send_signal(signal.SIGKILL)
            await n1.proc.wait()
            shutil.rmtree(n1.data_dir)
            n1 = await cluster.start_agent("n1", {"rack": "a"})
            named = [
                p
                for p, s in (await cluster.store.read_zone("sw")).partitions.items()
                if "n1" in (s.peers(AssignField.STABLE) or ())
            ]
            assert named
            assert not await direct.hosted_partitions(n1.address)
            adopted = driver.stats["adopted"]

            # The first term started before the zone existed: a new term sweeps it.
            await client.delete(driver.fence().leader_key)  # type: ignore[union-attr]

            async def retired() -> bool:
                return not await direct.hosted(outsider.address, "sw", 0)

            await eventually(retired, "the new term's sweep to retire n3's replica")

            async def n1_hosts() -> bool:
                return await direct.hosted_partitions(n1.address) == {("sw", p) for p in named}

            await eventually(n1_hosts, "the new term's sweep to adopt n1's replicas")
            assert await counted(driver, "adopted", adopted + len(named)) == adopted + len(named)
            assert await counted(driver, "retired", 1) >= 1
            assert driver.stats["terms"] >= 2
    finally:
        await direct.close()


async def test_an_agents_move_report_wakes_the_mover_instead_of_its_resend_backoff(
    etcd: object, cluster: Cluster, client: EtcdClient, keys: KeySpace
) -> None:
    """Agents registered with --etcd push ``{p}/progress/{zone}/{partition}/{node}`` when a
    catch-up ends; the mover, whose resend backoff is U(0, 30 s) here, resends at once and
    finishes within seconds (polling alone would usually wait many seconds)."""
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    cluster.catchup_delay = 1.0
    for i in range(3):
        await cluster.start_agent(f"n{i}", etcd=endpoint)
    slow = RetryPolicy(initial=30.0, cap=30.0)
    async with running_driver(endpoint, keys, resend=slow) as driver:
        fence = await leader_fence(driver)
        store = cluster.store

        async def registered() -> bool:
            return len((await store.list_nodes())[1]) == 3

        await eventually(registered, "the agents to register themselves")
        spec = ZoneSpec("r", partitions=2, replicas=2)
        assert (await store.create_zone(spec, fence)).applied
        await eventually(lambda: settled(store, spec), "zone creation")
        record = await store.get_zone("r")
        assert record is not None
        start = await client.current_revision()
        three = ZoneSpec("r", partitions=2, replicas=3)
        began = asyncio.get_running_loop().time()
        assert (await store.update_zone(three, record.mod_revision, fence)).applied
        await eventually(lambda: settled(store, three), "the rebalance", within=8.0 * SCALE)
        took = asyncio.get_running_loop().time() - began
        logging.getLogger(__name__).warning("rebalance with reports took %.2fs", took)
        assert await counted(driver, "finished", 2) == 2, driver.stats
        assert await counted(driver, "report_wakeups", 1) >= 1, driver.stats
        # the reports of the joining members were taken as their DONE: no round trip to ask
        assert driver.stats["report_answers"] >= 1, driver.stats
        events = await history(client, keys.progress_prefix(), start)
        puts = [key for kind, key in events if kind == EventKind.PUT.value]
        assert puts, "no agent wrote a move report"
        for key in puts:
            parsed = keys.parse(key)
            assert parsed is not None, key
            assert parsed.kind is KeyKind.PROGRESS, key
            assert parsed.name == "r", parsed
            assert parsed.node in {"n0", "n1", "n2"}, parsed

        async def reports_cleared() -> bool:
            found = await client.list_prefix(keys.progress_prefix())
            return not found.kvs

        await eventually(reports_cleared, "the driver to delete the reports after finishing")


class IsrRace(EtcdClient):
    """The driver's own etcd client, which — once armed — puts a new in-sync set into etcd just
    before the driver's next transaction that moves the lease away from ``holder``: a real
    concurrent write landing between the driver's read and its write (etcd decides, nothing is
    faked)."""

    def __init__(self, endpoint: str, primary_key: bytes, isr_key: bytes) -> None:
        super().__init__([endpoint])
        self.primary_key = primary_key
        self.isr_key = isr_key
        #: (the ISR value to put, the holder whose lease is about to move)
        self.armed: tuple[bytes, str] | None = None
        #: ``succeeded`` of each lease transaction raced so far.
        self.raced: list[bool] = []

    def _moves(self, ops: Sequence[Op], holder: str) -> bool:
        for op in ops:
            if isinstance(op, Put) and op.key == self.primary_key:
                lease = decode_primary(op.value)
                return isinstance(lease, PrimaryLease) and lease.node != holder
        return False

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op] = (), failure: Sequence[Op] = ()
    ) -> TxnResult:
        if self.armed is not None and self._moves(success, self.armed[1]):
            value, self.armed = self.armed[0], None
            await super().txn((), (Put(self.isr_key, value),))
            result = await super().txn(compares, success, failure)
            self.raced.append(result.succeeded)
            return result
        return await super().txn(compares, success, failure)


async def test_a_dead_primarys_lease_moves_after_expiry_to_an_isr_member_and_loses_to_an_isr_change(
    etcd: object, cluster: Cluster, client: EtcdClient, keys: KeySpace
) -> None:
    """One partition, three replicas, leases of 3 s (renewed with 1.5 s left); the scale-down
    delay keeps dead nodes in stable, so only the lease rules are at work:

    1. the holder's node record goes: its lease is left alone until it ends (its lease term is
       no longer renewed), then goes to
       the one member the ISR names — not to the other live member of stable;
    2. the new holder dies too; as the driver's move (to the last live member, in the ISR it
       read) is sent, the ISR drops that member: the transaction's ISR compare fails, the next
       passes re-decide on the new ISR (nobody in sync is live) and leave the lease alone;
    3. once the ISR names the live member again, the lease moves to it.

    Then dropping the zone deletes its ISR and replica-size keys with its primary keys.
    """
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    for i in range(3):
        await cluster.start_agent(f"n{i}")
    spec = ZoneSpec("kv", partitions=1, replicas=3, scale_down_delay=3600.0)
    primary_key, isr_key = keys.primary("kv", 0), keys.isr("kv", 0)
    own = IsrRace(endpoint, primary_key, isr_key)
    config = DriverConfig(
        member_id="d1", api_address="127.0.0.1:1", lease_ttl=3, leases=LeaseConfig(3_000, 1_500)
    )
    driver = Driver(own, keys, config)
    task = asyncio.create_task(driver.run())
    try:
        fence = await leader_fence(driver)
        store = cluster.store
        assert (await store.create_zone(spec, fence)).applied
        await eventually(lambda: settled(store, spec), "zone creation")
        stable = (await store.read_zone("kv")).partition(0).peers(AssignField.STABLE)
        assert stable is not None
        first, other, in_sync = stable

        async def lease_now() -> PrimaryLease | None:
            found = (await client.get(primary_key)).first()
            value = decode_primary(found.value) if found is not None else None
            return value if isinstance(value, PrimaryLease) else None

        async def granted() -> bool:
            held = await lease_now()
            return held is not None and held.node == first

        await eventually(granted, "the preferred primary to get the lease (no ISR key yet)")

        async def put_isr(*members: str) -> None:
            holder = await lease_now()
            assert holder is not None
            value = InSyncSet(tuple(sorted(members)), holder.node, holder.lease_epoch, 0)
            await client.put(isr_key, encode_isr(value))

        async def follow(holder: str, within: float) -> tuple[PrimaryLease, PrimaryLease]:
            """Poll the lease until it leaves ``holder``: (its last value held, the new one)."""
            last = await lease_now()
            assert last is not None
            assert last.node == holder
            deadline = asyncio.get_running_loop().time() + within
            while asyncio.get_running_loop().time() < deadline:
                now = await lease_now()
                assert now is not None
                if now.node != holder:
                    return last, now
                last = now
                await asyncio.sleep(0.02)
            pytest.fail(f"the lease stayed with {holder} for {within:.0f}s")

        # 1. the ISR names only `in_sync` besides the holder; the holder dies
        await put_isr(first, in_sync)
        await cluster.unregister(first)
        old, new = await follow(first, TIMEOUT)
        assert new.node == in_sync, (new, stable)
        assert new.lease_epoch == old.lease_epoch + 1
        term = (await client.get(keys.term(first))).first()
        assert term is not None
        ended = decode_term(term.value)
        assert isinstance(ended, LeaseTerm)
        assert not old.expiry, "the lease followed its holder's term"
        assert new.ts >= old.until(ended.until), "moved before the dead holder's lease had ended"

        # 2. the new holder dies; the ISR changes under the driver's move to `other`
        await put_isr(in_sync, other)
        own.armed = (encode_isr(InSyncSet((in_sync,), in_sync, new.lease_epoch, 0)), in_sync)
        await cluster.unregister(in_sync)

        async def raced() -> bool:
            return bool(own.raced)

        await eventually(raced, "the driver's lease move to meet the ISR change")
        assert own.raced == [False], "the lease write must lose against the ISR change"
        stuck = await lease_now()
        assert stuck is not None
        assert stuck.node == in_sync
        await asyncio.sleep(1.0 * SCALE)  # a couple of passes on the new ISR: nobody to move to
        still = await lease_now()
        assert still == stuck

        # 3. the ISR names `other` again: the lease goes there
        await client.put(isr_key, encode_isr(InSyncSet((in_sync, other), in_sync, 9, 0)))

        async def moved_to_other() -> bool:
            held = await lease_now()
            return held is not None and held.node == other

        await eventually(moved_to_other, "the lease to reach the member back in the ISR")
        final = await lease_now()
        assert final is not None
        assert final.lease_epoch >= 10  # above every epoch the ISR was written under

        # dropping the zone takes its ISR and replica-size keys along
        await client.put(keys.size("kv", 0, other), encode_size(ReplicaSize(10, 1, 0)))
        record = await store.get_zone("kv")
        assert record is not None
        assert (await store.delete_zone("kv", record.mod_revision, fence)).applied

        async def leftovers_gone() -> bool:
            for prefix in (
                keys.zone_primary_prefix("kv"),
                keys.zone_isr_prefix("kv"),
                keys.sizes_prefix(),
            ):
                if (await client.list_prefix(prefix)).kvs:
                    return False
            return True

        await eventually(leftovers_gone, "the dropped zone's primary, ISR and size keys to go")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await driver.agents.close()
        await own.close()
