"""An agent's part in re-sharding (design/resharding.md): the copy, the seal, the purge, reports.

For every zone whose layout (the agent's view) carries a reshard, and every partition this agent
leads (:class:`~replica.data.primary.Primary`), :class:`Resharding` runs what the phase asks:

* COPY and SEAL, on a destination: a :class:`Puller` copies from every source's primary the
  keys that route to the destination under the target count — a selected snapshot, then the
  selected log tail — writing them, with a :class:`~replica.data.control.Cursor` per source,
  through the destination's own log (so its in-sync set holds them, and a new primary resumes);
* SEAL, on a source: the seal, written through the source's log (``Primary.seal_for``);
* CLEANUP and ABORT, everywhere: the purge — every stored key that does not route to the
  partition under the layout in force is deleted through the partition's log (a source's moved
  keys and seal, a destination's cursors, an aborted shrink's copies);
* a :class:`~placement.metastore.codec.ReshardReport` per partition it leads, under the agent's
  registration lease, which the leader reads to advance the phases.

The source's seal makes "drained" a fact: a destination whose cursor passed a source's seal holds
every write that source will ever take for its keys.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from functools import partial

from placement.aio import wait_event
from placement.core.layout import SEAL_LAG, Reshard, ReshardPhase
from placement.core.retry import Backoff, RetryPolicy
from placement.data.partitioning import SEAL_KEY, routes_to
from placement.errors import PlacementError
from placement.metastore.codec import ReshardReport, encode_reshard_report
from replica.data.control import Cursor, Seal, cursor_key
from replica.data.follower import IDLE_POLL, TokenBucket
from replica.data.model import (
    FetchCall,
    FetchOutcome,
    FetchReply,
    Key,
    NotPrimary,
    PeerUnreachable,
    SendFetch,
    Unavailable,
)
from replica.data.primary import Primary
from replica.records import StoreThread

log = logging.getLogger(__name__)

#: Writes one copy or purge step queues at most (one batch of the destination's primary).
STEP_WRITES = 512
#: Seconds between two puts of a report whose facts did not change (progress only).
PROGRESS_EVERY = 2.0
#: A copy that is caught up polls its source this often during COPY (it only has to stay
#: within ``SEAL_LAG``); during SEAL every ``IDLE_POLL`` until drained, then not at all.
COPY_POLL = 1.0
#: A cursor that moved over source entries none of which were copied (other destinations'
#: keys) is written at most every this many entries: resuming from an older one re-scans them.
CURSOR_EVERY = 1000
#: Keys a purge examines per store read (keys only: their values are never read).
PURGE_PAGE = 4096
#: A clean-up's purge starts this long after the flip, deletes this many keys per write and
#: pauses this long between two: deleting the moved keys (big values, on every replica) at once
#: starved the new partitions' first writes for most of a second (design/resharding.md).
PURGE_DELAY = 1.0
PURGE_BATCH = 64
PURGE_PAUSE = 0.02
#: Waits while a source has no primary or does not answer.
PULL_RETRY = RetryPolicy(initial=0.1, cap=1.0, floor=0.5)


@dataclass(frozen=True, slots=True)
class ReshardDeps:
    """What re-sharding uses from its agent (built once by the data plane)."""

    node: str
    db: StoreThread
    fetch_bytes: int
    send_fetch: SendFetch
    #: The agent's catch-up throttle, shared with its learners.
    bucket: TokenBucket
    #: A partition's lease holder and its address (this node included), None = no lease.
    leader_of: Callable[[Key], tuple[str, str] | None]
    #: Puts this agent's reports (key -> value) under its registration lease.
    put_owned: Callable[[dict[bytes, bytes]], Awaitable[None]] | None
    report_key: Callable[[str, int], bytes]
    now_ms: Callable[[], int]
    #: Wakes the agent's roles loop: a fact a report carries changed (send it now).
    notify: Callable[[], None] = lambda: None
    retry: RetryPolicy = field(default_factory=lambda: PULL_RETRY)


@dataclass
class _SourceProgress:
    cursor: Cursor
    #: The cursor as last written through the destination's log (resumes start there).
    written: Cursor
    lag: int = 1 << 62  # unknown until the first answer
    keys: int = 0
    bytes: int = 0


class Puller:
    """Copies, into destination ``primary``'s partition, its keys from every source of
    ``reshard`` (design/resharding.md, COPY)."""

    def __init__(self, deps: ReshardDeps, primary: Primary, reshard: Reshard) -> None:
        self._deps = deps
        self.primary = primary
        self.reshard = reshard
        self.zone, self.partition = primary.key
        self.progress: dict[int, _SourceProgress] = {}
        #: Set to cut a caught-up copy's wait short (the reshard moved on to SEAL).
        self._wake = asyncio.Event()

    def seal(self, reshard: Reshard) -> None:
        """The reshard moved on to SEAL: copy what is left now and unthrottled — no restart,
        so no cursor is re-read and no copy loop waits out its COPY poll."""
        self.reshard = reshard
        self._wake.set()

    @property
    def drained(self) -> bool:
        sources = self.reshard.moves.sources
        return all((p := self.progress.get(s)) is not None and p.cursor.drained for s in sources)

    @property
    def lag(self) -> int:
        """The most source entries not copied yet (huge while a source is unknown or still in
        its snapshot)."""
        worst = 0
        for s in self.reshard.moves.sources:
            p = self.progress.get(s)
            if p is None or p.cursor.snapshot:
                return 1 << 62
            worst = max(worst, p.lag)
        return worst

    def report(self) -> ReshardReport:
        return ReshardReport(
            self.reshard.attempt,
            self.primary.lease_epoch,
            sum(p.keys for p in self.progress.values()),
            sum(p.bytes for p in self.progress.values()),
            min(self.lag, 2**62),
            self.drained,
            False,
            self._deps.now_ms(),
        )

    async def run(self) -> None:
        # A task group, not gather: one source's loop failing ends the others too. With gather
        # they ran on, owned by nothing, after the copy's task was done: an abort's cancel no
        # longer reached them, and their copies could commit behind the purge's scan.
        try:
            async with asyncio.TaskGroup() as group:
                for source in self.reshard.moves.sources:
                    group.create_task(self._pull(source), name=f"reshard copy <- {source}")
        except ExceptionGroup as e:  # the first failure ended the copy: said as it was raised
            raise e.exceptions[0] from None

    async def _load(self, source: int) -> Cursor:
        raw = await self._deps.db.call(
            self._deps.db.store.data.get, self.zone, self.partition, cursor_key(source)
        )
        cursor = Cursor.decode(raw) if raw is not None else None
        if cursor is None or cursor.attempt != self.reshard.attempt:
            return Cursor(self.reshard.attempt)
        return cursor

    async def _pull(self, source: int) -> None:
        deps = self._deps
        loaded = await self._load(source)
        progress = self.progress[source] = _SourceProgress(loaded, loaded)
        if loaded.drained:
            return  # copied up to the seal and committed: nothing past it is ever copied
        select = (self.reshard.target, self.partition)
        backoff = Backoff(deps.retry)
        while not self.primary.finished:
            cursor = progress.cursor
            leader = deps.leader_of((self.zone, source))
            if leader is None or not leader[1]:
                await asyncio.sleep(backoff.next())
                continue
            call = FetchCall(
                self.zone,
                source,
                deps.node,
                snapshot=cursor.snapshot,
                snapshot_after=bytes.fromhex(cursor.after),
                after_index=cursor.index,
                max_bytes=deps.fetch_bytes,
                select=select,
                seal_attempt=self._seal_attempt(),
            )
            try:
                # Throttled like a catch-up; not once sealed, so the write pause the seal
                # causes is bounded by the copy of what is left (design/resharding.md, SEAL).
                async with deps.bucket.turn(self._pause, self._sealed, page=cursor.snapshot):
                    reply = await deps.send_fetch(leader[1], call, 10)
                    if not self._sealed():
                        deps.bucket.charge(reply.size)
            except PeerUnreachable as e:
                log.debug("reshard copy %s/%s <- %s: %s", self.zone, self.partition, source, e)
                await asyncio.sleep(backoff.next())
                continue
            if reply.outcome is FetchOutcome.NOT_PRIMARY:
                await asyncio.sleep(backoff.next())
                continue
            backoff.reset()
            if reply.outcome is FetchOutcome.SNAPSHOT_NEEDED:
                try:
                    await self._forget(source)
                except Unavailable as e:  # the in-sync set is short: the next fetch asks again
                    log.debug("reshard copy %s/%s <- %s: %s", self.zone, self.partition, source, e)
                    await asyncio.sleep(backoff.next())
                    continue
                progress.cursor = Cursor(self.reshard.attempt)
                continue
            try:
                more = await self._apply(source, progress, reply)
            except Unavailable as e:  # the destination's in-sync set is short: wait, retry
                log.debug("reshard copy %s/%s <- %s: %s", self.zone, self.partition, source, e)
                await self._until_writable(source, progress.cursor, backoff)
                continue
            if progress.cursor.drained:
                return  # nothing past the seal is ever copied: this source is done
            if not more:
                if self._sealed():
                    await asyncio.sleep(IDLE_POLL)
                else:
                    await wait_event(self._wake, _until_next_poll(self.partition))

    def _sealed(self) -> bool:
        return self.reshard.phase is ReshardPhase.SEAL

    def _seal_attempt(self) -> int:
        """The attempt a fetch waits for the source's seal of: in SEAL, the fetch is answered
        once the source's seal is committed, so one fetch drains it (0 = answered at once)."""
        return self.reshard.attempt if self._sealed() else 0

    async def _pause(self, delay: float) -> None:
        """A wait for the throttle, cut short when the reshard moves on (to SEAL: a sealed copy
        is not throttled, and a stream still waiting out the shared debt would hold the
        cut-over for seconds)."""
        await wait_event(self._wake, delay)

    async def _until_writable(self, source: int, cursor: Cursor, backoff: Backoff) -> None:
        """Wait until the destination takes writes again, probing with the source's current
        cursor (a small write, safe to persist: every copy it covers is committed) rather than
        the page again: a refused write
        stays in the primary's log, uncommitted, and commits once the in-sync set is back, so
        re-sending a page on every try filled the log with copies of it (a learner replays
        them all)."""
        while not self.primary.finished:
            await asyncio.sleep(backoff.next())
            try:
                await self.primary.write_many([(cursor_key(source), cursor.encode())])
                return
            except Unavailable:
                continue

    async def _apply(self, source: int, progress: _SourceProgress, reply: FetchReply) -> bool:
        """Write one reply's keys and the new cursor through the destination's log; whether
        to fetch again at once: after a snapshot page, or a log tail cut short by its size.
        A caught-up copy whose cursor only moved over other destinations' entries waits for
        its poll: fetching again at once while the source took writes kept 256 loops (16 → 32)
        fetching back to back for the rest of COPY."""
        cursor = progress.cursor
        writes, new, lag = plan_copy(cursor, reply)
        if lag is not None:
            if (progress.lag <= SEAL_LAG) != (lag <= SEAL_LAG):
                progress.lag = lag
                self._deps.notify()
            progress.lag = lag
        if new == cursor:
            return False
        more = lag is None or lag > 0
        was = (self.drained, self.lag <= SEAL_LAG)
        # The cursor goes in the batch of the last copied keys (one replicated commit, not
        # two: the cut-over's drain waits for it): the log commits in order, so a committed
        # cursor implies every copy before it is committed. A drained cursor is written even
        # with no key to copy: a new primary of the destination that takes over after the flip
        # may still see SEAL, and resuming from an older cursor would copy the source's old
        # values over the client writes it took since (review finding).
        steps = [writes[i : i + STEP_WRITES] for i in range(0, len(writes), STEP_WRITES)]
        if writes or _worth_writing(progress.written, new):
            steps[-1:] = [(steps[-1] if steps else []) + [(cursor_key(source), new.encode())]]
        for step in steps:
            await self.primary.write_many(step)
        if steps:
            progress.written = new
        progress.cursor = new
        progress.keys += len(writes)
        progress.bytes += sum(len(k) + len(v or b"") for k, v in writes)
        if (self.drained, self.lag <= SEAL_LAG) != was:
            self._deps.notify()
        return more

    async def _forget(self, source: int) -> None:
        """The source's log no longer has what the cursor needs: delete, through the log,
        every key copied from it (they route to it under the source count), to start over."""
        await delete_where(
            self._deps.db,
            self.primary,
            lambda k: routes_to(k, source, self.reshard.source) or k == cursor_key(source),
        )


