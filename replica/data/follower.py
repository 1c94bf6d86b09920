"""The non-primary roles of a partition replica (design/data-plane.md, "Roles per partition").

* **follower** (:func:`answer_appends`): an in-sync set member that is not primary answers the
  primaries' appends of one ``Replicate`` (``DataStore.follow`` each: fence, undo, append,
  commit), all in one group commit.
* **learner** (:class:`Learner`): holds a replica, not in the in-sync set — pulls snapshot pages
  and committed entries from the primary, throttled (:class:`TokenBucket`), until the primary
  adds it to the in-sync set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from placement.aio import ByteBudget
from placement.core.retry import Backoff, Clock, RetryPolicy, Sleep
from placement.errors import PlacementError
from placement.failpoints import failpoint
from placement.logs import set_log_context
from placement.metastore.codec import PrimaryLease
from placement.metrics import CATCH_UP_BYTES
from replica.data.model import (
    AppendCall,
    AppendOutcome,
    AppendReply,
    FetchCall,
    FetchOutcome,
    FetchReply,
    Key,
    PeerUnreachable,
    SendFetch,
)
from replica.data.storage import AppendResult, DataState
from replica.records import NotHosted, StoreThread

log = logging.getLogger(__name__)
W = TypeVar("W")

#: A learner's waits for a primary that is absent, unreachable or not (yet) primary.
LEARNER_RETRY = RetryPolicy(initial=0.2, cap=0.5, floor=0.5)
#: A caught-up learner's poll for new committed entries (not a retry: nothing failed).
IDLE_POLL = 0.05
#: A caught-up learner not (yet) in the in-sync set waits this long before it asks again:
#: ``IDLE_POLL`` at first, doubling while nothing new arrives, woken at once when its
#: partition's lease, in-sync set or assignment changes in the agent's view. A fixed 50 ms poll
#: cost 20 fetches a second per learner the primary would not add (the view lagging, say).
IDLE_WAIT = RetryPolicy(initial=IDLE_POLL, cap=0.5, floor=1.0)

Trim = Callable[[Key, int], Awaitable[None]]

_APPEND_OUTCOMES = {
    AppendResult.OK: AppendOutcome.OK,
    AppendResult.STALE_EPOCH: AppendOutcome.STALE_EPOCH,
    AppendResult.MISMATCH: AppendOutcome.MISMATCH,
    AppendResult.AHEAD: AppendOutcome.AHEAD,
}


def unproven(call: AppendCall, sender: str, lease: PrimaryLease | None) -> AppendReply | None:
    """Why a follower must not apply ``call`` from node ``sender`` (None: it may), given the
    partition's primary lease in its view of etcd (design/data-plane.md, "Who may append"):
    the append must come from the node it names, and that node must hold the lease at the
    call's epoch — an epoch number alone is no proof (before, any caller could send an append
    with a higher epoch, which fenced out the real primary).

    * ``sender`` is not the call's primary, or the lease names another node at that epoch →
      UNPROVEN;
    * no lease in the view, or one at a lower epoch → UNPROVEN: the view may lag a lease just
      granted, so the primary retries (the plane waits a moment for its view first);
    * a lease at a higher epoch → STALE_EPOCH: etcd has a newer primary; the sender is
      deposed."""
    if sender != call.primary:
        return AppendReply(AppendOutcome.UNPROVEN)
    if lease is None or lease.lease_epoch < call.lease_epoch:
        return AppendReply(AppendOutcome.UNPROVEN)
    if lease.lease_epoch > call.lease_epoch:
        return AppendReply(AppendOutcome.STALE_EPOCH, lease_epoch=lease.lease_epoch)
    if lease.node != call.primary:
        return AppendReply(AppendOutcome.UNPROVEN)
    return None


def view_lags(
    calls: Sequence[AppendCall], sender: str, lease_of: Callable[[AppendCall], PrimaryLease | None]
) -> bool:
    """Whether a follower should wait for its view of etcd before answering ``calls``: there
    are some, and for every one the view shows no lease, or an older one, than the call claims
    for its own sender (a lease just granted, the watch behind). One proven or plainly refused
    append is answered at once, so proven appends of other partitions are never held back; an
    empty call (the pair's heartbeat) never waits."""

    def lags(call: AppendCall) -> bool:
        lease = lease_of(call)
        return sender == call.primary and (lease is None or lease.lease_epoch < call.lease_epoch)

    return bool(calls) and all(lags(c) for c in calls)


async def answer_appends(
    db: StoreThread, calls: Sequence[AppendCall], trim: Trim
) -> list[AppendReply]:
    """A follower's answers to one ``Replicate`` of the primaries on another node: every append
    in one group commit (one fsync), in order; NOT_HOSTED without a replica record. An append
    whose part failed (a storage error) is answered MISMATCH with nothing known, so its primary
    retries it (and drops this node after ``isr_timeout`` if it keeps failing)."""
    if not calls:  # the pair's heartbeat: nothing to store
        return []
    store = db.store
    outcomes = await db.group_each(
        store.hosted,
        [
            (store.data.follow, c.zone, c.partition, c.lease_epoch, c.prev_index,
             c.prev_epoch, list(c.entries), c.commit_index, c.tail)
            for c in calls
        ],
    )  # fmt: skip
    replies: list[AppendReply] = []
    for call, outcome in zip(calls, outcomes, strict=True):
        if isinstance(outcome, NotHosted):
            replies.append(AppendReply(AppendOutcome.NOT_HOSTED))
            continue
        if isinstance(outcome, BaseException):
            log.warning("append to %s/%s failed: %s", call.zone, call.partition, outcome)
            replies.append(AppendReply(AppendOutcome.MISMATCH, 0))
            continue
        result, state = outcome
        if call.entries and result is AppendResult.OK:
            await trim((call.zone, call.partition), len(call.entries))
        replies.append(
            AppendReply(
                _APPEND_OUTCOMES[result], state.last_index, state.last_epoch, state.seen_epoch
            )
        )
    return replies


#: Snapshot pages of one agent's pullers (learners and re-sharding copies) in flight at once,
#: counted in full pages (``page_bytes`` each): the bytes the agent may pull beyond its rate.
FETCH_TURNS = 4
#: A learner's first snapshot page asks for at most this many bytes, the next ones twice as many
#: as the one before, up to ``DataConfig.fetch_bytes`` (a slow start): the pages in flight are
#: bounded in bytes, so a node joining with hundreds of empty or small replicas fetches their
#: first pages a few hundred at once instead of ``FETCH_TURNS`` at once (600 learners waited
#: up to 3 s for a turn), and a large replica reaches full pages after a few round trips.
FIRST_PAGE_BYTES = 16 << 10


class TokenBucket:
    """An agent's catch-up throttle: bytes per second with a one-second burst (``rate <= 0`` =
    unlimited), shared by every puller of the agent (learners, re-sharding copies).

    A puller takes a :meth:`turn` around each fetch and, inside it, has the bytes it got
    charged (:meth:`charge`). A turn starts only once the bucket is out of debt, and snapshot
    pages of at most ``turns`` × ``page_bytes`` bytes (what they ask for) are fetched at once,
    so however many pullers there are, the agent moves at most that many bytes beyond the rate.
    Charging after the fetch alone let every puller fetch its first page at once: a reshard's
    80 copy streams per agent pulled the whole 50 MB in the first 4 s (writes fell to a few per
    second), then sat out the debt for 15 s. A log tail (``page=False``: the entries written
    since, small once caught up) only waits out the debt: queued behind 80 polls for 4 turns,
    a copy's tail fetch took 1–2 s, and the cut-over waited for it. Counting pages instead of
    bytes let a node joining with 600 empty replicas fetch 4 first pages at a time: up to 3 s
    before the last one started (the learners now start small, ``FIRST_PAGE_BYTES``)."""

    def __init__(
        self,
        rate: float,
        clock: Clock = time.monotonic,
        turns: int = FETCH_TURNS,
        page_bytes: int = 1 << 20,
    ) -> None:
        self.rate = rate
        self._clock = clock
        self._tokens = rate
        self._last = clock()
        self.page_bytes = page_bytes
        self._window = ByteBudget(turns * page_bytes)

    def charge(self, amount: int) -> float:
        """Take ``amount`` now; returns how long the bucket is in debt after it."""
        if self.rate <= 0:
            return 0.0
        self._refill()
        self._tokens -= amount
        return self.debt()

    def debt(self) -> float:
        """Seconds until the bucket is out of debt (0.0: it is not)."""
        if self.rate <= 0:
            return 0.0
        self._refill()
        # Less than a byte owed is no debt: float rounding must not keep a turn waiting.
        return -self._tokens / self.rate if self._tokens < -1.0 else 0.0

    @contextlib.asynccontextmanager
    async def turn(
        self,
        pause: Callable[[float], Awaitable[object]] = asyncio.sleep,
        hurry: Callable[[], bool] = lambda: False,
        *,
        page: bool = True,
        size: int | None = None,
    ) -> AsyncIterator[None]:
        """One fetch's turn (see the class docstring): a snapshot ``page`` of at most ``size``
        bytes (None: ``page_bytes``) waits until that many are free in the window; then any
        fetch waits out the debt with ``pause``. ``hurry()`` true = unthrottled: no turn, no
        wait (a sealed copy; ``pause`` may return early so a waiting turn notices)."""
        if self.rate <= 0 or hurry():
            yield
            return
        held = self.page_bytes if size is None else size
        async with self._window.hold(held) if page else contextlib.nullcontext():
            while not hurry() and (delay := self.debt()) > 0:
                await pause(delay)
            yield

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.rate, self._tokens + (now - self._last) * self.rate)
        self._last = now


