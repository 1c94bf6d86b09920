"""Leader election on etcd: the ``concurrency`` package's recipe on our client.

* Campaign: each candidate puts its own key ``{prefix}/leader/{member}`` under its lease with
  ``create_revision == 0`` (never overwriting a key someone else may own). The candidate whose key
  has the lowest create revision leads; every other candidate waits for the deletion of its
  **predecessor only** (the key just below its own), then looks again — no thundering herd.
* Epoch: the leader key's create revision. :attr:`Leadership.fence` is the
  :class:`~.transitions.Fence` every write compares; a paused former leader cannot write
  after its key is gone, whatever it believes.
* Loss: :meth:`Leadership.wait_lost` returns when the lease is lost (keep-alive failed past the
  TTL, or etcd expired it) or the key was deleted or re-created. Leadership is a belief that can
  lag reality; the fence compares are what make writes safe.
* The lease is refreshed on the client's :class:`~.etcd.KeepAliveThread` (its own event loop
  and connection), so a leader whose loop is busy with a long pass keeps its term; a loss the
  thread sees is signalled on the leader's loop.

States of a :class:`Leadership`: ``LEADING -> LOST`` (lease lost, key deleted/replaced) or
``LEADING -> RESIGNED``; both final.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from placement.aio import cancel_and_wait
from placement.errors import Compacted, NotLeader, StoreUnavailable
from placement.metastore.etcd import EtcdClient, Lease, Losable
from placement.metastore.keys import KeySpace, prefix_range_end
from placement.metastore.kv import EventKind, KeyValue, Range
from placement.metastore.transitions import Fence
from placement.metastore.txn import Compare, Delete, Get, Put

log = logging.getLogger(__name__)

T = TypeVar("T")


class Leadership(Losable):
    """A won election: the key, its epoch and fence, and how to notice losing it."""

    def __init__(
        self, client: EtcdClient, key: bytes, epoch: int, lease: Lease, member_id: str
    ) -> None:
        super().__init__()
        self._client = client
        self.key = key
        self.epoch = epoch
        self.lease = lease
        self.member_id = member_id
        self.fence = Fence(key, epoch)
        self._loss_label = f"leadership of {member_id} (epoch {epoch})"
        self._monitor = asyncio.create_task(self._watch_loss(), name=f"leadership-{member_id}")

    def __repr__(self) -> str:
        return f"Leadership({self.member_id!r}, epoch={self.epoch}, lost={self.is_lost})"

    async def resign(self) -> None:
        """Give up: delete the key (only if it is still this term's) and revoke the lease."""
        self._mark_lost("resigned")
        await self._stop_monitor()
        try:
            await self._client.txn(
                (Compare.create(self.key, "==", self.epoch),), (Delete(self.key),), ()
            )
        finally:
            await self.lease.revoke()

    async def _stop_monitor(self) -> None:
        if self._monitor is not asyncio.current_task():
            await cancel_and_wait(self._monitor)

    async def _watch_loss(self) -> None:
        lease_lost = asyncio.create_task(self.lease.wait_lost())
        key_gone = asyncio.create_task(self._wait_key_gone())
        try:
            done, _ = await asyncio.wait(
                {lease_lost, key_gone}, return_when=asyncio.FIRST_COMPLETED
            )
            if lease_lost in done:
                self._mark_lost(f"lease lost: {lease_lost.result()}")
            else:
                self._mark_lost(key_gone.result())
                with contextlib.suppress(Exception):
                    await self.lease.revoke()
        finally:
            for task in (lease_lost, key_gone):
                task.cancel()

    async def _wait_key_gone(self) -> str:
        next_revision = self.epoch + 1
        backoff = self._client.reconnect_backoff()
        while True:
            try:
                async with self._client.watch(self.key, start_revision=next_revision) as watch:
                    async for batch in watch:
                        for event in batch.events:
                            if event.kind is EventKind.DELETE:
                                return "leader key deleted"
                            if event.kv.create_revision != self.epoch:
                                return "leader key re-created in another term"
                        next_revision = watch.next_revision
                        backoff.reset()
            except Compacted:
                try:
                    found = await self._client.get(self.key)
                except StoreUnavailable:
                    await self._client.sleep(backoff.next())
                    continue
                if not self.fence.holds(found.first()):
                    return "leader key gone (found after compaction)"
                next_revision = found.revision + 1
            except StoreUnavailable:
                await self._client.sleep(backoff.next())


class Election:
    """Candidate ``member_id`` in the election under ``keys.leader_prefix()``."""

    def __init__(
        self,
        client: EtcdClient,
        keys: KeySpace,
        member_id: str,
        *,
        ttl: int = 5,
        value: bytes = b"",
    ) -> None:
        self._client = client
        self._keys = keys
        self.member_id = member_id
        self.key = keys.leader(member_id)
        self.ttl = ttl
        self.value = value or member_id.encode()

    async def campaign(self) -> Leadership:
        """Block until this candidate leads; return its :class:`Leadership`.

        Raises :class:`NotLeader` when the lease is lost or the key removed while waiting, and
        :class:`StoreUnavailable` when etcd cannot be reached to grant the lease. Once the
        candidate holds a lease, a call that gets no answer (etcd briefly away, or this loop
        blocked past the call timeout) is retried with backoff while the lease lives, so the
        candidate keeps its place in line. On any error or cancellation the lease is revoked,
        which removes the candidate's key.
        """
        lease = await self._client.grant_lease(self.ttl)
        try:
            epoch = await self._create_key(lease)
            await self._wait_predecessors(lease, epoch)
            return Leadership(self._client, self.key, epoch, lease, self.member_id)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(lease.revoke())
            raise

    async def _patiently(self, lease: Lease, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, retried with backoff while it gets no answer and ``lease`` lives.

        Safe for every call of the campaign: reads, and the create transaction, whose compare
        fails on a retry after an unseen success and then finds the key under this lease.
        """
        backoff = self._client.reconnect_backoff()
        while True:
            try:
                return await call()
            except StoreUnavailable as e:
                if lease.is_lost:
                    raise NotLeader(f"{self.member_id}: lease lost while campaigning: {e}") from e
                log.info("%s: campaign call got no answer (%s); retrying", self.member_id, e)
                await self._client.sleep(backoff.next())

    async def _create_key(self, lease: Lease) -> int:
        while True:
            result = await self._patiently(
                lease,
                lambda: self._client.txn(
                    (Compare.create(self.key, "==", 0),),
                    (Put(self.key, self.value, lease=lease.id),),
                    (Get(self.key),),
                ),
            )
            if result.succeeded:
                return result.revision
            (found,) = result.responses
            assert isinstance(found, Range)
            holder = found.first()
            if holder is not None and holder.lease == lease.id:
                return holder.create_revision
            # An earlier incarnation of this member still holds the key: it is not ours to delete.
            log.info(
                "%s: key held by lease %#x; waiting for it to go",
                self.member_id,
                holder and holder.lease,
            )
            await self._wait_deleted(self.key, result.revision + 1, lease)

    async def _wait_predecessors(self, lease: Lease, epoch: int) -> None:
        prefix = self._keys.leader_prefix()

        async def look() -> tuple[Range, Range]:
            found = await self._client.range(
                prefix,
                prefix_range_end(prefix),
                max_create_revision=epoch - 1,
                sort_target="create",
                descending=True,
                limit=1,
            )
            return found, await self._client.get(self.key, revision=found.revision)

        while True:
            found, own = await self._patiently(lease, look)
            if not Fence(self.key, epoch).holds(own.first()):
                raise NotLeader(f"{self.member_id}: candidate key removed while campaigning")
            predecessor = found.first()
            if predecessor is None:
                return
            await self._wait_deleted(predecessor.key, found.revision + 1, lease)

    async def _wait_deleted(self, key: bytes, start_revision: int, lease: Lease) -> None:
        """Wait for the deletion of ``key`` after ``start_revision - 1``, or fail on lease loss."""
        deleted = asyncio.create_task(self._deleted(key, start_revision))
        lost = asyncio.create_task(lease.wait_lost())
        try:
            done, _ = await asyncio.wait({deleted, lost}, return_when=asyncio.FIRST_COMPLETED)
            if lost in done:
                raise NotLeader(f"{self.member_id}: lease lost while campaigning: {lost.result()}")
            try:
                deleted.result()
            except StoreUnavailable as e:
                # The watch gave up resuming: the caller looks again (retrying while the lease
                # lives), after a pause so an outage is not met with a tight loop.
                log.info("%s: watch on %r ended (%s); looking again", self.member_id, key, e)
                await self._client.sleep(self._client.reconnect_backoff().next())
        finally:
            for task in (deleted, lost):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _deleted(self, key: bytes, start_revision: int) -> None:
        try:
            async with self._client.watch(
                key, start_revision=start_revision, prev_kv=False
            ) as watch:
                async for batch in watch:
                    if any(e.kind is EventKind.DELETE for e in batch.events):
                        return
        except Compacted:
            return  # history gone: the caller looks again


async def current_leader(client: EtcdClient, keys: KeySpace) -> KeyValue | None:
    """The leader key (lowest create revision under the leader prefix), or None."""
    prefix = keys.leader_prefix()
    found = await client.range(
        prefix, prefix_range_end(prefix), sort_target="create", descending=False, limit=1
    )
    return found.first()