def _until_next_poll(destination: int) -> float:
    """Seconds to the destination's next poll instant: every ``COPY_POLL`` on the loop's clock,
    at an offset of its own. The 16 loops of a destination poll at the same instants, so they
    find their keys together and their writes share the destination's batches (one replicated
    write per poll, not one per source); different destinations poll at offsets spread evenly
    over the period (the golden-ratio sequence), so an agent's destinations do not all fetch
    at once: one instant for every loop of the agent (80 fetches, then their writes) made the
    client writes stall once a second for 0.1–0.3 s (design/resharding.md)."""
    offset = (destination * _GOLDEN % 1.0) * COPY_POLL
    return COPY_POLL - (asyncio.get_running_loop().time() - offset) % COPY_POLL


#: The fractional part of the golden ratio: ``k * _GOLDEN % 1`` spreads any run of k evenly.
_GOLDEN = 0.6180339887498949


def _worth_writing(written: Cursor, new: Cursor) -> bool:
    """Write a cursor that moved over nothing copied only when it changed phase (snapshot
    done, seal seen, drained) or went ``CURSOR_EVERY`` entries past the written one: every
    cursor write is a replicated write, and a caught-up copy polling a busy source would
    otherwise write one per poll for nothing."""
    return (
        new.snapshot != written.snapshot
        or new.after != written.after
        or new.seal_bound != written.seal_bound
        or new.drained != written.drained
        or new.index - written.index >= CURSOR_EVERY
    )


