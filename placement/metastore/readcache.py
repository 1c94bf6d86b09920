"""The prefix in memory for reads: one list-watch per driver instance, grouped by zone, that
GetAssignments, GetZoneStatus, ListNodes and the dashboard answer from (design/control-plane.md,
"Reads from memory").

Every answer carries the revision the cache reflects. A caller may ask for at least a revision
(``min_revision``: e.g. the revision its own write returned; the cache waits up to ``lag_wait``
for its watch to apply it) or for a linearizable read: the cache asks etcd for its current
revision (one key, ``keys_only``) and answers only if its watch has applied it already — etcd's
read-index idea without the wait, since the revision also moves for writes outside the prefix
that no event would confirm (etcd's progress notifications could, but etcd before 3.4.25/3.5.8
may send one ahead of events still unsent, issue etcd-io/etcd#15220, which would make the cache
skip them). A cache that is not watching right now (not started yet, its stream broken and
resuming, its watch failed), that is behind, or that does not hold the zone asked for answers
nothing: the caller reads etcd directly, as every read did before the cache.

States: STARTING (listing; retried with backoff while etcd is unreachable) -> watching (the
stream open and confirmed) <-> resuming (the stream broke: its snapshot is kept, not served)
-> CLOSED.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from placement.aio import cancel_and_wait
from placement.core.closing import AsyncClosing
from placement.errors import PlacementError, StoreUnavailable
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeyKind, KeySpace
from placement.metastore.kv import KeyValue
from placement.metastore.listwatch import ListWatch

log = logging.getLogger(__name__)

#: Seconds a read waits for the watch to reach the revision it needs before reading etcd.
LAG_WAIT = 1.0
#: The group of the keys every zone's decisions read: nodes, drain and cordon marks, leader,
#: pause flag, lease terms.
GLOBAL = ""
#: Kinds kept in their zone's group: what ``Metastore.read_zone_snapshot`` reads of a zone.
ZONE_KINDS = frozenset(
    {
        KeyKind.ZONE,
        KeyKind.ASSIGN,
        KeyKind.DATANODES,
        KeyKind.PRIMARY,
        KeyKind.ISR,
        KeyKind.SIZES,
        KeyKind.LAYOUT,
        KeyKind.RESHARD,
    }
)
GLOBAL_KINDS = frozenset(
    {KeyKind.NODE, KeyKind.LEADER, KeyKind.DRAIN, KeyKind.CORDON, KeyKind.CONTROL, KeyKind.TERM}
)


class ReadCache(AsyncClosing):
    """The prefix under ``keys``, kept current by one :class:`ListWatch`; see the module
    docstring. :meth:`start` begins listing in the background and returns at once."""

    def __init__(self, client: EtcdClient, keys: KeySpace, *, lag_wait: float = LAG_WAIT) -> None:
        self.client = client
        self.keys = keys
        self.lag_wait = lag_wait
        self._watch = ListWatch(client, keys.prefix.encode() + b"/", group=self._group)
        self._task: asyncio.Task[None] | None = None
        self._started = asyncio.Event()
        self._closed = False

    def _group(self, key: bytes) -> str | None:
        parsed = self.keys.parse(key)
        if parsed is None:
            return None
        if parsed.kind in ZONE_KINDS:
            return parsed.name
        return GLOBAL if parsed.kind in GLOBAL_KINDS else None

    def start(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.create_task(self._run(), name="read-cache")

    async def _run(self) -> None:
        backoff = self.client.reconnect_backoff()
        while not self._closed:
            try:
                await self._watch.start()
            except StoreUnavailable as e:
                log.debug("read cache: list failed (%s); retrying", e)
                await asyncio.sleep(backoff.next())
                continue
            self._started.set()
            log.info("read cache synced at revision %d", self._watch.revision)
            return

    async def close(self) -> None:
        self._closed = True
        try:
            with contextlib.suppress(PlacementError):  # its first list's failure: nothing to add
                await cancel_and_wait(self._task)
        finally:
            await self._watch.close()

    @property
    def synced(self) -> bool:
        return self._started.is_set() and self._watch.connected

    async def wait_synced(self) -> None:
        """Return once the cache answers: listed, and its watch stream open (polled: the
        stream opens a moment after the list, inside the list-watch's task)."""
        await self._started.wait()
        while True:
            if self.synced:
                return
            await asyncio.sleep(0.01)

    @property
    def revision(self) -> int:
        """Every change up to this revision is applied."""
        return self._watch.revision

    async def ready(self, min_revision: int = 0, linearizable: bool = False) -> bool:
        """Whether an answer from the cache may be given now: it watches, and it has applied
        ``min_revision`` (waiting up to ``lag_wait`` for it) — and, when ``linearizable``,
        etcd's current revision, without waiting: the revision also moves for writes the watch
        does not carry, which no event would ever confirm. False: read etcd instead."""
        if not self.synced:
            return False
        if linearizable:
            current = await self.client.current_revision(self.keys.paused())
            return self.synced and self._watch.revision >= max(current, min_revision)
        if self._watch.revision >= min_revision:
            return True
        with contextlib.suppress(TimeoutError, PlacementError):
            await asyncio.wait_for(self._watch.wait_revision(min_revision), self.lag_wait)
        return self.synced and self._watch.revision >= min_revision

    # -- reads: call them after ready(), before the next await --------------------------------

    def get(self, key: bytes) -> KeyValue | None:
        return self._watch.get(key)

    def zone_kvs(self, zone: str) -> dict[bytes, KeyValue]:
        """What ``Metastore.read_zone_snapshot(zone)`` reads, as of :attr:`revision`."""
        return {**self._watch.group(GLOBAL), **self._watch.group(zone)}

    def global_kvs(self) -> Mapping[bytes, KeyValue]:
        """Node records, drain marks, leader keys and the pause flag (live)."""
        return self._watch.group(GLOBAL)

    def all_kvs(self) -> Mapping[bytes, KeyValue]:
        """Every key under the prefix (live)."""
        return self._watch.live()
