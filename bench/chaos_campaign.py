"""Seeded chaos campaign: a long run of random faults against a real local cluster under a
recorded workload, then the checkers' verdicts (design/architecture.md, "Chaos campaign").

One run::

    .venv/bin/python bench/chaos_campaign.py --seed 1 --faults 100 \\
        [--out bench/results/chaos_campaign.md] [--nodes 5] [--drivers 2] [--ttl 3]

The cluster is the one ``placectl up --etcd-members 3`` starts (``start_cluster`` +
``wait_ready``): secure (mutual TLS, etcd over TLS with auth on), three etcd members, the
drivers and the agents as subprocesses. One zone (8 partitions, 3 replicas, scale-down delay
15 s) takes recorded writes and reads for the whole campaign (``run_writers`` with readers).
Faults come one at a time from a schedule drawn up front from ``random.Random(seed)`` — first
every kind of the menu once in a seeded order, then uniform draws — each after a seeded pause:

* ``driver-leader-kill``: SIGKILL of the leading driver, restarted at once;
* ``driver-leader-stop``: SIGSTOP of the leading driver for 1.5–3 lease TTLs, then SIGCONT;
* ``agent-kill``: SIGKILL of an agent, restarted 0.5–2 s after its registration expired (an
  agent refuses to start while its node is registered under the killed process's lease);
* ``primary-kill``: the same for the agent holding a partition's primary lease;
* ``etcd-member-kill``: SIGKILL of one of the three etcd members, restarted 1–3 s later;
* ``node-join``: a new agent (a new node, its certificate issued by the cluster's CA);
* ``node-leave``: SIGTERM of an agent, which stays gone (never fewer than the larger R + 1
  agents);
* ``replicas-change``: ``AlterZone`` replicas 3 ↔ 2 (``--replicas A,B``);
* ``partitions-change``: ``AlterZone`` partitions 8 ↔ 12 (a re-shard).

Operator changes go through the product's API (``PlacementClient``); nothing writes etcd. After
each fault the campaign waits for **recovery**: the fault's own condition (a new leader term,
the restarted process registered, the new node listed, the left one gone, etcd member healthy)
and the zone READY and converged on its expected layout (status READY, nothing off target,
every partition's stable of R replicas with a primary, no move or re-shard in flight) and a
write to every partition acknowledged. A recovery over ``--stuck-after`` (60 s) is recorded as
stuck; one not reached within ``--give-up`` (180 s) stops the campaign.

At the end: the workload checker (``check_workload``: every acknowledged write on the API and on
every stable replica, replicas agree, every key's history linearizable), the audit of etcd's
history for writes by a deposed leader term after its leader key was deleted
(``placement.metastore.audit``), stuck recoveries, and recovery times per kind (p50/p99/max,
against the goal TTL + 2 s for the kinds where it applies). Writes the markdown result file,
prints a summary, and exits 1 when a verdict other than the recovery-time goal fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from placement.grpc_env import quiet_grpc_core  # noqa: E402

quiet_grpc_core()  # before anything imports grpc

from placement.api.client import PlacementClient  # noqa: E402
from placement.data.checker import CheckResult, check_workload  # noqa: E402
from placement.data.client import DataClient  # noqa: E402
from placement.data.partitioning import partition_of  # noqa: E402
from placement.data.workload import WorkloadStats, percentile, run_writers  # noqa: E402
from placement.errors import PlacementError  # noqa: E402
from placement.local.cluster import (  # noqa: E402
    Child,
    Cluster,
    UpOptions,
    add_agent,
    start_cluster,
    wait_ready,
)
from placement.metastore.audit import DeposalAudit, audit_deposed_writes  # noqa: E402
from placement.metastore.codec import LeaderRecord, decode_leader  # noqa: E402
from placement.metastore.election import current_leader  # noqa: E402
from placement.metastore.etcd import EtcdClient  # noqa: E402
from placement.metastore.keys import KeySpace  # noqa: E402
from placement.v1 import driver_pb2  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "chaos_campaign.md"
ZONE = "campaign"
PARTITIONS = (8, 12)
#: The replica counts ``replicas-change`` alternates between (``--replicas``), the first the
#: zone's at creation.
REPLICAS = (3, 2)
MENU = (
    "driver-leader-kill",
    "driver-leader-stop",
    "agent-kill",
    "primary-kill",
    "etcd-member-kill",
    "node-join",
    "node-leave",
    "replicas-change",
    "partitions-change",
)
#: The kinds whose recovery is a failover of the control plane or the metastore, so the goal
#: "recovered within the drivers' lease TTL + 2 s" applies to them. The others wait on a
#: primary lease (10 s) to expire, a process to start, or data to move.
FAILOVER_KINDS = frozenset({"driver-leader-kill", "driver-leader-stop", "etcd-member-kill"})
#: The zone's scale-down delay (``--scale-down-delay``): longer than a killed agent takes to be
#: back (its registration's TTL, the restart delay, a start on a loaded machine), so kill and
#: restart faults move no replica, while a node that left is replaced after it.
SCALE_DOWN_DELAY = 15.0
#: Seconds between looks at the cluster while waiting for recovery.
POLL = 0.25


@dataclass(frozen=True, slots=True)
class Step:
    """One scheduled fault: its kind, the pause before it, and a duration (the SIGSTOP's in
    lease TTLs, a kill's delay before the restart in seconds; unused by the other kinds)."""

    kind: str
    gap: float
    duration: float


def agent_bounds(replicas: tuple[int, int]) -> tuple[int, int]:
    """Fewest and most running agents node-leave and node-join keep: the larger R plus one (an
    agent-kill may take one more), and two more than that."""
    fewest = max(replicas) + 1
    return fewest, fewest + 2


def schedule(
    seed: int, faults: int, nodes: int, max_gap: float, replicas: tuple[int, int] = REPLICAS
) -> list[Step]:
    """The campaign's faults, from ``random.Random(seed)`` alone: every kind of :data:`MENU` once
    in a seeded order, then uniform draws; a node-leave that would leave fewer agents than
    :func:`agent_bounds` allows becomes a node-join, and a join beyond them a leave."""
    fewest, most = agent_bounds(replicas)
    rng = random.Random(seed)
    kinds = list(MENU)
    rng.shuffle(kinds)
    steps: list[Step] = []
    agents = nodes
    for i in range(faults):
        kind = kinds[i] if i < len(kinds) else rng.choice(MENU)
        if kind == "node-leave" and agents <= fewest:
            kind = "node-join"
        elif kind == "node-join" and agents >= most:
            kind = "node-leave"
        agents += {"node-join": 1, "node-leave": -1}.get(kind, 0)
        gap = rng.uniform(max_gap / 3, max_gap)
        duration = rng.uniform(1.5, 3.0) if kind == "driver-leader-stop" else rng.uniform(0.5, 2.0)
        steps.append(Step(kind, round(gap, 2), round(duration, 2)))
    return steps


@dataclass
class Fault:
    index: int
    at: float  # seconds since the campaign's workload began
    kind: str
    target: str
    recovery: float | None = None  # seconds; None: not recovered before giving up
    stuck: bool = False
    notes: list[str] = field(default_factory=list)


@dataclass
class Outcome:
    seed: int
    faults_asked: int
    ttl: int
    replicas: tuple[int, int]
    scale_down_delay: float
    stuck_after: float
    faults: list[Fault]
    stats: WorkloadStats | None = None
    check: CheckResult | None = None
    audit: DeposalAudit | None = None
    aborted: str = ""
    #: The zone's state when the workload stopped (the wait before the check).
    final: str = ""
    #: Why the workload checker could not judge (it could not read the zone).
    check_error: str = ""
    elapsed: float = 0.0
    started_unix: float = 0.0

    @property
    def lost(self) -> int:
        """Acknowledged writes missing or wrong on the API or on a stable replica."""
        c = self.check
        return -1 if c is None else c.lost + c.wrong + c.replica_lost + c.replica_wrong

    @property
    def stuck(self) -> int:
        return sum(1 for f in self.faults if f.stuck)

    def failures(self) -> list[str]:
        """Every failed verdict (the recovery-time goal is reported, not judged here)."""
        out: list[str] = []
        if self.aborted:
            out.append(f"campaign stopped: {self.aborted}")
        c = self.check
        if c is None:
            out.append(f"the workload was not checked: {self.check_error or 'not reached'}")
        else:
            if self.lost:
                out.append(f"{self.lost} acknowledged writes lost or wrong")
            if c.nonlinearizable:
                out.append(f"{c.nonlinearizable} keys not linearizable")
            if c.divergent_replicas or c.unreachable_replicas:
                out.append(
                    f"replicas: {c.divergent_replicas} divergent, "
                    f"{c.unreachable_replicas} unreadable"
                )
            if not c.acked_writes or not c.reads:
                out.append("the workload acknowledged no write or completed no read")
        if self.stats is not None and c is not None and c.acked_writes != self.stats.acked:
            out.append(
                f"the record holds {c.acked_writes} acknowledged writes, the "
                f"writers counted {self.stats.acked}"
            )
        if self.audit is None:
            out.append("etcd's history was not audited")
        elif self.audit.stale:
            out.append(f"{len(self.audit.stale)} writes by a deposed leader term")
        if self.stuck:
            out.append(f"{self.stuck} recoveries over {self.stuck_after:.0f}s")
        return out


@dataclass
class Expect:
    """What the zone must look like once recovered."""

    partitions: int
    replicas: int


class Campaign:
    """The running cluster, its clients and the bookkeeping of one campaign."""

    def __init__(
        self,
        cluster: Cluster,
        opts: UpOptions,
        api: PlacementClient,
        probe: DataClient,
        etcd: EtcdClient,
        seed: int,
        replicas: tuple[int, int],
        say: Callable[[str], None],
    ) -> None:
        self.cluster = cluster
        self.opts = opts
        self.api = api
        self.probe = probe
        self.etcd = etcd
        self.keys = KeySpace(cluster.prefix)
        self.targets = random.Random(seed ^ 0x5EED)  # target choices: a stream of their own
        self.replicas = replicas
        self.expect = Expect(PARTITIONS[0], replicas[0])
        self.say = say
        self.next_node = opts.nodes + 1
        self.gone: set[str] = set()  # agents that left
        probes: dict[int, dict[int, bytes]] = {}
        for count in PARTITIONS:
            found: dict[int, bytes] = {}
            for i in range(10_000):
                found.setdefault(partition_of(b"probe-%d" % i, count), b"probe-%d" % i)
                if len(found) == count:
                    break
            probes[count] = found
        self.probes = probes

    # -- looking at the cluster -----------------------------------------------------------------

    def child(self, name: str) -> Child:
        (found,) = [c for c in self.cluster.children if c.name == name]
        return found

    def agents(self) -> list[Child]:
        """Agents that have not left (running, or killed and about to be restarted)."""
        return sorted(
            (c for c in self.cluster.children if c.name.startswith("node-")),
            key=lambda c: int(c.name.split("-")[1]),
        )

    def running_agents(self) -> list[Child]:
        return [c for c in self.agents() if c.name not in self.gone and c.alive]

    async def leader(self) -> tuple[str, int] | None:
        """(driver id, epoch) of the leading term, from its election key."""
        kv = await current_leader(self.etcd, self.keys)
        if kv is None:
            return None
        record = decode_leader(kv.value)
        return (record.member_id, kv.create_revision) if isinstance(record, LeaderRecord) else None

    async def wait_leader(self, within: float) -> tuple[str, int]:
        deadline = time.monotonic() + within
        while True:
            with contextlib.suppress(PlacementError):
                found = await self.leader()
                if found is not None:
                    return found
            if time.monotonic() > deadline:
                raise PlacementError(f"no driver leads after {within:.0f}s")
            await asyncio.sleep(POLL)

    async def registered(self) -> set[str]:
        found = await self.api.read(
            lambda s, t: s.ListNodes(driver_pb2.ListNodesRequest(), timeout=t)
        )
        return {n.name for n in found.nodes}

    async def assignments(self) -> list[driver_pb2.PartitionAssignment]:
        request = driver_pb2.GetAssignmentsRequest(zone=ZONE)
        page = await self.api.read(lambda s, t: s.GetAssignments(request, timeout=t))
        return list(page.assignments)

    async def unhealthy(self) -> str | None:
        """Why the zone is not recovered yet (None: READY, converged on the expected layout,
        every partition writable)."""
        want = self.expect
        get = driver_pb2.GetZoneRequest(name=ZONE)
        status = await self.api.read(lambda s, t: s.GetZoneStatus(get, timeout=t))
        state = driver_pb2.ZoneState.Name(status.state)
        if state != "READY" or status.partitions_off_target or status.under_replicated:
            return f"zone {state}, {status.partitions_off_target} partitions off target"
        zone = await self.api.read(lambda s, t: s.GetZone(get, timeout=t))
        layout = zone.layout
        if layout.partitions != want.partitions or layout.HasField("reshard"):
            return f"layout {layout.partitions} partitions, reshard {layout.HasField('reshard')}"
        table = await self.assignments()
        if len(table) != want.partitions:
            return f"{len(table)} partitions assigned, want {want.partitions}"
        for a in table:
            if len(a.stable.names) != want.replicas or a.has_pending or a.has_planned:
                return f"partition {a.partition} not settled on {want.replicas} replicas"
            if not a.primary:
                return f"partition {a.partition} has no primary"
        writes = [
            self.probe.put(ZONE, key, b"probe") for key in self.probes[want.partitions].values()
        ]
        results = await asyncio.gather(*writes, return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            return f"{len(failed)} probe writes failed: {failed[0]}"
        return None

    async def recover(
        self, fault: Fault, began: float, ready: Callable[[], Awaitable[str | None]], limit: float
    ) -> None:
        """Wait (at most ``limit`` s after ``began``) until ``ready()`` and :meth:`unhealthy`
        find nothing; records the recovery time (or that none came) on ``fault`` — and, for a
        failover kind, what it waited on and from when (the phases of its recovery)."""
        why = "not looked at yet"
        phases: list[tuple[float, str]] = []
        ready_at: float | None = None  # when the fault's own condition first held
        while True:
            look = time.monotonic()
            try:
                why = await ready() or ""
                if not why:
                    ready_at = ready_at if ready_at is not None else time.monotonic() - began
                    why = await self.unhealthy() or ""
            except PlacementError as e:
                why = f"{type(e).__name__}: {e}"
            now = time.monotonic()
            if why and (not phases or phases[-1][1] != why):
                phases.append((now - began, why))
            if not why:
                fault.recovery = now - began
                if fault.kind in FAILOVER_KINDS:
                    waited = "; ".join(f"{at:.1f}s {what[:60]}" for at, what in phases[-3:])
                    fault.notes.append(
                        f"waited on: {waited or '-'}; own condition at {ready_at or 0:.1f}s,"
                        f" the last look took {now - look:.1f}s"
                    )
                return
            if now - began > limit:
                fault.notes.append(f"not recovered after {limit:.0f}s: {why}")
                return
            await asyncio.sleep(POLL)

    # -- the faults -----------------------------------------------------------------------------

    async def inject(self, fault: Fault, step: Step, limit: float) -> None:
        """Inject ``fault`` and wait for its recovery; every kind restores what it broke
        (restart, SIGCONT) before returning."""
        kind = fault.kind
        if kind in ("driver-leader-kill", "driver-leader-stop"):
            name, epoch = await self.wait_leader(limit)
            driver = self.child(name)
            fault.target = f"{name} (epoch {epoch})"

            async def new_term() -> str | None:
                now = await self.leader()
                if now is None or now[1] == epoch:
                    return "no new leader term yet"
                if not all(self.child(d).alive for d in self._drivers()):
                    return "a driver is not running"
                return None

            if kind == "driver-leader-kill":
                began = time.monotonic()
                driver.signal_group(signal.SIGKILL)
                await asyncio.to_thread(_reap, driver)
                driver.start()  # restarted at once; it joins as a follower
                await self.recover(fault, began, new_term, limit)
            else:
                pause = step.duration * self.opts.lease_ttl
                began = time.monotonic()
                driver.signal_group(signal.SIGSTOP)
                try:
                    await asyncio.wait_for(self.recover(fault, began, new_term, limit), pause)
                except TimeoutError:
                    pass
                finally:
                    left = pause - (time.monotonic() - began)
                    if left > 0:
                        await asyncio.sleep(left)
                    driver.signal_group(signal.SIGCONT)
                fault.notes.append(f"SIGCONT after {pause:.1f}s")
                if fault.recovery is None:
                    await self.recover(fault, began, new_term, limit)
            if fault.recovery is not None:
                now = await self.leader()
                fault.notes.append(f"new leader {now[0] if now else '?'}")
        elif kind in ("agent-kill", "primary-kill"):
            agents = self.running_agents()
            if kind == "agent-kill":
                agent = self.targets.choice(agents)
                fault.target = agent.name
            else:
                table = [a for a in await self.assignments() if a.primary]
                if not table:
                    raise PlacementError("no partition has a primary to kill")
                a = self.targets.choice(table)
                agent = self.child(a.primary)
                held = sum(1 for x in table if x.primary == a.primary)
                fault.target = f"{agent.name} (primary of {ZONE}/{a.partition}; {held} leases)"
            began = time.monotonic()
            agent.signal_group(signal.SIGKILL)
            await asyncio.to_thread(_reap, agent)
            # An agent refuses to start while its node is registered under another lease (the
            # killed process's, until its TTL runs out): a supervisor restarts it after that.
            expired = await self._unregistered(agent.name, began + limit)
            await asyncio.sleep(step.duration)
            agent.start()
            fault.notes.append(
                f"registration gone after {expired - began:.1f}s, restarted"
                f" {step.duration:.1f}s later"
            )
            await self.recover(fault, began, self._listed(agent.name), limit)
        elif kind == "etcd-member-kill":
            member = self.targets.choice(self.cluster.etcd_members)
            leader = await asyncio.to_thread(member.is_leader)
            fault.target = member.name + (" (the etcd leader)" if leader else "")
            began = time.monotonic()
            await asyncio.to_thread(member.kill)
            await asyncio.sleep(step.duration * 1.5)
            self.cluster.restart_etcd_member(member)
            fault.notes.append(f"restarted after {step.duration * 1.5:.1f}s")

            async def member_back() -> str | None:
                healthy = await asyncio.gather(
                    *(asyncio.to_thread(m.healthy) for m in self.cluster.etcd_members)
                )
                return None if all(healthy) else f"{healthy.count(False)} etcd members unhealthy"

            await self.recover(fault, began, member_back, limit)
        elif kind == "node-join":
            name = f"node-{self.next_node}"
            self.next_node += 1
            rack = f"r{(self.next_node - 2) % 3 + 1}"
            fault.target = f"{name} (rack {rack})"
            began = time.monotonic()
            await asyncio.to_thread(add_agent, self.cluster, self.opts, name, rack)
            await self.recover(fault, began, self._listed(name), limit)
        elif kind == "node-leave":
            agent = self.targets.choice(self.running_agents())
            fault.target = agent.name
            self.gone.add(agent.name)
            began = time.monotonic()
            agent.signal_group(signal.SIGTERM)

            async def unlisted() -> str | None:
                if agent.alive:
                    return f"{agent.name} still running"
                return (
                    f"{agent.name} still listed" if agent.name in await self.registered() else None
                )

            await self.recover(fault, began, unlisted, limit)
            if agent.alive:  # a graceful stop that did not end: a finding, then a kill
                fault.notes.append("did not exit on SIGTERM; killed")
                agent.signal_group(signal.SIGKILL)
                await asyncio.to_thread(_reap, agent)
        elif kind == "replicas-change":
            old = self.expect.replicas
            new = self.replicas[1] if old == self.replicas[0] else self.replicas[0]
            fault.target = f"replicas {old} -> {new}"
            began = await self._alter(driver_pb2.ZoneConfig(replicas=new), "replicas")
            self.expect.replicas = new
            await self.recover(fault, began, _nothing, limit)
        elif kind == "partitions-change":
            old = self.expect.partitions
            new = PARTITIONS[1] if old == PARTITIONS[0] else PARTITIONS[0]
            fault.target = f"partitions {old} -> {new}"
            began = await self._alter(driver_pb2.ZoneConfig(partitions=new), "partitions")
            self.expect.partitions = new
            await self.recover(fault, began, _nothing, limit)
        else:
            raise ValueError(f"unknown fault kind {kind!r}")

    def _drivers(self) -> list[str]:
        return [c.name for c in self.cluster.children if c.name.startswith("driver-")]

    def _listed(self, name: str) -> Callable[[], Awaitable[str | None]]:
        async def listed() -> str | None:
            child = self.child(name)
            if child.proc is not None and child.proc.poll() is not None:
                return f"{name} exited with {child.proc.returncode} (see its log)"
            return None if name in await self.registered() else f"{name} not registered"

        return listed

    async def _unregistered(self, name: str, deadline: float) -> float:
        """Waits (until ``deadline``) for ``name``'s registration to go; returns when it went."""
        while True:
            with contextlib.suppress(PlacementError):
                if name not in await self.registered():
                    return time.monotonic()
            if time.monotonic() > deadline:
                raise PlacementError(f"{name} still registered after its process was killed")
            await asyncio.sleep(POLL)

    async def _alter(self, config: driver_pb2.ZoneConfig, field_name: str) -> float:
        """Alter the zone's ``field_name`` through the API; returns when it was sent."""
        request = driver_pb2.AlterZoneRequest(name=ZONE, config=config, update_fields=[field_name])
        began = time.monotonic()
        await self.api.call(lambda s, t: s.AlterZone(request, timeout=t))
        return began


async def _nothing() -> str | None:
    return None


def _reap(child: Child, timeout: float = 15.0) -> None:
    """Wait (bounded) for a signalled child to exit."""
    if child.proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout)


# -- the campaign ------------------------------------------------------------------------------


async def run_campaign(
    cluster: Cluster,
    opts: UpOptions,
    steps: Sequence[Step],
    work: Path,
    *,
    seed: int,
    replicas: tuple[int, int] = REPLICAS,
    scale_down_delay: float = SCALE_DOWN_DELAY,
    stuck_after: float = 60.0,
    give_up: float = 180.0,
    say: Callable[[str], None] = print,
) -> Outcome:
    """Create the zone, run the workload, inject ``steps`` one at a time waiting for each
    recovery, then stop the workload and judge (see the module docstring)."""
    outcome = Outcome(seed, len(steps), opts.lease_ttl, replicas, scale_down_delay, stuck_after, [])
    record = work / "workload.jsonl"
    tls_admin, tls_client = cluster.tls("admin"), cluster.tls("client")
    async with (
        PlacementClient(cluster.driver_apis, deadline=5.0, call_timeout=2.0, tls=tls_admin) as api,
        DataClient(cluster.driver_apis, deadline=5.0, call_timeout=2.0, tls=tls_client) as probe,
        DataClient(cluster.driver_apis, deadline=30.0, tls=tls_client) as data,
        EtcdClient(
            cluster.etcd_endpoint.split(","), credentials=cluster.etcd_credentials()
        ) as etcd,
    ):
        campaign = Campaign(cluster, opts, api, probe, etcd, seed, replicas, say)
        keys = campaign.keys
        start_revision = await etcd.current_revision(keys.zone(ZONE))
        config = driver_pb2.ZoneConfig(
            partitions=PARTITIONS[0],
            replicas=replicas[0],
            scale_up_delay_seconds=0.0,
            scale_down_delay_seconds=scale_down_delay,
        )
        create = driver_pb2.CreateZoneRequest(name=ZONE, config=config)
        await api.call(lambda s, t: s.CreateZone(create, timeout=t))
        ready = Fault(-1, 0.0, "zone-create", ZONE)
        await campaign.recover(ready, time.monotonic(), _nothing, give_up)
        if ready.recovery is None:
            outcome.aborted = f"the zone never became ready: {ready.notes}"
            return outcome
        say(f"zone {ZONE} ready in {ready.recovery:.1f}s; workload starts")
        stop = asyncio.Event()
        writers = asyncio.create_task(
            run_writers(data, ZONE, 3, 30, 24 * 3600.0, record, stop, seed=seed, readers=2)
        )
        t0 = time.monotonic()
        outcome.started_unix = time.time()
        try:
            for i, step in enumerate(steps):
                await asyncio.sleep(step.gap)
                if writers.done():
                    outcome.aborted = "the workload ended early"
                    break
                fault = Fault(i + 1, time.monotonic() - t0, step.kind, "")
                outcome.faults.append(fault)
                try:
                    await campaign.inject(fault, step, give_up)
                except PlacementError as e:
                    fault.notes.append(f"could not inject: {e}")
                fault.stuck = fault.recovery is None or fault.recovery > stuck_after
                took = "none" if fault.recovery is None else f"{fault.recovery:.2f}s"
                say(
                    f"[{fault.index}/{len(steps)}] t={fault.at:.0f}s {fault.kind} "
                    f"{fault.target}: recovery {took}" + (" STUCK" if fault.stuck else "")
                )
                if fault.recovery is None:
                    outcome.aborted = f"fault {fault.index} ({fault.kind}) did not recover"
                    break
            await asyncio.sleep(1.0)  # writes on the settled zone too
        finally:
            stop.set()
            outcome.stats = await writers
        outcome.elapsed = time.monotonic() - t0
        say(
            f"workload: {outcome.stats.acked}/{outcome.stats.attempted} writes acknowledged,"
            f" {outcome.stats.reads} reads; checking"
        )
        final = Fault(0, 0.0, "final", ZONE)
        await campaign.recover(
            final, time.monotonic(), _nothing, 10.0 if outcome.aborted else give_up
        )
        outcome.final = "; ".join(final.notes) or f"recovered in {final.recovery or 0.0:.1f}s"
        try:
            outcome.check = await check_workload(data, ZONE, record, settle=30.0)
        except PlacementError as e:  # e.g. a partition that serves nobody: a verdict, not a crash
            outcome.check_error = f"{type(e).__name__}: {e}"
        try:
            outcome.audit = await audit_deposed_writes(
                etcd, keys, start_revision, catch_up_within=120.0
            )
        except PlacementError as e:
            outcome.check_error += f" (etcd's history unread: {type(e).__name__}: {e})"
    return outcome


# -- the report --------------------------------------------------------------------------------


def recovery_rows(outcome: Outcome) -> list[tuple[str, int, float, float, float, str]]:
    """Per kind (and all): (kind, count, p50, p99, max, goal verdict)."""
    goal = outcome.ttl + 2.0
    rows = []
    kinds = [k for k in MENU if any(f.kind == k for f in outcome.faults)]
    for kind in [*kinds, "all"]:
        times = [
            f.recovery
            for f in outcome.faults
            if f.recovery is not None and (kind == "all" or f.kind == kind)
        ]
        if not times:
            continue
        p99 = percentile(times, 99)
        if kind in FAILOVER_KINDS:
            verdict = f"{'meets' if p99 <= goal else 'MISSES'} p99 ≤ {goal:.0f}s"
        else:
            verdict = "n/a (not a failover)" if kind != "all" else ""
        rows.append((kind, len(times), percentile(times, 50), p99, max(times), verdict))
    return rows


def render(outcome: Outcome, command: str, machine: str, commit: str) -> str:
    failures = outcome.failures()
    c, a = outcome.check, outcome.audit
    lines = [
        "# Chaos campaign",
        "",
        "Seeded faults against a local secure cluster (3 etcd members, drivers and agents as "
        "subprocesses) under recorded writes and reads; `bench/chaos_campaign.py`, "
        'design/architecture.md, "Chaos campaign".',
        "",
        f"- command: `{command}`",
        f"- seed: {outcome.seed}; faults: {len(outcome.faults)} of {outcome.faults_asked} asked",
        f"- machine: {machine}",
        f"- commit: {commit}",
        f"- started: {dt.datetime.fromtimestamp(outcome.started_unix, dt.UTC):%Y-%m-%d %H:%M:%S}"
        f" UTC; campaign {outcome.elapsed:.0f}s; driver lease TTL {outcome.ttl}s; zone"
        f" {PARTITIONS[0]}×{outcome.replicas[0]}, replicas-change"
        f" {outcome.replicas[0]} ↔ {outcome.replicas[1]}, scale-down delay"
        f" {outcome.scale_down_delay:g}s",
        "",
        "## Verdicts",
        "",
        f"**{'PASS' if not failures else 'FAIL'}**"
        + ("" if not failures else ": " + "; ".join(failures)),
        "",
        "| check | result | goal |",
        "|---|---|---|",
    ]
    if outcome.stats is not None:
        s = outcome.stats
        lines.append(
            f"| workload | {s.acked}/{s.attempted} writes acknowledged, {s.reads} reads, "
            f"{s.read_failures} failed reads | > 0 |"
        )
    if c is not None:
        lines += [
            f"| acknowledged writes lost or wrong (API and every stable replica) | {outcome.lost} "
            f"(API lost {c.lost}, wrong {c.wrong}; replicas lost {c.replica_lost}, wrong "
            f"{c.replica_wrong}) | 0 |",
            f"| replicas divergent / unreadable | {c.divergent_replicas} / "
            f"{c.unreachable_replicas} ({c.replicas_checked} replicas in "
            f"{c.partitions_checked} partitions) | 0 |",
            f"| linearizability violations (keys) | {c.nonlinearizable} ({c.undecided} "
            f"undecided, {c.keys} keys) | 0 |",
        ]
    if a is not None:
        lines.append(
            f"| stale applications (writes by a deposed epoch after its leader key's deletion) | "
            f"{len(a.stale)} ({a.terms_ended} leader terms ended, {a.events} events audited, "
            f"revisions {a.from_revision}..{a.to_revision}) | 0 |"
        )
    lines.append(f"| recoveries over {outcome.stuck_after:.0f}s (stuck) | {outcome.stuck} | 0 |")
    lines.append(f"| the zone when the workload stopped | {outcome.final} | recovered |")
    if c is not None and c.examples:
        lines += ["", "Checker examples:", ""] + [f"- {e}" for e in c.examples]
    if a is not None and a.stale:
        lines += ["", "Stale writes:", ""] + [
            f"- {w.key!r} at revision {w.revision}, epoch {w.epoch} ended at {w.ended_at}"
            for w in a.stale[:10]
        ]
    lines += [
        "",
        "## Recovery times",
        "",
        f"From the fault's injection until recovered (module docstring). Goal: p99 ≤ TTL + 2 s ="
        f" {outcome.ttl + 2}s for the failover kinds ({', '.join(sorted(FAILOVER_KINDS))}).",
        "",
        "| kind | faults | p50 s | p99 s | max s | goal |",
        "|---|---|---|---|---|---|",
    ]
    for kind, n, p50, p99, top, verdict in recovery_rows(outcome):
        lines.append(f"| {kind} | {n} | {p50:.2f} | {p99:.2f} | {top:.2f} | {verdict} |")
    lines += [
        "",
        "## Faults",
        "",
        "| # | t (s) | kind | target | recovery (s) | notes |",
        "|---|---|---|---|---|---|",
    ]
    for f in outcome.faults:
        took = "—" if f.recovery is None else f"{f.recovery:.2f}"
        notes = "; ".join([*(["STUCK"] if f.stuck else []), *f.notes])
        lines.append(f"| {f.index} | {f.at:.1f} | {f.kind} | {f.target} | {took} | {notes} |")
    return "\n".join(lines) + "\n"


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"nproc {os.cpu_count()}, load average {load} (at the end)"


def commit() -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head


def start(opts: UpOptions, base: Path) -> Cluster:
    """The cluster ``placectl up --etcd-members 3`` starts, ready (no demo zone)."""
    cluster = start_cluster(opts, base, Console(quiet=True))
    try:
        asyncio.run(wait_ready(cluster, opts, demo_zone=False))
    except BaseException:
        cluster.stop()
        raise
    return cluster


def campaign_options(nodes: int, drivers: int, ttl: int) -> UpOptions:
    return UpOptions(
        nodes=nodes,
        drivers=drivers,
        api_port=0,
        live=False,
        etcd_members=3,
        lease_ttl=ttl,
        metrics=False,
        dashboard=False,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--drivers", type=int, default=2)
    parser.add_argument("--ttl", type=int, default=3, help="drivers' and agents' lease TTL (s)")
    parser.add_argument(
        "--replicas", default="3,2", help="the replica counts replicas-change alternates between"
    )
    parser.add_argument("--scale-down-delay", type=float, default=SCALE_DOWN_DELAY)
    parser.add_argument("--max-gap", type=float, default=3.0, help="most seconds between faults")
    parser.add_argument("--stuck-after", type=float, default=60.0)
    parser.add_argument("--give-up", type=float, default=180.0)
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory")
    args = parser.parse_args(argv)
    try:
        low, high = (int(r) for r in args.replicas.split(","))
    except ValueError:
        parser.error("--replicas takes two replica counts, e.g. 3,2")
    replicas = (low, high)
    fewest, _ = agent_bounds(replicas)
    if args.nodes < fewest or args.faults < 1 or min(replicas) < 1:
        parser.error(f"--nodes must be at least {fewest} and --faults positive")
    command = " ".join([".venv/bin/python", "bench/chaos_campaign.py", *sys.argv[1:]])
    steps = schedule(args.seed, args.faults, args.nodes, args.max_gap, replicas)
    tree = commit()  # the code that runs: taken at the start
    opts = campaign_options(args.nodes, args.drivers, args.ttl)
    base = Path(tempfile.mkdtemp(prefix="chaos-campaign-"))
    print(f"cluster in {base}; schedule: {', '.join(s.kind for s in steps[:12])} ...")
    cluster = start(opts, base / "cluster")
    try:
        outcome = asyncio.run(
            run_campaign(
                cluster, opts, steps, base, seed=args.seed, replicas=replicas,
                scale_down_delay=args.scale_down_delay,
                stuck_after=args.stuck_after, give_up=args.give_up,
            )
        )  # fmt: skip
    finally:
        cluster.stop()
    text = render(outcome, command, machine(), tree)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    failures = outcome.failures()
    print("PASS" if not failures else "FAIL: " + "; ".join(failures))
    if not args.keep and not failures:
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"cluster directory kept: {base}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
