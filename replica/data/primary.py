"""One partition's primary at one lease epoch (design/data-plane.md, "Writes" and "ISR changes").

On start it fences its replica at its lease epoch, makes sure an in-sync set (ISR) exists and holds
this node, and brings every member to its log (reconcile). Then one replication task group-commits
queued writes: appends them to its own log (a group commit shared with the agent's other
partitions), sends ``Append`` to every other member (over the pair stream to each node),
acknowledges after all of them persisted. A member that stops answering leaves the ISR (never
below the zone's minimum); a learner that fetched up to the last entry joins it.

**Hibernation** (design/data-plane.md): idle, a primary sends nothing. After a burst of writes it
sends one commit notice (so followers learn the commit index), then sleeps until a write, a read
that needs a commit, or a :meth:`Primary.poke` from its agent (a member's node left, its pair link
went down, the partition's assignment changed) — and once right after its reconcile: then
members that are gone leave the ISR (fenced by the assignment revisions they were judged by).

Everything it needs from its agent comes through :class:`PrimaryDeps`; the wire is behind
``PrimaryDeps.send_append``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import NoReturn, Protocol, TypeVar

from placement.aio import Pulse, wait_event
from placement.data.partitioning import SEAL_KEY, key_moves, selected
from placement.failpoints import failpoint
from placement.logs import log_context, set_log_context
from placement.metastore.codec import InSyncSet, PrimaryLease
from placement.metastore.keys import AssignField
from placement.metrics import ISR_CHANGES, LACKING_PRIMARIES
from replica.data.control import Seal
from replica.data.model import (
    AppendCall,
    AppendOutcome,
    AppendReply,
    Deposed,
    FetchCall,
    FetchOutcome,
    FetchReply,
    Key,
    NotPrimary,
    PeerUnreachable,
    Sealed,
    SendAppend,
    Unavailable,
)
from replica.data.storage import DataState, Entry
from replica.records import NotHosted, StoreThread

#: How soon a client refused by a seal should retry: the seal's pause is the time for the
#: destinations to copy what is left and the leader to flip (design/resharding.md, SEAL).
SEALED_RETRY_MS = 20
#: Pause before re-sending an append a member could not prove (its view lags our lease).
UNPROVEN_RETRY = 0.05
#: The longest a selected fetch waits for this source's seal write to commit.
SEAL_FETCH_WAIT = 2.0
#: A learner whose fetch is answered with everything up to the last entry, at most JOIN_GAP
#: entries behind it, gets a join hold: new batches wait up to JOIN_HOLD seconds for its next
#: fetch, which then asks for what follows the last entry and joins. At most one hold per
#: learner every JOIN_HOLD_EVERY seconds.
JOIN_GAP = 4096
JOIN_HOLD = 0.25
JOIN_HOLD_EVERY = 1.0

log = logging.getLogger(__name__)

#: Why a member cannot be brought up to date by appends (it needs a snapshot).
NEEDS_SNAPSHOT = "it needs a snapshot"
#: Why a member refused an append: it holds a committed entry this primary's log lacks.
HOLDS_MORE = "it holds committed entries this primary lacks"

T = TypeVar("T")

#: Fresh from etcd at one revision: (lease, its mod revision, ISR, its mod revision); 0 = absent.
LeaseAndIsr = tuple[PrimaryLease | None, int, InSyncSet | None, int]


#: (assignment field, mod revision; 0 = absent) pairs an ISR write compares.
AssignmentMods = tuple[tuple[AssignField, int], ...]


class WriteIsr(Protocol):
    def __call__(
        self,
        key: Key,
        lease_epoch: int,
        members: frozenset[str],
        isr_revision: int,
        assignment_mods: AssignmentMods = (),
    ) -> Awaitable[int]: ...


@dataclass(frozen=True, slots=True)
class PrimaryDeps:
    """What a primary uses from its agent (built once by the data plane)."""

    node: str
    db: StoreThread
    isr_timeout: float
    heartbeat: float
    batch_max: int
    fetch_bytes: int
    send_append: SendAppend
    #: A node's address from the agent's view of etcd ("" = unknown).
    address_of: Callable[[str], str]
    #: This node holds lease ``epoch`` of the partition by its own clock (with a margin).
    lease_ok: Callable[[Key, int], bool]
    #: ``NODE@ADDRESS`` of the partition's primary as far as the agent knows ("" = none).
    primary_hint: Callable[[Key], str]
    #: The zone's effective minimum in-sync set size.
    min_in_sync: Callable[[str], int]
    read_lease_and_isr: Callable[[Key], Awaitable[LeaseAndIsr]]
    #: Writes the ISR members if this node still holds the lease epoch, the ISR is still at
    #: the given revision and (a join) the assignment keys at theirs; returns the new
    #: revision; raises Deposed or Unavailable.
    write_isr: WriteIsr
    #: Counts entries appended to a partition and trims its log now and then.
    trim: Callable[[Key, int], Awaitable[None]]
    #: Why an ISR member of the partition should leave the ISR now ("" = it should not): its
    #: node is not registered, its pair link is down, or the assignment no longer names it.
    member_gone: Callable[[Key, str], str] = lambda key, member: ""
    #: The nodes stable and pending name for the partition (None = unknown).
    holders: Callable[[Key], frozenset[str] | None] = lambda key: None
    #: Why an ISR member will not come back — its node is not registered and the partition's
    #: pending assignment (the move that replaces it) does not name it — so it may leave the ISR
    #: even below the minimum ("" = it may come back: it stays, and writes wait for it).
    replaced: Callable[[Key, str], str] = lambda key, member: ""
    #: The mod revisions of the partition's stable and pending keys as the agent's view has
    #: them — what ``member_gone`` judged a learner by; its join's ISR write compares them.
    assignment_revisions: Callable[[Key], AssignmentMods] = lambda key: ()


@dataclass
class _Write:
    key: bytes
    value: bytes | None
    future: asyncio.Future[tuple[int, int, bool]]


class Primary:
    """See the module docstring."""

    def __init__(self, deps: PrimaryDeps, key: Key, lease_epoch: int) -> None:
        self._deps = deps
        self._db = deps.db
        self._data = deps.db.store.data
        self.key = key
        self.zone, self.partition = key
        self.lease_epoch = lease_epoch
        self.ready = asyncio.Event()
        self.finished = False
        self.members: dict[str, int] = {}
        self.isr_revision = 0
        self.state = DataState()
        self._queue: list[_Write] = []
        self._inflight: list[_Write] = []
        #: Writes ever queued; every one is in ``_inflight`` or ``_queue`` until it has left
        #: for good (committed or refused), in the order queued (:meth:`settled`).
        self._queued = 0
        #: Fired whenever writes leave, and when this primary finishes: :meth:`settled` waits.
        self._left = Pulse()
        self._wake = asyncio.Event()
        self._probe_due = False
        #: The commit index every member was last told (behind ``state.commit_index`` after a
        #: batch, until the next append or the commit notice carries it).
        self._told_commit = 0
        self._lock = asyncio.Lock()
        self._recent: list[Entry] = []
        #: This partition's seal for a re-sharding cut-over (design/resharding.md): once set,
        #: client writes to the keys it moves are refused. Loaded from the replica at start;
        #: set when the seal is queued, so every write queued after it is refused.
        self.seal: Seal | None = None
        #: The seal as last written through the log (and committed): what ``seal_for`` and
        #: ``unseal`` compare with, so a write that failed is written again.
        self._seal_written: Seal | None = None
        #: Fired whenever ``_seal_written`` changes, and when this primary finishes: draining
        #: fetches wait on it.
        self._seal_moved = Pulse()
        #: A learner about to join: (its node, until when new batches wait for its next fetch),
        #: the event its join sets, and when each learner may get a hold again.
        self._join_hold: tuple[str, float] | None = None
        self._joined = asyncio.Event()
        self._next_hold: dict[str, float] = {}
        self._task = asyncio.create_task(self._run(), name=f"primary {key}@{lease_epoch}")

    def _not_primary(self) -> NotPrimary:
        return NotPrimary(self.zone, self.partition, self._deps.primary_hint(self.key))

    async def stop(self, why: str) -> None:
        if not self.finished:
            log.info("primary %s/%s@%d stops: %s", self.zone, self.partition, self.lease_epoch, why)
        self._finish()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task

    def _finish(self, *, fail_writes: bool = True) -> None:
        """This primary is done, and every waiter wakes to see it — a :meth:`settled` waiter
        returns, a draining fetch held for the seal is answered NotPrimary. The one way
        ``finished`` becomes True. ``fail_writes``: every write not acknowledged yet (queued, or
        in a batch that was cut short) fails with NotPrimary — not while a batch may still be
        appended (a read's ``committed()`` found this primary deposed: the replication task
        ends it, and fails its writes then)."""
        self.finished = True
        if fail_writes:
            queue, self._queue = self._inflight + self._queue, []
            self._inflight = []
            error = self._not_primary()
            for write in queue:
                if not write.future.done():
                    write.future.set_exception(error)
        self._left.fire()
        self._seal_moved.fire()

    def poke(self) -> None:
        """Wake a hibernating primary to look at its members (see the module docstring)."""
        self._probe_due = True
        self._wake.set()

    async def submit(self, key: bytes, value: bytes | None) -> tuple[int, int, bool]:
        """A client's write; refused (Unavailable) when this partition is sealed and the key
        is one its re-sharding moves."""
        await self._until_ready()  # the seal is loaded from the replica by the reconcile
        seal = self.seal
        if seal is not None and key_moves(key, seal.source, seal.target) is not None:
            raise Sealed(
                f"{self.zone}/{self.partition} is sealed for a re-sharding cut-over"
                f" ({seal.source} → {seal.target} partitions); retry shortly",
                SEALED_RETRY_MS,
            )
        (result,) = await self.write_many([(key, value)])
        return result

    async def write_many(
        self, writes: Sequence[tuple[bytes, bytes | None]]
    ) -> list[tuple[int, int, bool]]:
        """Queue ``writes`` (put, or delete for None) in order, unchecked — the agent's own
        (re-sharding's copies, cursors, seal and purge); returns once all are acknowledged."""
        if self.finished:
            raise self._not_primary()
        loop = asyncio.get_running_loop()
        futures = []
        for key, value in writes:
            future: asyncio.Future[tuple[int, int, bool]] = loop.create_future()
            self._queue.append(_Write(key, value, future))
            futures.append(future)
        self._queued += len(writes)
        self._wake.set()
        return list(await asyncio.gather(*futures))

    async def settled(self) -> None:
        """Return once every write queued before this call has left the queue for good —
        committed, or refused — or this primary has finished. A write whose caller stopped
        waiting (a cancelled copy step) is still written with its batch, so a scan of the
        replica after this sees every write queued before it that will ever commit: an aborted
        re-sharding's purge scans only then, and a copy cancelled by the abort cannot commit
        a key behind the purge's scan (design/resharding.md, ABORT)."""
        target = self._queued
        while not self.finished and self._queued - len(self._queue) - len(self._inflight) < target:
            await self._left.round.wait()

    async def seal_for(self, seal: Seal) -> None:
        """Write ``seal`` through the log (once per attempt; again if that write failed);
        client writes to the keys it moves are refused from now on."""
        if self._seal_written == seal:
            return
        self.seal = seal
        try:
            await self.write_many([(SEAL_KEY, seal.encode())])
            self._seal_written = seal
        finally:
            self._seal_moved.fire()
        log.info(
            "%s/%s@%d: sealed for reshard %d (%d -> %d partitions)",
            self.zone,
            self.partition,
            self.lease_epoch,
            seal.attempt,
            seal.source,
            seal.target,
        )

    async def _until_sealed(self, attempt: int) -> None:
        """Wait, at most ``SEAL_FETCH_WAIT``, until this source's seal for ``attempt`` is
        committed — also while its view has not reached SEAL and nothing is being written yet."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SEAL_FETCH_WAIT
        while not self.finished:
            written = self._seal_written
            left = deadline - loop.time()
            if (written is not None and written.attempt >= attempt) or left <= 0:
                return
            await wait_event(self._seal_moved.round, left)

    @property
    def seal_written(self) -> Seal | None:
        return self._seal_written

    def forget_seal(self) -> None:
        """The seal key was deleted through the log (a purge): nothing is sealed any more."""
        self.seal = self._seal_written = None
        self._seal_moved.fire()

    async def unseal(self) -> None:
        """Drop a seal whose attempt ended (aborted, or finished and purged elsewhere)."""
        self.seal = None
        if self._seal_written is None:
            return
        await self.write_many([(SEAL_KEY, None)])
        self._seal_written = None
        self._seal_moved.fire()

    @contextlib.asynccontextmanager
    async def committed(self) -> AsyncIterator[None]:
        """Hold the replication lock with every applied entry committed (reads, snapshots)."""
        await self._until_ready()
        async with self._lock:
            if self.state.commit_index < self.state.last_index:
                try:
                    await self._replicate(self.state.last_index)
                except Deposed:
                    self._finish(fail_writes=False)
                    raise NotPrimary(self.zone, self.partition, "") from None
            yield

    async def _until_ready(self) -> None:
        """Wait (bounded) until the reconcile is done; Unavailable if it takes too long,
        NotPrimary once this primary has ended without finishing it."""
        if self.ready.is_set():
            return
        if self.finished:
            raise self._not_primary()
        if not await wait_event(self.ready, self._deps.isr_timeout * 2):
            raise Unavailable(f"{self.zone}/{self.partition}: the primary is still reconciling")

    # -- the replication task ------------------------------------------------------------------

    async def _run(self) -> None:
        set_log_context(zone=self.zone, partition=self.partition, epoch=self.lease_epoch)
        try:
            await self._reconcile()
            self.ready.set()
            # A new primary looks at its members once: the assignment change that named one
            # gone may have reached this agent before its lease did, and pokes only the primary
            # of its moment — the member would otherwise stay in the ISR until the next change.
            self._probe_due = True
            self._wake.set()
            while not self.finished:
                # Hibernate: no timer at all, unless followers still have to learn a commit.
                behind = self._told_commit < self.state.commit_index
                notice = self._deps.heartbeat if behind else None
                if not await wait_event(self._wake, notice):
                    await self._commit_notice()
                    continue
                self._wake.clear()
                if self._probe_due:
                    self._probe_due = False
                    await self._probe()
                while self._queue:
                    await self._wait_for_join()
                    batch = self._queue[: self._deps.batch_max]
                    del self._queue[: len(batch)]
                    self._inflight = batch
                    await self._commit_batch(batch)
                    self._inflight = []
                    self._left.fire()
        except Deposed as e:
            log.info("primary %s/%s@%d deposed: %s", self.zone, self.partition, self.lease_epoch, e)
        except NotHosted as e:  # discarded under it (a retire, an aborted re-sharding)
            log.info("primary %s/%s@%d stops: %s", self.zone, self.partition, self.lease_epoch, e)
        except Unavailable as e:  # expected (members away, below the minimum): retried next tick
            log.warning("primary %s/%s@%d: %s", self.zone, self.partition, self.lease_epoch, e)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("primary %s/%s@%d failed", self.zone, self.partition, self.lease_epoch)
        finally:
            self._finish()

    async def _write(self, fn: Callable[..., T], *args: object) -> T:
        """One of this primary's writes to its replica (a part of a group commit), refused
        (NotHosted) once the replica's record is gone: a discard never races a write that
        would recreate its state."""
        result: T = await self._db.group(
            self._db.store.hosted, fn, self.zone, self.partition, *args
        )
        return result

    async def _reconcile(self) -> None:
        """Fence, make sure an ISR exists and holds this node, bring every member to this log."""
        node = self._deps.node
        self.state = await self._write(self._data.raise_fence, self.lease_epoch)
        sealed = await self._db.call(self._data.get, self.zone, self.partition, SEAL_KEY)
        self.seal = self._seal_written = Seal.decode(sealed) if sealed is not None else None
        self._seal_moved.fire()
        lease, _rev, isr, isr_rev = await self._deps.read_lease_and_isr(self.key)
        if lease is None or lease.node != node or lease.lease_epoch != self.lease_epoch:
            raise Deposed("the lease is not this node's")
        if isr is None:
            members = frozenset({node} | await self._bootstrap_peers())
            isr_rev = await self._deps.write_isr(self.key, self.lease_epoch, members, 0)
            isr = InSyncSet(tuple(sorted(members)), node, self.lease_epoch, 0)
        if node not in isr.members:
            raise Deposed("this node is not in the in-sync set")
        self.isr_revision = isr_rev
        self.members = {m: self.state.last_index for m in isr.members if m != node}
        async with self._lock:
            # Below the minimum only once every member that failed was dropped for good: the
            # reconcile ends, learners can copy from this primary, and writes stay refused until
            # the ISR grows back (a departed member would otherwise block the partition forever).
            await self._replicate(self.state.last_index, below_minimum=True)

    async def _bootstrap_peers(self) -> set[str]:
        """A brand-new partition (no ISR key: no write was ever acknowledged) whose log is empty:
        the replicas of stable and pending that answer an empty append at this lease epoch with
        an empty log of their own (so they are fenced at it and hold everything there is) join
        the first ISR with this node — one ISR write instead of one per replica."""
        holders = self._deps.holders(self.key)
        if self.state.last_index != 0 or not holders:
            return set()
        node = self._deps.node
        probe = AppendCall(self.zone, self.partition, self.lease_epoch, node, 0, 0, (), 0)

        async def empty(member: str) -> bool:
            address = self._deps.address_of(member)
            if not address:
                return False
            deadline = time.monotonic() + self._deps.isr_timeout
            reply = await self._send(member, address, probe, deadline)
            if isinstance(reply, str):
                return False
            if reply.outcome is AppendOutcome.STALE_EPOCH:
                raise Deposed(f"{member} has seen lease epoch {reply.lease_epoch}")
            return reply.outcome is AppendOutcome.OK and reply.last_index == 0

        others = sorted(holders - {self._deps.node})
        answers = await asyncio.gather(*(empty(m) for m in others))
        return {m for m, ok in zip(others, answers, strict=True) if ok}

    def _below_minimum(self) -> Unavailable | None:
        minimum = self._deps.min_in_sync(self.zone)
        if len(self.members) + 1 >= minimum:
            return None
        return Unavailable(
            f"{self.zone}/{self.partition}: in-sync set {len(self.members) + 1} is below"
            f" the zone's minimum {minimum}; writes are refused until replicas catch up"
        )

    async def _commit_batch(self, batch: list[_Write]) -> None:
        async with self._lock:
            self._check_lease()
            error = self._below_minimum()
            if error is not None:
                # Everything queued behind the batch fails with it: a later write must never
                # commit after an earlier one was refused unlogged — one write_many split across
                # batches (a copy's keys, then its cursor) would commit the cursor without the
                # keys it covers.
                queued, self._queue = self._queue, []
                for write in batch + queued:
                    if not write.future.done():
                        write.future.set_exception(error)
                return
            index, epoch = self.state.last_index, self.lease_epoch
            entries = [
                Entry(index + i, epoch, w.key, w.value or b"", w.value is None)
                for i, w in enumerate(batch, 1)
            ]
            self.state, existed = await self._write(
                self._data.append_writes, entries, self.state.commit_index
            )
            await failpoint("primary.after-append")
            self._remember(entries)
            try:
                await self._replicate(self.state.last_index)
            except (Unavailable, Deposed) as e:
                failure = (
                    e if isinstance(e, Unavailable) else NotPrimary(self.zone, self.partition, "")
                )
                for write in batch:
                    if not write.future.done():
                        write.future.set_exception(failure)
                if isinstance(e, Deposed):
                    raise
                return
            for write, entry, had in zip(batch, entries, existed, strict=True):
                if not write.future.done():
                    write.future.set_result((entry.index, epoch, had))
            await self._deps.trim(self.key, len(entries))

    async def _commit_notice(self) -> None:
        """After a burst of writes: tell every member the commit index (an empty append) and
        make this replica's own commit index durable; then the partition hibernates."""
        async with self._lock:
            try:
                await self._replicate(self.state.last_index)
            except Unavailable as e:
                log.debug("commit notice of %s/%s: %s", self.zone, self.partition, e)
                self._told_commit = self.state.commit_index  # the next write carries it
            self.state = await self._write(self._data.set_commit, self.state.commit_index)

    async def _probe(self) -> None:
        """Poked: members that are gone (see ``PrimaryDeps.member_gone``) leave the ISR, unless
        that would take it below the zone's minimum (then writes wait for them or fail)."""
        async with self._lock:
            self._check_lease()
            judged_by = self._deps.assignment_revisions(self.key)
            gone = {m: why for m in self.members if (why := self._deps.member_gone(self.key, m))}
            if not gone:
                return
            keep = frozenset(self.members) - gone.keys() | {self._deps.node}
            minimum = self._deps.min_in_sync(self.zone)
            if len(keep) < minimum:
                if not await self._drop_hopeless(gone, minimum):
                    log.info(
                        "%s/%s: members gone (%s) but the in-sync set may not shrink below %d",
                        self.zone,
                        self.partition,
                        _reasons(gone),
                        minimum,
                    )
                return
            try:
                # Fenced by the assignment it was judged by, as a join is: the agent watches
                # leases and assignments apart, so a new primary's view may not show yet the
                # pending that names a member which just joined. The change that moved the
                # assignment on pokes this primary again.
                await self._set_isr(keep, assignment_mods=judged_by)
            except Unavailable as e:
                log.info("%s/%s: members kept: %s", self.zone, self.partition, e)
                return
            log.warning(
                "%s/%s: removed from the in-sync set: %s", self.zone, self.partition, _reasons(gone)
            )

    async def _set_isr(
        self,
        members: frozenset[str],
        joined: dict[str, int] | None = None,
        assignment_mods: AssignmentMods = (),
    ) -> None:
        """Record the ISR ``members`` in etcd, then make ``self.members`` (every other member,
        with its match index; ``joined`` gives the new ones') agree with it; a join's write
        compares the ``assignment_mods`` it was judged by. Shielded: a fetch
        cancelled by its learner must never leave etcd and memory disagreeing — an ISR member
        the primary does not replicate to would break every acknowledgement's promise."""

        before = frozenset(self.members) | {self._deps.node}

        async def write() -> None:
            self.isr_revision = await self._deps.write_isr(
                self.key, self.lease_epoch, members, self.isr_revision, assignment_mods
            )
            log.info("%s/%s: in-sync set is now %s", self.zone, self.partition, sorted(members))
            change = "shrink" if members < before else "expand" if members > before else "other"
            ISR_CHANGES.labels(change).inc()
            joined_now = joined or {}
            self.members = {
                m: self.members.get(m, joined_now.get(m, 0))
                for m in sorted(members)
                if m != self._deps.node
            }

        with log_context(zone=self.zone, partition=self.partition, epoch=self.lease_epoch):
            task = asyncio.ensure_future(write())  # its lines carry the partition, whoever called
        task.add_done_callback(self._isr_write_done)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            # The caller holds the replication lock (a learner's join runs under committed()),
            # and it keeps it until the write has ended and ``self.members`` agrees with etcd:
            # released at the cancellation, a batch could commit without the learner while
            # the write naming it landed — an in-sync member missing a committed entry, which
            # a lease moved to it then would lose or, as the members refuse its log, leave
            # the partition without writes for good (an etcd chaos test's learner's fetch hit
            # its deadline under a slow ISR write and did exactly that).
            while not task.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(task)
            raise

    def _isr_write_done(self, task: asyncio.Future[None]) -> None:
        """A shielded ISR write that ended after its caller stopped waiting (the primary was
        stopped): its outcome is logged here, never left unretrieved."""
        if task.cancelled():
            return
        error = task.exception()
        if error is not None and self.finished:
            log.info("%s/%s: late in-sync set write: %s", self.zone, self.partition, error)

    def _check_lease(self) -> None:
        if not self._deps.lease_ok(self.key, self.lease_epoch):
            raise Deposed("the lease expired or moved")

    def _remember(self, entries: list[Entry]) -> None:
        self._recent.extend(entries)
        if len(self._recent) > 4096:
            del self._recent[:-2048]

    async def _replicate(self, upto: int, *, below_minimum: bool = False) -> None:
        """Bring every member to ``upto``; drop those that fail (never below the minimum, but
        for members that cannot come back: :meth:`_drop_hopeless`); then commit ``upto``.
        Raises Unavailable (nothing committed) or Deposed. ``below_minimum`` (the reconcile,
        which acknowledges nothing): commit even below the minimum once every member that failed
        was dropped for good."""
        self._check_lease()
        names = list(self.members)
        told = self.state.commit_index  # what this round's appends carry
        results = await asyncio.gather(*(self._sync(m, upto) for m in names))
        failed = {m: why for m, why in zip(names, results, strict=True) if why}
        if ahead := {m: why for m, why in failed.items() if why.startswith(HOLDS_MORE)}:
            await self._step_down(ahead)
        if failed:
            keep = frozenset(self.members) - failed.keys() | {self._deps.node}
            minimum = self._deps.min_in_sync(self.zone)
            if len(keep) < minimum:
                dropped = await self._drop_hopeless(failed, minimum)
                if not below_minimum or dropped != failed.keys():
                    raise Unavailable(
                        f"{self.zone}/{self.partition}: members out of sync ({_reasons(failed)})"
                        f" and the in-sync set may not shrink below {minimum}; write refused"
                    )
            else:
                await self._set_isr(keep)
                log.warning(
                    "%s/%s: removed from the in-sync set: %s",
                    self.zone,
                    self.partition,
                    _reasons(failed),
                )
        # In memory only: the next append (or the commit notice) makes it durable. A commit index
        # that lags on disk is safe: a replica undoes only entries that differ from, or run past,
        # what the current primary holds — never acknowledged ones — and nothing merely because
        # a new epoch began (design/data-plane.md, "A new primary").
        if upto > self.state.commit_index:
            self.state = replace(self.state, commit_index=upto)
        self._told_commit = told

    async def _step_down(self, ahead: dict[str, str]) -> NoReturn:
        """Members answered AHEAD: this node's replica lacks entries they know are committed
        (a replica lost and re-created empty while the ISR still named its node). It must never
        serve: it writes the ISR of only the members that answered AHEAD — they kept their whole
        log, so they hold every acknowledged write; one that accepted this primary's appends may
        have undone entries acknowledged above its commit index, and one that did not answer
        may still get them — and ends. The driver moves the lease to one of them once this
        one's term has passed, and the other nodes' learners copy the partition back
        (design/data-plane.md, "A primary that lacks committed entries")."""
        log.error(
            "%s/%s: this replica lacks committed entries (%s); it leaves the in-sync set",
            self.zone,
            self.partition,
            _reasons(ahead),
        )
        LACKING_PRIMARIES.inc()
        await self._set_isr(frozenset(ahead))
        raise Deposed(f"this replica lacks committed entries ({_reasons(ahead)})")

    async def _drop_hopeless(self, failed: dict[str, str], minimum: int) -> set[str]:
        """Members no append can bring back leave the in-sync set even below the minimum —
        kept, they would block the partition for good — and returns them:

        * a member whose log ends below this primary's, which starts at a snapshot point (it
          caught up from a snapshot, and their log differs from it at its last entry, so they
          answered with their commit index, which lags on disk): as a learner it copies a
          snapshot and rejoins;
        * a member that is replaced (``PrimaryDeps.replaced``): its node is not registered and
          the move under way does not name it — it left, and the replica replacing it can copy
          from this primary only once it serves.

        Nothing acknowledged is lost (this primary holds it all); writes wait below the minimum
        (design/data-plane.md)."""
        hopeless = {
            m: why
            for m, why in failed.items()
            # a log end of 0 may be a follower's storage error, not its log: not hopeless
            if why.startswith(NEEDS_SNAPSHOT) and self.members.get(m, 0) > 0
        }
        for m in failed.keys() - hopeless.keys():
            if gone_for_good := self._deps.replaced(self.key, m):
                hopeless[m] = gone_for_good
        if not hopeless:
            return set()
        await self._set_isr(frozenset(self.members) - hopeless.keys() | {self._deps.node})
        log.warning(
            "%s/%s: removed from the in-sync set below its minimum %d: %s",
            self.zone,
            self.partition,
            minimum,
            _reasons(hopeless),
        )
        return set(hopeless)

    async def _sync(self, member: str, upto: int) -> str:
        """Send ``member`` what it lacks up to ``upto``; returns "" once it holds ``upto``, else
        why not (the member is to leave the ISR)."""
        address = self._deps.address_of(member)
        if not address:
            return "its node is not registered"
        deadline = time.monotonic() + self._deps.isr_timeout
        for _ in range(8):
            after = self.members.get(member, 0)
            if after < self.state.base_index:
                return f"{NEEDS_SNAPSHOT} (its log ends at {after})"
            prev_epoch, entries = await self._entries(after, upto)
            if prev_epoch is None:  # trimmed on disk under a stale base: a guess would be
                return f"{NEEDS_SNAPSHOT} (its log ends at {after})"  # taken for a conflict
            call = AppendCall(
                zone=self.zone,
                partition=self.partition,
                lease_epoch=self.lease_epoch,
                primary=self._deps.node,
                prev_index=after,
                prev_epoch=prev_epoch,
                entries=tuple(entries),
                commit_index=self.state.commit_index,
                tail=after + len(entries) == self.state.last_index,
            )
            # A primary paused past its lease sends nothing when it wakes.
            reply = await self._send(member, address, call, deadline, self._check_lease)
            if isinstance(reply, str):
                return reply
            if reply.outcome is AppendOutcome.STALE_EPOCH:
                raise Deposed(f"{member} has seen lease epoch {reply.lease_epoch}")
            if reply.outcome is AppendOutcome.NOT_HOSTED:
                return "it does not host the partition"
            if reply.outcome is AppendOutcome.AHEAD:
                return (
                    f"{HOLDS_MORE} (its commit index is {reply.last_index}, this log ends at"
                    f" {self.state.last_index})"
                )
            if reply.outcome is AppendOutcome.OK:
                # A member's log may run past ours (an older primary's uncommitted suffix): a
                # ``tail`` append has it undone; it matches ours up to what we sent.
                self.members[member] = min(reply.last_index, self.state.last_index)
                if reply.last_index >= upto:
                    return ""
                continue
            self.members[member] = min(reply.last_index, self.state.last_index)
        return f"its log still differs after 8 appends (it ends at {self.members.get(member)})"

    async def _send(
        self,
        member: str,
        address: str,
        call: AppendCall,
        deadline: float,
        check: Callable[[], None] = lambda: None,
    ) -> AppendReply | str:
        """Send ``call`` to ``member`` (``check()`` first, each time); while it answers UNPROVEN
        — its view of etcd does not show this node's lease yet — again every
        ``UNPROVEN_RETRY`` until ``deadline``. The reply, or why there is none."""
        while True:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                return "no answer in time"
            check()
            try:
                reply = await self._deps.send_append(member, address, call, timeout)
            except PeerUnreachable as e:
                return f"append failed: {e}"
            if reply.outcome is not AppendOutcome.UNPROVEN:
                return reply
            if time.monotonic() + UNPROVEN_RETRY >= deadline:
                return "its view of etcd does not show this node's lease"
            await asyncio.sleep(UNPROVEN_RETRY)

    async def _entries(self, after: int, upto: int) -> tuple[int | None, list[Entry]]:
        """The epoch at ``after`` (None: no longer in the log, trimmed since ``state`` was read)
        and the entries ``(after, upto]`` (bounded in count and bytes): from the entries this
        primary wrote recently, else from its log."""
        recent = self._recent
        if recent and recent[0].index <= after and recent[-1].index >= upto:
            start = after - recent[0].index
            return recent[start].epoch, recent[start + 1 : start + 1 + min(upto - after, 2000)]
        epoch = await self._db.call(
            self._data.epoch_at, self.zone, self.partition, after, self.state
        )
        entries = await self._db.call(
            self._data.entries, self.zone, self.partition, after, upto, self._deps.fetch_bytes
        )
        return epoch, entries

    # -- learners ------------------------------------------------------------------------------

    async def fetch(self, call: FetchCall) -> FetchReply:
        """Serve a learner: a snapshot page, or committed entries. A learner joins the ISR when
        it asks for what follows the last entry — its log already holds every entry — never on
        the answer that carries them: the learner has not written those yet, and may never
        (its task ends when it sees itself in the ISR), and an ISR member missing committed
        entries is a lost write waiting for the other members to fail. A selected fetch
        (re-sharding's copy, design/resharding.md) gets only the selected keys and never
        joins."""
        max_bytes = call.max_bytes or self._deps.fetch_bytes
        if call.select is not None and not call.snapshot:
            if call.seal_attempt:
                # A destination draining at the cut-over: answer once the seal is committed —
                # the answer then carries the seal and the destination is drained in one round
                # trip. Also before this source has seen SEAL: polling every 50 ms until it had,
                # 16 destinations x 16 sources made the fetches that slowed the seals' writes.
                # (A destination from before seal_attempt polls so until drained.)
                await self._until_sealed(call.seal_attempt)
            return await self._selected_entries(call.after_index, call.select, max_bytes)
        async with self.committed():
            if call.snapshot:
                return await self._snapshot_page(call.snapshot_after, max_bytes, call.select)
            if call.after_index < self.state.base_index:
                return FetchReply(FetchOutcome.SNAPSHOT_NEEDED)
            entries = await self._db.call(
                self._data.entries,
                self.zone,
                self.partition,
                call.after_index,
                self.state.commit_index,
                max_bytes,
            )
            # The assignment's revisions as judged now (no await in between): the join lands
            # only while etcd's is still the one that names the learner. A retire is sent once
            # stable no longer names a node, and the agent reads the ISR before it discards the
            # replica: a join judged before that switch, in flight meanwhile, would name a
            # replica that is gone (design/data-plane.md, "A learner's join").
            judged_by = self._deps.assignment_revisions(self.key)
            if (
                call.after_index == self.state.last_index
                and call.node not in self.members
                and call.node != self._deps.node
                and not self._deps.member_gone(self.key, call.node)  # e.g. a leaving replica
            ):
                members = frozenset(self.members) | {self._deps.node, call.node}
                await self._set_isr(members, {call.node: call.after_index}, judged_by)
                if self._join_hold is not None and self._join_hold[0] == call.node:
                    self._join_hold = None
                    self._joined.set()
            elif entries and entries[-1].index == self.state.last_index:
                self._hold_for_join(call)
            return FetchReply(
                FetchOutcome.OK,
                entries=tuple(entries),
                commit_index=self.state.commit_index,
                lease_epoch=self.lease_epoch,
            )

    def _hold_for_join(self, call: FetchCall) -> None:
        """A learner just got everything up to the last entry: hold new batches until its next
        fetch (at most ``JOIN_HOLD``), so that fetch asks for what follows the last entry and
        joins. Under a steady stream of writes a learner otherwise never found the log at rest:
        each answer carried the entries committed while it applied the one before, and a chaos
        test's learner joined only when its writers stopped, a minute later."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if (
            call.node in self.members
            or call.node == self._deps.node
            or self.state.last_index - call.after_index > JOIN_GAP
            or now < self._next_hold.get(call.node, 0.0)
            or self._deps.member_gone(self.key, call.node)
        ):
            return
        # Only learners whose next hold is still ahead are kept: the map stays as small as the
        # learners fetching in the last JOIN_HOLD_EVERY, over a primary that lives for months.
        self._next_hold = {n: t for n, t in self._next_hold.items() if t > now}
        self._next_hold[call.node] = now + JOIN_HOLD_EVERY
        self._join_hold = (call.node, now + JOIN_HOLD)
        self._joined = asyncio.Event()

    async def _wait_for_join(self) -> None:
        """Before a batch: wait out a learner's join hold (see ``_hold_for_join``)."""
        hold = self._join_hold
        if hold is None:
            return
        left = hold[1] - asyncio.get_running_loop().time()
        if left > 0:
            await wait_event(self._joined, left)
        if self._join_hold is hold:
            self._join_hold = None

    async def _read(self, fn: Callable[..., T], *args: object) -> T:
        """A read of this primary's replica for a fetch; NotPrimary once the replica's record is
        gone (discarded under it): an empty page from a dropped replica would look like a
        source with no keys, and a copy would record it as done."""
        try:
            result: T = await self._db.call(
                self._db.store.hosted, fn, self.zone, self.partition, *args
            )
        except NotHosted:
            raise self._not_primary() from None
        return result

    async def _selected_entries(
        self, after: int, select: tuple[int, int], max_bytes: int
    ) -> FetchReply:
        """A re-sharding copy's entries after ``after`` whose keys ``select`` takes: committed
        ones only, read without the replication lock — nothing joins the in-sync set, committed
        entries never change, and the base check and the read are one store call, so a trim
        between them cannot leave a gap. Under the lock, 16 destinations' fetches queued
        behind each other and every batch of client writes: the cut-over's drain waited on
        that queue."""
        if self.finished:
            raise self._not_primary()
        commit = self.state.commit_index
        found = await self._read(self._data.committed_entries, after, commit, max_bytes)
        if found is None:
            return FetchReply(FetchOutcome.SNAPSHOT_NEEDED)
        return FetchReply(
            FetchOutcome.OK,
            entries=tuple(e for e in found if selected(e.key, select)),
            commit_index=commit,
            lease_epoch=self.lease_epoch,
            scanned_to=found[-1].index if found else after,
        )

    def _page_and_epoch(
        self,
        zone: str,
        partition: int,
        after: bytes,
        max_bytes: int,
        select: tuple[int, int] | None,
        state: DataState,
    ) -> tuple[tuple[list[tuple[bytes, bytes]], bool, bytes], int | None]:
        """A snapshot page and the epoch at the commit index, in one store call (on the store
        thread; two calls were two waits behind the group commits of a busy agent)."""
        page = self._data.snapshot_page(zone, partition, after, max_bytes, select)
        return page, self._data.epoch_at(zone, partition, state.commit_index, state)

    async def _snapshot_page(
        self, after: bytes, max_bytes: int, select: tuple[int, int] | None = None
    ) -> FetchReply:
        (items, done, scanned), epoch = await self._read(
            self._page_and_epoch, after, max_bytes, select, self.state
        )
        return FetchReply(
            FetchOutcome.OK,
            items=tuple(items),
            snapshot_done=done,
            snapshot_index=self.state.commit_index,
            snapshot_epoch=epoch or 0,
            commit_index=self.state.commit_index,
            lease_epoch=self.lease_epoch,
            scanned_after=scanned,
        )


def _reasons(why: dict[str, str]) -> str:
    return "; ".join(f"{m}: {reason}" for m, reason in sorted(why.items()))
