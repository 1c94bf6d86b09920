"""The placement driver process: election, the leader's passes, and the movers. I/O lives here.

Instance states::

    CAMPAIGNING --won--> LEADING --lease lost / leader key gone / fenced (NotLeader)--> CAMPAIGNING
    any --stop()--> STOPPED (resigns: deletes its key if still this term's, revokes its lease)

While LEADING (one *term*), everything the leader does runs in tasks owned by the term: a
list-then-watch of the whole prefix (listed fresh from etcd at the start of every term — a new
leader never decides from an old cache), the pass loop and one mover per partition being driven.
Losing the term cancels all of them at once; a new session then campaigns again.

The pass loop (:func:`placement.driver.core.plan_pass` on an immutable view, rebuilt only where
etcd changed and reusing the plans of zones nothing happened to:
:mod:`placement.driver.incremental`) writes data
nodes, creations, triggers and primary leases — every write a fenced transaction; a lease that
changes holder also compares the partition's in-sync-set key as read — and keeps one mover per
:class:`~placement.driver.core.Drive`. It passes when etcd changes, when woken, and at the last
plan's ``next_due_ms`` (lease renewals, holddown expiry; at most ``max_idle`` apart): an idle
cluster costs a pass per lease renewal round, not one per tick. A mover:

1. re-reads its partition from etcd (pending and cancel straight from the store; batched with
   the other movers starting at the same moment) and stops if the drive changed;
2. while ``{p}/control/paused`` exists, waits (sends nothing new);
3. takes throttle slots (global, then per joining node, in name order: no deadlock — a slot and
   the move's bytes from the node's budget) for the whole move;
4. sends ``Rebalance`` (or ``CancelRebalance``) to every registered member of old ∪ new (the
   client batches an agent's requests into ``RebalanceBatch`` calls), resending to the members
   that have not answered DONE under their current registration, with exponential backoff +
   jitter until :func:`placement.driver.core.aggregate` says finish.
   The wait between resends is cut short when a pass sees a new move report
   (``{p}/progress/{zone}/{partition}/{node}``, written by an agent whose catch-up of the drive's
   revision ended): the mover resends at once, and that RPC confirms DONE (push, with polling
   as the fallback);
5. finishes with the guarded transition (``finish``/``finish_cancel``, batched with the other
   movers ending at the same moment: ``Metastore.end_moves``), which decides on a fresh read: a
   late or duplicate finish is STALE and changes nothing. The partition's report keys are
   deleted in the same transaction.

Agents are idempotent per (revision, epoch), so a new leader resending everything is safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from placement import metrics
from placement.aio import ByteBudget, Coalescer, cancel_and_wait, first_done
from placement.core.layout import Step
from placement.core.model import Peers
from placement.core.retry import Clock, RetryPolicy, Sleep, retry
from placement.core.throttles import (
    DEFAULT_MAX_BYTES_PER_NODE,
    DEFAULT_MAX_MOVES,
    DEFAULT_MAX_MOVES_PER_NODE,
    MOVE_FLOOR_BYTES,
)
from placement.driver.agents import AgentAnswer, AgentClient, AgentUnavailable
from placement.driver.core import (
    WRITE_FIELDS,
    ClusterView,
    Drive,
    PassPlan,
    PlanMemo,
    Verdict,
    WriteDataNodes,
    WritePrimaries,
    WriteTerms,
    aggregate,
    drive_action,
    plan_pass,
)
from placement.driver.gauges import GaugeMemo, fleet_gauges
from placement.driver.health import EtcdHealth
from placement.driver.incremental import ViewBuilder, view_group
from placement.driver.leases import LeaseConfig
from placement.driver.liveness import Liveness
from placement.errors import (
    Conflict,
    CredentialError,
    NotLeader,
    PlacementError,
    StoreUnavailable,
)
from placement.failpoints import failpoint
from placement.logs import log_context, set_log_context
from placement.metastore.codec import (
    Assignment,
    LeaderRecord,
    MoveReport,
    NodeRecord,
    ReplicaSize,
    decode_leader,
    decode_size,
    encode_leader,
)
from placement.metastore.election import Election, Leadership
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import AssignField, KeySpace
from placement.metastore.listwatch import ListWatch
from placement.metastore.store import Metastore
from placement.metastore.transitions import (
    Ending,
    Fence,
    Outcome,
    PartitionState,
    TransitionResult,
)
from placement.security.tls import TlsMaterial

log = logging.getLogger(__name__)

#: The failpoint after each committed layout write of a reshard (placement/failpoints.py).
RESHARD_FAILPOINTS = {
    Step.BEGIN: "driver.reshard-begin",
    Step.ADVANCE: "driver.reshard-advance",
    Step.FLIP: "driver.reshard-flip",
    Step.ABORT: "driver.reshard-abort",
    Step.FINISH: "driver.reshard-finish",
}


@dataclass(slots=True)
class _Reports:
    """A mover's view of the agents' reports of its drive: the ones already acted on, and the
    event a pass sets when a new one shows up (cuts the mover's resend backoff short)."""

    revision: int
    seen: frozenset[tuple[str, MoveReport]] = frozenset()
    event: asyncio.Event = field(default_factory=asyncio.Event)


#: Zones whose writes a pass executes at once.
EXECUTE_ZONES = 8
#: Partitions a pass decides at most before it defers the other zones to the next pass, which
#: follows at once (``core.plan_pass``): about 0.1 s of decisions on one core at 1,000 nodes
#: (``bench/results/driver_pass.md``), so no pass holds the event loop for seconds.
PASS_BUDGET = 5_000
#: Partitions per ``Metastore.read_partitions`` call of the movers' first reads.
READS_PER_FLUSH = 1024
#: Finishes per ``Metastore.end_moves`` call (it packs them into transactions within etcd's
#: limits, about 30 per transaction).
ENDINGS_PER_FLUSH = 512


@dataclass(frozen=True, slots=True)
class DriverConfig:
    """Options of one driver instance (``placectl driver run`` flags)."""

    member_id: str
    api_address: str
    lease_ttl: int = 5
    #: Moves (partitions being rebalanced) at once, in total and per joining node, and the bytes
    #: a joining node copies at once (each move counts its partition's largest replica, at least
    #: ``MOVE_FLOOR_BYTES``; a move larger than the whole budget runs alone on its node).
    max_moves_global: int = DEFAULT_MAX_MOVES
    max_moves_per_node: int = DEFAULT_MAX_MOVES_PER_NODE
    max_bytes_per_node: int = DEFAULT_MAX_BYTES_PER_NODE
    #: Polling period while paused, and the longest wait before a pass that failed is redone.
    tick: float = 0.5
    #: Longest wait between passes when nothing changes in etcd and nothing falls due (a safety
    #: net: lease renewals and holddown expiries wake the pass loop at their due time,
    #: ``PassPlan.next_due_ms``, so an idle cluster costs a pass per renewal round, not per tick).
    max_idle: float = 5.0
    rpc_timeout: float = 3.0
    resend: RetryPolicy = field(default_factory=lambda: RetryPolicy(0.05, 1.0))
    store_retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(0.1, 2.0))
    #: Retire resends (best effort, until acknowledged while leading).
    retire_retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(0.1, 5.0))
    #: ListHosted calls (one per node) at once in a new term's sweep.
    sweep_concurrency: int = 4
    #: Adopt Rebalance calls at once (replica records for a new zone's first members; they go
    #: to the agents in batch calls).
    adopt_concurrency: int = 1024
    #: Sends of one adopt of a new zone before it is left to the next term's sweep.
    adopt_attempts: int = 8
    leases: LeaseConfig = field(default_factory=LeaseConfig)
    #: Health-check a lease's holder before renewing or granting it (placement.driver.liveness);
    #: False trusts the node record alone (a lease outlives a killed holder by up to the
    #: registration TTL more).
    probe_holders: bool = True
    #: Partitions a pass decides before it defers the other zones to the next one
    #: (``core.plan_pass``; design/control-plane.md, "A budget per pass").
    pass_budget: int = PASS_BUDGET