@dataclass(frozen=True, slots=True)
class LearnerDeps:
    """What a learner uses from its agent (built once by the data plane)."""

    node: str
    db: StoreThread
    fetch_bytes: int
    send_fetch: SendFetch
    #: The agent's catch-up throttle, shared by all its learners.
    bucket: TokenBucket
    #: The partition's lease holder and its address from the agent's view (None = no lease).
    primary_of: Callable[[Key], tuple[str, str] | None]
    #: True once this node is in the partition's in-sync set, or the agent is closing.
    done: Callable[[Key], bool]
    #: Waits between tries while there is no primary to pull from or it does not answer.
    retry: RetryPolicy = field(default_factory=lambda: LEARNER_RETRY)
    sleep: Sleep = asyncio.sleep
    #: A caught-up learner's wait: until the partition changes in the agent's view (its lease,
    #: in-sync set or assignment), at most the given seconds.
    idle: Callable[[Key, float], Awaitable[None]] = lambda key, at_most: asyncio.sleep(at_most)


class Learner:
    """Pulls one partition from its primary until this node is in the in-sync set."""

    def __init__(self, deps: LearnerDeps, key: Key) -> None:
        self._deps = deps
        self._db = deps.db
        self._data = deps.db.store.data
        self.key = key

    async def run(self) -> None:
        """Pull until in sync; on an unexpected error log it and end (the roles pass restarts
        it)."""
        set_log_context(zone=self.key[0], partition=self.key[1])
        try:
            await self._pull()
        except NotHosted as e:  # retired or discarded meanwhile: nothing to copy into
            log.info("learner of %s/%s stopped: %s", *self.key, e)
        except (PlacementError, ValueError) as e:
            log.warning("learner of %s/%s stopped, restarting: %s", *self.key, e)
            await asyncio.sleep(0.5)

    async def _write(self, fn: Callable[..., W], *args: object) -> W:
        """One of this learner's writes to its replica (a part of a group commit), refused once
        the replica is no longer hosted (``NotHosted``)."""
        result: W = await self._db.group(self._db.store.hosted, fn, *self.key, *args)
        return result

    def _load(
        self, zone: str, partition: int, reply: FetchReply, expect: DataState | None
    ) -> DataState:
        """A snapshot page's writes, one part of a group commit (three group commits in a row
        were three rounds of the store thread per page): the snapshot's start when ``expect``
        is given (the state it must still find), the page, and the fence once it is loaded."""
        data = self._data
        if expect is not None:
            data.begin_snapshot(zone, partition, reply.snapshot_index, reply.snapshot_epoch, expect)
        state = data.load_page(zone, partition, list(reply.items), reply.snapshot_done)
        if reply.lease_epoch > state.seen_epoch and not state.loading_snapshot:
            state = data.raise_fence(zone, partition, reply.lease_epoch)
        return state

    async def _durable(self) -> DataState:
        """The replica's state as it is on disk (``NotHosted`` once its record is gone); created
        empty when a catch-up has not created it yet."""
        state: DataState | None = await self._db.call(
            self._db.store.hosted, self._data.state, *self.key
        )
        if state is None:
            state = await self._write(self._data.ensure)
        return state

    async def _pull(self) -> None:
        """Nothing is undone when the learner starts, nor on its own: entries past the commit
        index (written lazily) may be acknowledged ones — this node may be an in-sync member
        its view of etcd does not show yet — so it asks for what follows its commit index, the
        last entry it knows is the primary's too, and applies the answer by the followers' rule
        (``DataStore.learn``), which undoes only entries the primary does not hold. Until
        2026-12-01 a learner undid its log down to its commit index when it started: the chaos
        campaign caught an in-sync node doing so, then taking the lease — acknowledged writes
        lost (design/data-plane.md, "Learners")."""
        zone, partition = self.key
        deps = self._deps
        state = await self._durable()
        fresh = state.last_index == 0 and not state.loading_snapshot
        backoff = Backoff(deps.retry)
        idle = Backoff(IDLE_WAIT)
        page_bytes = min(FIRST_PAGE_BYTES, deps.fetch_bytes)  # doubles per full page
        while not deps.done(self.key):
            primary = deps.primary_of(self.key)
            if primary is None or primary[0] == deps.node or not primary[1]:
                await deps.sleep(backoff.next())
                continue
            address = primary[1]
            # The replica as it is on disk, read before every fetch: a position remembered from
            # an earlier answer no longer holds once the replica was retired and created again
            # under this task (or appended to as an in-sync member), and a fetch after the
            # primary's last index makes the primary add this node to the in-sync set.
            durable = await self._durable()
            if _position(durable) != _position(state):
                log.info(
                    "learner of %s/%s: the replica changed under it (%s -> %s); starting over",
                    *self.key, _position(state), _position(durable),
                )  # fmt: skip
                return
            state = durable
            snapshot = fresh or state.loading_snapshot
            call = FetchCall(
                zone,
                partition,
                deps.node,
                snapshot=snapshot,
                snapshot_after=(state.snap_after or b"") if snapshot else b"",
                after_index=0 if snapshot else state.commit_index,
                max_bytes=page_bytes if snapshot else deps.fetch_bytes,
            )
            try:
                async with deps.bucket.turn(deps.sleep, page=snapshot, size=call.max_bytes):
                    reply = await deps.send_fetch(address, call, 10)
                    deps.bucket.charge(reply.size)
                    CATCH_UP_BYTES.inc(reply.size)
            except PeerUnreachable as e:
                log.debug("fetch %s from %s: %s", self.key, address, e)
                await deps.sleep(backoff.next())
                continue
            if reply.outcome is FetchOutcome.NOT_PRIMARY:
                await deps.sleep(backoff.next())
                continue
            backoff.reset()
            if reply.outcome is FetchOutcome.SNAPSHOT_NEEDED:
                fresh = True
                continue
            if snapshot:
                # nobody else touched the replica since ``state`` (see begin_snapshot)
                state = await self._write(self._load, reply, state if fresh else None)
                await failpoint("agent.mid-catch-up")
                fresh = False
                page_bytes = min(page_bytes * 2, deps.fetch_bytes)
                continue
            result, state = await self._write(
                self._data.learn,
                reply.lease_epoch,
                call.after_index,
                list(reply.entries),
                reply.commit_index,
            )
            if result is AppendResult.STALE_EPOCH:  # a deposed primary answered: ask again
                await deps.sleep(backoff.next())
                continue
            if result is AppendResult.MISMATCH:
                # The primary's log differs at an entry this replica holds as committed: it
                # cannot be matched entry by entry. A snapshot starts it over (``begin_snapshot``
                # refuses once a primary appended to it: it is an in-sync member then).
                log.warning("learner of %s/%s: the primary's log differs below the commit"
                            " index %d; starting over from a snapshot", *self.key,
                            call.after_index)  # fmt: skip
                fresh = True
                continue
            if reply.entries:
                idle.reset()
            elif not deps.done(self.key):  # no await since the check: no change is missed
                await deps.idle(self.key, idle.next())


def _position(state: DataState) -> tuple[int, int, int, int, bytes | None]:
    """Where a replica's log stands (its base, last entry and snapshot cursor): what only a
    learner's own writes change while it runs, unless the replica is replaced or appended to."""
    return (state.base_index, state.base_epoch, state.last_index, state.last_epoch,
            state.snap_after)  # fmt: skip
