"""The agent's data plane: which role it plays for each partition replica it holds, and routing.

Design: design/data-plane.md. Roles are derived, every half second and on every change of the
agent's etcd view (zones, primary leases, in-sync sets, nodes), from the replica records in the
agent store:

* **primary** (:class:`~replica.data.primary.Primary`): holds the lease and is in the ISR (or no
  ISR exists yet).
* **follower** (:func:`~replica.data.follower.answer_append`): in the ISR, not primary — answers
  ``Append``.
* **learner** (:class:`~replica.data.follower.Learner`): holds a replica, not in the ISR — pulls
  from the primary until the primary adds it to the ISR.

A rebalance's catch-up (``catch_up``) creates the replica and waits until its node is in the ISR.
Client requests go to the partition's primary; the ISR in etcd is read and written through
:class:`~placement.metastore.store.Metastore`; other agents are reached through
:class:`~replica.data.peers.ReplicationPeers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from placement.core.model import ZoneSpec, effective_min_in_sync
from placement.core.retry import Clock
from placement.data.partitioning import partition_of
from placement.errors import InvalidInput, PlacementError
from placement.metastore.codec import (
    InSyncSet,
    NodeRecord,
    PrimaryLease,
    ReplicaSize,
    decode_isr,
    decode_node,
    decode_primary,
    decode_zone_spec,
    encode_size,
)
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeyKind, KeySpace
from placement.metastore.listwatch import ListWatch
from placement.metastore.store import Metastore
from replica.data.follower import Learner, LearnerDeps, TokenBucket, answer_append
from replica.data.model import (
    AppendCall,
    AppendReply,
    Deposed,
    FetchCall,
    FetchReply,
    Key,
    NotPrimary,
    ReplicaPage,
    Unavailable,
    UnknownZone,
)
from replica.data.peers import ReplicationPeers
from replica.data.primary import Primary, PrimaryDeps
from replica.protocol import StartCatchUp
from replica.records import StoreThread

log = logging.getLogger(__name__)

#: Puts keys this agent owns (its replica sizes: key -> value) under its registration lease.
PutOwned = Callable[[dict[bytes, bytes]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class DataConfig:
    """Tunables; times in seconds."""

    isr_timeout: float = 3.0
    lease_margin_ms: int = 500
    catch_up_bytes_per_s: float = 64e6
    fetch_bytes: int = 1 << 20
    log_keep: int = 20_000
    size_interval: float = 10.0
    batch_max: int = 512
    tick: float = 0.5
    heartbeat: float = 1.0


@dataclass
class View:
    """The agent's decoded view of etcd (rebuilt from the watches' snapshots)."""

    zones: dict[str, ZoneSpec] = field(default_factory=dict)
    leases: dict[Key, tuple[PrimaryLease, int]] = field(default_factory=dict)
    isrs: dict[Key, tuple[InSyncSet, int]] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)

    def primary_hint(self, key: Key) -> str:
        lease = self.leases.get(key)
        if lease is None:
            return ""
        node = lease[0].node
        return f"{node}@{self.nodes.get(node, '')}"


class DataPlane:
    """See the module docstring."""

    def __init__(
        self,
        node: str,
        db: StoreThread,
        client: EtcdClient,
        keys: KeySpace,
        *,
        config: DataConfig | None = None,
        clock: Clock = time.time,
        put_owned: PutOwned | None = None,
    ) -> None:
        self.node = node
        self.db = db
        self.data = db.store.data
        self.client = client
        self.keys = keys
        self.metastore = Metastore(client, keys)
        self.config = config or DataConfig()
        self.clock = clock
        self.put_owned = put_owned
        self.view = View()
        self.peers = ReplicationPeers()
        self._watches: list[ListWatch] = []
        self._primaries: dict[Key, Primary] = {}
        self._learners: dict[Key, asyncio.Task[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()
        self._view_changed = asyncio.Condition()
        self._sizes: dict[Key, tuple[int, int]] = {}
        self._appended: dict[Key, int] = {}
        self._closed = False
        self._primary_deps = PrimaryDeps(
            node=node,
            db=db,
            isr_timeout=self.config.isr_timeout,
            heartbeat=self.config.heartbeat,
            batch_max=self.config.batch_max,
            fetch_bytes=self.config.fetch_bytes,
            send_append=self.peers.append,
            address_of=lambda member: self.view.nodes.get(member, ""),
            lease_ok=self.lease_ok,
            primary_hint=lambda key: self.view.primary_hint(key),
            min_in_sync=self.min_in_sync,
            read_lease_and_isr=lambda key: self.metastore.read_lease_and_isr(*key),
            write_isr=self.write_isr,
            trim=self.maybe_trim,
        )
        self._learner_deps = LearnerDeps(
            node=node,
            db=db,
            fetch_bytes=self.config.fetch_bytes,
            send_fetch=self.peers.fetch,
            bucket=TokenBucket(self.config.catch_up_bytes_per_s),
            primary_of=self._primary_of,
            done=lambda key: self._closed or self.in_sync(key),
        )

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        for prefix in (
            self.keys.zones_prefix(),
            self.keys.primary_prefix(),
            self.keys.isr_prefix(),
            self.keys.nodes_prefix(),
        ):
            watch = ListWatch(self.client, prefix)
            await watch.start()
            self._watches.append(watch)
        self._rebuild_view()
        for watch in self._watches:
            self._tasks.append(asyncio.create_task(self._follow_watch(watch)))
        self._tasks.append(asyncio.create_task(self._roles_loop(), name="data-roles"))
        self._tasks.append(asyncio.create_task(self._sizes_loop(), name="data-sizes"))

    async def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for primary in list(self._primaries.values()):
            await primary.stop("the agent is shutting down")
        for task in self._learners.values():
            task.cancel()
        await asyncio.gather(*self._tasks, *self._learners.values(), return_exceptions=True)
        for watch in self._watches:
            await watch.close()
        await self.peers.close()

    async def _follow_watch(self, watch: ListWatch) -> None:
        snapshot = watch.snapshot()
        while not self._closed:
            snapshot = await watch.wait_newer(snapshot)
            self._rebuild_view()
            self._changed.set()
            async with self._view_changed:
                self._view_changed.notify_all()

    def _rebuild_view(self) -> None:
        view = View()
        for watch in self._watches:
            for kv in watch.snapshot().kvs.values():
                parsed = self.keys.parse(kv.key)
                if parsed is None:
                    continue
                if parsed.kind is KeyKind.ZONE:
                    spec = decode_zone_spec(kv.value)
                    if isinstance(spec, ZoneSpec):
                        view.zones[parsed.name] = spec
                elif parsed.kind is KeyKind.PRIMARY and parsed.partition is not None:
                    lease = decode_primary(kv.value)
                    if isinstance(lease, PrimaryLease):
                        view.leases[(parsed.name, parsed.partition)] = (lease, kv.mod_revision)
                elif parsed.kind is KeyKind.ISR and parsed.partition is not None:
                    isr = decode_isr(kv.value)
                    if isinstance(isr, InSyncSet):
                        view.isrs[(parsed.name, parsed.partition)] = (isr, kv.mod_revision)
                elif parsed.kind is KeyKind.NODE:
                    record = decode_node(kv.value)
                    if isinstance(record, NodeRecord):
                        view.nodes[parsed.name] = record.address
        self.view = view

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def lease_ok(self, key: Key, lease_epoch: int) -> bool:
        """This node holds lease ``lease_epoch`` of ``key`` by its own clock (with a margin)."""
        entry = self.view.leases.get(key)
        if entry is None:
            return False
        lease = entry[0]
        return (
            lease.node == self.node
            and lease.lease_epoch == lease_epoch
            and self.now_ms() < lease.expiry - self.config.lease_margin_ms
        )

    def in_sync(self, key: Key) -> bool:
        entry = self.view.isrs.get(key)
        return entry is not None and self.node in entry[0].members

    def _primary_of(self, key: Key) -> tuple[str, str] | None:
        entry = self.view.leases.get(key)
        if entry is None:
            return None
        holder = entry[0].node
        return holder, self.view.nodes.get(holder, "")

    def min_in_sync(self, zone: str) -> int:
        spec = self.view.zones.get(zone)
        return 1 if spec is None else effective_min_in_sync(spec)

    # -- roles -------------------------------------------------------------------------------

    async def _roles_loop(self) -> None:
        while not self._closed:
            try:
                await self._roles()
            except PlacementError as e:
                log.warning("data plane: %s", e)
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.config.tick)

    async def _roles(self) -> None:
        rows = await self.db.call(self.db.store.replicas)
        held = {(r.zone, r.partition) for r in rows}
        for key in held:
            entry = self.view.leases.get(key)
            isr = self.view.isrs.get(key)
            lease = entry[0] if entry is not None else None
            mine = (
                lease is not None
                and self.lease_ok(key, lease.lease_epoch)
                and (isr is None or self.node in isr[0].members)
            )
            primary = self._primaries.get(key)
            if mine and lease is not None:
                if primary is not None and primary.lease_epoch != lease.lease_epoch:
                    await primary.stop("a newer lease epoch")
                    primary = None
                if primary is None or primary.finished:
                    self._primaries[key] = Primary(self._primary_deps, key, lease.lease_epoch)
            elif primary is not None:
                await primary.stop("the lease moved or expired")
                del self._primaries[key]
            learn = not mine and not self.in_sync(key) and lease is not None
            learner = self._learners.get(key)
            if learn and (learner is None or learner.done()):
                self._learners[key] = asyncio.create_task(
                    Learner(self._learner_deps, key).run(), name=f"learn {key}"
                )
            elif not learn and learner is not None:
                learner.cancel()
                del self._learners[key]
        for key in list(self._primaries):
            if key not in held:
                await self._primaries.pop(key).stop("the replica is gone")
        for key in list(self._learners):
            if key not in held:
                self._learners.pop(key).cancel()

    async def catch_up(self, job: StartCatchUp, db: StoreThread) -> None:
        """The rebalance catch-up (``replica.service.CatchUp``): create the replica, let the
        learner copy it, return once this node is in the partition's in-sync set."""
        await db.call(db.store.begin_replica, job.zone, job.partition)
        await db.call(self.data.ensure, job.zone, job.partition)
        self._changed.set()  # the roles loop starts this replica's learner
        key = (job.zone, job.partition)
        async with self._view_changed:
            await self._view_changed.wait_for(lambda: self.in_sync(key))

    # -- sizes -------------------------------------------------------------------------------

    async def _sizes_loop(self) -> None:
        """Every ``size_interval``: every replica's size in one store call (the records, and one
        query for all sizes), and the changed ones put in as few etcd transactions as etcd's
        limits allow (``put_owned``: ``Registration.put_owned_many``)."""
        while not self._closed:
            await asyncio.sleep(self.config.size_interval)
            if self.put_owned is None:
                continue
            try:
                rows, sizes = await self.db.call(
                    lambda: (self.db.store.replicas(), self.data.sizes())
                )
                now = {
                    (r.zone, r.partition): sizes.get((r.zone, r.partition), (0, 0)) for r in rows
                }
                changed = {key: size for key, size in now.items() if self._sizes.get(key) != size}
                if changed:
                    ts = self.now_ms()
                    await self.put_owned(
                        {
                            self.keys.size(zone, partition, self.node): encode_size(
                                ReplicaSize(size[0], size[1], ts)
                            )
                            for (zone, partition), size in changed.items()
                        }
                    )
                self._sizes = now  # replicas gone are forgotten: reported again if they return
            except PlacementError as e:
                log.debug("size report: %s", e)

    # -- requests ----------------------------------------------------------------------------

    def _check(self, zone: str, partition: int, key: bytes | None) -> Key:
        spec = self.view.zones.get(zone)
        if spec is None:
            raise UnknownZone(f"zone {zone!r} does not exist")
        if not 0 <= partition < spec.partitions:
            raise InvalidInput("partition", f"{partition} is not in 0..{spec.partitions - 1}")
        if key is not None and partition_of(key, spec.partitions) != partition:
            raise InvalidInput(
                "partition",
                f"key belongs to partition {partition_of(key, spec.partitions)}, not {partition}",
                "compute it with placement.data.partitioning.partition_of",
            )
        return (zone, partition)

    def _serving(self, key: Key) -> Primary:
        primary = self._primaries.get(key)
        if primary is None or primary.finished or not self.lease_ok(key, primary.lease_epoch):
            raise NotPrimary(key[0], key[1], self.view.primary_hint(key))
        return primary

    async def write(
        self, zone: str, partition: int, key: bytes, value: bytes | None
    ) -> tuple[int, int, bool]:
        """Put (``value``) or delete (None); returns (index, lease_epoch, existed)."""
        k = self._check(zone, partition, key)
        return await self._serving(k).submit(key, value)

    async def get(self, zone: str, partition: int, key: bytes) -> bytes | None:
        k = self._check(zone, partition, key)
        primary = self._serving(k)
        async with primary.committed():
            return await self.db.call(self.data.get, zone, partition, key)

    async def scan(
        self, zone: str, partition: int, prefix: bytes, start_after: bytes, limit: int
    ) -> tuple[list[tuple[bytes, bytes]], bool]:
        k = self._check(zone, partition, None)
        primary = self._serving(k)
        async with primary.committed():
            return await self.db.call(self.data.scan, zone, partition, prefix, start_after, limit)

    async def append(self, call: AppendCall) -> AppendReply:
        """The primary's ``Append`` to this node (a follower's work)."""
        return await answer_append(self.db, call, self.maybe_trim)

    async def fetch(self, call: FetchCall) -> FetchReply:
        """A learner's ``Fetch`` from this node (the primary's work)."""
        key = (call.zone, call.partition)
        primary = self._serving(key)
        if not primary.ready.is_set():
            raise NotPrimary(key[0], key[1], "")
        try:
            return await primary.fetch(call)
        except Deposed as e:  # this primary object was superseded while the fetch ran
            log.info("%s/%s: fetch by %s on a superseded primary: %s", *key, call.node, e)
            raise NotPrimary(key[0], key[1], self.view.primary_hint(key)) from None

    async def read_replica(
        self, zone: str, partition: int, start_after: bytes, limit: int
    ) -> ReplicaPage:
        row = await self.db.call(self.db.store.replica, zone, partition)
        state = await self.db.call(self.data.state, zone, partition)
        if row is None or state is None:
            return ReplicaPage(hosted=False)
        items, more = await self.db.call(self.data.scan, zone, partition, b"", start_after, limit)
        return ReplicaPage(row.complete, items, more, state.last_index, state.commit_index)

    # -- the in-sync set in etcd ---------------------------------------------------------------

    async def write_isr(
        self, key: Key, lease_epoch: int, members: frozenset[str], isr_revision: int
    ) -> int:
        """Write the ISR ``members`` if this node still holds lease ``lease_epoch`` and the ISR
        is still at ``isr_revision``; returns the new ISR revision. Raises ``Deposed``."""
        for _ in range(5):
            lease, lease_rev, _isr, current_rev = await self.metastore.read_lease_and_isr(*key)
            if lease is None or lease.node != self.node or lease.lease_epoch != lease_epoch:
                raise Deposed("the lease moved")
            if current_rev != isr_revision:
                raise Deposed(
                    f"the in-sync set changed under this primary ({isr_revision} -> {current_rev})"
                )
            value = InSyncSet(tuple(sorted(members)), self.node, lease_epoch, self.now_ms())
            revision = await self.metastore.write_isr(
                *key, value, lease_key_mod=lease_rev, isr_mod=isr_revision
            )
            if revision is not None:
                return revision
        raise Unavailable(f"cannot record the in-sync set of {key[0]}/{key[1]}: etcd keeps racing")

    async def maybe_trim(self, key: Key, appended: int) -> None:
        """Every ``log_keep // 4`` entries appended to a partition, forget the log's oldest."""
        count = self._appended.get(key, 0) + appended
        if count < max(1, self.config.log_keep // 4):
            self._appended[key] = count
            return
        self._appended[key] = 0
        await self.db.call(self.data.trim, key[0], key[1], self.config.log_keep)