class Driver:
    """One driver instance. ``run()`` until cancelled; ``fence()``/``leader_api()`` for the API."""

    def __init__(
        self,
        client: EtcdClient,
        keys: KeySpace,
        config: DriverConfig,
        *,
        agents: AgentClient | None = None,
        tls: TlsMaterial | None = None,
        clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.client = client
        self.keys = keys
        self.config = config
        self.store = Metastore(client, keys)
        #: This driver's certificate: for agents, and for forwarding API calls to the leader.
        self.tls = tls
        self.agents = (
            agents if agents is not None else AgentClient(timeout=config.rpc_timeout, tls=tls)
        )
        self._clock = clock
        self._sleep = sleep
        #: What this instance's etcd probe saw last (``placectl driver run`` runs the probe).
        self.etcd_health = EtcdHealth()
        #: Agents that answer, probed before lease writes (design/control-plane.md).
        #: An answer is trusted for at most a quarter of the renewal period (0.5 s at most): a
        #: holder that died within that before its renewal is renewed once more, so a killed
        #: primary's partitions wait at most the lease plus that.
        period = config.leases.duration_ms - config.leases.renew_before_ms
        self.liveness = Liveness(self.agents.answers, fresh=min(0.5, period / 4000))
        self._leadership: Leadership | None = None
        self._leader_api: str | None = None
        self._view: ClusterView | None = None
        #: The gauges' counts and placements per zone (their own: the metrics thread uses it).
        self._gauges = GaugeMemo()
        #: This term's list-watch of the whole prefix (the replica sizes a move's bytes count).
        self._watch: ListWatch | None = None
        self._movers: dict[tuple[str, int], tuple[Drive, asyncio.Task[None]]] = {}
        #: Per running mover (sending), the move reports it has seen: (zone, partition) -> ...
        self._reports: dict[tuple[str, int], _Reports] = {}
        self._wanted: dict[tuple[str, int], Drive] = {}
        #: Retire and adopt sends in flight this term: (zone, partition, node) -> task.
        self._retires: dict[tuple[str, int, str], asyncio.Task[None]] = {}
        #: Zones created this term whose first members still need their replica records.
        self._adopt_zones: set[str] = set()
        self._adopt_slots = asyncio.Semaphore(config.adopt_concurrency)
        #: This term's adopts of the zones it created (one task per zone).
        self._adopting: set[asyncio.Task[None]] = set()
        #: The health checks of the next term round's holders, made just before it (one task).
        self._probe_ahead: tuple[tuple[int, frozenset[str]], asyncio.Task[None]] | None = None
        self._wake = asyncio.Event()
        #: This term's batcher of finishes (design/control-plane.md, "Batched finishes").
        self._endings: Coalescer[Ending, TransitionResult | PlacementError] | None = None
        #: This term's batcher of the movers' first reads of their partitions.
        self._reads: Coalescer[tuple[str, int], PartitionState] | None = None
        #: Revision of the leader's last applied lease write (the next pass waits to see it).
        self._written = 0
        self._fenced: NotLeader | None = None
        self._global_slots = asyncio.Semaphore(config.max_moves_global)
        self._node_slots: dict[str, asyncio.Semaphore] = {}
        self._node_bytes: dict[str, ByteBudget] = {}
        #: Counters for tests and the benchmark.
        self.stats: dict[str, int] = {
            "finished": 0,
            "cancel_finished": 0,
            "rpcs": 0,
            "terms": 0,
            "max_moves": 0,
            "max_moves_per_node": 0,
            "retired": 0,
            "retire_rpcs": 0,
            "adopted": 0,
            "report_wakeups": 0,
            "report_answers": 0,
        }
        self._moving = 0
        self._moving_nodes: Counter[str] = Counter()
        #: Corrupt ISR keys last logged (logged again only when the set changes).
        self._corrupt_isrs: Mapping[str, tuple[int, ...]] = {}

    # -- what the API uses -------------------------------------------------------------------

    def fence(self) -> Fence | None:
        """The fence to write with while leading (None otherwise). The fence, not this belief,
        is what makes writes safe: a write with a stale fence raises NotLeader."""
        leadership = self._leadership
        if leadership is None or leadership.is_lost:
            return None
        return leadership.fence

    def leader_api(self) -> str | None:
        """The current leader's API address (HOST:PORT), as last seen; None when unknown."""
        if self.fence() is not None:
            return self.config.api_address
        return self._leader_api

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def set_paused(self, paused: bool) -> None:
        """Pause/resume all driving (for the API): fenced put/delete of ``{p}/control/paused``."""
        fence = self.fence()
        if fence is None:
            raise NotLeader(f"{self.config.member_id} is not the leader")
        await self.store.set_paused(paused, fence, self.now_ms())

    def gauges(self) -> list[metrics.GaugeFamily]:
        """The leader's state gauges, from its latest view (immutable: safe to read from the
        metrics thread) — nothing while not leading (a follower's view is not current)."""
        view = self._view
        if view is None or self.fence() is None:
            return []
        moving = Counter(zone for zone, _ in list(self._movers))
        return fleet_gauges(view, self.now_ms(), self._gauges, moving)

    # -- the instance loop -------------------------------------------------------------------

    async def run(self) -> None:
        """Campaign, lead, step down, campaign again — until cancelled."""
        watcher = asyncio.create_task(self._watch_leader(), name="leader-watch")
        try:
            attempt = 0
            while True:
                value = encode_leader(LeaderRecord(self.config.member_id, self.config.api_address))
                election = Election(
                    self.client,
                    self.keys,
                    self.config.member_id,
                    ttl=self.config.lease_ttl,
                    value=value,
                )
                try:
                    leadership = await election.campaign()
                except CredentialError:
                    raise  # etcd refuses this driver's credential: end the process, say which
                except PlacementError as e:
                    attempt += 1
                    log.warning("campaign failed: %s; retrying", e)
                    await self._sleep(self.config.store_retry.delay(attempt))
                    continue
                attempt = 0
                await self._term(leadership)
        finally:
            await cancel_and_wait(watcher)

    async def _term(self, leadership: Leadership) -> None:
        self._leadership = leadership
        self._fenced = None
        self.stats["terms"] += 1
        metrics.DRIVER_TERMS.inc()
        metrics.DRIVER_LEADER.set(1)
        metrics.DRIVER_EPOCH.set(leadership.epoch)
        log.info("leader %s epoch %d", self.config.member_id, leadership.epoch)
        with log_context(epoch=leadership.epoch):  # the term's tasks log their epoch
            work = asyncio.create_task(self._lead(leadership.fence), name="lead")
        lost = asyncio.create_task(leadership.wait_lost(), name="wait-lost")
        reason = "stopped"
        try:
            done, _ = await asyncio.wait({work, lost}, return_when=asyncio.FIRST_COMPLETED)
            if lost in done:
                reason = lost.result()
            elif work.exception() is not None:
                reason = f"{type(work.exception()).__name__}: {work.exception()}"
            else:
                reason = "work ended"
        finally:
            self._leadership = None
            metrics.DRIVER_LEADER.set(0)
            metrics.DRIVER_EPOCH.set(0)
            for task in (work, lost):
                task.cancel()
            await asyncio.gather(work, lost, return_exceptions=True)
            log.warning(
                "%s stepping down (epoch %d): %s", self.config.member_id, leadership.epoch, reason
            )
            with contextlib.suppress(PlacementError, OSError):
                await asyncio.shield(leadership.resign())
        refused = work.exception() if work.done() and not work.cancelled() else None
        if isinstance(refused, CredentialError):
            raise refused  # the term ended because etcd refuses this driver: end the process

    async def _watch_leader(self) -> None:
        """Keep ``leader_api()`` current for followers (lowest create revision leads)."""
        watch = ListWatch(self.client, self.keys.leader_prefix())
        snapshot = await retry(
            watch.start,
            policy=self.config.store_retry,
            retry_on=(StoreUnavailable,),
            sleep=self._sleep,
        )
        try:
            while True:
                leader = min(snapshot.kvs.values(), key=lambda kv: kv.create_revision, default=None)
                self._leader_api = None
                record = decode_leader(leader.value) if leader is not None else None
                if isinstance(record, LeaderRecord):
                    self._leader_api = record.api or None
                snapshot = await watch.wait_newer(snapshot)
        finally:
            await watch.close()

    # -- one term ----------------------------------------------------------------------------

    async def _lead(self, fence: Fence) -> None:
        sizes = self.keys.sizes_prefix()
        # Replica-size reports (agents, every few seconds) inform nothing the leader decides.
        watch = ListWatch(
            self.client,
            self.keys.prefix.encode() + b"/",
            quiet=lambda key: key.startswith(sizes),
            group=view_group(self.keys),
        )
        await retry(
            watch.start,
            policy=self.config.store_retry,
            retry_on=(StoreUnavailable,),
            sleep=self._sleep,
            attempts=5,
        )
        attempt = 0
        sweep: asyncio.Task[None] | None = None
        # Incremental passes (design/control-plane.md): only the groups of keys that changed
        # are decoded again, and only the zones they belong to are decided again.
        self._watch = watch
        builder = ViewBuilder(self.keys)
        memo = PlanMemo()
        seen = watch.changes
        self._reads = Coalescer(
            lambda partitions: self.store.read_partitions(partitions, fence),
            limit=READS_PER_FLUSH,
            name="mover-reads",
        )
        self._endings = Coalescer(
            lambda endings: self.store.end_moves(endings, fence, self.now_ms()),
            limit=ENDINGS_PER_FLUSH,
            name="end-moves",
            key=lambda e: (e.zone, e.partition),
        )
        try:
            while True:
                if self._fenced is not None:
                    raise self._fenced
                started = time.monotonic()
                view = builder.build(watch.revision, watch.groups(), watch.stamps())
                self._view = view
                self._notice_reports(view)
                if sweep is None:
                    sweep = asyncio.create_task(self._retire_sweep(view, fence), name="sweep")
                self._adopt_created(view, fence)
                self.liveness.forget(view.nodes)
                plan = plan_pass(
                    view,
                    self.now_ms(),
                    self.config.leases,
                    memo,
                    self.liveness.silent(),
                    self.config.pass_budget,
                )
                if plan.deferred:
                    metrics.ZONES_DEFERRED.inc(len(plan.deferred))
                try:
                    await self._execute(plan, fence)
                    if plan.deferred:
                        # The next pass decides the deferred zones at once: on a view holding
                        # this pass's writes, so their tally counts the zones decided here at
                        # their targets, as one pass deciding all would (core.plan_pass).
                        revision = await self.client.current_revision()
                        self._written = max(self._written, revision)
                    attempt = 0
                except (StoreUnavailable, Conflict) as e:
                    attempt += 1
                    log.warning("pass at revision %d failed: %s", view.revision, e)
                    await self._sleep(self.config.store_retry.delay(attempt))
                self._reconcile(plan.drives, fence)
                self._schedule_probes(plan.term_round)
                metrics.PASS_SECONDS.observe(time.monotonic() - started)
                seen = await self._next_change(watch, seen, self._idle(plan, attempt))
        finally:
            movers = [task for _, task in self._movers.values()]
            movers.extend(self._retires.values())
            movers.extend(self._adopting)
            if self._probe_ahead is not None:
                movers.append(self._probe_ahead[1])
                self._probe_ahead = None
            if sweep is not None:
                movers.append(sweep)
            self._movers.clear()
            self._retires.clear()
            self._adopt_zones.clear()
            self._wanted = {}
            for task in movers:
                task.cancel()
            await asyncio.gather(*movers, return_exceptions=True)
            self._watch = None
            endings, self._endings = self._endings, None
            await endings.close()
            reads, self._reads = self._reads, None
            await reads.close()
            await watch.close()

    def _idle(self, plan: PassPlan, failed: int) -> float:
        """Seconds the pass loop may wait for a change before the next pass: until the plan's
        next due time (at most ``max_idle``), or ``tick`` after a failed pass."""
        if failed:
            return self.config.tick
        wait = self.config.max_idle
        if plan.next_due_ms is not None:
            # 1 ms late rather than early: a pass just before the due time finds nothing due.
            wait = min(max((plan.next_due_ms - self.now_ms() + 1) / 1000, 0.0), wait)
        silence = self.liveness.silence_ends_in()
        if silence is not None:  # a node that missed one probe is planned for again then
            wait = min(wait, silence + 0.001)
        return wait

    async def _next_change(self, watch: ListWatch, seen: int, idle: float) -> int:
        if watch.revision < self._written:
            # The next pass decides on a view that shows this pass's lease writes: one taken
            # half-way through their echo would find the rest still due and renew them again
            # (with stale compares that fail). Bounded: a stalled watch only delays the pass.
            await first_done(watch.wait_revision(self._written), at_most=self.config.tick)
        newer, _ = await first_done(watch.wait_change(seen), self._wake.wait(), at_most=idle)
        self._wake.clear()
        if newer.done() and not newer.cancelled() and newer.exception() is not None:
            raise newer.exception()  # type: ignore[misc]
        return watch.changes

    async def _execute(self, plan: PassPlan, fence: Fence) -> None:
        """The plan's writes: each zone's in the plan's order, zones concurrently (at most
        ``EXECUTE_ZONES`` at once — a fleet's zone creation or lease round is thousands of
        transactions, which one after another made a pass last seconds). A zone whose write
        fails does not stop the others; the first such error is raised once all are done (the
        pass is redone with backoff), NotLeader at once. The lease terms go last (see there)."""
        self._log_corrupt_isrs(plan.corrupt_isrs)
        zones = sorted({w.zone for f in WRITE_FIELDS for w in getattr(plan, f)})
        if not zones:
            if plan.terms is not None:
                await self._write_terms(plan.terms, fence)
            return
        slots = asyncio.Semaphore(EXECUTE_ZONES)

        async def one(zone: str) -> None:
            def mine(group: tuple[Any, ...]) -> tuple[Any, ...]:
                return tuple(w for w in group if w.zone == zone)

            fields: dict[str, Any] = {f: mine(getattr(plan, f)) for f in WRITE_FIELDS}
            part = replace(plan, **fields)
            async with slots:
                await self._execute_zone(part, fence)

        results = await asyncio.gather(*(one(z) for z in zones), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for error in errors:
            if isinstance(error, NotLeader | asyncio.CancelledError):
                raise error
        if plan.terms is not None:
            # After the leases: a cap or a move lands before the renewal of its old holder's
            # term, so no agent sees its term renewed before the lease it must give up (a
            # grant to a node without a term waits for it: the lease starts with the term).
            await self._write_terms(plan.terms, fence)
        if errors:
            raise errors[0]

    async def _execute_zone(self, plan: PassPlan, fence: Fence) -> None:
        """One zone's writes, in order."""
        ts = self.now_ms()
        for write in plan.datanodes:
            await self._write_datanodes(write, fence, ts)
        for create in plan.creates:
            result = await self.store.create_partitions(
                create.zone, create.stables, create.trigger_revision, fence, ts
            )
            log.info("zone %s: created %d partition(s)", create.zone, len(result.created))
            self._adopt_zones.add(create.zone)
        for trig in plan.triggers:
            batch = await self.store.apply_triggers(
                trig.zone, trig.targets, trig.trigger_revision, fence, ts
            )
            actions: dict[str, int] = {}
            for r in batch.results.values():
                name = r.action.value if r.action is not None else r.outcome.value
                actions[name] = actions.get(name, 0) + 1
            log.info(
                "zone %s: trigger %d on %d partition(s): %s",
                trig.zone,
                trig.trigger_revision,
                len(trig.targets),
                actions,
            )
            await failpoint("driver.after-trigger")
        for primaries in plan.primaries:
            await self._write_primaries(primaries, fence, ts)
        for cancel in plan.cancels:
            cancelled = await self.store.cancel(
                cancel.zone, cancel.partition, cancel.revision, fence, ts
            )
            log.info(
                "%s/%d: cancel of revision %d (a joining node left the zone): %s",
                cancel.zone,
                cancel.partition,
                cancel.revision,
                cancelled.outcome.value,
            )
        for drop in plan.drops:
            await self.store.drop_zone_leftovers(drop.zone, fence)
            log.info(
                "zone %s: dropped; its data nodes, primary leases, in-sync sets, replica sizes,"
                " layout and reshard reports deleted",
                drop.zone,
            )
        for retire in plan.retires:
            revision = await self.store.retire_partitions(
                retire.zone, sorted(retire.holders), retire.expected_layout_mod, fence
            )
            log.info(
                "zone %s: partition(s) %s retired by its layout (%s)",
                retire.zone,
                sorted(retire.holders),
                f"revision {revision}" if revision else "lost a race; next pass",
            )
            if revision:
                for partition, nodes in retire.holders.items():
                    for node in nodes:
                        self._spawn_retire(retire.zone, partition, node, (), revision, fence)
        for change in plan.layouts:
            revision = await self.store.write_layout(
                change.zone,
                change.layout,
                change.expected_layout_mod,
                change.expected_zone_mod,
                fence,
                ts,
            )
            log.info(
                "zone %s: layout %s: generation %d, %d partitions (%s)",
                change.zone,
                change.step.value,
                change.layout.generation,
                change.layout.partitions,
                f"written at revision {revision}" if revision else "lost a race; next pass",
            )
            if revision and change.step in RESHARD_FAILPOINTS:
                await failpoint(RESHARD_FAILPOINTS[change.step])

    def _log_corrupt_isrs(self, found: Mapping[str, tuple[int, ...]]) -> None:
        if found == self._corrupt_isrs:
            return
        self._corrupt_isrs = found
        for zone, partitions in sorted(found.items()):
            log.warning(
                "zone %s: in-sync set of partition(s) %s unreadable: their primary leases stay "
                "with the current holder (inspect %s)",
                zone,
                list(partitions),
                self.keys.zone_isr_prefix(zone).decode(),
            )

    async def _write_datanodes(self, write: WriteDataNodes, fence: Fence, ts: int) -> None:
        record = write.record
        ok = await self.store.write_datanodes(write.zone, record, write.expected_mod, fence, ts)
        log.info(
            "zone %s: data nodes applied=%s observed=%s up_since=%s down_since=%s (%s)",
            write.zone,
            list(record.applied),
            list(record.observed),
            record.up_since,
            record.down_since,
            "written" if ok else "lost race",
        )

    async def _silent_holders(self, holders: Iterable[str], what: str) -> frozenset[str]:
        """Of ``holders`` (nodes a pass is about to grant or renew leases), those whose agents
        do not answer a health check (placement.driver.liveness; none when probing is off): their
        writes are withheld, and the next pass, told they are silent, lets their leases end and
        grants them elsewhere."""
        if not self.config.probe_holders:
            return frozenset()
        nodes = self._view.nodes if self._view is not None else {}
        opened = self.liveness.failed_open
        silent = await self.liveness.check(
            {n: nodes[n].address if n in nodes else "" for n in set(holders)}
        )
        if self.liveness.failed_open > opened:
            log.warning(
                "%s: no agent has answered a health check for %.0f s: lease writes go"
                " out on the node records alone (check this driver's certificate and its"
                " network to the agents)",
                what,
                self.liveness.open_after,
            )
        if silent:
            log.warning(
                "%s: %s did not answer a health check: their lease writes withheld",
                what,
                ", ".join(sorted(silent)),
            )
            self._wake.set()
        return silent

    def _schedule_probes(self, term_round: tuple[int, frozenset[str]] | None) -> None:
        """Health-check the next term round's holders a little before it (0.8 ``fresh``), in a
        task of their own: the round's pass then finds them fresh and renews at once instead of
        waiting for a thousand probes inside the pass. The same answers as checking in the pass
        (one answered within ``fresh`` counts, as there): the wait after a kill is unchanged."""
        held = self._probe_ahead
        if held is not None and held[0] == term_round and not held[1].done():
            return
        if held is not None:
            held[1].cancel()
        self._probe_ahead = None
        if term_round is None or not self.config.probe_holders:
            return
        task = asyncio.create_task(self._probe_before(*term_round), name="probe-ahead")
        self._probe_ahead = (term_round, task)

    async def _probe_before(self, at_ms: int, nodes: frozenset[str]) -> None:
        lead_ms = 800 * self.liveness.fresh
        await self._sleep(max(0.0, (at_ms - lead_ms - self.now_ms()) / 1000))
        view = self._view
        records = view.nodes if view is not None else {}
        # Shielded: a round rescheduled (or a step-down) mid-probe must not cancel the probes
        # themselves, which a pass may share and a cancelled one would count as silence.
        await asyncio.shield(
            self.liveness.check({n: records[n].address if n in records else "" for n in nodes})
        )

    async def _write_terms(self, write: WriteTerms, fence: Fence) -> None:
        """Renew the lease terms of the nodes that answer (a lost compare: redone next pass)."""
        silent = await self._silent_holders(write.writes, "lease terms")
        writes = {n: w for n, w in write.writes.items() if n not in silent}
        metrics.LEASE_WRITES.labels("withheld").inc(len(write.writes) - len(writes))
        if not writes and not write.drops:
            return
        written = await self.store.write_terms(writes, write.drops, fence, self.now_ms())
        self._written = max(self._written, written.revision)
        for _ in range(written.raced):
            log.info("lease terms raced; redone next pass")

    async def _write_primaries(self, write: WritePrimaries, fence: Fence, ts: int) -> None:
        """A lost compare: redone next pass, on a fresh view. Leases for a holder whose agent
        does not answer are not written (:meth:`_silent_holders`)."""
        leases = write.leases
        silent = await self._silent_holders(
            (w.lease.node for w in leases.values()), f"zone {write.zone}"
        )
        if silent:
            kept = {p: w for p, w in leases.items() if w.lease.node not in silent}
            metrics.LEASE_WRITES.labels("withheld").inc(len(leases) - len(kept))
            leases = kept
            if not leases:
                return
        written = await self.store.write_primaries(write.zone, leases, fence, ts)
        self._written = max(self._written, written.revision)
        for _ in range(written.raced):
            log.info("zone %s: primary leases raced; redone next pass", write.zone)

    # -- movers ------------------------------------------------------------------------------

    def _reconcile(self, drives: Iterable[Drive], fence: Fence) -> None:
        """One mover per wanted drive. A mover whose drive is no longer wanted is not cancelled
        (it may be committing its finish): it notices at its next round and exits, and the
        next pass starts the mover of the new drive."""
        self._wanted = {d.key: d for d in drives}
        for key, (_, task) in list(self._movers.items()):
            if task.done():
                del self._movers[key]
        for key, drive in self._wanted.items():
            if key not in self._movers:
                task = asyncio.create_task(self._move(drive, fence), name=f"move {key}")
                task.add_done_callback(self._mover_done)
                self._movers[key] = (drive, task)

    def _mover_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, NotLeader):
            self._fenced = error
        elif error is not None:
            log.error("mover %s failed", task.get_name(), exc_info=error)
        self._wake.set()

    def _notice_reports(self, view: ClusterView) -> None:
        """Wake the movers whose drive got a new move report (DONE or FAILED of its revision)."""
        for (zone, partition), reports in self._reports.items():
            found = view.reported(zone, partition, reports.revision)
            now = frozenset(found.items())
            if now - reports.seen:
                reports.seen |= now
                reports.event.set()

    async def _resend_wait(self, delay: float, reports: _Reports) -> None:
        """Sleep ``delay`` (the resend backoff) unless a new report arrives first."""
        if reports.event.is_set():
            self.stats["report_wakeups"] += 1
            return
        await first_done(self._sleep(delay), reports.event.wait())
        if reports.event.is_set():
            self.stats["report_wakeups"] += 1

    def _paused(self) -> bool:
        return self._view is not None and self._view.paused

    def _slots(self, drive: Drive) -> list[contextlib.AbstractAsyncContextManager[Any]]:
        """The throttles a move holds while it runs: a global slot, then per *joining* node (in
        name order — no deadlock) a slot and its bytes. Cancels are not throttled."""
        if drive.cancel:
            return []
        joining = sorted(set(drive.new) - set(drive.old))
        cost = self._move_bytes(drive)
        slots: list[contextlib.AbstractAsyncContextManager[Any]] = [self._global_slots]
        for node in joining:
            slot = self._node_slots.get(node)
            if slot is None:
                slot = self._node_slots[node] = asyncio.Semaphore(self.config.max_moves_per_node)
            budget = self._node_bytes.get(node)
            if budget is None:
                budget = self._node_bytes[node] = ByteBudget(self.config.max_bytes_per_node)
            slots.extend((slot, budget.hold(cost)))
        return slots

    def _move_bytes(self, drive: Drive) -> int:
        """What the move copies onto each joining node: the partition's largest replica among
        the agents' size reports (``{p}/sizes/``), at least ``MOVE_FLOOR_BYTES``."""
        watch = self._watch
        largest = 0
        if watch is not None:
            for node in drive.old:
                kv = watch.get(self.keys.size(drive.zone, drive.partition, node))
                size = decode_size(kv.value) if kv is not None else None
                if isinstance(size, ReplicaSize):
                    largest = max(largest, size.bytes)
        return max(largest, MOVE_FLOOR_BYTES)

    async def _move(self, drive: Drive, fence: Fence) -> None:
        set_log_context(zone=drive.zone, partition=drive.partition, revision=drive.revision)
        reads = self._reads
        if reads is None:
            return  # the term is ending
        state = await retry(
            lambda: reads.submit((drive.zone, drive.partition)),
            policy=self.config.store_retry,
            retry_on=(StoreUnavailable,),
            sleep=self._sleep,
        )
        if drive_action(state) != drive:
            self._wake.set()
            return
        while self._paused():
            await self._sleep(self.config.tick)
        async with contextlib.AsyncExitStack() as stack:
            for slot in self._slots(drive):
                await stack.enter_async_context(slot)
            if not drive.cancel:
                stack.callback(self._count_move(drive))
            reports = _Reports(drive.revision)
            if self._view is not None:
                found = self._view.reported(drive.zone, drive.partition, drive.revision)
                reports.seen = frozenset(found.items())
            self._reports[drive.key] = reports
            stack.callback(self._drop_reports, drive.key, reports)
            attempt = 0
            # Members that answered DONE to this move, with the registration they answered
            # under: final while that registration lasts (an agent persists DONE before it
            # answers, and a newer move makes this one's finish fail its compare), so a resend
            # goes only to the others. A node registered again (restarted, maybe on an empty
            # disk) is asked again.
            done: dict[str, NodeRecord] = {}
            while True:
                while self._paused():
                    await self._sleep(self.config.tick)
                if self._wanted.get(drive.key) != drive:
                    return  # the partition moved on (finished elsewhere, cancelled, replaced)
                reports.event.clear()
                nodes = self._view.nodes if self._view is not None else {}
                for node in [n for n, record in done.items() if nodes.get(n) is not record]:
                    del done[node]
                if not drive.cancel:
                    reported = self._reported_done(drive)
                    self.stats["report_answers"] += len(reported.keys() - done.keys())
                    done.update(reported)
                answers = await self._send_all(drive, fence.epoch, skip=done)
                if not drive.cancel:
                    done.update(
                        (n, nodes[n]) for n, a in answers.items() if a == "DONE" and n in nodes
                    )
                answers.update(dict.fromkeys(done, "DONE"))
                verdict = aggregate(drive, answers)
                if verdict is not Verdict.WAIT:
                    await self._finish(drive, verdict, fence)
                    return
                attempt += 1
                await self._resend_wait(self.config.resend.delay(attempt), reports)

    def _reported_done(self, drive: Drive) -> dict[str, NodeRecord]:
        """Members whose move report says DONE for this drive's revision, written under the
        registration the node has now (the report's lease is its node key's): the report is
        put only after the agent committed DONE, so it is that answer without asking again."""
        view, watch = self._view, self._watch
        if view is None or watch is None:
            return {}
        done: dict[str, NodeRecord] = {}
        for node, report in view.reported(drive.zone, drive.partition, drive.revision).items():
            record = view.nodes.get(node)
            if report.phase != "DONE" or record is None:
                continue
            progress = watch.get(self.keys.progress(drive.zone, drive.partition, node))
            registered = watch.get(self.keys.node(node))
            if progress and registered and progress.lease and progress.lease == registered.lease:
                done[node] = record
        return done

    def _drop_reports(self, key: tuple[str, int], reports: _Reports) -> None:
        if self._reports.get(key) is reports:
            del self._reports[key]

    def _count_move(self, drive: Drive) -> Callable[[], None]:
        """Track moves holding throttle slots (``stats``: the highest counts seen)."""
        joining = set(drive.new) - set(drive.old)
        self._moving += 1
        self._moving_nodes.update(joining)
        self.stats["max_moves"] = max(self.stats["max_moves"], self._moving)
        if joining:
            top = max(self._moving_nodes[n] for n in joining)
            self.stats["max_moves_per_node"] = max(self.stats["max_moves_per_node"], top)

        def done() -> None:
            self._moving -= 1
            self._moving_nodes.subtract(joining)

        return done

    async def _send_all(
        self, drive: Drive, epoch: int, skip: Mapping[str, object]
    ) -> dict[str, str | None]:
        nodes = self._view.nodes if self._view is not None else {}
        members = sorted((set(drive.old) | set(drive.new)) - set(skip))
        targets = {n: nodes[n].address for n in members if n in nodes}
        results = await asyncio.gather(*(self._send(drive, a, epoch) for a in targets.values()))
        answers: dict[str, str | None] = {}
        for node, answer in zip(targets, results, strict=True):
            answers[node] = answer.outcome if answer is not None else None
        return answers

    async def _send(self, drive: Drive, address: str, epoch: int) -> AgentAnswer | None:
        self.stats["rpcs"] += 1
        try:
            answer = await self.agents.rebalance(
                address,
                drive.zone,
                drive.partition,
                drive.old,
                drive.new,
                drive.revision,
                epoch,
                cancel=drive.cancel,
            )
        except AgentUnavailable as e:
            log.info("%s/%d: %s", drive.zone, drive.partition, e)
            metrics.REBALANCE_RPCS.labels("unavailable").inc()
            return None
        metrics.REBALANCE_RPCS.labels(answer.outcome.lower()).inc()
        if answer.outcome == "FAILED":
            metrics.MOVES.labels(drive.zone, "failed").inc()
        return answer

    async def _finish(self, drive: Drive, verdict: Verdict, fence: Fence) -> None:
        """End the move as ``verdict`` says, batched with the other movers ending at the same
        moment (``Metastore.end_moves``: their switches, and their move reports deleted, in
        few transactions)."""
        ending = Ending(
            drive.zone,
            drive.partition,
            drive.revision,
            cancelled=verdict is not Verdict.FINISH,
            already_done=verdict is Verdict.CANCEL_ALREADY_DONE,
        )
        endings = self._endings
        if endings is None:
            return  # the term is ending
        unknown = False  # a try whose outcome is unknown (StoreUnavailable) came first

        async def end() -> TransitionResult:
            nonlocal unknown
            found = await endings.submit(ending)
            if isinstance(found, PlacementError):  # this ending's own error
                unknown = unknown or isinstance(found, StoreUnavailable)
                raise found
            return found

        result = await retry(
            end,
            policy=self.config.store_retry,
            retry_on=(StoreUnavailable, Conflict),
            sleep=self._sleep,
        )
        await failpoint("driver.after-finish")
        outcome = result.outcome
        if outcome is Outcome.STALE and unknown and _ended_by(result.state, drive, fence):
            outcome = Outcome.APPLIED  # the try whose answer was lost had committed it
        if outcome is Outcome.APPLIED:
            self._start_retires(drive, result.state, fence)
            if verdict is not Verdict.FINISH:
                self._start_readopts(drive, result.state, fence)
            self.stats["finished" if verdict is Verdict.FINISH else "cancel_finished"] += 1
            done = "done" if verdict is Verdict.FINISH else "cancelled"
            metrics.MOVES.labels(drive.zone, done).inc()
        log.info(
            "%s/%d: %s of revision %d -> %s",
            drive.zone,
            drive.partition,
            verdict.value,
            drive.revision,
            outcome.value,
        )
        self._wake.set()

    def _start_readopts(self, drive: Drive, after: PartitionState, fence: Fence) -> None:
        """After a committed finish_cancel that left the partition idle (on old, or on new when
        the cancel came too late): every member of stable gets an adopt at the transaction's
        revision. A member the move reached before the zone creation's adopt did (no replica
        record yet) either started a catch-up, which the cancel discarded (a staying member),
        or recorded the move as done without a replica (a leaving one); its creation adopt, at
        stable's older revision, is then STALE (design/replica-protocol.md). Which staying
        member answered CANCELLED does not decide the verdict, so all of stable is asked: one
        holding its replica answers DONE at once."""
        stable = after.peers(AssignField.STABLE)
        if stable is None or after.pending is not None or after.planned is not None:
            return  # a move that names them follows (or stable is unreadable)
        for node in sorted(stable):
            self._spawn_adopt(drive.zone, drive.partition, node, stable, after.revision, fence)

    # -- retire (make-before-break cleanup) -----------------------------------------------------

    def _start_retires(self, drive: Drive, after: PartitionState, fence: Fence) -> None:
        """After a committed finish / finish_cancel: members of old ∪ new that the stable now in
        etcd does not name — and that no pending or planned names (they are about to be moved
        again) — drop their replicas. ``after`` is the partition as of the transaction's
        revision, which is the revision sent (= stable's mod_revision after a switch)."""
        stable = after.peers(AssignField.STABLE)
        if stable is None:
            return
        keep = set(stable)
        keep.update(after.peers(AssignField.PENDING) or ())
        keep.update(after.peers(AssignField.PLANNED) or ())
        for node in sorted((set(drive.old) | set(drive.new)) - keep):
            self._spawn_retire(drive.zone, drive.partition, node, stable, after.revision, fence)

    async def _retire_sweep(self, view: ClusterView, fence: Fence) -> None:
        """Once per term, on its first view: a Retire lost with the previous leader's term is
        found again, and a member of stable without a replica gets one. Each registered node is
        asked once what it hosts (``ListHosted``, at most ``sweep_concurrency`` nodes at once);
        then, over every idle partition (no pending, planned or cancel): a node hosting one its
        stable does not name gets a Retire at the view's revision (at which stable was as seen
        and no pending existed), a member of stable not hosting it an adopt. Best effort: a node
        that does not answer is skipped. Cost: one call per node, not one per partition and
        node."""
        slots = asyncio.Semaphore(self.config.sweep_concurrency)

        async def hosted(node: str) -> tuple[str, set[tuple[str, int]] | None]:
            async with slots:
                try:
                    return node, await self.agents.hosted_partitions(view.nodes[node].address)
                except AgentUnavailable:
                    return node, None

        listed = await asyncio.gather(*(hosted(n) for n in sorted(view.nodes)))
        answered = {node: found for node, found in listed if found is not None}
        if missing := sorted(node for node, found in listed if found is None):
            log.warning("sweep: %d node(s) did not list their replicas, skipped: %s",
                        len(missing), ", ".join(missing[:10]))  # fmt: skip

        def idle(zone: str, partition: int) -> Peers | None:
            """Stable, if the partition is idle with a readable stable."""
            found = view.zones.get(zone)
            state = found.partitions.get(partition) if found is not None else None
            if state is None or state.pending or state.planned or state.cancel:
                return None
            return state.peers(AssignField.STABLE)

        for node, found in answered.items():  # hosted, not named: retire
            for zone, partition in sorted(found):
                named = idle(zone, partition)
                if named is None or node in named or (zone, partition, node) in self._retires:
                    continue
                log.info("%s/%d: %s hosts a replica stable does not name", zone, partition, node)
                self._spawn_retire(zone, partition, node, named, view.revision, fence)
        for zone_view in view.zones.values():  # named, not hosted: adopt
            for partition in zone_view.partitions:
                named = idle(zone_view.name, partition)
                if named is None:
                    continue
                key = (zone_view.name, partition)
                for node in named:
                    held = answered.get(node)
                    if held is None or key in held or (*key, node) in self._retires:
                        continue
                    log.info("%s/%d: %s is in stable but holds no replica", *key, node)
                    # at the view's revision (the partition idle at it), like the retires: a
                    # cancelled move may have raised the agent past stable's own revision
                    self._spawn_adopt(*key, node, named, view.revision, fence)

    def _spawn_retire(
        self, zone: str, partition: int, node: str, stable: Peers, revision: int, fence: Fence
    ) -> None:
        self._spawn_housekeeping(
            (zone, partition, node), self._retire(zone, partition, node, stable, revision, fence)
        )

    def _spawn_adopt(
        self, zone: str, partition: int, node: str, stable: Peers, revision: int, fence: Fence
    ) -> None:
        self._spawn_housekeeping(
            (zone, partition, node), self._adopt(zone, partition, node, stable, revision, fence)
        )

    def _spawn_housekeeping(
        self, key: tuple[str, int, str], work: Coroutine[Any, Any, None]
    ) -> None:
        """One retire or adopt send per (zone, partition, node); a newer one supersedes."""
        running = self._retires.get(key)
        if running is not None and not running.done():
            running.cancel()
        task = asyncio.create_task(work, name=f"housekeeping {key}")
        self._retires[key] = task
        task.add_done_callback(functools.partial(self._retire_done, key))

    def _adopt_created(self, view: ClusterView, fence: Fence) -> None:
        """A zone created this term: its first members get their replica records (no data
        moves — a brand-new partition is empty), by an adopt Rebalance each — sent
        ``adopt_concurrency`` at a time by one task per zone (a fleet's zone creation is
        hundreds of thousands of adopts: a task each would hold the loop for seconds and
        gigabytes), batched per agent by the client."""
        for name in sorted(self._adopt_zones & set(view.zones)):
            self._adopt_zones.discard(name)
            work: list[tuple[int, str, Peers, int]] = []
            for partition, state in view.zones[name].partitions.items():
                stable = state.peers(AssignField.STABLE)
                if stable is None or state.stable is None or state.pending is not None:
                    continue
                work.extend((partition, n, stable, state.stable.mod_revision) for n in stable)
            task = asyncio.create_task(self._adopt_all(name, work, fence), name=f"adopt {name}")
            self._adopting.add(task)
            task.add_done_callback(self._adopting.discard)

    async def _adopt_all(
        self, zone: str, work: list[tuple[int, str, Peers, int]], fence: Fence
    ) -> None:
        """``adopt_concurrency`` workers over the zone's adopts (a slow or dead node holds up
        one worker, not the others)."""
        pending = iter(work)

        async def worker() -> None:
            for p, node, stable, revision in pending:
                try:
                    await self._adopt(
                        zone, p, node, stable, revision, fence, self.config.adopt_attempts
                    )
                except Exception:  # one adopt's failure must not stop the zone's others
                    log.exception("%s/%d: adopt on %s failed", zone, p, node)

        workers = min(self.config.adopt_concurrency, len(work))
        await asyncio.gather(*(worker() for _ in range(workers)))

    def _retire_done(self, key: tuple[str, int, str], task: asyncio.Task[None]) -> None:
        if self._retires.get(key) is task:
            del self._retires[key]
        if not task.cancelled() and task.exception() is not None:
            log.error("retire %s failed", key, exc_info=task.exception())

    async def _until_answered(
        self, once: Callable[[], Awaitable[AgentAnswer]], attempts: int | None = None
    ) -> AgentAnswer:
        """``once`` retried with ``retire_retry`` while the agent is unavailable (at most
        ``attempts`` times; None: until it answers)."""
        return await retry(
            once,
            policy=self.config.retire_retry,
            retry_on=(AgentUnavailable,),
            sleep=self._sleep,
            attempts=attempts,
        )

    def _registered_address(self, node: str) -> str:
        """The node's agent address in the current view; an unregistered node is
        :class:`AgentUnavailable` (retried like a node that does not answer)."""
        nodes = self._view.nodes if self._view is not None else {}
        record = nodes.get(node)
        if record is None:
            raise AgentUnavailable(f"{node} is not registered")
        return record.address

    async def _adopt(
        self,
        zone: str,
        partition: int,
        node: str,
        stable: Peers,
        revision: int,
        fence: Fence,
        attempts: int | None = None,
    ) -> None:
        """Make a member of an idle stable hold its replica record: ``Rebalance(old = new =
        stable, revision)`` — stable's mod_revision for a zone's creation, the view's for the
        sweep, the finish_cancel's after a reverted cancel — resent until the agent answers DONE (or
        STALE: a newer move already covers the node). While the agent answers (ACCEPTED: it is
        catching up; FAILED: the resend restarts it) it is asked again with backoff for as long
        as it takes; an agent that does not answer, or a node not registered, is given up on
        after ``attempts`` sends in a row (None: never) and left to the next term's sweep.
        Idempotent on the agent like any Rebalance."""

        async def once() -> AgentAnswer:
            address = self._registered_address(node)
            async with self._adopt_slots:
                return await self.agents.rebalance(
                    address, zone, partition, stable, stable, revision, fence.epoch
                )

        busy = 0
        while True:
            try:
                answer = await self._until_answered(once, attempts)
            except AgentUnavailable as e:
                log.warning("%s/%d: adopt on %s left to the next term's sweep: %s", zone,
                            partition, node, e)  # fmt: skip
                metrics.ADOPTS.labels("left").inc()
                return
            if answer.outcome in ("DONE", "STALE"):
                break
            busy += 1  # catching up: ask again (not an attempt against a silent agent)
            await self._sleep(self.config.retire_retry.delay(busy))
        metrics.ADOPTS.labels(answer.outcome.lower()).inc()
        if answer.outcome == "DONE":
            self.stats["adopted"] += 1
        log.debug("%s/%d: adopt on %s at %d -> %s", zone, partition, node, revision, answer.outcome)

    async def _retire(
        self, zone: str, partition: int, node: str, stable: Peers, revision: int, fence: Fence
    ) -> None:
        """Send Retire until the agent acknowledges it (any answer), with backoff; an
        unregistered node is waited for. Best effort: nothing waits for it, and the term's end
        cancels it (the next term's sweep finds a replica it left behind)."""

        async def once() -> AgentAnswer:
            address = self._registered_address(node)
            self.stats["retire_rpcs"] += 1
            answer = await self.agents.retire(
                address, zone, partition, stable, revision, fence.epoch
            )
            if answer.outcome == "RETIRE_IN_SYNC":
                # Its in-sync set still names the node: the primary removes it (it is in
                # neither stable nor pending), then the replica can go.
                raise AgentUnavailable(f"{node}: {answer.detail}")
            return answer

        answer = await self._until_answered(once)
        if answer.outcome == "RETIRED":
            self.stats["retired"] += 1
        log.info(
            "%s/%d: retire on %s at revision %d -> %s (%s)",
            zone,
            partition,
            node,
            revision,
            answer.outcome,
            answer.detail,
        )


def _ended_by(state: PartitionState, drive: Drive, fence: Fence) -> bool:
    """Whether ``state`` is what this term's end of ``drive`` left: no pending of its revision
    and stable naming, stamped by this epoch, the peers the move ended on (new for a finish or
    a cancel already done; old for a cancel reverted)."""
    entry = state.stable
    if entry is None or not isinstance(entry.value, Assignment):
        return False
    pending = state.pending
    if pending is not None and pending.mod_revision == drive.revision:
        return False
    return entry.value.epoch == fence.epoch and entry.value.peers in (drive.new, drive.old)
