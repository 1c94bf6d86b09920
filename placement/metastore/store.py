"""The narrow store interface of the placement driver: zone configs, nodes and assignments in etcd.

Every write here is **one etcd transaction** whose compares make it atomic and race-free, and every
driver write also compares the writer's :class:`Fence` (``create_revision(leader_key) == epoch``):
a writer whose leadership ended — its key deleted, expired, or re-created in a later term — cannot
change anything, and gets :class:`~placement.errors.NotLeader`.

Assignment transitions (design/metastore.md §3) — :meth:`Metastore.trigger`,
:meth:`Metastore.finish`, :meth:`Metastore.cancel`, :meth:`Metastore.finish_cancel` — share one
shape:

1. take the partition's state (read fresh, or the ``observed`` state the caller already holds);
2. decide with a pure function of :mod:`placement.metastore.transitions`
   (:func:`~placement.metastore.transitions.plan_trigger`, ...) what to write;
3. write it in one transaction that compares exactly what the decision was based on (the trigger
   value and the ``mod_revision`` of every key read, 0 meaning absent) plus the fence. Its failure
   branch reads the partition and the leader key at the same revision, so a lost race costs no extra
   round trip: the decision is re-made on that fresh state, a bounded number of times.

A decision to write nothing (stale trigger, stale finish, ...) is only ever reported from a fresh
read: when it was made on a caller's ``observed`` state, the partition is read again first. So
the result of every transition is the rule applied to the state at its commit revision.

Outcomes of every transition:

* applied — ``Outcome.APPLIED``, with the state after the write;
* stale / lost — ``Outcome.STALE_TRIGGER``, ``Outcome.STALE``, ``Outcome.CANCELLED``,
  ``Outcome.CORRUPT``: nothing written, with the current state; a race lost more than
  ``max_attempts`` times raises :class:`~placement.errors.Conflict`;
* fenced — raises :class:`~placement.errors.NotLeader`, nothing written;
* store unavailable — raises :class:`~placement.errors.StoreUnavailable`. The write **may or may
  not** have been applied: re-read (every transition is safe to call again with the same
  arguments — it re-reads and re-decides).

The table of compares per transition is in ``design/metastore.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from types import MappingProxyType

from placement.core.layout import ZoneLayout
from placement.core.limits import MAX_PARTITIONS
from placement.core.model import Peers, ZoneSpec
from placement.core.names import validate_name, validate_partition
from placement.errors import Conflict, InvalidInput, NotLeader, PlacementError, StoreUnavailable
from placement.failpoints import failpoint
from placement.metastore.codec import (
    Assignment,
    ControlMark,
    DataNodes,
    InSyncSet,
    LayoutValue,
    NodeRecord,
    PrimaryLease,
    TriggerMark,
    decode_isr,
    decode_layout,
    decode_node,
    decode_primary,
    decode_zone_spec,
    encode_assignment,
    encode_control,
    encode_datanodes,
    encode_isr,
    encode_layout,
    encode_node,
    encode_trigger,
    encode_zone_spec,
    validate_peers,
)
from placement.metastore.etcd import EtcdClient, Lease
from placement.metastore.keys import AssignField, KeyKind, KeySpace, prefix_range_end
from placement.metastore.kv import KeyValue, Range, TxnResult
from placement.metastore.transitions import (
    BatchTriggerResult,
    CreateResult,
    Decision,
    Ending,
    Fence,
    LeaseWrite,
    NodeEntry,
    Outcome,
    PartitionState,
    TermWrite,
    TransitionResult,
    TxnStats,
    Unit,
    Write,
    ZoneRecord,
    ZoneState,
    ZoneWrite,
    apply_write,
    batch_txn,
    pack,
    partition_states,
    plan_cancel,
    plan_ending,
    plan_finish,
    plan_finish_cancel,
    plan_owned_txns,
    plan_primary_txns,
    plan_term_txns,
    plan_trigger,
    txn_stats,
)
from placement.metastore.txn import MAX_TXN_OPS, Compare, Delete, Get, Op, Put, Txn
from placement.metrics import ETCD_FENCED, LEASE_WRITES

#: Attempts of a transition before a lost race is reported as :class:`Conflict`.
DEFAULT_MAX_ATTEMPTS = 8

# -- the store ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaseWrites:
    """What :meth:`Metastore.write_primaries` did: ``raced`` transactions lost a compare (their
    leases are not written); ``revision`` is that of the last one applied (0: none)."""

    raced: int
    revision: int


#: In-sync sets one :meth:`Metastore.write_isrs` transaction writes at most: two compares each,
#: four for a learner's join (its assignment's stable and pending revisions), within etcd's
#: limit on a transaction's compares.
ISR_BATCH = MAX_TXN_OPS // 4


@dataclass(frozen=True, slots=True)
class IsrWrite:
    """One partition's in-sync set, fenced by its primary lease key's and ISR key's revisions
    and, for a learner's join, by the mod revisions of the assignment keys it was judged by
    (``assignment_mods``: (field, mod revision), 0 = absent; design/data-plane.md)."""

    zone: str
    partition: int
    isr: InSyncSet
    lease_key_mod: int
    isr_mod: int
    assignment_mods: tuple[tuple[AssignField, int], ...] = ()


class Metastore:
    """Zone configs, node records and assignment transitions on one etcd client and key space."""

    def __init__(
        self, client: EtcdClient, keys: KeySpace, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS
    ) -> None:
        if max_attempts < 1:
            raise InvalidInput("max_attempts", "must be >= 1", "e.g. 8")
        self.client = client
        self.keys = keys
        self.max_attempts = max_attempts

    # -- reads -------------------------------------------------------------------------------

    def _partition_state(
        self, zone: str, partition: int, found: Range, revision: int
    ) -> PartitionState:
        states = partition_states(self.keys, zone, found.kvs, revision)
        return states.get(partition, PartitionState(zone, partition, revision))

    def _partition_get(self, zone: str, partition: int) -> Get:
        prefix = self.keys.partition_prefix(zone, partition)
        return Get(prefix, prefix_range_end(prefix))

    async def read_partition(self, zone: str, partition: int) -> PartitionState:
        """The five keys of one partition at one revision (one range read)."""
        prefix = self.keys.partition_prefix(zone, partition)
        found = await self.client.range(prefix, prefix_range_end(prefix))
        return self._partition_state(zone, partition, found, found.revision)

    async def read_zone(self, zone: str, *, page_size: int = 1000) -> ZoneState:
        """Every partition of ``zone`` at one revision (paginated range reads pinned to it)."""
        found = await self.client.list_prefix(
            self.keys.zone_assign_prefix(zone), page_size=page_size
        )
        states = partition_states(self.keys, zone, found.kvs, found.revision)
        return ZoneState(zone, found.revision, MappingProxyType(states))

    async def read_zone_snapshot(self, zone: str) -> tuple[int, dict[bytes, KeyValue]]:
        """Everything the leader decides ``zone`` on, at one revision, in one read transaction:
        its config, layout, data nodes, assignments, primary leases, in-sync sets, reshard
        reports and replica sizes, the registered nodes, drain and cordon marks, the nodes' lease
        terms, the leader keys and the pause flag —
        ``(revision, key -> KeyValue)``, what :func:`placement.driver.core.build_view` reads."""
        keys = self.keys
        prefixes = (
            keys.zone_assign_prefix(zone),
            keys.zone_primary_prefix(zone),
            keys.zone_isr_prefix(zone),
            keys.zone_reshard_prefix(zone),
            keys.sizes_prefix() + zone.encode() + b"/",
            keys.nodes_prefix(),
            keys.leader_prefix(),
            keys.drain_prefix(),
            keys.cordon_prefix(),
            keys.terms_prefix(),
        )
        singles = (keys.zone(zone), keys.layout(zone), keys.datanodes(zone), keys.paused())
        result = await self.client.txn(
            (),
            (
                *(Get(p, prefix_range_end(p)) for p in prefixes),
                *(Get(k) for k in singles),
            ),
        )
        found: dict[bytes, KeyValue] = {}
        for response in result.responses:
            assert isinstance(response, Range)
            found.update((kv.key, kv) for kv in response.kvs)
        return result.revision, found

    async def read_cluster_snapshot(self) -> tuple[int, dict[bytes, KeyValue]]:
        """Every key under the prefix at one revision (paged reads pinned to the first one's) —
        ``(revision, key -> KeyValue)`` for :func:`placement.driver.core.build_view`: what the
        leader's list-watch holds, for a decision over every zone (a drain's dry run)."""
        found = await self.client.list_prefix(self.keys.prefix.encode() + b"/")
        return found.revision, {kv.key: kv for kv in found.kvs}

    async def read_node_snapshot(self, node: str) -> tuple[int, dict[bytes, KeyValue]]:
        """What a node holds, at one revision: every zone config, assignment and primary lease,
        its node record and its drain and cordon marks — ``(revision, key -> KeyValue)`` for
        :func:`placement.driver.core.build_view`. Paged reads pinned to the first one's
        revision (a fleet's assignments do not fit one answer)."""
        keys = self.keys
        zones = await self.client.list_prefix(keys.zones_prefix())
        revision = zones.revision
        found = {kv.key: kv for kv in zones.kvs}
        for prefix in (keys.assign_prefix(), keys.primary_prefix()):
            page = await self.client.list_prefix(prefix, revision=revision)
            found.update((kv.key, kv) for kv in page.kvs)
        for key in (keys.node(node), keys.drain(node), keys.cordon(node), keys.term(node)):
            one = (await self.client.get(key, revision=revision)).first()
            if one is not None:
                found[key] = one
        return revision, found

    async def _read_fenced(self, zone: str, partition: int, fence: Fence) -> PartitionState:
        """The partition and the leader key at one revision; raises NotLeader if the fence fails."""
        (state,) = await self.read_partitions([(zone, partition)], fence)
        return state

    def _fenced_state(
        self, zone: str, partition: int, fence: Fence, result: TxnResult
    ) -> PartitionState:
        found, leader = result.responses
        assert isinstance(found, Range)
        assert isinstance(leader, Range)
        if not fence.holds(leader.first()):
            raise _fenced(
                f"fence {fence.leader_key!r}@{fence.epoch} no longer holds "
                f"(leader key now {leader.first()!r})"
            )
        return self._partition_state(zone, partition, found, result.revision)

    # -- the transition engine -----------------------------------------------------------------

    async def _transition(
        self,
        zone: str,
        partition: int,
        fence: Fence,
        observed: PartitionState | None,
        plan: Callable[[PartitionState], Decision],
    ) -> TransitionResult:
        validate_partition(partition)
        if observed is not None and (observed.zone, observed.partition) != (zone, partition):
            raise InvalidInput(
                "observed", "is the state of another partition", "pass its own state"
            )
        state = (
            observed if observed is not None else await self._read_fenced(zone, partition, fence)
        )
        fresh = observed is None
        for attempt in range(1, self.max_attempts + 1):
            decision = plan(state)
            if decision.write is None:
                if fresh:
                    return TransitionResult(decision.outcome, state, decision.action, attempt)
                state, fresh = await self._read_fenced(zone, partition, fence), True
                continue
            get = self._partition_get(zone, partition)
            result = await self.client.txn(
                (fence.compare(), *decision.write.compares),
                (*self._write_ops(zone, partition, decision.write), get),
                (get, Get(fence.leader_key)),
            )
            if result.succeeded:
                found = result.responses[-1]
                assert isinstance(found, Range)
                after = self._partition_state(zone, partition, found, result.revision)
                return TransitionResult(decision.outcome, after, decision.action, attempt)
            state, fresh = self._fenced_state(zone, partition, fence, result), True
        raise Conflict(
            f"{zone}/{partition}: lost the race {self.max_attempts} times; it is contended"
        )

    async def _on_pending(
        self,
        zone: str,
        partition: int,
        pending_revision: int,
        fence: Fence,
        ts: int,
        observed: PartitionState | None,
        plan: Callable[[KeySpace, PartitionState, int, int, int], Decision],
    ) -> TransitionResult:
        """A transition of the rebalance of pending ``pending_revision``: ``plan(keys, state,
        pending_revision, epoch, ts)``."""
        _check_revision("pending_revision", pending_revision)
        return await self._transition(
            zone,
            partition,
            fence,
            observed,
            lambda s: plan(self.keys, s, pending_revision, fence.epoch, ts),
        )

    def _span(self, zone: str, units: Sequence[Unit]) -> Get:
        """A read of every key of the partitions from the first unit's to the last unit's."""
        start = self.keys.partition_prefix(zone, units[0].partition)
        return Get(start, prefix_range_end(self.keys.partition_prefix(zone, units[-1].partition)))

    def _write_ops(self, zone: str, partition: int, write: Write) -> tuple[Op, ...]:
        puts: list[Op] = [
            Put(self.keys.assign(zone, partition, f), v) for f, v in write.puts.items()
        ]
        deletes: list[Op] = [Delete(self.keys.assign(zone, partition, f)) for f in write.deletes]
        return (*puts, *deletes)

    # -- assignment transitions ----------------------------------------------------------------

    async def trigger(
        self,
        zone: str,
        partition: int,
        target: Peers,
        trigger_revision: int,
        fence: Fence,
        ts: int,
        *,
        observed: PartitionState | None = None,
    ) -> TransitionResult:
        """Apply a configuration-change trigger to one partition (rule 2, design/metastore.md §3).

        Branches (:func:`decide_trigger`): pending := target / planned := target / delete planned /
        record only; always records ``trigger_revision`` in the trigger key.

        Compares (one txn): ``create_revision(leader) == epoch``; ``value(trigger) < be8(new)`` (or
        ``version(trigger) == 0`` when none was read); ``mod_revision`` of stable, pending and
        planned as read (0 = absent).

        Outcomes: APPLIED (``action`` says which branch) / STALE_TRIGGER (stored trigger not older,
        nothing written) / raises NotLeader, Conflict (lost more than ``max_attempts`` races),
        StoreUnavailable (outcome unknown: call again, it re-reads).
        """
        target = validate_peers(target, "target")
        _check_revision("trigger_revision", trigger_revision)
        return await self._transition(
            zone,
            partition,
            fence,
            observed,
            lambda s: plan_trigger(self.keys, s, target, trigger_revision, fence.epoch, ts),
        )

    async def finish(
        self,
        zone: str,
        partition: int,
        pending_revision: int,
        fence: Fence,
        ts: int,
        *,
        observed: PartitionState | None = None,
    ) -> TransitionResult:
        """The rebalance of pending ``pending_revision`` is done: ``stable := pending;
        pending := planned (or delete); delete planned``.

        Compares: ``create_revision(leader) == epoch``; ``mod_revision(pending) ==
        pending_revision``; ``version(cancel) == 0``; ``mod_revision(planned)`` as read.

        Outcomes: APPLIED / STALE (pending is not ``pending_revision``: a late "done" changes
        nothing) / CANCELLED (a cancel exists: cancel wins; finish it with :meth:`finish_cancel`) /
        CORRUPT (pending undecodable) / raises NotLeader, Conflict, StoreUnavailable.
        """
        return await self._on_pending(
            zone, partition, pending_revision, fence, ts, observed, plan_finish
        )

    async def cancel(
        self,
        zone: str,
        partition: int,
        pending_revision: int,
        fence: Fence,
        ts: int,
        *,
        observed: PartitionState | None = None,
    ) -> TransitionResult:
        """Record the intent to cancel the rebalance of pending ``pending_revision``.

        Compares: ``create_revision(leader) == epoch``; ``mod_revision(pending) ==
        pending_revision``; ``mod_revision(cancel)`` as read.

        Outcomes: APPLIED (written, or already there) / STALE (pending is not
        ``pending_revision``) / raises NotLeader, Conflict, StoreUnavailable.
        """
        return await self._on_pending(
            zone, partition, pending_revision, fence, ts, observed, plan_cancel
        )

    async def finish_cancel(
        self,
        zone: str,
        partition: int,
        pending_revision: int,
        fence: Fence,
        ts: int,
        *,
        already_done: bool = False,
        observed: PartitionState | None = None,
    ) -> TransitionResult:
        """The agents answered the cancel of pending ``pending_revision``: stable unchanged (they
        reverted) — or ``stable := pending`` when they answered "already done" —
        ``pending := planned (or delete); delete planned; delete cancel``.

        Compares: ``create_revision(leader) == epoch``; ``mod_revision(pending) ==
        pending_revision``; ``mod_revision(cancel)`` as read (non-zero); ``mod_revision(planned)``
        as read.

        Outcomes: APPLIED / STALE (pending is not ``pending_revision``, or no cancel) / CORRUPT /
        raises NotLeader, Conflict, StoreUnavailable.
        """
        plan = partial(plan_finish_cancel, already_done=already_done)
        return await self._on_pending(zone, partition, pending_revision, fence, ts, observed, plan)

    # -- batches -------------------------------------------------------------------------------

    async def read_partitions(
        self, partitions: Sequence[tuple[str, int]], fence: Fence
    ) -> list[PartitionState]:
        """Each partition's keys, in read-only transactions of at most etcd's op limit (each
        at one revision; raises NotLeader when the fence no longer holds)."""
        states: list[PartitionState] = []
        per_txn = MAX_TXN_OPS - 1  # and the leader key
        for start in range(0, len(partitions), per_txn):
            chunk = partitions[start : start + per_txn]
            result = await self.client.txn(
                (), (*(self._partition_get(z, p) for z, p in chunk), Get(fence.leader_key))
            )
            *found, leader = result.responses
            assert isinstance(leader, Range)
            if not fence.holds(leader.first()):
                raise _fenced(f"fence {fence.leader_key!r}@{fence.epoch} no longer holds")
            for (z, p), got in zip(chunk, found, strict=True):
                assert isinstance(got, Range)
                states.append(self._partition_state(z, p, got, result.revision))
        return states

    async def end_moves(
        self, endings: Sequence[Ending], fence: Fence, ts: int
    ) -> list[TransitionResult | PlacementError]:
        """:meth:`finish` / :meth:`finish_cancel` of many partitions (of any zones), in few
        transactions: one read of them all, then the writing ones packed within etcd's limits,
        each transaction carrying every packed partition's compares (AND-ed) and the fence, and
        deleting each ended partition's move reports (``{p}/progress/{zone}/{partition}/``) with
        its switch. A batch that loses a compare (one partition raced) is redone partition by
        partition. Per ending, in order: the outcome the single transition returns (the state
        after is computed from the write: the keys written are what etcd holds, a trigger key
        recorded meanwhile by another writer is not seen), or the error that one met
        (``StoreUnavailable`` of its batch's transaction, ``Conflict`` of its redo) — one batch
        failing leaves the others' results. Raises NotLeader, and errors of the first read. The
        partitions must be distinct."""
        if len({(e.zone, e.partition) for e in endings}) != len(endings):
            raise InvalidInput("endings", "name a partition twice", "end each move once")
        for e in endings:
            validate_partition(e.partition)
            _check_revision("pending_revision", e.pending_revision)
        states = await self.read_partitions([(e.zone, e.partition) for e in endings], fence)
        results: list[TransitionResult | PlacementError | None] = [None] * len(endings)
        units: list[Unit] = []
        planned: dict[int, tuple[PartitionState, Write, Decision]] = {}
        for i, (ending, state) in enumerate(zip(endings, states, strict=True)):
            decision = plan_ending(self.keys, state, ending, fence.epoch, ts)
            if decision.write is None:
                results[i] = TransitionResult(decision.outcome, state)
                continue
            reports = self.keys.partition_progress_prefix(ending.zone, ending.partition)
            ops = (
                *self._write_ops(ending.zone, ending.partition, decision.write),
                Delete(reports, prefix_range_end(reports)),
            )
            # Unit.partition is only a label here: the index into ``endings``
            units.append(Unit(i, decision.write.compares, ops))
            planned[i] = (state, decision.write, decision)
        redo: list[int] = []
        for batch in pack(units, reserved_compares=1):
            txn = batch_txn(fence, batch, (Get(fence.leader_key),))
            try:
                result = await self.client.txn(txn.compares, txn.success, txn.failure)
                await failpoint("metastore.end-moves-reply-lost")
            except StoreUnavailable as failed:  # applied or not: the caller's retry re-reads
                for unit in batch:
                    results[unit.partition] = failed
                continue
            if result.succeeded:
                for unit in batch:
                    state, write, decision = planned[unit.partition]
                    after = apply_write(state, write, result.revision)
                    results[unit.partition] = TransitionResult(decision.outcome, after)
                continue
            _raise_unless_held(result, fence)
            redo.extend(unit.partition for unit in batch)
        for i in redo:
            e = endings[i]
            try:
                if e.cancelled:
                    one = await self.finish_cancel(
                        e.zone, e.partition, e.pending_revision, fence, ts,
                        already_done=e.already_done,
                    )  # fmt: skip
                else:
                    one = await self.finish(e.zone, e.partition, e.pending_revision, fence, ts)
            except (StoreUnavailable, Conflict) as error:
                results[i] = error
                continue
            results[i] = one
            if one.outcome is Outcome.APPLIED:
                with contextlib.suppress(StoreUnavailable):  # best effort: reports are wake-ups
                    await self.clear_progress(e.zone, e.partition, fence)
        return [r for r in results if r is not None]

    async def create_partitions(
        self,
        zone: str,
        stables: Mapping[int, Peers],
        trigger_revision: int,
        fence: Fence,
        ts: int,
    ) -> CreateResult:
        """Create partitions (stable + trigger keys) in as few transactions as etcd's limits allow.

        Each partition is atomic and create-only: compare ``version == 0`` over the partition's
        whole key range (no key of it exists) and the fence; puts stable and trigger. A batch that
        fails because some partitions exist is resent without them (the failure branch says which).

        Outcomes: ``created`` / ``existing`` partitions; raises NotLeader, StoreUnavailable (some
        batches may have been applied: call again, existing partitions are reported as such).
        """
        _check_revision("trigger_revision", trigger_revision)
        units: list[Unit] = []
        for partition, peers in sorted(stables.items()):
            validate_partition(partition)
            peers = validate_peers(peers, f"stables[{partition}]")
            prefix = self.keys.partition_prefix(zone, partition)
            units.append(
                Unit(
                    partition,
                    (Compare.version(prefix, "==", 0, range_end=prefix_range_end(prefix)),),
                    (
                        Put(
                            self.keys.assign(zone, partition, AssignField.STABLE),
                            encode_assignment(Assignment(peers, fence.epoch, ts, trigger_revision)),
                        ),
                        Put(
                            self.keys.assign(zone, partition, AssignField.TRIGGER),
                            encode_trigger(TriggerMark(trigger_revision, fence.epoch, ts)),
                        ),
                    ),
                )
            )
        created: list[int] = []
        existing: list[int] = []
        stats: list[TxnStats] = []
        for batch in pack(units, reserved_compares=1):
            pending = list(batch)
            while pending:
                span = self._span(zone, pending)
                txn = batch_txn(
                    fence,
                    pending,
                    (Get(fence.leader_key), Get(span.key, span.range_end, keys_only=True)),
                )
                result = await self.client.txn(txn.compares, txn.success, txn.failure)
                stats.append(txn_stats(txn, len(pending), result))
                if result.succeeded:
                    created.extend(u.partition for u in pending)
                    break
                leader, found = result.responses
                assert isinstance(leader, Range)
                assert isinstance(found, Range)
                if not fence.holds(leader.first()):
                    raise _fenced(f"fence {fence.leader_key!r}@{fence.epoch} no longer holds")
                taken = {
                    parsed.partition
                    for kv in found.kvs
                    if (parsed := self.keys.parse(kv.key)) is not None
                }
                lost = [u.partition for u in pending if u.partition in taken]
                if not lost:
                    raise Conflict(f"{zone}: create batch failed with no partition taken")
                existing.extend(lost)
                pending = [u for u in pending if u.partition not in taken]
        return CreateResult(tuple(created), tuple(sorted(existing)), tuple(stats))

    async def apply_triggers(
        self,
        zone: str,
        targets: Mapping[int, Peers],
        trigger_revision: int,
        fence: Fence,
        ts: int,
        *,
        observed: ZoneState | None = None,
    ) -> BatchTriggerResult:
        """:meth:`trigger` for many partitions of a zone, grouped into few transactions.

        Decides every partition on one zone read (or ``observed``); the partitions that write are
        packed into transactions within etcd's limits, each carrying every packed partition's
        trigger compares (AND-ed) and the fence. A batch that fails (one partition raced) falls back
        to :meth:`trigger` per partition of that batch, as do no-op decisions made on ``observed``.
        Results per partition are exactly what :meth:`trigger` would return.
        """
        _check_revision("trigger_revision", trigger_revision)
        checked = {
            validate_partition(p): validate_peers(t, f"targets[{p}]") for p, t in targets.items()
        }
        fresh = observed is None
        zone_state = observed if observed is not None else await self.read_zone(zone)
        if fresh:  # early out for a deposed writer (the txn compares are the real guard)
            leader = await self.client.get(fence.leader_key, revision=zone_state.revision)
            if not fence.holds(leader.first()):
                raise _fenced(f"fence {fence.leader_key!r}@{fence.epoch} no longer holds")
        results: dict[int, TransitionResult] = {}
        redo: list[int] = []
        units: list[Unit] = []
        decisions: dict[int, Decision] = {}
        for p, target in sorted(checked.items()):
            state = zone_state.partition(p)
            decision = decisions[p] = plan_trigger(
                self.keys, state, target, trigger_revision, fence.epoch, ts
            )
            if decision.write is None:
                if fresh:
                    results[p] = TransitionResult(decision.outcome, state, decision.action)
                else:
                    redo.append(p)
                continue
            units.append(Unit(p, decision.write.compares, self._write_ops(zone, p, decision.write)))
        stats: list[TxnStats] = []
        for batch in pack(units, reserved_compares=1, reserved_ops=1):
            span = self._span(zone, batch)
            txn = batch_txn(fence, batch, (Get(fence.leader_key),), read_back=span)
            result = await self.client.txn(txn.compares, txn.success, txn.failure)
            stats.append(txn_stats(txn, len(batch), result))
            if result.succeeded:
                found = result.responses[-1]
                assert isinstance(found, Range)
                after = partition_states(self.keys, zone, found.kvs, result.revision)
                for unit in batch:
                    p = unit.partition
                    results[p] = TransitionResult(
                        decisions[p].outcome,
                        after.get(p, PartitionState(zone, p, result.revision)),
                        decisions[p].action,
                    )
                continue
            _raise_unless_held(result, fence)
            redo.extend(unit.partition for unit in batch)
        for p in sorted(redo):
            results[p] = await self.trigger(zone, p, checked[p], trigger_revision, fence, ts)
        return BatchTriggerResult(MappingProxyType(dict(sorted(results.items()))), tuple(stats))

    # -- zone configs ----------------------------------------------------------------------------

    def _zone_record(
        self, name: str, kv: KeyValue | None, layout: KeyValue | None = None
    ) -> ZoneRecord | None:
        if kv is None:
            return None
        return ZoneRecord(
            name,
            decode_zone_spec(kv.value),
            kv.mod_revision,
            kv.create_revision,
            None if layout is None else decode_layout(layout.value),
            0 if layout is None else layout.mod_revision,
        )

    async def _zone_cas(
        self, name: str, compares: Sequence[Compare], ops: Sequence[Op], fence: Fence
    ) -> ZoneWrite:
        key = self.keys.zone(name)
        result = await self.client.txn(
            (fence.compare(), *compares), ops, (Get(key), Get(fence.leader_key))
        )
        if result.succeeded:
            return ZoneWrite(True, result.revision, None)
        current, leader = result.responses
        assert isinstance(current, Range)
        assert isinstance(leader, Range)
        if not fence.holds(leader.first()):
            raise _fenced(f"fence {fence.leader_key!r}@{fence.epoch} no longer holds")
        return ZoneWrite(False, result.revision, self._zone_record(name, current.first()))

    async def create_zone(self, spec: ZoneSpec, fence: Fence) -> ZoneWrite:
        """Create-only: compares ``version(zone) == 0`` and the fence; else ``current``."""
        key, value = self.keys.zone(spec.name), encode_zone_spec(spec)
        return await self._zone_cas(
            spec.name, (Compare.version(key, "==", 0),), (Put(key, value),), fence
        )

    async def update_zone(
        self,
        spec: ZoneSpec,
        expected_mod_revision: int,
        fence: Fence,
        expected_layout_revision: int | None = None,
    ) -> ZoneWrite:
        """CAS: compares ``mod_revision(zone) == expected_mod_revision`` and the fence, and —
        given ``expected_layout_revision`` — ``mod_revision(layout) == expected_layout_revision``
        (0 = absent): the change was allowed on that layout (design/resharding.md)."""
        _check_revision("expected_mod_revision", expected_mod_revision)
        key, value = self.keys.zone(spec.name), encode_zone_spec(spec)
        compares = [Compare.mod(key, "==", expected_mod_revision)]
        if expected_layout_revision is not None:
            layout = self.keys.layout(spec.name)
            compares.append(Compare.mod(layout, "==", expected_layout_revision))
        return await self._zone_cas(spec.name, compares, (Put(key, value),), fence)

    async def delete_zone(self, name: str, expected_mod_revision: int, fence: Fence) -> ZoneWrite:
        """Delete the zone config, its layout and every assignment key of the zone, in one txn.

        Compares ``mod_revision(zone) == expected_mod_revision`` and the fence.
        """
        _check_revision("expected_mod_revision", expected_mod_revision)
        key = self.keys.zone(name)
        assign = self.keys.zone_assign_prefix(name)
        return await self._zone_cas(
            name,
            (Compare.mod(key, "==", expected_mod_revision),),
            (Delete(key), Delete(self.keys.layout(name)), Delete(assign, prefix_range_end(assign))),
            fence,
        )

    # -- layouts (design/resharding.md) ----------------------------------------------------------

    async def write_layout(
        self,
        zone: str,
        layout: ZoneLayout,
        expected_layout_revision: int,
        expected_zone_revision: int,
        fence: Fence,
        ts: int,
    ) -> int:
        """Write ``layout`` — a transition decided on the zone's config and layout read at
        ``expected_zone_revision`` / ``expected_layout_revision`` (mod revisions, 0 = absent) —
        stamped with the writer's epoch and ``ts``, in one fenced txn comparing both: its
        revision, or 0 when either changed (decide again on a fresh read); NotLeader when the
        fence failed."""
        value = encode_layout(LayoutValue(layout, fence.epoch, ts))
        key = self.keys.layout(zone)
        return await self._fenced_txn(
            fence,
            (
                Compare.mod(key, "==", expected_layout_revision),
                Compare.mod(self.keys.zone(zone), "==", expected_zone_revision),
            ),
            (Put(key, value),),
        )

    async def get_zone(self, name: str) -> ZoneRecord | None:
        """The zone's config and layout, read at one revision."""
        result = await self.client.txn((), (Get(self.keys.zone(name)), Get(self.keys.layout(name))))
        found, layout = result.responses
        assert isinstance(found, Range)
        assert isinstance(layout, Range)
        return self._zone_record(name, found.first(), layout.first())

    async def list_zones(self) -> tuple[int, tuple[ZoneRecord, ...]]:
        """Every zone config with its layout, at one revision: ``(revision, records in name
        order)``."""
        zones, layouts = self.keys.zones_prefix(), self.keys.layout_prefix()
        result = await self.client.txn(
            (), (Get(zones, prefix_range_end(zones)), Get(layouts, prefix_range_end(layouts)))
        )
        found, found_layouts = result.responses
        assert isinstance(found, Range)
        assert isinstance(found_layouts, Range)
        layout_of = {}
        for kv in found_layouts.kvs:
            parsed = self.keys.parse(kv.key)
            if parsed is not None and parsed.kind is KeyKind.LAYOUT:
                layout_of[parsed.name] = kv
        records = []
        for kv in found.kvs:
            parsed = self.keys.parse(kv.key)
            if parsed is not None and parsed.kind is KeyKind.ZONE:
                record = self._zone_record(parsed.name, kv, layout_of.get(parsed.name))
                assert record is not None
                records.append(record)
        return result.revision, tuple(records)

    # -- the driver's other records ---------------------------------------------------------------

    async def _fenced_cas(
        self, fence: Fence, compares: Iterable[Compare], ops: Iterable[Op]
    ) -> bool:
        """One fenced txn; False when a non-fence compare failed, NotLeader when the fence did."""
        return await self._fenced_txn(fence, compares, ops) > 0

    async def _fenced_txn(
        self, fence: Fence, compares: Iterable[Compare], ops: Iterable[Op]
    ) -> int:
        """One fenced txn: its revision, 0 when a non-fence compare failed, NotLeader when the
        fence did."""
        result = await self.client.txn(
            (fence.compare(), *compares), tuple(ops), (Get(fence.leader_key),)
        )
        if result.succeeded:
            return result.revision
        _raise_unless_held(result, fence)
        return 0

    async def write_datanodes(
        self, zone: str, record: DataNodes, expected_mod_revision: int, fence: Fence, ts: int
    ) -> bool:
        """CAS ``{p}/datanodes/{zone}`` from ``expected_mod_revision`` (0 = absent) to ``record``
        stamped with the writer's epoch and ``ts``; False when the compare lost."""
        key = self.keys.datanodes(zone)
        value = encode_datanodes(replace(record, epoch=fence.epoch, ts=ts))
        return await self._fenced_cas(
            fence, (Compare.mod(key, "==", expected_mod_revision),), (Put(key, value),)
        )

    async def write_primaries(
        self, zone: str, leases: Mapping[int, LeaseWrite], fence: Fence, ts: int
    ) -> LeaseWrites:
        """Write primary leases in the transactions of
        :func:`~placement.metastore.transitions.plan_primary_txns`, each fenced; returns how many
        lost a compare (their leases are not written) and the last applied one's revision."""
        raced = 0
        last = 0
        renewals = {self.keys.primary(zone, p) for p, w in leases.items() if not w.moves}
        for compares, puts in plan_primary_txns(self.keys, zone, leases, fence.epoch, ts):
            revision = await self._fenced_txn(fence, compares, puts)
            if revision:
                last = revision
                # renewals and moves never share a transaction
                LEASE_WRITES.labels("capped" if puts[0].key in renewals else "granted").inc(
                    len(puts)
                )
            else:
                raced += 1
        return LeaseWrites(raced, last)

    async def write_terms(
        self, writes: Mapping[str, TermWrite], drops: Mapping[str, int], fence: Fence, ts: int
    ) -> LeaseWrites:
        """Write (and delete) nodes' lease terms in the transactions of
        :func:`~placement.metastore.transitions.plan_term_txns`, each fenced, all at once (no
        two touch one key: a fleet's round is not nine round trips one after another); returns
        how many lost a compare (their terms are not written) and the highest applied one's
        revision."""
        txns = plan_term_txns(self.keys, writes, drops, fence.epoch, ts)
        revisions = await asyncio.gather(*(self._fenced_txn(fence, c, ops) for c, ops in txns))
        for (_, ops), revision in zip(txns, revisions, strict=True):
            if revision:
                LEASE_WRITES.labels("term").inc(sum(1 for op in ops if isinstance(op, Put)))
        return LeaseWrites(sum(1 for r in revisions if not r), max(revisions, default=0))

    async def clear_progress(self, zone: str, partition: int, fence: Fence) -> None:
        """Delete the partition's move reports (fenced; nothing happens when the fence fails)."""
        prefix = self.keys.partition_progress_prefix(zone, partition)
        await self.client.txn((fence.compare(),), (Delete(prefix, prefix_range_end(prefix)),), ())

    async def retire_partitions(
        self, zone: str, partitions: Sequence[int], expected_layout_mod: int, fence: Fence
    ) -> int:
        """Delete partitions the zone's layout no longer keeps (design/resharding.md): their
        assignment, primary lease, ISR, replica-size and reshard-report keys, in fenced txns
        comparing ``mod_revision(layout) == expected_layout_mod``; the last txn's revision, or 0
        when the compare lost (nothing of that txn deleted)."""
        layout = Compare.mod(self.keys.layout(zone), "==", expected_layout_mod)
        sizes = self.keys.sizes_prefix() + validate_name(zone).encode() + b"/"
        ops: list[Op] = []
        for p in partitions:
            assign = self.keys.partition_prefix(zone, p)
            size = sizes + f"{validate_partition(p):05d}/".encode()
            ops += [
                Delete(assign, prefix_range_end(assign)),
                Delete(self.keys.primary(zone, p)),
                Delete(self.keys.isr(zone, p)),
                Delete(size, prefix_range_end(size)),
                Delete(self.keys.reshard_report(zone, p)),
            ]
        revision = 0
        per_txn = MAX_TXN_OPS - 5
        for i in range(0, len(ops), per_txn):
            revision = await self._fenced_txn(fence, (layout,), ops[i : i + per_txn])
            if not revision:
                return 0
        return revision

    async def drop_zone_leftovers(self, zone: str, fence: Fence) -> bool:
        """A dropped zone's data nodes, primary leases, in-sync sets, replica sizes and reshard
        reports, deleted
        in one fenced txn that compares ``version(zone) == 0``; False when the zone exists."""
        prefixes = (
            self.keys.zone_primary_prefix(zone),
            self.keys.zone_isr_prefix(zone),
            self.keys.sizes_prefix() + validate_name(zone).encode() + b"/",
            self.keys.zone_reshard_prefix(zone),
        )
        return await self._fenced_cas(
            fence,
            (Compare.version(self.keys.zone(zone), "==", 0),),
            (
                Delete(self.keys.datanodes(zone)),
                Delete(self.keys.layout(zone)),
                *(Delete(prefix, prefix_range_end(prefix)) for prefix in prefixes),
            ),
        )

    async def set_paused(self, paused: bool, fence: Fence, ts: int) -> None:
        """Put (``paused``) or delete ``{p}/control/paused``, fenced; raises NotLeader."""
        await self._set_mark(self.keys.paused(), paused, fence, ts, "the pause flag")

    async def set_drain(self, node: str, drain: bool, fence: Fence, ts: int) -> None:
        """Put (``drain``) or delete ``{p}/drain/{node}``, fenced; raises NotLeader."""
        await self._set_mark(self.keys.drain(node), drain, fence, ts, "the drain mark")

    async def set_cordon(self, node: str, cordon: bool, fence: Fence, ts: int) -> None:
        """Put (``cordon``) or delete ``{p}/cordon/{node}``, fenced; raises NotLeader."""
        await self._set_mark(self.keys.cordon(node), cordon, fence, ts, "the cordon mark")

    async def _set_mark(self, key: bytes, on: bool, fence: Fence, ts: int, what: str) -> None:
        """An operator's mark: put (``on``, written by epoch at ``ts``) or delete ``key``."""
        op: Put | Delete = (
            Put(key, encode_control(ControlMark(fence.epoch, ts))) if on else Delete(key)
        )
        result = await self.client.txn((fence.compare(),), (op,), ())
        if not result.succeeded:
            raise _fenced(f"lost leadership while writing {what}; retry")

    async def read_assignment_page(
        self, zone: str, first: int, last: int
    ) -> tuple[int, Range, Range, Range]:
        """Partitions ``first..last-1``'s assignment keys, the zone's primary leases and the
        nodes' lease terms, at one revision: ``(revision, assignment keys, primary keys, lease
        terms)``."""
        begin = self.keys.partition_prefix(zone, first)
        end = (
            self.keys.partition_prefix(zone, last)
            if last < MAX_PARTITIONS
            else prefix_range_end(self.keys.zone_assign_prefix(zone))
        )
        primaries = self.keys.zone_primary_prefix(zone)
        terms = self.keys.terms_prefix()
        found = await self.client.txn(
            (),
            (
                Get(begin, end),
                Get(primaries, prefix_range_end(primaries)),
                Get(terms, prefix_range_end(terms)),
            ),
        )
        assign, leases, held = found.responses
        assert isinstance(assign, Range)
        assert isinstance(leases, Range)
        assert isinstance(held, Range)
        return found.revision, assign, leases, held

    # -- nodes -----------------------------------------------------------------------------------

    async def register_node(self, record: NodeRecord, lease: Lease | int) -> int:
        """Register (or refresh) a node under the agent's lease; returns the revision.

        One txn with a nested txn for the OR "the key is ours (same lease) OR absent":
        ``lease(node) == lease`` -> put; else [``version(node) == 0`` -> put; else read]. A key
        held under another lease (another live registration of that name) raises
        :class:`Conflict`; it frees itself when that lease expires. Not fenced: agents own their
        node key, the driver never writes it.
        """
        lease_id = lease.id if isinstance(lease, Lease) else lease
        key, value = self.keys.node(record.name), encode_node(record)
        put = Put(key, value, lease=lease_id)
        result = await self.client.txn(
            (Compare.lease(key, "==", lease_id),),
            (put,),
            (Txn((Compare.version(key, "==", 0),), (put,), (Get(key),)),),
        )
        if result.succeeded:
            return result.revision
        (nested,) = result.responses
        assert isinstance(nested, TxnResult)
        if nested.succeeded:
            return result.revision
        (current,) = nested.responses
        assert isinstance(current, Range)
        holder = current.first()
        raise Conflict(
            f"node {record.name!r} is registered under another lease "
            f"({holder.lease if holder else 0:#x}); retry after it expires"
        )

    async def list_nodes(self) -> tuple[int, tuple[NodeEntry, ...]]:
        """Every registered node at one revision: ``(revision, entries in name order)``."""
        found = await self.client.list_prefix(self.keys.nodes_prefix())
        entries = []
        for kv in found.kvs:
            parsed = self.keys.parse(kv.key)
            if parsed is not None and parsed.kind is KeyKind.NODE:
                entries.append(
                    NodeEntry(parsed.name, decode_node(kv.value), kv.lease, kv.mod_revision)
                )
        return found.revision, tuple(entries)

    async def read_keys(self, keys: Sequence[bytes]) -> list[KeyValue | None]:
        """Each key as etcd has it now (None: absent), in read-only transactions of at most
        etcd's op limit (each at one revision; linearizable)."""
        found: list[KeyValue | None] = []
        for start in range(0, len(keys), MAX_TXN_OPS):
            result = await self.client.txn(
                (), tuple(Get(k) for k in keys[start : start + MAX_TXN_OPS])
            )
            for response in result.responses:
                assert isinstance(response, Range)
                found.append(response.first())
        return found

    async def read_lease_and_isr(
        self, zone: str, partition: int
    ) -> tuple[PrimaryLease | None, int, InSyncSet | None, int]:
        """A partition's primary lease and in-sync set, both at one revision (one read-only
        transaction): ``(lease, its mod revision, ISR, its mod revision)``; a value is None when
        absent or undecodable, a mod revision 0 when absent."""
        lease_key, isr_key = self.keys.primary(zone, partition), self.keys.isr(zone, partition)
        result = await self.client.txn([], [Get(lease_key), Get(isr_key)])
        lease_range, isr_range = result.responses
        assert isinstance(lease_range, Range)
        assert isinstance(isr_range, Range)
        lease_kv, isr_kv = lease_range.first(), isr_range.first()
        lease = decode_primary(lease_kv.value) if lease_kv is not None else None
        isr = decode_isr(isr_kv.value) if isr_kv is not None else None
        return (
            lease if isinstance(lease, PrimaryLease) else None,
            lease_kv.mod_revision if lease_kv is not None else 0,
            isr if isinstance(isr, InSyncSet) else None,
            isr_kv.mod_revision if isr_kv is not None else 0,
        )

    async def write_isr(
        self,
        zone: str,
        partition: int,
        isr: InSyncSet,
        *,
        lease_key_mod: int,
        isr_mod: int,
        assignment_mods: tuple[tuple[AssignField, int], ...] = (),
    ) -> int | None:
        """Put the partition's in-sync set if the primary lease key is still at mod revision
        ``lease_key_mod``, the ISR key at ``isr_mod`` (0 = absent) and each assignment key of
        ``assignment_mods`` at its revision — the primary's fence (design/data-plane.md, "ISR
        changes"). Returns the new revision, None if a compare failed."""
        write = IsrWrite(zone, partition, isr, lease_key_mod, isr_mod, assignment_mods)
        return await self.write_isrs([write])

    async def write_isrs(self, writes: Sequence[IsrWrite]) -> int | None:
        """:meth:`write_isr` for several partitions in one transaction (at most
        :data:`ISR_BATCH`): all are written, or none when any compare failed (None)."""
        if not 0 < len(writes) <= ISR_BATCH:
            raise InvalidInput("writes", f"{len(writes)} in-sync sets", f"write 1..{ISR_BATCH}")
        compares: list[Compare] = []
        puts: list[Put] = []
        for w in writes:
            lease_key, isr_key = (
                self.keys.primary(w.zone, w.partition),
                self.keys.isr(w.zone, w.partition),
            )
            compares += [
                Compare.mod(lease_key, "==", w.lease_key_mod),
                Compare.mod(isr_key, "==", w.isr_mod),
            ]
            compares += [
                Compare.mod(self.keys.assign(w.zone, w.partition, f), "==", mod)
                for f, mod in w.assignment_mods
            ]
            puts.append(Put(isr_key, encode_isr(w.isr)))
        result = await self.client.txn(compares, puts)
        return result.revision if result.succeeded else None

    async def put_owned(self, key: bytes, value: bytes, lease: Lease | int) -> int:
        """Put a key only its writer owns (an agent's move report or replica size) under that
        writer's lease, unconditionally; returns the revision."""
        lease_id = lease.id if isinstance(lease, Lease) else lease
        return await self.client.put(key, value, lease=lease_id)

    async def put_owned_many(self, items: Mapping[bytes, bytes], lease: Lease | int) -> int:
        """:meth:`put_owned` of many keys (an agent's replica sizes), in as few transactions as
        etcd's limits allow (:func:`~placement.metastore.transitions.plan_owned_txns`: at most
        :data:`~placement.metastore.txn.MAX_TXN_OPS` puts each); returns how many it sent. Not
        atomic as a whole: after an error, some of the transactions may have been applied."""
        lease_id = lease.id if isinstance(lease, Lease) else lease
        txns = plan_owned_txns(items, lease_id)
        for puts in txns:
            await self.client.txn((), puts)
        return len(txns)


# -- argument checks ---------------------------------------------------------------------------


def _raise_unless_held(failed: TxnResult, fence: Fence) -> None:
    """A fenced txn whose failure branch read the leader key: NotLeader when that is why."""
    (leader,) = failed.responses
    assert isinstance(leader, Range)
    if not fence.holds(leader.first()):
        raise _fenced(f"fence {fence.leader_key!r}@{fence.epoch} no longer holds")


def _fenced(message: str) -> NotLeader:
    """The error of a write whose fence no longer held (counted: ``placement_etcd_fenced``)."""
    ETCD_FENCED.inc()
    return NotLeader(message)


def _check_revision(name: str, revision: int) -> None:
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 1:
        raise InvalidInput(name, f"{revision!r} is not a revision", "pass an int >= 1")
