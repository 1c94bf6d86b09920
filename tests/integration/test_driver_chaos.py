"""Chaos: driver instances as real subprocesses (``python -m placement driver run``) killed and
frozen with signals during a rebalance, real agents, real etcd — each test twice: against the
session etcd in plaintext, and secure (mutual TLS between drivers and agents, a three-member etcd
with TLS and auth on, the product's etcd user allowed only its prefix).

* SIGKILL of the leader: a follower leads within lease TTL + 2 s, the rebalance completes, and no
  agent applied anything twice (agents' journals: each effect once per (partition, revision)).
* SIGSTOP of the leader for 2 × TTL, then SIGCONT: once its lease is gone the old leader makes
  **zero** successful etcd writes — checked on etcd's history (every value a driver writes carries
  its epoch) — and its log says it stepped down.
* SIGSTOP of the leader for less than half its TTL, three times: no failover (the same term leads
  throughout), the rebalance completes, nothing applied twice.
* The leader's network to etcd cut (bytes held, nothing closed) mid-rebalance: it steps down by
  its own clock before etcd expires its key, so no Rebalance leaves it after expiry; the other
  driver completes the rebalance, nothing applied twice.

Deadlines scale with ``PLACEMENT_TEST_TIME_SCALE``. Teardown fails on any traceback in a log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from conftest import ChaosEtcd
from test_driver import (
    ROOT,
    SCALE,
    TIMEOUT,
    Cluster,
    assert_clean_log,
    converged,
    eventually,
    settled,
)

from placement.core.model import ZoneSpec
from placement.local.certs import LocalPki
from placement.metastore.audit import audit_deposed_writes
from placement.metastore.election import current_leader
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import AssignField, KeySpace
from placement.metastore.transitions import Fence
from replica.records import AgentStore

TTL = 2
_STABLE = AssignField.STABLE


@dataclass
class DriverProc:
    member: str
    proc: asyncio.subprocess.Process
    address: str
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Drivers:
    tmp_path: Path
    endpoint: str
    prefix: str
    procs: dict[str, DriverProc]
    #: The certificates (secure runs): each driver's own, and the product's etcd certificate.
    pki: LocalPki | None = None

    async def start(
        self, member: str, *extra: str, env: dict[str, str] | None = None
    ) -> DriverProc:
        """Start driver ``member`` with ``extra`` flags and ``env`` added to its environment."""
        log = self.tmp_path / f"driver-{member}.log"
        secure = [*self.pki.flags(member), *self.pki.etcd_flags()] if self.pki else []
        with log.open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "placement", "driver", "run",
                "--etcd", self.endpoint, "--listen", "127.0.0.1:0", "--id", member,
                "--lease-ttl", str(TTL), "--prefix", self.prefix, *secure, *extra,
                cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=err,
                stdin=asyncio.subprocess.DEVNULL, env={**os.environ, **(env or {})},
            )  # fmt: skip
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), TIMEOUT)).decode()
        assert line.startswith(f"driver {member} serving on 127.0.0.1:"), (line, log.read_text())
        driver = DriverProc(member, proc, line.rsplit(" ", 1)[1].strip(), log)
        self.procs[member] = driver
        return driver

    async def close(self) -> None:
        for d in self.procs.values():
            if d.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    d.proc.send_signal(signal.SIGCONT)
                    d.proc.send_signal(signal.SIGTERM)
        for d in self.procs.values():
            await asyncio.wait_for(d.proc.wait(), TIMEOUT)
        for d in self.procs.values():
            assert_clean_log(d.log)


@contextlib.asynccontextmanager
async def drivers_on(chaos_etcd: ChaosEtcd, tmp_path: Path, prefix: str) -> AsyncIterator[Drivers]:
    """Driver subprocesses on ``chaos_etcd`` (stopped and log-checked at the end)."""
    ds = Drivers(tmp_path, chaos_etcd.endpoints, prefix, {}, chaos_etcd.pki)
    try:
        yield ds
    finally:
        await ds.close()


@contextlib.asynccontextmanager
async def agents_on(
    chaos_etcd: ChaosEtcd, tmp_path: Path, keys: KeySpace, catchup_delay: float = 1.0
) -> AsyncIterator[Cluster]:
    """Rebalance-protocol agents (no data plane) on ``chaos_etcd``, with its certificates when
    secure; each catch-up lasts ``catchup_delay`` seconds."""
    tls_dir = chaos_etcd.pki.directory if chaos_etcd.pki is not None else None
    c = Cluster(tmp_path, chaos_etcd.client, keys, catchup_delay=catchup_delay, tls_dir=tls_dir)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
async def drivers(chaos_etcd: ChaosEtcd, tmp_path: Path, prefix: str) -> AsyncIterator[Drivers]:
    async with drivers_on(chaos_etcd, tmp_path, prefix) as ds:
        yield ds


@pytest.fixture
async def cluster(tmp_path: Path, chaos_etcd: ChaosEtcd, keys: KeySpace) -> AsyncIterator[Cluster]:
    async with agents_on(chaos_etcd, tmp_path, keys) as c:
        yield c


async def leader(client: EtcdClient, keys: KeySpace) -> tuple[str, Fence] | None:
    kv = await current_leader(client, keys)
    if kv is None:
        return None
    return json.loads(kv.value)["id"], Fence(kv.key, kv.create_revision)


async def wait_leader(
    client: EtcdClient, keys: KeySpace, *, other_than: str | None = None
) -> tuple[str, Fence]:
    found: list[tuple[str, Fence]] = []

    async def check() -> bool:
        now = await leader(client, keys)
        if now is None or now[0] == other_than:
            return False
        found.append(now)
        return True

    await eventually(check, f"a leader other than {other_than}")
    return found[-1]


async def start_rebalance(
    cluster: Cluster, client: EtcdClient, keys: KeySpace, fence: Fence, partitions: int
) -> ZoneSpec:
    """Create a zone (R=2), wait for it, then alter R to 3 and wait until it is in flight."""
    store = cluster.store
    spec = ZoneSpec("chaos", partitions=partitions, replicas=2)
    assert (await store.create_zone(spec, fence)).applied
    await eventually(lambda: settled(store, spec), "zone creation")
    record = await store.get_zone("chaos")
    assert record is not None
    bigger = ZoneSpec("chaos", partitions=partitions, replicas=3)
    assert (await store.update_zone(bigger, record.mod_revision, fence)).applied

    async def some_done_some_pending() -> bool:
        zone = await store.read_zone("chaos")
        pending = sum(s.pending is not None for s in zone.partitions.values())
        return 0 < pending < partitions and any(
            len(s.peers(_STABLE) or ()) == 3 for s in zone.partitions.values()
        )

    await eventually(some_done_some_pending, "the rebalance to be half-way")
    return bigger


async def rebalancing_under_two_drivers(
    drivers: Drivers, cluster: Cluster, keys: KeySpace, *d1_flags: str
) -> tuple[int, Fence, ZoneSpec]:
    """Agents n0..n4, driver d1 (``d1_flags`` added) leading and d2 following, and a rebalance
    in flight (:func:`start_rebalance`); returns the revision before the drivers started (where
    the history audit begins), d1's fence and the zone."""
    client = cluster.client
    for i in range(5):
        await cluster.start_agent(f"n{i}")
    start = await client.current_revision(keys.leader_prefix())
    await drivers.start("d1", "--max-moves", "4", *d1_flags)
    await wait_leader(client, keys)
    await drivers.start("d2", "--max-moves", "4")
    member, fence = await wait_leader(client, keys)
    assert member == "d1"
    spec = await start_rebalance(cluster, client, keys, fence, partitions=24)
    return start, fence, spec