def plan_copy(
    cursor: Cursor, reply: FetchReply
) -> tuple[list[tuple[bytes, bytes | None]], Cursor, int | None]:
    """What one ``Fetch`` answer from a source does to a destination (pure): the writes to make,
    in order, the cursor after them, and the lag (source entries not copied yet; None for a
    snapshot page).

    **Nothing past the source's seal is copied**, and the cursor never passes it: before the
    seal the source took every client write to a moving key; after it, none (the seal refuses
    them), so what follows in its log for those keys is its own clean-up — the purge's deletes
    once the zone flipped — which a puller still running must never apply to the destination
    (a chaos run lost keys exactly so). Once drained the lag is 0."""
    writes: list[tuple[bytes, bytes | None]] = []
    seal_bound = cursor.seal_bound
    if cursor.snapshot:
        base = cursor.base or reply.snapshot_index
        for key, value in reply.items:
            if key == SEAL_KEY:  # sealed at or before this page's snapshot index
                seal_bound = seal_bound or reply.snapshot_index
            else:
                writes.append((key, value))
        done = reply.snapshot_done
        new = Cursor(
            cursor.attempt,
            snapshot=not done,
            after="" if done else reply.scanned_after.hex(),
            base=base,
            index=base if done else 0,
            seal_bound=seal_bound,
        )
        return writes, new, None
    reached = reply.scanned_to
    for entry in reply.entries:
        if seal_bound and entry.index > seal_bound:
            reached = seal_bound
            break
        if entry.key == SEAL_KEY:
            if not entry.delete:
                seal_bound = seal_bound or entry.index
        else:
            writes.append((entry.key, None if entry.delete else entry.value))
    if seal_bound:
        reached = min(reached, seal_bound)
    new = Cursor(
        cursor.attempt,
        snapshot=False,
        base=cursor.base,
        index=max(cursor.index, reached),
        seal_bound=seal_bound,
    )
    lag = 0 if new.drained else max(0, reply.commit_index - new.index)
    return writes, new, lag


