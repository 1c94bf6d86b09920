"""The agent's node record in etcd: ``{p}/nodes/{name}`` under a lease it keeps alive.

The agent's move reports (:meth:`Registration.report`) go under the same lease, batched: the
reports submitted while one put is in flight go out together in the next etcd transaction
(:class:`~placement.aio.Coalescer`), so a burst of catch-ups ending at once costs a few
transactions per node, not one per partition (design/replica-protocol.md, "Move reports").

States: ``REGISTERING -> REGISTERED -> (lease lost) -> REGISTERING ...``; ``stop()`` from any
state -> ``STOPPED`` (the lease is revoked, so the node key disappears at once instead of after
the TTL). While another live lease holds the name (a previous incarnation that has not expired),
registration retries with capped backoff until that lease is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace

from placement.aio import Coalescer, cancel_and_wait
from placement.core.model import parse_pairs
from placement.core.retry import Backoff, RetryPolicy
from placement.errors import (
    Conflict,
    CredentialError,
    NotLeader,
    PlacementError,
    StoreUnavailable,
)
from placement.metastore.codec import MoveReport, NodeRecord, encode_node, encode_report
from placement.metastore.etcd import EtcdClient, Lease
from placement.metastore.keys import KeySpace
from placement.metastore.store import Metastore

log = logging.getLogger(__name__)

#: Move reports per put: etcd's default limit of operations in one transaction (--max-txn-ops).
REPORTS_PER_PUT = 128

#: Delays between registration attempts: 0.1-0.2 s at first, doubling, up to 1-2 s.
REGISTER_RETRY = RetryPolicy(initial=0.2, cap=2.0, floor=0.5)


def parse_attributes(items: Sequence[str]) -> dict[str, str]:
    """``["rack=a", "tier=ssd"]`` -> a dict; raises InvalidInput naming ``--attribute``."""
    return parse_pairs(items, "--attribute")


class Registration:
    """Keeps ``record`` registered under a lease of ``ttl`` seconds until :meth:`stop`."""

    def __init__(
        self,
        client: EtcdClient,
        keys: KeySpace,
        record: NodeRecord,
        *,
        ttl: int = 5,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_change: Callable[[bool], Awaitable[None]] | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        encode_node(record)  # validates: bad input fails here, before anything is written
        self.client = client
        self.keys = keys
        self.store = Metastore(client, keys)
        self.record = record
        self.ttl = ttl
        self._sleep = sleep
        #: Told True once registered, False when the lease is lost (the agent's health).
        self._on_change = on_change
        #: Told a refused credential: registering again cannot succeed.
        self._on_fatal = on_fatal
        self._lease: Lease | None = None
        self._task: asyncio.Task[None] | None = None
        self.registered = asyncio.Event()
        self.registrations = 0
        #: Move reports (key, value) waiting for or in the next put; one key per transaction.
        self.reports: Coalescer[tuple[bytes, bytes], None] = Coalescer(
            self._put_reports,
            limit=REPORTS_PER_PUT,
            name=f"reports-{record.name}",
            key=lambda item: item[0],
        )

    async def start(self) -> None:
        """Register once (raising on failure), then keep it registered in the background."""
        await self._register_once()
        self._task = asyncio.create_task(self._run(), name=f"registration-{self.record.name}")

    async def _register_once(self) -> None:
        lease = await self.client.grant_lease(self.ttl)
        try:
            await self.store.register_node(self.record, lease)
        except BaseException:
            with contextlib.suppress(Exception):
                await lease.revoke()
            raise
        self._lease = lease
        self.registrations += 1
        self.registered.set()
        log.info("node %s registered (lease %#x)", self.record.name, lease.id)

    async def _run(self) -> None:
        backoff = Backoff(REGISTER_RETRY)
        while True:
            lease = self._lease
            if lease is not None:
                reason = await lease.wait_lost()
                self.registered.clear()
                log.warning("node %s: lease lost (%s); registering again", self.record.name, reason)
                self._lease = None
                if self._on_change is not None:
                    await self._on_change(False)
            try:
                await self._register_once()
                backoff.reset()
                if self._on_change is not None:
                    await self._on_change(True)
            except (StoreUnavailable, Conflict, NotLeader) as e:
                log.warning("node %s: registration failed: %s", self.record.name, e)
                await self._sleep(backoff.next())
            except CredentialError as e:
                log.error("node %s: registration refused: %s", self.record.name, e)
                if self._on_fatal is not None:
                    self._on_fatal(e)
                return

    async def mark_stopping(self) -> bool:
        """Re-put the node record saying the agent stops (``stopping``), under the same lease:
        the leader hands its primary leases over before the registration goes. False when not
        registered or etcd does not take it (the stop goes on; leases then move on expiry)."""
        lease = self._lease
        if lease is None:
            return False
        self.record = replace(self.record, stopping=True)
        try:
            await self.store.register_node(self.record, lease)
        except PlacementError as e:
            log.warning("node %s: could not say it stops: %s", self.record.name, e)
            return False
        return True

    async def report(self, zone: str, partition: int, report: MoveReport) -> None:
        """Push a move report: put ``{p}/progress/{zone}/{partition}/{node}`` under the
        registration lease (the agent owns that key; it is not placement state, so no fence),
        in one transaction with the other reports submitted meanwhile (``reports``). Raises
        StoreUnavailable when not registered, etcd is unreachable or the registration stops;
        the caller treats it as best effort (the driver's resends find the outcome anyway)."""
        key = self.keys.progress(zone, partition, self.record.name)
        await self.reports.submit((key, encode_report(report)))

    async def _put_reports(self, items: list[tuple[bytes, bytes]]) -> list[None]:
        """One flush of ``reports``: every item in one transaction (``limit`` keeps it within
        etcd's limits; distinct keys, so none overwrites another)."""
        await self.put_owned_many(dict(items))
        return [None] * len(items)

    async def put_owned(self, key: bytes, value: bytes) -> None:
        """Put a key this agent owns (a move report, a replica size) under the registration
        lease, so it disappears with the agent. Raises StoreUnavailable when not registered."""
        lease = self._lease
        if lease is None:
            raise StoreUnavailable(f"node {self.record.name} is not registered")
        await self.store.put_owned(key, value, lease)

    async def put_owned_many(self, items: Mapping[bytes, bytes]) -> None:
        """:meth:`put_owned` of many keys (the replica sizes of one report), in few etcd
        transactions (``Metastore.put_owned_many``). Raises StoreUnavailable when not
        registered."""
        lease = self._lease
        if lease is None:
            raise StoreUnavailable(f"node {self.record.name} is not registered")
        await self.store.put_owned_many(items, lease)

    async def stop(self) -> None:
        """Stop keeping alive and revoke the lease (the node key goes with it)."""
        await self.reports.close(StoreUnavailable(f"node {self.record.name} stops"))
        task, self._task = self._task, None
        await cancel_and_wait(task)
        lease, self._lease = self._lease, None
        self.registered.clear()
        if lease is not None:
            try:
                await lease.revoke()
            except PlacementError as e:  # refused or unreachable: the key expires with the lease
                log.warning("node %s: lease revoke failed (%s); its key expires with the lease",
                            self.record.name, e)  # fmt: skip


async def register(
    endpoints: str,
    prefix: str,
    name: str,
    address: str,
    attributes: Mapping[str, str],
    *,
    ttl: int = 5,
) -> tuple[EtcdClient, Registration]:
    """Open a client on ``endpoints`` and start a :class:`Registration` (caller stops both)."""
    client = EtcdClient(endpoints)
    try:
        registration = Registration(
            client, KeySpace(prefix), NodeRecord(name, address, dict(attributes)), ttl=ttl
        )
        await registration.start()
    except BaseException:
        await client.close()
        raise
    return client, registration