async def no_deposed_write(
    client: EtcdClient, keys: KeySpace, start: int, *, terms_ended: int
) -> None:
    """The history audit every chaos test ends with (``placement.metastore.audit``): since
    revision ``start``, no value written by a leader term after its key was deleted, and at
    least ``terms_ended`` terms ended."""
    audit = await audit_deposed_writes(client, keys, start, catch_up_within=30.0 * SCALE)
    assert not audit.stale, f"writes by a deposed leader after its key was deleted: {audit.stale}"
    assert audit.terms_ended >= terms_ended, f"{audit.terms_ended} terms ended, not {terms_ended}"


def journal_effects(cluster: Cluster) -> Counter[tuple[str, str, int, int, str]]:
    counts: Counter[tuple[str, str, int, int, str]] = Counter()
    for node, agent in cluster.agents.items():
        store = AgentStore.inspect(agent.data_dir)
        try:
            for record in store.records():
                for entry in store.journal(record.zone, record.partition):
                    counts[(node, record.zone, record.partition, entry.revision, entry.effect)] += 1
        finally:
            store.close()
    return counts


async def test_sigkill_of_the_leader_mid_rebalance_a_follower_takes_over_and_completes_it(
    drivers: Drivers, cluster: Cluster, keys: KeySpace
) -> None:
    client = cluster.client  # the secure run's client presents the product's etcd certificate
    start, _, spec = await rebalancing_under_two_drivers(drivers, cluster, keys)

    killed_at = time.monotonic()
    drivers.procs["d1"].proc.send_signal(signal.SIGKILL)
    await drivers.procs["d1"].proc.wait()
    new_member, new_fence = await wait_leader(client, keys, other_than="d1")
    took = time.monotonic() - killed_at
    assert new_member == "d2"
    print(f"failover: d2 leads {took:.2f}s after SIGKILL of d1 (TTL {TTL}s)")
    assert took <= (TTL + 2) * SCALE, f"failover took {took:.1f}s"

    await eventually(lambda: converged(cluster.store, spec), "the rebalance to complete on d2")
    log = drivers.procs["d2"].text()
    assert f"leader d2 epoch {new_fence.epoch}" in log
    repeated = {k: n for k, n in journal_effects(cluster).items() if n > 1}
    assert not repeated, f"effects applied more than once: {repeated}"
    await no_deposed_write(client, keys, start, terms_ended=1)


