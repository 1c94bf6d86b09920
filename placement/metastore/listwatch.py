"""List-then-watch of one key prefix, giving consumers immutable snapshots.

The recipe (Kubernetes' reflector, Patroni's KV cache): list the prefix at a revision ``R``
(paginated, pinned to ``R``), watch from ``R + 1``, apply every event in order. Then:

* a broken stream is resumed from the last applied revision + 1 (inside
  :class:`~.etcd.Watch` for short outages, here with backoff for longer ones) — no event
  lost, none applied twice;
* :class:`~placement.errors.Compacted` (the resume revision is gone) means re-list and re-watch; the
  next snapshot comes from the new list with ``generation`` incremented, and
  :meth:`ListWatch.updates` emits it as a **reset** (consumers holding derived state rebuild it).

Watches only *wake* consumers: :meth:`ListWatch.wait_newer` returns the latest snapshot once
something changed, coalescing any number of events. A :class:`Snapshot` is immutable (a read-only
mapping nobody else holds), so consumers decide on a consistent view at one revision. A snapshot
copies the prefix; a consumer that keeps its own state instead takes what changed from a
:class:`Follower` (:meth:`ListWatch.follow`) and reads those keys live — a cost per changed key,
not per key of the prefix.

States: ``SYNCED`` (watching) -> ``RETRYING`` (etcd unreachable, snapshot kept, retrying with
backoff) -> ``SYNCED``; ``CLOSED`` is final.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Self

from placement.aio import cancel_and_wait
from placement.core.closing import AsyncClosing
from placement.core.retry import Backoff, Sleep
from placement.errors import Compacted, StoreUnavailable
from placement.metastore.etcd import EtcdClient, Watch
from placement.metastore.keys import prefix_range_end
from placement.metastore.kv import EventKind, KeyValue, WatchBatch

log = logging.getLogger(__name__)


class WatchState(StrEnum):
    SYNCED = "synced"
    RETRYING = "retrying"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The prefix as of ``revision``: ``kvs`` maps key -> :class:`KeyValue` (read-only).

    ``generation`` counts lists (1 for the first): a snapshot of a higher generation than the one a
    consumer holds comes from a re-list, not from applying events to it.
    """

    revision: int
    kvs: Mapping[bytes, KeyValue]
    generation: int


@dataclass(frozen=True, slots=True)
class Update:
    """What :meth:`ListWatch.updates` yields: a snapshot, and whether it is a reset for this
    consumer (its first, or from a re-list since the consumer's previous one)."""

    snapshot: Snapshot
    reset: bool


class Follower:
    """The keys of one consumer's list-watch that may have changed since its last :meth:`take`:
    every key an applied event named (put or deleted), and after a re-list every key before and
    after it. Read each one live (:meth:`ListWatch.get`; absent = deleted) before the next
    ``await``. A key can be named with its value unchanged (a re-list): consumers apply values
    idempotently."""

    __slots__ = ("__weakref__", "_keys")

    def __init__(self) -> None:
        self._keys: set[bytes] = set()

    def take(self) -> set[bytes]:
        keys, self._keys = self._keys, set()
        return keys