async def delete_where(
    db: StoreThread,
    primary: Primary,
    doomed: Callable[[bytes], bool],
    *,
    batch: int = STEP_WRITES,
    pause: float = 0.0,
) -> int:
    """Delete through ``primary``'s log every stored key of its partition that ``doomed``
    picks, page by page, ``batch`` deletes per write and ``pause`` seconds between two;
    returns how many. Idempotent: a repeat finds fewer or none. The scan starts once every
    write queued before the call has left the primary's queue (``Primary.settled``): a copy
    step cancelled just before (an abort) may still commit, and must do so before the scan."""
    zone, partition = primary.key
    await primary.settled()
    if primary.finished:  # its queue may still hold writes a scan now would miss
        raise NotPrimary(zone, partition, "")
    store = db.store.data
    deleted = 0
    after = b""
    while True:
        keys, done = await db.call(store.key_page, zone, partition, after, PURGE_PAGE)
        if keys:
            after = keys[-1]
        writes: list[tuple[bytes, bytes | None]] = [(k, None) for k in keys if doomed(k)]
        for i in range(0, len(writes), batch):
            if i and pause:
                await asyncio.sleep(pause)
            await primary.write_many(writes[i : i + batch])
        deleted += len(writes)
        if done:
            return deleted


async def purge(db: StoreThread, primary: Primary, partitions: int) -> int:
    """Delete through ``primary``'s log every stored key that does not route to its partition
    under a layout of ``partitions`` (control keys included: the seal, the cursors); returns how
    many."""
    partition = primary.key[1]
    deleted = await delete_where(
        db,
        primary,
        lambda k: not routes_to(k, partition, partitions),
        batch=PURGE_BATCH,
        pause=PURGE_PAUSE,
    )
    primary.forget_seal()
    return deleted