async def test_sigstopped_leader_makes_no_write_after_losing_its_lease_and_steps_down(
    drivers: Drivers, cluster: Cluster, keys: KeySpace
) -> None:
    client = cluster.client  # the secure run's client presents the product's etcd certificate
    _, fence, spec = await rebalancing_under_two_drivers(drivers, cluster, keys)

    stopped_revision = await client.current_revision(keys.leader_prefix())
    old = drivers.procs["d1"]
    old.proc.send_signal(signal.SIGSTOP)
    try:
        await wait_leader(client, keys, other_than="d1")
        await asyncio.sleep(2 * TTL * SCALE)
    finally:
        old.proc.send_signal(signal.SIGCONT)

    async def stepped_down() -> bool:
        return re.search(rf"d1 stepping down \(epoch {fence.epoch}\)", old.text()) is not None

    await eventually(stepped_down, "the old leader to log that it stepped down")
    await eventually(lambda: settled(cluster.store, spec), "the rebalance to complete on d2")

    # etcd's history since the stop: no value carries the old epoch after its key went.
    await no_deposed_write(client, keys, stopped_revision, terms_ended=1)
    repeated = {k: n for k, n in journal_effects(cluster).items() if n > 1}
    assert not repeated, f"effects applied more than once: {repeated}"


async def test_a_leader_sigstopped_for_less_than_half_its_ttl_keeps_leading_and_repeats_nothing(
    drivers: Drivers, cluster: Cluster, keys: KeySpace
) -> None:
    """A pause shorter than half the election lease (GC, a slow disk, a busy host) costs no
    failover: the same term (epoch) leads before and after, the rebalance it was driving
    completes, and no agent applied anything twice."""
    client = cluster.client
    start, fence, spec = await rebalancing_under_two_drivers(drivers, cluster, keys)
    member = "d1"  # it leads: checked
    d1 = drivers.procs["d1"]
    pause = TTL / 2 * 0.8
    for _ in range(3):  # a few short pauses, each followed by time to renew the lease
        d1.proc.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(pause)
        finally:
            d1.proc.send_signal(signal.SIGCONT)
        await asyncio.sleep(TTL)
        now = await leader(client, keys)
        assert now is not None
        assert now == (member, fence), f"the pause cost a failover: {now}"
    await eventually(lambda: converged(cluster.store, spec), "the rebalance to complete on d1")
    assert await leader(client, keys) == (member, fence)
    assert "stepping down" not in d1.text()
    assert "leader d2" not in drivers.procs["d2"].text()
    repeated = {k: n for k, n in journal_effects(cluster).items() if n > 1}
    assert not repeated, f"effects applied more than once: {repeated}"
    await no_deposed_write(client, keys, start, terms_ended=0)