class ListWatch(AsyncClosing):
    """Keeps an in-memory copy of ``prefix`` current; see the module docstring."""

    def __init__(
        self,
        client: EtcdClient,
        prefix: bytes,
        *,
        page_size: int = 1000,
        sleep: Sleep = asyncio.sleep,
        backoff: Backoff | None = None,
        quiet: Callable[[bytes], bool] | None = None,
        group: Callable[[bytes], str | None] | None = None,
    ) -> None:
        """``quiet(key)`` true: a change of that key is applied but wakes nobody — it shows in
        the next snapshot made for another change (e.g. the driver and replica-size reports).
        ``group(key)``: the name of the group the key is kept in as well (None: none), read
        with :meth:`group` without copying the prefix (e.g. one zone's keys)."""
        self._quiet = quiet
        self._group_of = group
        self._groups: dict[str, dict[bytes, KeyValue]] = {}
        #: group -> the number of the applied batch (or list) that last changed it
        self._stamps: dict[str, int] = {}
        self._batches = 0
        self._client = client
        self._prefix = prefix
        self._end = prefix_range_end(prefix)
        self._page_size = page_size
        self._sleep = sleep
        self._backoff = backoff or client.reconnect_backoff()
        self._kvs: dict[bytes, KeyValue] = {}
        self._revision = 0
        self._generation = 0
        self._changes = 0  # bumped on every applied change or reset
        self._snapshot: Snapshot | None = None
        self._snapshot_changes = -1
        self._changed = asyncio.Condition()
        self._followers: weakref.WeakSet[Follower] = weakref.WeakSet()
        self._task: asyncio.Task[None] | None = None
        self._watch: Watch | None = None
        self._failure: BaseException | None = None
        self.state = WatchState.RETRYING
        self.resets = 0

    @property
    def closed(self) -> bool:
        return self.state is WatchState.CLOSED

    @property
    def revision(self) -> int:
        """Every change of the prefix up to this revision is applied."""
        return self._revision

    async def start(self) -> Snapshot:
        """List the prefix, start watching; return the first (reset) snapshot.

        Raises :class:`StoreUnavailable` if the first list fails (nothing started).
        """
        if self._task is not None:
            raise RuntimeError("ListWatch already started")
        await self._list()
        self.state = WatchState.SYNCED
        self._task = asyncio.create_task(self._run(), name=f"listwatch-{self._prefix!r}")
        return self.snapshot()

    async def close(self) -> None:
        self.state = WatchState.CLOSED
        task, self._task = self._task, None
        await cancel_and_wait(task)
        async with self._changed:
            self._changed.notify_all()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    def get(self, key: bytes) -> KeyValue | None:
        """``key`` as of :attr:`revision` (no copy: read it before the next ``await``)."""
        return self._kvs.get(key)

    def group(self, name: str) -> Mapping[bytes, KeyValue]:
        """The keys of group ``name`` as of :attr:`revision` — live, not a copy: read it before
        the next ``await`` (every change is applied between two awaits, never during one)."""
        return MappingProxyType(self._groups.get(name, {}))

    def groups(self) -> Mapping[str, Mapping[bytes, KeyValue]]:
        """Every group's keys, live like :meth:`group` (read before the next ``await``)."""
        return MappingProxyType(self._groups)

    def stamps(self) -> Mapping[str, int]:
        """group -> a number that changes whenever a key of the group changes (quiet keys too),
        live like :meth:`group`: a consumer re-reads only the groups whose stamp moved."""
        return MappingProxyType(self._stamps)

    @property
    def changes(self) -> int:
        """A number that changes with every applied change that is not quiet, and every list
        (:meth:`wait_change` waits for it to move)."""
        return self._changes

    def follow(self) -> Follower:
        """A :class:`Follower` of every change from now on (held weakly: drop it to stop)."""
        follower = Follower()
        self._followers.add(follower)
        return follower

    def live(self) -> Mapping[bytes, KeyValue]:
        """Every key as of :attr:`revision`, live like :meth:`group`."""
        return MappingProxyType(self._kvs)

    def snapshot(self) -> Snapshot:
        """The current snapshot (built once per change, then shared)."""
        if self._snapshot is None or self._snapshot_changes != self._changes:
            self._snapshot = Snapshot(
                self._revision,
                MappingProxyType(dict(self._kvs)),
                self._generation,
            )
            self._snapshot_changes = self._changes
        return self._snapshot

    async def wait_newer(self, than: Snapshot | None) -> Snapshot:
        """The latest snapshot once it differs from ``than`` (at once if it already does).

        Raises what stopped the watch, or :class:`StoreUnavailable` once closed.
        """
        async with self._changed:
            while True:
                self._raise_if_ended()
                current = self.snapshot()
                if than is None or current is not than:
                    return current
                await self._changed.wait()

    async def wait_change(self, seen: int) -> int:
        """:attr:`changes` once it differs from ``seen`` (at once if it already does), without
        copying the prefix as :meth:`wait_newer` does (read the groups live instead). Raises
        like :meth:`wait_newer`."""
        async with self._changed:
            while True:
                self._raise_if_ended()
                if self._changes != seen:
                    return self._changes
                await self._changed.wait()

    async def wait_revision(self, revision: int) -> None:
        """Return once every change up to ``revision`` is applied (e.g. the caller's own write:
        a snapshot taken after this shows it). Raises like :meth:`wait_newer`."""
        async with self._changed:
            while self._revision < revision:
                self._raise_if_ended()
                await self._changed.wait()

    def _raise_if_ended(self) -> None:
        """Raise what stopped the watch, or StoreUnavailable once it is closed."""
        if self._failure is not None:
            raise self._failure
        if self.state is WatchState.CLOSED:
            raise StoreUnavailable("list-watch closed")

    @property
    def connected(self) -> bool:
        """Watching right now: its stream open and confirmed by etcd, and nothing failed
        (:attr:`state` stays SYNCED while the watch resumes a broken stream by itself)."""
        watch = self._watch
        return (
            self.state is WatchState.SYNCED
            and self._failure is None
            and watch is not None
            and watch.connected
        )

    async def updates(self) -> AsyncIterator[Update]:
        """Every distinct snapshot from now on (coalesced), flagged ``reset`` when it is the
        consumer's first or comes from a re-list; ends when closed."""
        last: Snapshot | None = None
        while not self.closed:
            try:
                current = await self.wait_newer(last)
            except StoreUnavailable:
                if self.closed:
                    return
                raise
            reset = last is None or current.generation != last.generation
            last = current
            yield Update(current, reset)

    # -- internals -------------------------------------------------------------------------------

    async def _list(self) -> None:
        listed = await self._client.list_prefix(self._prefix, page_size=self._page_size)
        before = self._kvs
        self._kvs = {kv.key: kv for kv in listed.kvs}
        for follower in self._followers:
            follower._keys.update(before.keys(), self._kvs.keys())
        self._groups = {}
        group_of = self._group_of
        if group_of is not None:
            for key, kv in self._kvs.items():
                name = group_of(key)
                if name is not None:
                    self._groups.setdefault(name, {})[key] = kv
        self._batches += 1
        self._stamps = dict.fromkeys(self._groups, self._batches)
        self._revision = listed.revision
        self._generation += 1
        self._changes += 1
        if self._generation > 1:
            self.resets += 1
            log.info("re-listed %r at revision %d", self._prefix, listed.revision)
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _apply(self, batch: WatchBatch) -> None:
        self._batches += 1
        followers = list(self._followers)
        for event in batch.events:
            if event.kv.mod_revision <= self._revision:
                continue  # already in the list (cannot happen with start = R + 1; kept as a guard)
            key = event.kv.key
            for follower in followers:
                follower._keys.add(key)
            name = self._group_of(key) if self._group_of is not None else None
            if name is not None:
                self._stamps[name] = self._batches
            if event.kind is EventKind.DELETE:
                self._kvs.pop(key, None)
                if name is not None:
                    self._groups.get(name, {}).pop(key, None)
            else:
                self._kvs[key] = event.kv
                if name is not None:
                    self._groups.setdefault(name, {})[key] = event.kv
        quiet = self._quiet
        changed = any(quiet is None or not quiet(e.kv.key) for e in batch.events)
        self._revision = max(self._revision, batch.revision)
        if changed:
            self._changes += 1
        await self._notify()  # quiet changes too: wait_revision counts every revision

    async def _run(self) -> None:
        relist = False
        try:
            while True:
                try:
                    if relist:
                        await self._list()
                        relist = False
                    async with self._client.watch(
                        self._prefix, self._end, start_revision=self._revision + 1
                    ) as watch:
                        self.state = WatchState.SYNCED
                        self._watch = watch
                        async for batch in watch:
                            await self._apply(batch)
                            self._backoff.reset()
                    return  # the watch was closed under us (client closing)
                except Compacted as e:
                    log.info("watch of %r compacted (%s); re-listing", self._prefix, e)
                    relist = True
                except StoreUnavailable:
                    self.state = WatchState.RETRYING
                    await self._sleep(self._backoff.next())
        except asyncio.CancelledError:
            raise
        except Exception as e:  # reported to the consumers by wait_newer / wait_revision
            self._failure = e
            await self._notify()
