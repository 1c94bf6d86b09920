"""The agent's data plane: which role it plays for each partition replica it holds, and routing.

Design: design/data-plane.md. Roles are derived, every ``tick`` and on every change of the
agent's etcd view (:class:`~replica.data.view.View`: zones, primary leases, in-sync sets, nodes,
assignments), from the replica records in the agent store:

* **primary** (:class:`~replica.data.primary.Primary`): holds the lease and is in the ISR (or no
  ISR exists yet).
* **follower** (:func:`~replica.data.follower.answer_appends`): in the ISR, not primary —
  answers the appends of the primaries' ``Replicate`` calls (the pair streams).
* **learner** (:class:`~replica.data.follower.Learner`): holds a replica, not in the ISR — pulls
  from the primary until the primary adds it to the ISR.

A rebalance's catch-up (``catch_up``) creates the replica and waits until its node is in the ISR.
Client requests go to the partition's primary; the ISR in etcd is read and written through
:class:`~placement.metastore.store.Metastore`; other agents are reached through
:class:`~replica.data.peers.ReplicationPeers` (one pair link per node). Primaries hibernate: this
module pokes one when a member's node record goes, its pair link goes down, or the partition's
assignment changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from placement.aio import Coalescer, Pulse, cancel_and_wait, wait_event
from placement.core.layout import Reshard, check_partitions
from placement.core.model import effective_min_in_sync
from placement.core.names import validate_name
from placement.core.retry import Clock
from placement.data.partitioning import partition_of
from placement.errors import InvalidInput, PlacementError
from placement.metastore.codec import (
    InSyncSet,
    PrimaryLease,
    ReplicaSize,
    decode_isr,
    encode_size,
)
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import AssignField, KeySpace
from placement.metastore.kv import KeyValue
from placement.metastore.listwatch import Follower, ListWatch
from placement.metastore.store import IsrWrite, Metastore
from placement.metrics import CATCH_UP_RATE, CATCH_UP_SECONDS, LEASES_LOST, GaugeFamily
from placement.security.tls import TlsMaterial
from replica.data.follower import (
    Learner,
    LearnerDeps,
    TokenBucket,
    answer_appends,
    unproven,
    view_lags,
)
from replica.data.isr_writes import IsrWrites
from replica.data.model import (
    AppendCall,
    AppendReply,
    Deposed,
    FetchCall,
    FetchReply,
    Key,
    NotPrimary,
    ReplicaPage,
    Sealed,
    Unavailable,
    UnknownZone,
    WrongLayout,
    WrongNode,
)
from replica.data.peers import MAX_BATCH_APPENDS, LinkConfig, ReplicationPeers
from replica.data.primary import Primary, PrimaryDeps
from replica.data.resharding import ReshardDeps, Resharding
from replica.data.view import Changes, View
from replica.data.yielding import WINDOW, WriteGauge, YieldingRate
from replica.protocol import StartCatchUp
from replica.records import AgentStore, NotHosted, StoreThread

log = logging.getLogger(__name__)

#: In-sync-set reads per batch (``Metastore.read_keys`` splits it within etcd's op limit).
ISR_READS_PER_BATCH = 512

#: The longest a write refused by a re-sharding seal waits at the agent for the cut-over before
#: it is answered "sealed, retry shortly" (``DataPlane.write``).
SEAL_PARK = 1.0

#: The longest a follower waits for its view to show the lease an append claims.
LEASE_LAG_WAIT = 1.0

#: Puts keys this agent owns (its replica sizes: key -> value) under its registration lease.
PutOwned = Callable[[dict[bytes, bytes]], Awaitable[None]]


#: Seconds a stopping agent waits for the next of its leases to be handed over before it gives
#: up (the leader hands them all over in one pass, a fraction of a second after the request).
HAND_OVER_STALL = 1.5


@dataclass(frozen=True, slots=True)
class DataConfig:
    """Tunables; times in seconds."""

    isr_timeout: float = 3.0
    lease_margin_ms: int = 500
    catch_up_bytes_per_s: float = 64e6
    #: Run the catch-up throttle below its rate while it slows client writes
    #: (``replica.data.yielding``); False: always at ``catch_up_bytes_per_s``.
    catch_up_yields: bool = True
    fetch_bytes: int = 1 << 20
    log_keep: int = 20_000
    size_interval: float = 10.0
    batch_max: int = 512
    #: Full roles pass when nothing changed (lease expiry by the clock, a primary or learner
    #: that ended to restart); changes are handled at once, for the partitions they concern.
    tick: float = 2.0
    #: A pair link's heartbeat when idle, and a primary's commit notice after a write burst.
    heartbeat: float = 1.0


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
        tls: TlsMaterial | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.node = node
        #: Told when the agent's view of etcd stops for good (a watch that failed, e.g. on a
        #: credential etcd now refuses): serving on a frozen view would be wrong.
        self.on_fatal = on_fatal
        self.db = db
        self.data = db.store.data
        self.client = client
        self.keys = keys
        self.metastore = Metastore(client, keys)
        self._isr_writes = IsrWrites(self.metastore)
        #: Linearizable in-sync-set reads of the rebalance decisions, batched (a burst of moves
        #: asks about hundreds of partitions at once: one read transaction, not hundreds).
        self._isr_reads: Coalescer[bytes, KeyValue | None] = Coalescer(
            self.metastore.read_keys, limit=ISR_READS_PER_BATCH, name="isr-reads"
        )
        self.config = config or DataConfig()
        self.clock = clock
        self.put_owned = put_owned
        self.view = View(keys)
        self.peers = ReplicationPeers(
            node,
            LinkConfig(heartbeat=self.config.heartbeat, down_after=self.config.isr_timeout),
            on_down=self._link_down,
            tls=tls,
        )
        self._watches: list[ListWatch] = []
        self._pending = Changes()
        #: The replicas this agent holds, as of the last full roles pass (or a catch-up since).
        self._held: set[Key] = set()
        self._primaries: dict[Key, Primary] = {}
        self._learners: dict[Key, asyncio.Task[None]] = {}
        #: Partitions whose learner a retire's decision holds stopped (how many hold it).
        self._learners_paused: dict[Key, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()
        #: Set when a fact a re-sharding report carries changed: put it now (``_reports_loop``).
        self._reports_due = asyncio.Event()
        #: Fired whenever a zone's layout changes: writes refused by a re-sharding
        #: seal wait on it for the cut-over (``write``).
        self._layouts_moved = Pulse()
        #: Fired whenever a partition's lease or ISR changes in the view: an
        #: append whose lease the view does not show yet waits on it (``append_many``).
        self._leases_moved = Pulse()
        #: Catch-ups waiting for their node to be in a partition's ISR.
        self._joining: dict[Key, asyncio.Event] = {}
        #: Caught-up learners waiting for a change of their partition (``_learner_idle``).
        self._idle_learners: dict[Key, asyncio.Event] = {}
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
            member_gone=self.member_gone,
            holders=lambda key: self.view.holders(key),
            replaced=self.replaced,
            assignment_revisions=self.view.assignment_revisions,
        )
        #: The catch-up throttle, shared by learners and re-sharding's copies.
        self._catch_up_bucket = TokenBucket(
            self.config.catch_up_bytes_per_s, page_bytes=self.config.fetch_bytes
        )
        #: Client writes acknowledged here, and the rate the bucket runs at because of them.
        self.writes = WriteGauge()
        self._yielding = YieldingRate(
            self.config.catch_up_bytes_per_s if self.config.catch_up_yields else 0.0
        )
        self._resharding = Resharding(
            ReshardDeps(
                node=node,
                db=db,
                fetch_bytes=self.config.fetch_bytes,
                send_fetch=self.peers.fetch,
                bucket=self._catch_up_bucket,
                leader_of=self._primary_of,
                put_owned=self._put_owned_now,
                report_key=keys.reshard_report,
                now_ms=self.now_ms,
                notify=self._reports_due.set,
            )
        )
        self._learner_deps = LearnerDeps(
            node=node,
            db=db,
            fetch_bytes=self.config.fetch_bytes,
            send_fetch=self.peers.fetch,
            bucket=self._catch_up_bucket,
            primary_of=self._primary_of,
            done=lambda key: self._closed or self.in_sync(key),
            idle=self._learner_idle,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        for prefix in (
            self.keys.zones_prefix(),
            self.keys.layout_prefix(),
            self.keys.primary_prefix(),
            self.keys.isr_prefix(),
            self.keys.nodes_prefix(),
            self.keys.assign_prefix(),
        ):
            watch = ListWatch(self.client, prefix)
            await watch.start()
            # Followed from its first list on (nothing awaited in between): each change costs
            # the keys it names, not a copy of the prefix (tens of thousands of keys in a fleet).
            follower = watch.follow()
            self._watches.append(watch)
            self.view.apply(watch.live().keys(), watch.live())
            self._tasks.append(asyncio.create_task(self._follow_watch(watch, follower)))
        self._tasks.append(asyncio.create_task(self._roles_loop(), name="data-roles"))
        self._tasks.append(asyncio.create_task(self._sizes_loop(), name="data-sizes"))
        self._tasks.append(asyncio.create_task(self._reports_loop(), name="reshard-reports"))
        CATCH_UP_RATE.set(self._catch_up_bucket.rate)
        if self._yielding.ceiling > 0:
            self._tasks.append(asyncio.create_task(self._yield_loop(), name="catch-up-yield"))

    async def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for primary in list(self._primaries.values()):
            await primary.stop("the agent is shutting down")
        for task in self._learners.values():
            task.cancel()
        await self._resharding.close()
        await asyncio.gather(*self._tasks, *self._learners.values(), return_exceptions=True)
        for watch in self._watches:
            await watch.close()
        await self._isr_writes.close()
        await self._isr_reads.close()
        await self.peers.close()

    async def _follow_watch(self, watch: ListWatch, follower: Follower) -> None:
        try:
            await self._follow(watch, follower)
        except PlacementError as e:
            if self._closed:
                return
            log.error("the agent's view of etcd stopped: %s", e)
            if self.on_fatal is not None:
                self.on_fatal(e)

    async def _follow(self, watch: ListWatch, follower: Follower) -> None:
        seen = -1  # apply at once what changed since the follower was made
        while not self._closed:
            seen = await watch.wait_change(seen)
            changes = self.view.apply(follower.take(), watch.live())
            if not changes:
                continue
            self._note(changes)
            if changes.zones:
                self._layouts_moved.fire()
            if changes.partitions:
                self._leases_moved.fire()
            if changes.zones and not self._closed:
                # A layout moved on (a seal to write, a copy to finish unthrottled): at once,
                # not after the roles pass, which waits for the store behind the writes.
                self._resharding.sync(self._primaries, self._reshards())
            for key in changes.partitions & self._joining.keys():
                if self.in_sync(key):
                    self._joining[key].set()
            for key in (changes.partitions | changes.assignments) & self._idle_learners.keys():
                self._idle_learners[key].set()

    def _note(self, changes: Changes) -> None:
        if self.node in changes.terms:  # this node's leases may start or end with its term
            mine = {k for k, (lease, _) in self.view.leases.items() if lease.node == self.node}
            changes.partitions |= mine
        pending = self._pending
        pending.assignments |= changes.assignments
        pending.partitions |= changes.partitions
        pending.nodes |= changes.nodes
        pending.zones |= changes.zones
        self._changed.set()

    def _link_down(self, node: str) -> None:
        """A pair link found ``node`` silent for ``isr_timeout``: wake its partitions."""
        self._note(Changes(nodes={node}))

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def leases_held(self) -> int:
        """Unexpired primary leases naming this node, as its view shows them."""
        now = self.now_ms()
        return sum(
            1
            for lease, _ in self.view.leases.values()
            if lease.node == self.node and self.view.lease_until(lease) > now
        )

    async def hand_over(self, within: float, stall: float = HAND_OVER_STALL) -> int:
        """Wait until no lease names this node any more — the leader hands them over once the
        node record says it stops — at most ``within`` seconds, and no longer than ``stall``
        seconds without one moving (no taker: every other member stopping too, say, or no
        leader); returns how many it still holds (they move on expiry)."""
        deadline = time.monotonic() + within
        held = self.leases_held()
        progress = time.monotonic()
        while held:
            now = time.monotonic()
            left = min(deadline - now, progress + stall - now)
            if left <= 0:
                break
            await wait_event(self._leases_moved.round, min(left, 0.2))
            if (now_held := self.leases_held()) < held:
                progress = time.monotonic()
            held = now_held
        return held

    def lease_ok(self, key: Key, lease_epoch: int) -> bool:
        """This node holds lease ``lease_epoch`` of ``key`` by its own clock (with a margin)."""
        entry = self.view.leases.get(key)
        if entry is None:
            return False
        lease = entry[0]
        return (
            lease.node == self.node
            and lease.lease_epoch == lease_epoch
            and self.now_ms() < self.view.lease_until(lease) - self.config.lease_margin_ms
        )

    async def isr_names_me(self, zone: str, partition: int) -> bool | None:
        """Whether the partition's in-sync set names this node as etcd has it now (one
        linearizable read, not the watched view, which may lag); None when it has none yet (a
        new partition: no write was ever acknowledged). Raises when etcd cannot be read or
        the record cannot be decoded."""
        found = await self._isr_reads.submit(self.keys.isr(zone, partition))
        if found is None:
            return None
        isr = decode_isr(found.value)
        if not isinstance(isr, InSyncSet):
            raise PlacementError(f"the in-sync set of {zone}/{partition} cannot be read: {isr}")
        return self.node in isr.members

    @contextlib.asynccontextmanager
    async def learner_paused(self, zone: str, partition: int) -> AsyncIterator[None]:
        """Stop the partition's learner (its fetch cancelled and ended) and keep it from
        starting until the context ends; then the roles pass judges it again. A retire holds
        it over its read of the in-sync set and the discard (design/data-plane.md, "A learner's
        join")."""
        key = (zone, partition)
        self._learners_paused[key] = self._learners_paused.get(key, 0) + 1
        try:
            learner = self._learners.pop(key, None)
            if learner is not None:
                await cancel_and_wait(learner)
            yield
        finally:
            left = self._learners_paused.pop(key) - 1
            if left:
                self._learners_paused[key] = left
            self._note(Changes(partitions={key}))

    def in_sync(self, key: Key) -> bool:
        entry = self.view.isrs.get(key)
        return entry is not None and self.node in entry[0].members

    def named(self, key: Key) -> bool:
        """Whether the partition's stable or pending names this node (True when unknown)."""
        holders = self.view.holders(key)
        return holders is None or self.node in holders

    async def _learner_idle(self, key: Key, at_most: float) -> None:
        """A caught-up learner's wait (``LearnerDeps.idle``): until the partition's lease, ISR
        or assignment changes in the view, at most ``at_most`` seconds."""
        event = self._idle_learners[key] = asyncio.Event()
        try:
            await wait_event(event, at_most)
        finally:
            if self._idle_learners.get(key) is event:
                del self._idle_learners[key]

    async def _put_owned_now(self, items: dict[bytes, bytes]) -> None:
        """``put_owned`` as set now (the agent sets it once registered)."""
        if self.put_owned is not None:
            await self.put_owned(items)

    def _reshards(self) -> dict[str, tuple[Reshard | None, int, int]]:
        """Per zone: its reshard (None = none), its layout's count and revision (the view)."""
        return {
            zone: (layout.reshard, layout.partitions, self.view.layout_revisions.get(zone, 0))
            for zone, layout in self.view.layouts.items()
        }

    def _primary_of(self, key: Key) -> tuple[str, str] | None:
        entry = self.view.leases.get(key)
        if entry is None:
            return None
        holder = entry[0].node
        return holder, self.view.nodes.get(holder, "")

    def min_in_sync(self, zone: str) -> int:
        spec = self.view.zones.get(zone)
        return 1 if spec is None else effective_min_in_sync(spec)

    async def _reports_loop(self) -> None:
        """Re-sharding reports whose facts changed (caught up, drained, purged) are put as soon
        as they change, not at the end of the next roles pass: a destination's "drained" is what
        the cut-over waits for, and the roles pass after a layout change first waits for the
        store behind the writes (design/resharding.md, SEAL). The roles pass still puts the
        periodic progress."""
        while not self._closed:
            await self._reports_due.wait()
            self._reports_due.clear()
            try:
                self._resharding.sync(self._primaries, self._reshards())
                await self._resharding.send_reports(time.monotonic())
            except PlacementError as e:
                log.warning("re-sharding reports: %s", e)

    # -- roles -------------------------------------------------------------------------------

    async def _roles_loop(self) -> None:
        """A full pass (every replica record, read from the store) every ``tick``; in between,
        passes over only the partitions whose lease, ISR or assignment changed."""
        full_due = 0.0
        while not self._closed:
            self._changed.clear()
            changes, self._pending = self._pending, Changes()
            try:
                if time.monotonic() >= full_due or changes.zones or changes.nodes:
                    rows = await self.db.call(self.db.store.replicas)
                    self._held = {(r.zone, r.partition) for r in rows}
                    full_due = time.monotonic() + self.config.tick
                    await self._roles(self._held, full=True)
                else:
                    touched = changes.partitions | changes.assignments
                    await self._roles(touched & self._held, full=False)
                self._poke(changes)
                await self._keep_links()
                self._resharding.sync(self._primaries, self._reshards())
                await self._resharding.send_reports(time.monotonic())
            except PlacementError as e:
                log.warning("data plane: %s", e)
            except Exception:  # a bug: logged with its traceback; the roles loop must go on
                log.exception("data plane: roles pass failed")
            await wait_event(self._changed, max(0.0, full_due - time.monotonic()))

    def _poke(self, changes: Changes) -> None:
        """Wake the hibernating primaries a change concerns (design/data-plane.md)."""
        if not (changes.assignments or changes.nodes):
            return
        for key, primary in self._primaries.items():
            if key in changes.assignments or not changes.nodes.isdisjoint(primary.members):
                primary.poke()

    async def _keep_links(self) -> None:
        """A pair link to every node that is an ISR member of a partition this node leads."""
        wanted = {m for p in self._primaries.values() if not p.finished for m in p.members}
        await self.peers.keep({m: self.view.nodes.get(m, "") for m in wanted})

    def member_gone(self, key: Key, member: str) -> str:
        """Why ISR member ``member`` of ``key`` should leave the ISR now ("" = it should not)."""
        if member not in self.view.nodes:
            return "its node is not registered"
        if self.peers.is_down(member):
            return "its pair link is down"
        holders = self.view.holders(key)
        if holders is not None and member not in holders:
            return "the assignment no longer names it"
        return ""

    def replaced(self, key: Key, member: str) -> str:
        """Why ISR member ``member`` of ``key`` will not come back ("" = it may): its node is
        not registered and the partition's pending assignment — the move under way, which
        replaces it — does not name it."""
        if member in self.view.nodes:
            return ""
        pending = (self.view.assignments.get(key) or {}).get(AssignField.PENDING)
        if pending is None or member in pending:
            return ""
        return "its node is not registered and the move under way replaces it"

    async def _roles(self, keys: set[Key], *, full: bool) -> None:
        """Start or stop each of ``keys``' primary and learner; a ``full`` pass (``keys`` = every
        replica held) also stops those of replicas that are gone."""
        held = self._held
        for key in keys:
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
                    LEASES_LOST.labels("moved").inc()
                    await primary.stop("a newer lease epoch")
                    primary = None
                if primary is None or primary.finished:
                    self._primaries[key] = Primary(self._primary_deps, key, lease.lease_epoch)
            elif primary is not None:
                still_mine = lease is not None and lease.node == self.node
                expired = (
                    still_mine and lease is not None and lease.lease_epoch == primary.lease_epoch
                )
                LEASES_LOST.labels("expired" if expired else "moved").inc()
                await primary.stop("the lease moved or expired")
                del self._primaries[key]
            # Not for a replica the assignment no longer names (leaving, not retired yet): its
            # primary would never add it, and it polled the primary until the retire came.
            learn = (
                not mine
                and not self.in_sync(key)
                and lease is not None
                and self.named(key)
                and key not in self._learners_paused
            )
            learner = self._learners.get(key)
            if learn and (learner is None or learner.done()):
                self._learners[key] = asyncio.create_task(
                    Learner(self._learner_deps, key).run(), name=f"learn {key}"
                )
            elif not learn and learner is not None:
                learner.cancel()
                del self._learners[key]
        if not full:
            return
        for key in list(self._primaries):
            if key not in held:
                await self._primaries.pop(key).stop("the replica is gone")
        for key in list(self._learners):
            if key not in held:
                self._learners.pop(key).cancel()

    def gauges(self) -> list[GaugeFamily]:
        """This agent's state gauges (read at scrape time from plain containers: safe from the
        metrics thread)."""
        replicas: dict[str, int] = {}
        for zone, _ in list(self._held):
            replicas[zone] = replicas.get(zone, 0) + 1
        primaries: dict[str, int] = {}
        isr_sizes: dict[tuple[str, ...], float] = {}
        for key, primary in list(self._primaries.items()):
            if primary.finished:
                continue
            primaries[key[0]] = primaries.get(key[0], 0) + 1
            isr = self.view.isrs.get(key)
            size = str(len(isr[0].members)) if isr is not None else "0"
            isr_sizes[(key[0], size)] = isr_sizes.get((key[0], size), 0) + 1
        learners: dict[str, int] = {}
        for key, task in list(self._learners.items()):
            if not task.done():
                learners[key[0]] = learners.get(key[0], 0) + 1
        zones = set(replicas) | set(primaries)
        return [
            GaugeFamily(
                "placement_agent_replicas",
                "Replicas of the zone this agent hosts.",
                ("zone",),
                {(z,): replicas.get(z, 0) for z in zones},
            ),
            GaugeFamily(
                "placement_agent_primaries",
                "Partitions of the zone this agent leads (holds the primary lease of).",
                ("zone",),
                {(z,): primaries.get(z, 0) for z in zones},
            ),
            GaugeFamily(
                "placement_agent_isr_size",
                "Partitions this agent leads, by the size of their in-sync set (0: none yet).",
                ("zone", "size"),
                isr_sizes,
            ),
            GaugeFamily(
                "placement_agent_learners",
                "Replicas of the zone catching up on this agent (not in the in-sync set yet).",
                ("zone",),
                {(z,): learners.get(z, 0) for z in zones | set(learners)},
            ),
        ]

    async def catch_up(self, job: StartCatchUp, db: StoreThread) -> None:
        """The rebalance catch-up (``replica.service.CatchUp``): create the replica, let the
        learner copy it, return once this node is in the partition's in-sync set. A learner
        still running for the partition is stopped first: it may remember a replica that was
        retired since, and this one may be new."""
        key = (job.zone, job.partition)
        stale = self._learners.pop(key, None)
        if stale is not None:
            stale.cancel()
        await db.group(_begin_replica, db.store, job.zone, job.partition)
        self._held.add(key)
        self._note(Changes(partitions={key}))  # the roles loop starts this replica's learner
        joined = self._joining.setdefault(key, asyncio.Event())
        started = time.monotonic()
        try:
            if not self.in_sync(key):
                await joined.wait()
        finally:
            self._joining.pop(key, None)
        CATCH_UP_SECONDS.observe(time.monotonic() - started)

    # -- sizes -------------------------------------------------------------------------------

    async def _yield_loop(self) -> None:
        """Every ``yielding.WINDOW``: the catch-up bucket's rate from the client writes of the
        window (``replica.data.yielding``)."""
        while not self._closed:
            await asyncio.sleep(WINDOW)
            was = self._catch_up_bucket.rate
            rate = self._catch_up_bucket.rate = self._yielding.step(*self.writes.take())
            CATCH_UP_RATE.set(rate)
            if rate != was:
                log.debug("catch-up rate %.0f B/s (ceiling %.0f)", rate, self._yielding.ceiling)

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

    def _check(self, zone: str, partition: int, key: bytes | None, generation: int = 0) -> Key:
        """A client request's partition (and key) under the zone's layout in force
        (design/resharding.md): another ``generation`` than that layout's (0 = not given) is
        :class:`WrongLayout`; a key of another partition is InvalidInput."""
        if zone not in self.view.zones:
            raise UnknownZone(f"zone {zone!r} does not exist")
        layout = self.view.layouts.get(zone)
        if layout is None:
            raise Unavailable(f"zone {zone!r} has no data layout yet; retry shortly")
        if generation and generation != layout.generation:
            hint = (
                self.view.primary_hint((zone, partition_of(key, layout.partitions)))
                if key is not None
                else ""
            )
            raise WrongLayout(zone, generation, layout.generation, layout.partitions, hint)
        count = layout.partitions
        if not 0 <= partition < count:
            raise InvalidInput("partition", f"{partition} is not in 0..{count - 1}")
        if key is not None and partition_of(key, count) != partition:
            raise InvalidInput(
                "partition",
                f"key belongs to partition {partition_of(key, count)}, not {partition}",
                "compute it with placement.data.partitioning.partition_of",
            )
        return (zone, partition)

    def _serving(self, key: Key) -> Primary:
        primary = self._primaries.get(key)
        if primary is None or primary.finished or not self.lease_ok(key, primary.lease_epoch):
            raise NotPrimary(key[0], key[1], self.view.primary_hint(key))
        return primary

    async def write(
        self,
        zone: str,
        partition: int,
        key: bytes,
        value: bytes | None,
        generation: int = 0,
        park: float = 0.0,
    ) -> tuple[int, int, bool]:
        """Put (``value``) or delete (None); returns (index, lease_epoch, existed).

        A write refused by a re-sharding seal waits up to ``park`` seconds (at most
        ``SEAL_PARK``) for the zone's layout to change — the flip, or an abort — and is then
        checked and tried again: after the flip it is refused as routed under the old layout
        (the client re-routes at once), after an abort it is tried again (applied once the
        seal is dropped, else answered "sealed, retry shortly"). Clients used to retry
        sealed writes every 20 ms: 16 writers made 800 refused calls a second on agents busy
        with the very drain the cut-over waits for (design/resharding.md, SEAL)."""
        moved = self._layouts_moved.round  # before the attempt: a flip right after it is not missed
        k = self._check(zone, partition, key, generation)
        try:
            return await self._submit(k, key, value)
        except Sealed:
            if park <= 0:
                raise
            await wait_event(moved, min(park, SEAL_PARK))
        k = self._check(zone, partition, key, generation)
        return await self._submit(k, key, value)

    async def _submit(self, k: Key, key: bytes, value: bytes | None) -> tuple[int, int, bool]:
        """A client write through ``k``'s primary, timed for the catch-up's yielding."""
        started = time.monotonic()
        result = await self._serving(k).submit(key, value)
        self.writes.record(time.monotonic() - started)
        return result

    async def get(self, zone: str, partition: int, key: bytes, generation: int = 0) -> bytes | None:
        k = self._check(zone, partition, key, generation)
        primary = self._serving(k)
        async with primary.committed():
            return await self.db.call(self.data.get, zone, partition, key)

    async def scan(
        self,
        zone: str,
        partition: int,
        prefix: bytes,
        start_after: bytes,
        limit: int,
        generation: int = 0,
    ) -> tuple[list[tuple[bytes, bytes]], bool]:
        k = self._check(zone, partition, None, generation)
        primary = self._serving(k)
        routed = self.view.layouts[zone].partitions  # only this partition's keys, no control key
        async with primary.committed():
            return await self.db.call(
                self.data.scan, zone, partition, prefix, start_after, limit, 1 << 20, routed
            )

    def check_replicate(self, from_node: str, to_node: str, appends: int) -> None:
        """A ``Replicate`` must come from a named node, be meant for this one and be bounded;
        raises InvalidInput or WrongNode."""
        validate_name(from_node, "from_node")
        if to_node != self.node:
            raise WrongNode(
                f"this agent is node {self.node!r}, not {to_node!r}; re-read the node records"
            )
        if appends > MAX_BATCH_APPENDS:
            raise InvalidInput(
                "appends", f"{appends} appends in one call", f"send at most {MAX_BATCH_APPENDS}"
            )

    async def append_many(self, calls: list[AppendCall], sender: str) -> list[AppendReply]:
        """The appends of one ``Replicate`` from node ``sender`` to this node (a follower's
        work), one group commit — only those the view proves (:func:`unproven`). While the view
        lags every one of them (:func:`view_lags`: leases just granted), it waits up to
        ``LEASE_LAG_WAIT`` for the view to move before answering UNPROVEN."""
        deadline = time.monotonic() + LEASE_LAG_WAIT
        while (left := deadline - time.monotonic()) > 0:
            moved = self._leases_moved.round
            if not view_lags(calls, sender, self._lease):
                break
            await wait_event(moved, left)
        refused = [unproven(c, sender, self._lease(c)) for c in calls]
        todo = [c for c, r in zip(calls, refused, strict=True) if r is None]
        answered = iter(await answer_appends(self.db, todo, self.maybe_trim))
        return [r if r is not None else next(answered) for r in refused]

    def _lease(self, call: AppendCall) -> PrimaryLease | None:
        entry = self.view.leases.get((call.zone, call.partition))
        return entry[0] if entry is not None else None

    async def fetch(self, call: FetchCall) -> FetchReply:
        """A learner's ``Fetch`` from this node (the primary's work), or re-sharding's copy
        (``call.select``: checked here, InvalidInput naming the field)."""
        if call.select is not None:
            partitions, partition = call.select
            check_partitions(partitions, "select_partitions")
            if not 0 <= partition < partitions:
                raise InvalidInput(
                    "select_partition",
                    f"{partition} is not in 0..{partitions - 1}",
                    "name a partition of the selected layout",
                )
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
        self,
        key: Key,
        lease_epoch: int,
        members: frozenset[str],
        isr_revision: int,
        assignment_mods: tuple[tuple[AssignField, int], ...] = (),
    ) -> int:
        """Write the ISR ``members`` if this node still holds lease ``lease_epoch``, the ISR is
        still at ``isr_revision`` and each assignment key of ``assignment_mods`` (a learner's
        join: the revisions it was judged by) at its revision; returns the new ISR revision.
        Raises ``Deposed``, or ``Unavailable`` when the assignment moved on (the learner asks
        again and is judged by the new one).

        First batched with the agent's other ISR writes (fenced by the lease key's revision as
        this agent's view has it); if that batch did not apply, checked alone against a fresh
        read."""
        value = InSyncSet(tuple(sorted(members)), self.node, lease_epoch, self.now_ms())
        seen = self.view.leases.get(key)
        if seen is not None and (seen[0].node, seen[0].lease_epoch) == (self.node, lease_epoch):
            revision = await self._isr_writes.write(
                IsrWrite(key[0], key[1], value, seen[1], isr_revision, assignment_mods)
            )
            if revision is not None:
                return revision
        for _ in range(5):
            lease, lease_rev, _isr, current_rev = await self.metastore.read_lease_and_isr(*key)
            if lease is None or lease.node != self.node or lease.lease_epoch != lease_epoch:
                raise Deposed("the lease moved")
            if current_rev != isr_revision:
                raise Deposed(
                    f"the in-sync set changed under this primary ({isr_revision} -> {current_rev})"
                )
            if assignment_mods:
                found = await self.metastore.read_keys(
                    [self.keys.assign(*key, f) for f, _ in assignment_mods]
                )
                now = tuple((f, kv.mod_revision if kv is not None else 0)
                            for (f, _), kv in zip(assignment_mods, found, strict=True))  # fmt: skip
                if now != assignment_mods:
                    raise Unavailable(
                        f"the assignment of {key[0]}/{key[1]} changed since this in-sync set"
                        " change was judged (a learner's join, a member leaving); it is judged"
                        " again on the new one"
                    )
            revision = await self.metastore.write_isr(
                *key,
                value,
                lease_key_mod=lease_rev,
                isr_mod=isr_revision,
                assignment_mods=assignment_mods,
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
        try:  # never through a discarded replica (the trim would recreate its state)
            await self.db.call(self.db.store.hosted, self.data.trim, *key, self.config.log_keep)
        except NotHosted:
            self._appended.pop(key, None)


def _begin_replica(store: AgentStore, zone: str, partition: int) -> None:
    """A catch-up's replica: its partial record and its empty data state, in one part of a group
    commit (two group commits in a row were two fsync rounds before the learner could start)."""
    store.begin_replica(zone, partition)
    store.data.ensure(zone, partition)