class Blackhole:
    """A TCP proxy to ``target`` that can be cut: while cut, bytes are held in both directions
    and nothing is closed — a network partition, not a refused connection."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.open = asyncio.Event()
        self.open.set()
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        pipes = [
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer)),
        ]
        self.tasks.update(pipes)
        try:
            await asyncio.gather(*pipes)
        finally:
            writer.close()
            up_writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                await self.open.wait()
                writer.write(data)
                await writer.drain()

    async def close(self) -> None:
        self.open.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.server is not None:
            self.server.close()


def _logged_at(text: str, pattern: str) -> float | None:
    """The unix time of the first log line matching ``pattern`` (its asctime, local time)."""
    for line in text.splitlines():
        if re.search(pattern, line):
            stamp = line[:23]
            return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


async def test_a_leader_cut_off_from_etcd_steps_down_before_its_key_expires(
    drivers: Drivers, cluster: Cluster, keys: KeySpace, chaos_etcd: ChaosEtcd
) -> None:
    """The leader's network to etcd is cut (a partition: bytes held, nothing closed) while it
    drives a rebalance. It must tell by its own clock that its lease is over — with the
    keep-alive deadline's margin, before etcd expires its key — and step down within its TTL,
    so it cannot send a Rebalance once another driver may lead; the other driver takes over
    and completes the rebalance, nothing applied twice."""
    client = cluster.client
    hole = Blackhole(chaos_etcd.endpoints.split(",")[0])
    proxied = await hole.start()
    try:
        start, fence, spec = await rebalancing_under_two_drivers(
            drivers, cluster, keys, "--etcd", proxied
        )
        cut_at = time.time()
        hole.open.clear()

        seen_at = cut_at  # the start of the last read that still found the key

        async def key_gone() -> bool:
            nonlocal seen_at
            asked = time.time()
            if (await client.get(fence.leader_key)).first() is None:
                return True
            seen_at = asked
            return False

        await eventually(key_gone, "etcd to expire the cut-off leader's key")
        expired_at = time.time()
        new_member, _ = await wait_leader(client, keys, other_than="d1")
        assert new_member == "d2"
        d1 = drivers.procs["d1"]

        async def stepped_down() -> bool:
            return _logged_at(d1.text(), rf"d1 stepping down \(epoch {fence.epoch}\)") is not None

        await eventually(stepped_down, "the cut-off leader to log that it stepped down")
        stepped = _logged_at(d1.text(), rf"d1 stepping down \(epoch {fence.epoch}\)")
        assert stepped is not None
        print(
            f"cut at 0; d1 stepped down at {stepped - cut_at:.2f}s; its key was there at"
            f" {seen_at - cut_at:.2f}s and gone by {expired_at - cut_at:.2f}s (TTL {TTL}s)"
        )
        assert stepped - cut_at <= TTL * SCALE, "it did not notice within its TTL"
        # Its term's work (every Rebalance it sends) is cancelled before the line is logged: a
        # step-down logged while etcd still held the key means nothing went out after expiry.
        assert stepped <= seen_at, "it still believed it led when etcd may have expired its key"
        await eventually(lambda: converged(cluster.store, spec), "the rebalance to complete on d2")
        hole.open.set()  # healed: d1 comes back as a follower
        await asyncio.sleep(TTL)
        assert (await leader(client, keys) or ("",))[0] == "d2"
        repeated = {k: n for k, n in journal_effects(cluster).items() if n > 1}
        assert not repeated, f"effects applied more than once: {repeated}"
        await no_deposed_write(client, keys, start, terms_ended=1)
    finally:
        await hole.close()