class Resharding:
    """This agent's re-sharding tasks, started and stopped by :meth:`sync`."""

    def __init__(self, deps: ReshardDeps) -> None:
        self._deps = deps
        self._pullers: dict[Key, tuple[Puller, asyncio.Task[None]]] = {}
        self._tasks: dict[tuple[Key, str, int, int], asyncio.Task[object]] = {}
        #: Per partition led: the latest report to put (sent by :meth:`send_reports`).
        self._reports: dict[Key, ReshardReport] = {}
        self._sent: dict[Key, ReshardReport] = {}
        self._progress_sent = 0.0

    def sync(
        self, primaries: dict[Key, Primary], reshards: dict[str, tuple[Reshard | None, int, int]]
    ) -> None:
        """``reshards``: zone -> (its reshard or None, the layout's partition count, the layout
        key's mod revision), from the agent's view."""
        wanted_pullers: set[Key] = set()
        for key, primary in primaries.items():
            if primary.finished or not primary.ready.is_set():
                continue
            zone, partition = key
            found = reshards.get(zone)
            if found is None:
                continue
            reshard, count, revision = found
            if reshard is None:
                seal = primary.seal or primary.seal_written
                if seal is not None and revision > seal.attempt:  # the attempt ended
                    self._start(primary, "unseal", seal.attempt, primary.unseal)
                continue
            moves = reshard.moves
            phase = reshard.phase
            if phase in (ReshardPhase.COPY, ReshardPhase.SEAL) and partition in moves.destinations:
                wanted_pullers.add(key)
                running = self._pullers.get(key)
                if (
                    running is not None
                    and not running[1].done()
                    and running[0].primary is primary
                    and running[0].reshard != reshard
                    and replace(running[0].reshard, phase=reshard.phase) == reshard
                ):
                    running[0].seal(reshard)  # COPY -> SEAL of the same attempt
                elif (
                    running is None
                    or (running[1].done() and not running[0].drained)  # drained: it is done
                    or running[0].primary is not primary
                    or running[0].reshard != reshard
                ):
                    if running is not None:
                        running[1].cancel()
                    puller = Puller(self._deps, primary, reshard)
                    task = asyncio.create_task(puller.run(), name=f"reshard copy {key}")
                    task.add_done_callback(_log_end)
                    self._pullers[key] = (puller, task)
            if phase is ReshardPhase.SEAL and partition in moves.sources:
                seal = Seal(reshard.attempt, reshard.source, reshard.target)
                self._start(primary, "seal", reshard.attempt, partial(primary.seal_for, seal))
            if phase in (ReshardPhase.CLEANUP, ReshardPhase.ABORT) and partition < count:
                work = partial(self._purge, primary, reshard, count)
                self._start(primary, "purge", reshard.attempt, work)
        for key in list(self._pullers):
            if key not in wanted_pullers:
                self._pullers.pop(key)[1].cancel()
        for key, (puller, _) in self._pullers.items():
            self._reports[key] = puller.report()
            sealed = puller.reshard.phase is ReshardPhase.SEAL
            if sealed and not puller.drained and log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "%s/%s: not drained yet: %s",
                    *key,
                    {
                        s: (p.cursor.snapshot, p.cursor.index, p.cursor.seal_bound, p.lag)
                        for s, p in puller.progress.items()
                    },
                )
        self._forget_ended(primaries)
        self._forget_reports(primaries, reshards)

    def _forget_reports(
        self, primaries: dict[Key, Primary], reshards: dict[str, tuple[Reshard | None, int, int]]
    ) -> None:
        """Reports are put again every ``PROGRESS_EVERY`` only while they matter: of a
        partition this agent leads, for the zone's reshard attempt in progress."""
        led = {key for key, primary in primaries.items() if not primary.finished}
        for key, report in list(self._reports.items()):
            found = reshards.get(key[0])
            reshard = found[0] if found is not None else None
            if key not in led or reshard is None or report.attempt != reshard.attempt:
                del self._reports[key]
                self._sent.pop(key, None)

    def _start(
        self, primary: Primary, what: str, attempt: int, work: Callable[[], Awaitable[object]]
    ) -> None:
        """Run ``work()`` once per (primary, what, attempt): again only if it failed."""
        slot = (primary.key, what, attempt, id(primary))
        running = self._tasks.get(slot)
        if running is not None and (
            not running.done() or (not running.cancelled() and running.exception() is None)
        ):
            return
        task = asyncio.ensure_future(work())
        task.add_done_callback(_log_end)
        self._tasks[slot] = task

    def _forget_ended(self, primaries: dict[Key, Primary]) -> None:
        alive = {id(p) for p in primaries.values() if not p.finished}
        for slot in [s for s, t in self._tasks.items() if t.done() and s[3] not in alive]:
            del self._tasks[slot]

    async def _purge(self, primary: Primary, reshard: Reshard, count: int) -> None:
        if reshard.phase is ReshardPhase.CLEANUP:
            # Moved keys are invisible already (reads route by the layout in force): let the
            # new partitions take their first writes before the sources' deletes compete.
            await asyncio.sleep(PURGE_DELAY)
        deleted = await purge(self._deps.db, primary, count)
        log.info(
            "%s/%s: purged %d key(s) of reshard %d (%s)",
            *primary.key,
            deleted,
            reshard.attempt,
            reshard.phase,
        )
        copied = self._reports.get(primary.key)  # a destination keeps its copy's figures
        if copied is None or copied.attempt != reshard.attempt:
            copied = ReshardReport(reshard.attempt, primary.lease_epoch)
        self._reports[primary.key] = replace(
            copied,
            lease_epoch=primary.lease_epoch,
            lag=0,
            purged=True,
            ts=self._deps.now_ms(),
        )
        self._deps.notify()

    async def send_reports(self, now: float) -> None:
        """Put the reports whose facts changed (caught up, drained, purged, a new attempt or
        primary), and every report again every ``PROGRESS_EVERY`` seconds: its progress, and a
        repair — a deposed primary's put that reached etcd late overwrites the key, and the
        leader ignores that one (its lease epoch is older), waiting for this one."""
        put = self._deps.put_owned
        if put is None:
            return
        progress_due = now - self._progress_sent >= PROGRESS_EVERY
        changed = {
            key: report
            for key, report in self._reports.items()
            if _facts(self._sent.get(key)) != _facts(report) or progress_due
        }
        if not changed:
            return
        if progress_due:
            self._progress_sent = now
        for key, report in changed.items():
            if _facts(self._sent.get(key)) != _facts(report):
                log.info(
                    "%s/%s: reshard %d report: lag %d, drained %s, purged %s (lease epoch %d)",
                    *key,
                    report.attempt,
                    report.lag,
                    report.drained,
                    report.purged,
                    report.lease_epoch,
                )
        await put(
            {
                self._deps.report_key(*key): encode_reshard_report(report)
                for key, report in changed.items()
            }
        )
        self._sent.update(changed)

    async def close(self) -> None:
        tasks = [t for _, t in self._pullers.values()] + list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _facts(report: ReshardReport | None) -> tuple[object, ...] | None:
    """What the leader decides on (design/resharding.md): not the progress figures."""
    if report is None:
        return None
    caught_up = report.lag <= SEAL_LAG
    return (report.attempt, report.lease_epoch, caught_up, report.drained, report.purged)


def _log_end(task: asyncio.Task[object]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None and not isinstance(error, PlacementError):
        log.error("reshard task %s failed", task.get_name(), exc_info=error)
    elif error is not None:
        log.info("reshard task %s: %s", task.get_name(), error)
