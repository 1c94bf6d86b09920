"""The replica agent's I/O shell: ``ReplicaAgent`` (async, domain; its gRPC edge is
:mod:`replica.servicer`).

``ReplicaAgent`` runs each decision of ``replica.protocol`` under a per-partition lock:
load → decide → stop superseded catch-ups → persist (one transaction) → start catch-ups → answer.
Persisting before answering means an answer the driver saw survives any crash of the agent.
Concurrent duplicates queue on the lock, so they see the first one's record and cause no effect.

Store calls run on one dedicated thread, in submission order. That FIFO order is what makes
``StopCatchUp`` safe: a store write a cancelled catch-up already submitted runs before the
decision that discards its replica.

A failed commit leaves memory and disk possibly disagreeing, so the agent fail-stops
(``on_fatal``); a restart rebuilds everything from the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

from placement.aio import cancel_and_wait
from placement.errors import PlacementError
from placement.failpoints import failpoint
from placement.logs import set_log_context
from placement.metastore.codec import MoveReport
from replica.protocol import (
    CancelOutcome,
    Decision,
    Effect,
    MoveRequest,
    PartitionRecord,
    Phase,
    RebalanceOutcome,
    RetireOutcome,
    RetireRequest,
    StartCatchUp,
    StopCatchUp,
    on_cancel,
    on_move_finished,
    on_rebalance,
    on_retire,
    resume_effects,
    validate_partition_key,
    validate_request,
    validate_retire,
)
from replica.records import StoreThread

log = logging.getLogger(__name__)

OutcomeT = TypeVar("OutcomeT")
Key = tuple[str, int]

#: Brings this node's replica of ``job.partition`` up to date from ``job.sources``, writing
#: through the store it is given. Must be idempotent and resumable (it is restarted after a
#: crash) and must stop when cancelled. Returning = caught up; raising = the move FAILED.
CatchUp = Callable[[StartCatchUp, "StoreThread"], Awaitable[None]]

#: Pushes a move report (zone, partition, report) to the driver — with ``--etcd``, a put of
#: ``{p}/progress/{zone}/{partition}/{node}`` under the registration lease. Best effort.
Reporter = Callable[[str, int, MoveReport], Awaitable[None]]


#: How long a decision waits for the in-sync set from etcd before taking the safe answer.
ISR_READ_TIMEOUT = 1.0


class UnknownPartition(PlacementError):
    """This agent holds no record of the partition."""


async def record_catch_up(job: StartCatchUp, db: StoreThread) -> None:
    """The catch-up of an agent without a data plane (no ``--etcd``): there is no partition data,
    so catching up is creating the durable (partial) replica record. With a data plane the
    catch-up is ``DataPlane.catch_up`` (a snapshot + log-tail copy; design/data-plane.md)."""
    await db.group(db.store.begin_replica, job.zone, job.partition)


class ReplicaAgent:
    """One node's replicas: decisions serialised per partition, persisted before answering."""

    def __init__(
        self,
        node: str,
        db: StoreThread,
        *,
        catch_up: CatchUp | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
        reporter: Reporter | None = None,
        isr_names_me: Callable[[str, int], Awaitable[bool | None]] | None = None,
        pause_learner: Callable[[str, int], AbstractAsyncContextManager[None]] | None = None,
    ) -> None:
        self.node = node
        #: Whether a partition's in-sync set names this node as etcd has it now (None: it has
        #: none yet); without a data plane every replica counts as current and none as in a set.
        self._isr_names_me = isr_names_me
        #: Stops the partition's learner and keeps it stopped while the context lasts: a retire
        #: reads the in-sync set and discards the replica inside it, so this node's own join
        #: cannot start in between (design/data-plane.md, "A learner's join").
        self._pause_learner = pause_learner
        #: Set (also after construction, once registered) to push move reports; None = poll only.
        self.reporter = reporter
        self._db = db
        self._catch_up: CatchUp = catch_up if catch_up is not None else record_catch_up
        self._on_fatal = on_fatal
        self._locks: dict[Key, asyncio.Lock] = {}
        #: Each partition's record as last loaded or committed (this process is the store's only
        #: writer, and only under the partition's lock): a resend is answered without a store
        #: call — during a node's join the driver resends every move's Rebalance to every member.
        #: Complete once :meth:`start` loaded them all (a partition absent has no record).
        self._records: dict[Key, PartitionRecord | None] = {}
        self._all_records = False
        self._tasks: dict[Key, tuple[int, asyncio.Task[None]]] = {}
        self._inflight: set[asyncio.Task[object]] = set()
        self._closed = False

    async def start(self) -> None:
        """Restart the catch-ups of moves that were in progress when the agent last stopped."""
        for record in await self._db.call(self._db.store.records):
            self._records[(record.zone, record.partition)] = record
            self._start_catch_ups(resume_effects(record, self.node))
        self._all_records = True

    async def close(self) -> None:
        """Stop background catch-ups (they resume on restart) and close the store."""
        self._closed = True
        tasks = [task for _, task in self._tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*self._inflight, return_exceptions=True)
        await self._db.close()

    async def rebalance(self, request: MoveRequest) -> Decision[RebalanceOutcome]:
        validate_request(request, self.node)
        set_log_context(
            zone=request.zone,
            partition=request.partition,
            revision=request.revision,
            epoch=request.epoch,
        )
        # Unknown (etcd unreachable): not in sync, so a hosted replica catches up first.
        return await self._decide(
            request.key,
            lambda rec, named: on_rebalance(rec, request, self.node, named is not False),
            named_if_unknown=False,
        )

    async def cancel(self, request: MoveRequest) -> Decision[CancelOutcome]:
        validate_request(request, self.node)
        set_log_context(
            zone=request.zone,
            partition=request.partition,
            revision=request.revision,
            epoch=request.epoch,
        )
        return await self._decide(
            request.key, lambda rec, _named: on_cancel(rec, request, self.node)
        )

    async def retire(self, request: RetireRequest) -> Decision[RetireOutcome]:
        """Drop this node's replica if stable (and every move it knows) no longer names it."""
        validate_retire(request)
        set_log_context(
            zone=request.zone,
            partition=request.partition,
            revision=request.revision,
            epoch=request.epoch,
        )
        # Unknown (etcd unreachable): in sync, so nothing is deleted until etcd answers.
        return await self._decide(
            request.key,
            lambda rec, named: on_retire(rec, request, self.node, named is True),
            named_if_unknown=True,
            pause_learner=True,
        )

    async def _named(self, key: Key, if_unknown: bool) -> bool | None:
        """Whether the in-sync set of ``key`` names this node (None: no set yet, or no plane),
        read from etcd inside the decision, under the partition's lock — not from the agent's
        watched view, which may lag: a move answered DONE or a retire refused on a stale view
        would leave a replica out of sync or delete an in-sync one (design/replica-protocol.md).
        ``if_unknown``: the answer when etcd cannot be read, the safe one for the decision."""
        if self._isr_names_me is None:
            return None
        try:
            # well inside the driver's call deadline, so the safe answer still reaches it
            async with asyncio.timeout(ISR_READ_TIMEOUT):
                return await self._isr_names_me(*key)
        except (PlacementError, TimeoutError) as e:
            log.warning("in-sync set of %s/%s unknown (%s); deciding as if %s", *key, e,
                        "in it" if if_unknown else "out of it")  # fmt: skip
            return if_unknown

    async def state(self, zone: str, partition: int) -> PartitionRecord:
        validate_partition_key(zone, partition)
        record = await self._db.call(self._db.store.load, zone, partition)
        if record is None:
            raise UnknownPartition(f"no record of partition {zone}/{partition} on this node")
        return record

    async def hosted(self) -> list[Key]:
        """Every partition this node holds a complete replica of (the driver's sweep)."""
        records = await self._db.call(self._db.store.records)
        return [(r.zone, r.partition) for r in records if r.hosted]

    async def _decide(
        self,
        key: Key,
        decide: Callable[[PartitionRecord | None, bool | None], Decision[OutcomeT]],
        *,
        named_if_unknown: bool | None = None,
        pause_learner: bool = False,
    ) -> Decision[OutcomeT]:
        """Run one decision to its end even if the caller goes away (an RPC cancelled by its
        deadline must not leave a committed move without its catch-up task). ``decide`` gets
        the record and, when ``named_if_unknown`` is not None and the record is hosted, whether
        the in-sync set names this node (:meth:`_named`, read only when the decision depends on
        it; else None). ``pause_learner``: the partition's learner is stopped before that read
        and stays stopped until the decision is committed (a retire's)."""
        if self._closed:
            raise PlacementError("agent is shutting down")
        task = asyncio.create_task(self._decide_now(key, decide, named_if_unknown, pause_learner))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return await asyncio.shield(task)

    async def _decide_now(
        self,
        key: Key,
        decide: Callable[[PartitionRecord | None, bool | None], Decision[OutcomeT]],
        named_if_unknown: bool | None,
        pause_learner: bool,
    ) -> Decision[OutcomeT]:
        async with self._locks.setdefault(key, asyncio.Lock()), contextlib.AsyncExitStack() as held:
            if key in self._records or self._all_records:
                before = self._records.get(key)
            else:
                before = self._records[key] = await self._db.call(self._db.store.load, *key)
            if named_if_unknown is not None and before is not None and before.hosted:
                # Only a hosted replica's decisions may depend on it, and only some of them (a
                # new revision, not the repeat a resend gets): decide both ways (pure), and read
                # etcd only when the answers differ — so a resend never costs an etcd read.
                decision = decide(before, True)
                if decision != decide(before, False):
                    if pause_learner and self._pause_learner is not None:
                        await held.enter_async_context(self._pause_learner(*key))
                    decision = decide(before, await self._named(key, named_if_unknown))
            else:
                decision = decide(before, None)
            if decision.record == before and not decision.effects:
                return decision
            await self._stop_catch_ups(decision.effects)
            self._records.pop(key, None)  # unknown until the commit has returned
            try:
                await self._db.group(self._db.store.commit, decision.record, decision.effects)
            except Exception as e:
                self._all_records = False  # memory and disk may disagree: read the store again
                log.critical("cannot persist %s/%s: %s; stopping the agent", *key, e)
                if self._on_fatal is not None:
                    self._on_fatal(e)
                raise
            await failpoint("agent.after-decision")
            self._records[key] = decision.record
            self._start_catch_ups(decision.effects)
            return decision

    async def _stop_catch_ups(self, effects: tuple[Effect, ...]) -> None:
        for effect in effects:
            if not isinstance(effect, StopCatchUp):
                continue
            key = (effect.zone, effect.partition)
            running = self._tasks.get(key)
            if running is None or running[0] != effect.revision:
                continue
            del self._tasks[key]
            await cancel_and_wait(running[1])

    def _start_catch_ups(self, effects: tuple[Effect, ...]) -> None:
        for effect in effects:
            if isinstance(effect, StartCatchUp) and not self._closed:
                key = (effect.zone, effect.partition)
                task = asyncio.create_task(self._run_catch_up(effect), name=f"catch-up {key}")
                self._tasks[key] = (effect.revision, task)

    async def _run_catch_up(self, job: StartCatchUp) -> None:
        key = (job.zone, job.partition)
        try:
            try:
                await self._catch_up(job, self._db)
                succeeded = True
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("catch-up of %s/%s at revision %d failed", *key, job.revision)
                succeeded = False
            decision = await self._decide(
                key,
                lambda rec, _named: on_move_finished(
                    _existing(rec), job.revision, succeeded=succeeded
                ),
            )
            await self._report(job, decision.record)
        except PlacementError as e:
            log.warning("catch-up of %s/%s at revision %d not recorded: %s", *key, job.revision, e)
        finally:
            running = self._tasks.get(key)
            if running is not None and running[1] is asyncio.current_task():
                del self._tasks[key]

    async def _report(self, job: StartCatchUp, record: PartitionRecord) -> None:
        """After the end of a catch-up is committed: push DONE/FAILED (best effort)."""
        reporter, move = self.reporter, record.move
        if reporter is None or move is None or move.revision != job.revision:
            return
        if move.phase not in (Phase.DONE, Phase.FAILED):
            return
        if move.old == move.new:
            # An adopt (old = new = stable): the driver resends it until DONE, so a report
            # would tell it nothing, and a zone creation's adopts would write one per replica
            # (design/control-plane.md, "Retire and adopt").
            return
        report = MoveReport(
            job.revision,
            record.accepted_epoch,
            move.phase.name,
            f"catch-up of revision {job.revision} {move.phase.value}",
            int(time.time() * 1000),
        )
        try:
            await reporter(job.zone, job.partition, report)
        except Exception as e:  # best effort: the driver's resends find the outcome anyway
            log.warning(
                "report of %s/%s at revision %d failed: %s",
                job.zone,
                job.partition,
                job.revision,
                e,
            )


def _existing(record: PartitionRecord | None) -> PartitionRecord:
    if record is None:
        raise UnknownPartition("partition record vanished")  # records are never deleted
    return record
