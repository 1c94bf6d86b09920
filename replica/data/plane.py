"""The agent's data plane: primary, follower and learner of each partition replica it holds.

Design: design/data-plane.md. Roles are derived, every half second and on every change of the
agent's etcd view (zones, primary leases, in-sync sets, nodes), from the replica records in the
agent store:

* **primary** (``Primary``): holds the lease and is in the ISR (or no ISR exists yet). Reconciles
  the ISR members to its log, then runs one replication task: group-commits queued writes, sends
  ``Append`` to every other member, acknowledges after all of them persisted; shrinks the ISR
  (etcd transaction fenced by the lease key's revision) when a member stops answering, never
  below the zone's minimum; grows it when a learner caught up (``fetch``).
* **follower**: in the ISR, not primary — answers ``Append`` (``DataStore.follow``).
* **learner** (``_learn``): holds a replica, not in the ISR — pulls snapshot pages and committed
  entries from the primary, throttled, until the primary adds it to the ISR.

A rebalance's catch-up (``catch_up``) creates the replica and waits until its node is in the ISR.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from placement.core.model import ZoneSpec, effective_min_in_sync
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
    encode_isr,
    encode_size,
)
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeyKind, KeySpace
from placement.metastore.listwatch import ListWatch
from placement.metastore.txn import Compare, Get, Put, Range
from placement.v1 import common_pb2, data_pb2, data_pb2_grpc
from replica.data.storage import AppendResult, DataState, Entry
from replica.protocol import StartCatchUp
from replica.service import SerialStore

log = logging.getLogger(__name__)

Key = tuple[str, int]
Clock = Callable[[], float]
PutOwned = Callable[[bytes, bytes], Awaitable[None]]


class NotPrimary(PlacementError):
    """This agent is not the partition's primary; ``primary`` is ``NODE@ADDRESS`` or ""."""

    def __init__(self, zone: str, partition: int, primary: str) -> None:
        self.primary = primary
        where = f"; the primary is {primary}" if primary else "; no primary is known yet"
        super().__init__(f"not the primary of {zone}/{partition}{where}")


class Unavailable(PlacementError):
    """The partition cannot take the request now (in-sync set below minimum, reconciling)."""


class UnknownZone(PlacementError):
    """No zone of that name (as far as this agent's view of etcd goes)."""


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


class TokenBucket:
    """Bytes per second with a one-second burst; ``rate <= 0`` = unlimited."""

    def __init__(self, rate: float, clock: Clock = time.monotonic) -> None:
        self.rate = rate
        self._clock = clock
        self._tokens = rate
        self._last = clock()

    async def take(self, amount: int) -> None:
        if self.rate <= 0:
            return
        now = self._clock()
        self._tokens = min(self.rate, self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= amount
        if self._tokens < 0:
            await asyncio.sleep(-self._tokens / self.rate)


@dataclass
class _Write:
    key: bytes
    value: bytes | None
    future: asyncio.Future[tuple[int, int, bool]]


class Deposed(Exception):
    """Internal: the primary lost its lease (or saw a higher epoch)."""


class DataPlane:
    """See the module docstring."""

    def __init__(
        self,
        node: str,
        db: SerialStore,
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
        self.config = config or DataConfig()
        self.clock = clock
        self.put_owned = put_owned
        self.view = View()
        self.bucket = TokenBucket(self.config.catch_up_bytes_per_s)
        self._watches: list[ListWatch] = []
        self._primaries: dict[Key, Primary] = {}
        self._learners: dict[Key, asyncio.Task[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()
        self._view_changed = asyncio.Condition()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._sizes: dict[Key, tuple[int, int]] = {}
        self._appended: dict[Key, int] = {}
        self._closed = False

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
        for channel in self._channels.values():
            await channel.close()

    def stub(self, address: str) -> data_pb2_grpc.ReplicationServiceAsyncStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(address)
            self._channels[address] = channel
        return data_pb2_grpc.ReplicationServiceStub(channel)  # an AsyncStub on an aio channel

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
                    self._primaries[key] = Primary(self, key, lease.lease_epoch)
            elif primary is not None:
                await primary.stop("the lease moved or expired")
                del self._primaries[key]
            learn = not mine and not self.in_sync(key) and lease is not None
            learner = self._learners.get(key)
            if learn and (learner is None or learner.done()):
                self._learners[key] = asyncio.create_task(self._learn(key), name=f"learn {key}")
            elif not learn and learner is not None:
                learner.cancel()
                del self._learners[key]
        for key in list(self._primaries):
            if key not in held:
                await self._primaries.pop(key).stop("the replica is gone")
        for key in list(self._learners):
            if key not in held:
                self._learners.pop(key).cancel()

    async def catch_up(self, job: StartCatchUp, db: SerialStore) -> None:
        """The rebalance catch-up (``replica.service.CatchUp``): create the replica, let the
        learner copy it, return once this node is in the partition's in-sync set."""
        await db.call(db.store.begin_replica, job.zone, job.partition)
        await db.call(self.data.ensure, job.zone, job.partition)
        self._changed.set()  # the roles loop starts this replica's learner
        key = (job.zone, job.partition)
        async with self._view_changed:
            await self._view_changed.wait_for(lambda: self.in_sync(key))

    # -- learner -----------------------------------------------------------------------------

    async def _learn(self, key: Key) -> None:
        """Pull until in sync; on an unexpected error log it and end (``_roles`` restarts it)."""
        try:
            await self._pull(key)
        except (PlacementError, ValueError, grpc.aio.AioRpcError) as e:
            log.warning("learner of %s/%s stopped, restarting: %s", *key, e)
            await asyncio.sleep(0.5)

    async def _pull(self, key: Key) -> None:
        zone, partition = key
        ref = common_pb2.PartitionRef(zone=zone, partition=partition)
        state = await self.db.call(self.data.ensure, zone, partition)
        if not state.loading_snapshot and state.last_index > state.commit_index:
            state = await self.db.call(self.data.truncate, zone, partition, state.commit_index)
        fresh = state.last_index == 0 and not state.loading_snapshot
        while not self._closed and not self.in_sync(key):
            entry = self.view.leases.get(key)
            address = self.view.nodes.get(entry[0].node, "") if entry is not None else ""
            if entry is None or entry[0].node == self.node or not address:
                await asyncio.sleep(0.2)
                continue
            stub = self.stub(address)
            try:
                if fresh or state.loading_snapshot:
                    request = data_pb2.FetchRequest(
                        partition=ref,
                        node=self.node,
                        snapshot=True,
                        snapshot_after=state.snap_after or b"",
                        max_bytes=self.config.fetch_bytes,
                    )
                else:
                    request = data_pb2.FetchRequest(
                        partition=ref,
                        node=self.node,
                        after_index=state.last_index,
                        max_bytes=self.config.fetch_bytes,
                    )
                reply = await stub.Fetch(request, timeout=10)
            except grpc.aio.AioRpcError as e:
                log.debug("fetch %s from %s: %s", key, address, e.code())
                await asyncio.sleep(0.3)
                continue
            if reply.outcome == data_pb2.FETCH_NOT_PRIMARY:
                await asyncio.sleep(0.2)
                continue
            if reply.outcome == data_pb2.FETCH_SNAPSHOT_NEEDED:
                fresh = True
                continue
            size = sum(len(i.key) + len(i.value) for i in reply.items)
            size += sum(len(e.key) + len(e.value) for e in reply.entries)
            if request.snapshot:
                if fresh:
                    state = await self.db.call(
                        self.data.begin_snapshot,
                        zone,
                        partition,
                        reply.snapshot_index,
                        reply.snapshot_epoch,
                    )
                    fresh = False
                items = [(i.key, i.value) for i in reply.items]
                state = await self.db.call(
                    self.data.load_page, zone, partition, items, reply.snapshot_done
                )
            elif reply.entries:
                entries = [_entry(e) for e in reply.entries]
                state = await self.db.call(
                    self.data.append, zone, partition, entries, reply.commit_index
                )
            else:
                await asyncio.sleep(0.05)
            if reply.lease_epoch > state.seen_epoch and not state.loading_snapshot:
                state = await self.db.call(
                    self.data.raise_fence, zone, partition, reply.lease_epoch
                )
            await self.bucket.take(size)

    # -- sizes -------------------------------------------------------------------------------

    async def _sizes_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.config.size_interval)
            if self.put_owned is None:
                continue
            try:
                for row in await self.db.call(self.db.store.replicas):
                    key = (row.zone, row.partition)
                    size = await self.db.call(self.data.size, row.zone, row.partition)
                    if self._sizes.get(key) == size:
                        continue
                    value = encode_size(ReplicaSize(size[0], size[1], self.now_ms()))
                    await self.put_owned(self.keys.size(row.zone, row.partition, self.node), value)
                    self._sizes[key] = size
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

    async def append(self, request: data_pb2.AppendRequest) -> data_pb2.AppendResponse:
        zone, partition = request.partition.zone, request.partition.partition
        row = await self.db.call(self.db.store.replica, zone, partition)
        if row is None:
            return data_pb2.AppendResponse(outcome=data_pb2.APPEND_NOT_HOSTED)
        entries = [_entry(e) for e in request.entries]
        result, state = await self.db.call(
            self.data.follow,
            zone,
            partition,
            request.lease_epoch,
            request.prev_index,
            request.prev_epoch,
            entries,
            request.commit_index,
        )
        if entries and result is AppendResult.OK:
            await self.maybe_trim((zone, partition), len(entries))
        if result is AppendResult.STALE_EPOCH:
            outcome = data_pb2.APPEND_STALE_EPOCH
        elif result is AppendResult.MISMATCH:
            outcome = data_pb2.APPEND_MISMATCH
        else:
            outcome = data_pb2.APPEND_OK
        return data_pb2.AppendResponse(
            outcome=outcome,
            last_index=state.last_index,
            last_epoch=state.last_epoch,
            lease_epoch=state.seen_epoch,
        )

    async def fetch(self, request: data_pb2.FetchRequest) -> data_pb2.FetchResponse:
        key = (request.partition.zone, request.partition.partition)
        primary = self._serving(key)
        if not primary.ready.is_set():
            raise NotPrimary(key[0], key[1], "")
        try:
            return await primary.fetch(request)
        except Deposed as e:  # this primary object was superseded while the fetch ran
            log.info("%s/%s: fetch by %s on a superseded primary: %s", *key, request.node, e)
            raise NotPrimary(key[0], key[1], self.view.primary_hint(key)) from None

    async def read_replica(
        self, zone: str, partition: int, start_after: bytes, limit: int
    ) -> data_pb2.ReadReplicaResponse:
        row = await self.db.call(self.db.store.replica, zone, partition)
        state = await self.db.call(self.data.state, zone, partition)
        if row is None or state is None:
            return data_pb2.ReadReplicaResponse(hosted=False)
        items, more = await self.db.call(self.data.scan, zone, partition, b"", start_after, limit)
        return data_pb2.ReadReplicaResponse(
            hosted=row.complete,
            items=[data_pb2.KeyValue(key=k, value=v) for k, v in items],
            more=more,
            last_index=state.last_index,
            commit_index=state.commit_index,
        )

    # -- the in-sync set in etcd ---------------------------------------------------------------

    async def read_lease_and_isr(
        self, key: Key
    ) -> tuple[PrimaryLease | None, int, InSyncSet | None, int]:
        """Fresh from etcd, both at one revision (one read-only transaction): (lease, its mod
        revision, ISR, its mod revision); 0 = absent."""
        result = await self.client.txn([], [Get(self.keys.primary(*key)), Get(self.keys.isr(*key))])
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
        self, key: Key, lease_epoch: int, members: frozenset[str], isr_revision: int
    ) -> int:
        """Write the ISR ``members`` if this node still holds lease ``lease_epoch`` and the ISR
        is still at ``isr_revision``; returns the new ISR revision. Raises ``Deposed``."""
        for _ in range(5):
            lease, lease_rev, _isr, current_rev = await self.read_lease_and_isr(key)
            if lease is None or lease.node != self.node or lease.lease_epoch != lease_epoch:
                raise Deposed("the lease moved")
            if current_rev != isr_revision:
                raise Deposed(
                    f"the in-sync set changed under this primary ({isr_revision} -> {current_rev})"
                )
            value = InSyncSet(tuple(sorted(members)), self.node, lease_epoch, self.now_ms())
            result = await self.client.txn(
                [
                    Compare.mod(self.keys.primary(*key), "==", lease_rev),
                    Compare.mod(self.keys.isr(*key), "==", isr_revision),
                ],
                [Put(self.keys.isr(*key), encode_isr(value))],
            )
            if result.succeeded:
                return result.revision
        raise Unavailable(f"cannot record the in-sync set of {key[0]}/{key[1]}: etcd keeps racing")

    async def maybe_trim(self, key: Key, appended: int) -> None:
        """Every ``log_keep // 4`` entries appended to a partition, forget the log's oldest."""
        count = self._appended.get(key, 0) + appended
        if count < max(1, self.config.log_keep // 4):
            self._appended[key] = count
            return
        self._appended[key] = 0
        await self.db.call(self.data.trim, key[0], key[1], self.config.log_keep)

    def min_in_sync(self, zone: str) -> int:
        spec = self.view.zones.get(zone)
        return 1 if spec is None else effective_min_in_sync(spec)


class Primary:
    """One partition's primary at one lease epoch (see the module docstring)."""

    def __init__(self, plane: DataPlane, key: Key, lease_epoch: int) -> None:
        self.plane = plane
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
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._recent: list[Entry] = []
        self._task = asyncio.create_task(self._run(), name=f"primary {key}@{lease_epoch}")

    @property
    def ref(self) -> common_pb2.PartitionRef:
        return common_pb2.PartitionRef(zone=self.zone, partition=self.partition)

    async def stop(self, why: str) -> None:
        if not self.finished:
            log.info("primary %s/%s@%d stops: %s", self.zone, self.partition, self.lease_epoch, why)
        self.finished = True
        self._fail_queue(
            NotPrimary(self.zone, self.partition, self.plane.view.primary_hint(self.key))
        )
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task

    def _fail_queue(self, error: Exception) -> None:
        """Fail every write not acknowledged yet (queued, or in a batch that was cut short)."""
        queue, self._queue = self._inflight + self._queue, []
        self._inflight = []
        for write in queue:
            if not write.future.done():
                write.future.set_exception(error)

    async def submit(self, key: bytes, value: bytes | None) -> tuple[int, int, bool]:
        if self.finished:
            raise NotPrimary(self.zone, self.partition, self.plane.view.primary_hint(self.key))
        future: asyncio.Future[tuple[int, int, bool]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Write(key, value, future))
        self._wake.set()
        return await future

    @contextlib.asynccontextmanager
    async def committed(self) -> AsyncIterator[None]:
        """Hold the replication lock with every applied entry committed (reads, snapshots)."""
        try:
            await asyncio.wait_for(self.ready.wait(), self.plane.config.isr_timeout * 2)
        except TimeoutError:
            raise Unavailable(
                f"{self.zone}/{self.partition}: the primary is still reconciling"
            ) from None
        async with self._lock:
            if self.state.commit_index < self.state.last_index:
                try:
                    await self._replicate(self.state.last_index)
                except Deposed:
                    self.finished = True
                    raise NotPrimary(self.zone, self.partition, "") from None
            yield

    # -- the replication task ------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._reconcile()
            self.ready.set()
            while True:
                try:
                    await asyncio.wait_for(self._wake.wait(), self.plane.config.heartbeat)
                except TimeoutError:
                    await self._heartbeat()
                    continue
                self._wake.clear()
                while self._queue:
                    batch = self._queue[: self.plane.config.batch_max]
                    del self._queue[: len(batch)]
                    self._inflight = batch
                    await self._commit_batch(batch)
                    self._inflight = []
        except Deposed as e:
            log.info("primary %s/%s@%d deposed: %s", self.zone, self.partition, self.lease_epoch, e)
        except Unavailable as e:  # expected (members away, below the minimum): retried next tick
            log.warning("primary %s/%s@%d: %s", self.zone, self.partition, self.lease_epoch, e)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("primary %s/%s@%d failed", self.zone, self.partition, self.lease_epoch)
        finally:
            self.finished = True
            self._fail_queue(
                NotPrimary(self.zone, self.partition, self.plane.view.primary_hint(self.key))
            )

    async def _reconcile(self) -> None:
        """Fence, make sure an ISR exists and holds this node, bring every member to this log."""
        plane, db = self.plane, self.plane.db
        self.state = await db.call(
            plane.data.raise_fence, self.zone, self.partition, self.lease_epoch
        )
        lease, _rev, isr, isr_rev = await plane.read_lease_and_isr(self.key)
        if lease is None or lease.node != plane.node or lease.lease_epoch != self.lease_epoch:
            raise Deposed("the lease is not this node's")
        if isr is None:
            isr_rev = await plane.write_isr(self.key, self.lease_epoch, frozenset({plane.node}), 0)
            isr = InSyncSet((plane.node,), plane.node, self.lease_epoch, 0)
        if plane.node not in isr.members:
            raise Deposed("this node is not in the in-sync set")
        self.isr_revision = isr_rev
        self.members = {m: self.state.last_index for m in isr.members if m != plane.node}
        async with self._lock:
            await self._replicate(self.state.last_index)

    async def _commit_batch(self, batch: list[_Write]) -> None:
        plane = self.plane
        async with self._lock:
            self._check_lease()
            if len(self.members) + 1 < plane.min_in_sync(self.zone):
                # Try to bring the pending tail in anyway; it fails if members stay away.
                error = Unavailable(
                    f"{self.zone}/{self.partition}: in-sync set {len(self.members) + 1} is below"
                    f" the zone's minimum {plane.min_in_sync(self.zone)}; writes are refused until"
                    " replicas catch up"
                )
                for write in batch:
                    write.future.set_exception(error)
                return
            index, epoch = self.state.last_index, self.lease_epoch
            entries = [
                Entry(index + i, epoch, w.key, w.value or b"", w.value is None)
                for i, w in enumerate(batch, 1)
            ]
            self.state, existed = await plane.db.call(
                plane.data.append_writes,
                self.zone,
                self.partition,
                entries,
                self.state.commit_index,
            )
            self._remember(entries)
            try:
                await self._replicate(self.state.last_index)
            except (Unavailable, Deposed) as e:
                for write in batch:
                    if not write.future.done():
                        write.future.set_exception(
                            e
                            if isinstance(e, Unavailable)
                            else NotPrimary(self.zone, self.partition, "")
                        )
                if isinstance(e, Deposed):
                    raise
                return
            for write, entry, had in zip(batch, entries, existed, strict=True):
                if not write.future.done():
                    write.future.set_result((entry.index, epoch, had))
            await plane.maybe_trim(self.key, len(entries))

    async def _heartbeat(self) -> None:
        """Idle: an empty append to every member, so a member that left (NOT_HOSTED) or went
        silent leaves the ISR within ``isr_timeout`` even without writes, and followers learn
        the commit index."""
        if not self.members:
            self._check_lease()
            return
        async with self._lock:
            try:
                await self._replicate(self.state.last_index)
            except Unavailable as e:
                log.debug("heartbeat of %s/%s: %s", self.zone, self.partition, e)

    async def _set_isr(self, members: frozenset[str], joined: dict[str, int] | None = None) -> None:
        """Record the ISR ``members`` in etcd, then make ``self.members`` (every other member,
        with its match index; ``joined`` gives the new ones') agree with it. Shielded: a fetch
        cancelled by its learner must never leave etcd and memory disagreeing — an ISR member
        the primary does not replicate to would break every acknowledgement's promise."""

        async def write() -> None:
            self.isr_revision = await self.plane.write_isr(
                self.key, self.lease_epoch, members, self.isr_revision
            )
            log.info("%s/%s: in-sync set is now %s", self.zone, self.partition, sorted(members))
            joined_now = joined or {}
            self.members = {
                m: self.members.get(m, joined_now.get(m, 0))
                for m in sorted(members)
                if m != self.plane.node
            }

        await asyncio.shield(asyncio.ensure_future(write()))

    def _check_lease(self) -> None:
        if not self.plane.lease_ok(self.key, self.lease_epoch):
            raise Deposed("the lease expired or moved")

    def _remember(self, entries: list[Entry]) -> None:
        self._recent.extend(entries)
        if len(self._recent) > 4096:
            del self._recent[:-2048]

    async def _replicate(self, upto: int) -> None:
        """Bring every member to ``upto``; drop those that fail (never below the minimum);
        then commit ``upto``. Raises Unavailable (nothing committed) or Deposed."""
        plane = self.plane
        self._check_lease()
        names = list(self.members)
        results = await asyncio.gather(*(self._sync(m, upto) for m in names))
        failed = {m for m, ok in zip(names, results, strict=True) if not ok}
        if failed:
            keep = frozenset(self.members) - failed | {plane.node}
            if len(keep) < plane.min_in_sync(self.zone):
                raise Unavailable(
                    f"{self.zone}/{self.partition}: {sorted(failed)} do not answer and the in-sync"
                    f" set may not shrink below {plane.min_in_sync(self.zone)}; write refused"
                )
            await self._set_isr(keep)
            log.warning(
                "%s/%s: removed %s from the in-sync set", self.zone, self.partition, sorted(failed)
            )
        self.state = await plane.db.call(plane.data.set_commit, self.zone, self.partition, upto)

    async def _sync(self, member: str, upto: int) -> bool:
        """Send ``member`` what it lacks up to ``upto``; False = drop it from the ISR."""
        plane = self.plane
        address = plane.view.nodes.get(member)
        if not address:
            return False
        stub = plane.stub(address)
        deadline = time.monotonic() + plane.config.isr_timeout
        for _ in range(8):
            after = self.members.get(member, 0)
            if after < self.state.base_index:
                return False  # needs a snapshot: it becomes a learner
            prev_epoch, entries = await self._entries(after, upto)
            request = data_pb2.AppendRequest(
                partition=self.ref,
                lease_epoch=self.lease_epoch,
                primary=plane.node,
                prev_index=after,
                prev_epoch=prev_epoch,
                entries=[_entry_pb(e) for e in entries],
                commit_index=self.state.commit_index,
            )
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                return False
            self._check_lease()  # a primary paused past its lease sends nothing when it wakes
            try:
                reply = await stub.Append(request, timeout=timeout)
            except grpc.aio.AioRpcError as e:
                log.info("%s/%s: append to %s: %s", self.zone, self.partition, member, e.code())
                return False
            if reply.outcome == data_pb2.APPEND_STALE_EPOCH:
                raise Deposed(f"{member} has seen lease epoch {reply.lease_epoch}")
            if reply.outcome == data_pb2.APPEND_NOT_HOSTED:
                return False
            if reply.outcome == data_pb2.APPEND_OK:
                self.members[member] = reply.last_index
                if reply.last_index >= upto:
                    return True
                continue
            self.members[member] = min(reply.last_index, self.state.last_index)
        return False

    async def _entries(self, after: int, upto: int) -> tuple[int, list[Entry]]:
        """The epoch at ``after`` and the entries ``(after, upto]`` (bounded in count and
        bytes): from the entries this primary wrote recently, else from its log."""
        plane = self.plane
        recent = self._recent
        if recent and recent[0].index <= after and recent[-1].index >= upto:
            start = after - recent[0].index
            return recent[start].epoch, recent[start + 1 : start + 1 + min(upto - after, 2000)]
        epoch = await plane.db.call(
            plane.data.epoch_at, self.zone, self.partition, after, self.state
        )
        entries = await plane.db.call(
            plane.data.entries, self.zone, self.partition, after, upto, plane.config.fetch_bytes
        )
        return (epoch or 0), entries

    # -- learners ------------------------------------------------------------------------------

    async def fetch(self, request: data_pb2.FetchRequest) -> data_pb2.FetchResponse:
        plane = self.plane
        async with self.committed():
            if request.snapshot:
                items, done = await plane.db.call(
                    plane.data.snapshot_page,
                    self.zone,
                    self.partition,
                    request.snapshot_after,
                    request.max_bytes or plane.config.fetch_bytes,
                )
                epoch = await plane.db.call(
                    plane.data.epoch_at,
                    self.zone,
                    self.partition,
                    self.state.commit_index,
                    self.state,
                )
                return data_pb2.FetchResponse(
                    outcome=data_pb2.FETCH_OK,
                    items=[data_pb2.KeyValue(key=k, value=v) for k, v in items],
                    snapshot_done=done,
                    snapshot_index=self.state.commit_index,
                    snapshot_epoch=epoch or 0,
                    commit_index=self.state.commit_index,
                    lease_epoch=self.lease_epoch,
                )
            if request.after_index < self.state.base_index:
                return data_pb2.FetchResponse(outcome=data_pb2.FETCH_SNAPSHOT_NEEDED)
            entries = await plane.db.call(
                plane.data.entries,
                self.zone,
                self.partition,
                request.after_index,
                self.state.commit_index,
                request.max_bytes or plane.config.fetch_bytes,
            )
            reached = entries[-1].index if entries else request.after_index
            if (
                reached == self.state.last_index
                and request.node not in self.members
                and request.node != plane.node
            ):
                members = frozenset(self.members) | {plane.node, request.node}
                await self._set_isr(members, {request.node: reached})
            return data_pb2.FetchResponse(
                outcome=data_pb2.FETCH_OK,
                entries=[_entry_pb(e) for e in entries],
                commit_index=self.state.commit_index,
                lease_epoch=self.lease_epoch,
            )


def _entry(e: data_pb2.LogEntry) -> Entry:
    return Entry(e.index, e.epoch, e.key, e.value, e.delete)


def _entry_pb(e: Entry) -> data_pb2.LogEntry:
    return data_pb2.LogEntry(
        index=e.index, epoch=e.epoch, key=e.key, value=e.value, delete=e.delete
    )
