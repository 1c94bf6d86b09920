"""Re-sharding benchmark: a zone's partition count changed online with data in it and writers
running (design/resharding.md, "What is measured").

One run (the issue's figures: 16 → 32 on 3 agents, 100 MB preloaded, 16 writers)::

    .venv/bin/python bench/reshard_bench.py [--mb 100] [--writers 16] [--from 16] [--to 32]
        [--value-size 65536] [--catch-up-mbps MBPS] [--out bench/results/reshard.md]

    .venv/bin/python bench/reshard_bench.py --quick      # ~5 MB, 4 writers, 4 → 8; a minute

Real processes, started the way ``placectl up`` starts them (``placement.local.cluster``): etcd,
one placement driver, 3 replica agents (``--catch-up-mbps`` passed to every agent when given,
else the agents' default). Zone ``bench`` of ``--from`` partitions × 3 replicas; once every
partition takes writes and every in-sync set is full, ``--mb`` of ``--value-size`` values is
preloaded (``DataClient.put``, ``--preload-concurrency`` in flight), then:

1. ``--writers`` recorded writers start (``placement.data.workload.run_writers``: one operation
   in flight each, 10 % deletes, its JSONL record), plus one **probe** per source partition
   (below); after a warm-up, a **before** window of ``--steady`` seconds;
2. ``AlterZone(partitions=--to)``; the **during** window lasts from the alter until the layout
   in force is ``--to`` with no reshard. Every layout write is seen through an etcd watch (the
   leader's own timestamp of each phase change), every destination's reshard report through
   another, and ``GetZoneStatus`` is polled every 0.25 s;
3. an **after** window of ``--after`` seconds at the new count;
4. writers and probes stop; ``check_workload`` (every acknowledged write readable with its value,
   every stable replica identical), every preloaded key read back, every probe's last
   acknowledged value read back. Any failure: the results say FAILED and the exit code is 1.

Writes the results (``--out``; the figures and what each one means) and prints them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import grpc
import psutil
from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
for extra in (str(ROOT), str(ROOT / "bench")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

from data_plane_bench import load, machine  # noqa: E402

from placement.api.client import PlacementClient  # noqa: E402
from placement.core.layout import Moves  # noqa: E402
from placement.core.retry import RetryPolicy  # noqa: E402
from placement.data.checker import CheckResult, check_workload  # noqa: E402
from placement.data.client import (  # noqa: E402
    LAYOUT_HEADER,
    DataClient,
    GrpcConnector,
    WriteResult,
    header_value,
)
from placement.data.partitioning import key_moves, partition_of  # noqa: E402
from placement.data.workload import percentile, run_writers  # noqa: E402
from placement.errors import PlacementError  # noqa: E402
from placement.local.cluster import Cluster, UpOptions, start_cluster, wait_ready  # noqa: E402
from placement.metastore.codec import (  # noqa: E402
    InSyncSet,
    LayoutValue,
    ReshardReport,
    decode_isr,
    decode_layout,
    decode_reshard_report,
)
from placement.metastore.etcd import EtcdClient  # noqa: E402
from placement.metastore.keys import KeySpace, prefix_range_end  # noqa: E402
from placement.v1 import driver_pb2  # noqa: E402

if TYPE_CHECKING:
    from placement.v1 import data_pb2_grpc

RESULTS = ROOT / "bench" / "results" / "reshard.md"
ZONE = "bench"
REPLICAS = 3
AGENTS = 3
#: The agents' default catch-up throttle (``placectl agent run --catch-up-mbps``).
AGENT_DEFAULT_MBPS = 64.0
#: Seconds between two writes of a probe outside the cut-over (inside it: back to back).
PROBE_GAP = 0.2
#: The probes' retry: every 10 ms, no jitter (the writers keep the client's default backoff).
PROBE_RETRY = RetryPolicy(initial=0.01, cap=0.01, floor=1.0)
#: Probes stay back to back this long after the flip was seen.
PROBE_FAST_AFTER_FLIP = 0.5
STATUS_EVERY = 0.25
GOAL_THROUGHPUT = 0.70
GOAL_PAUSE_MS = 200.0

FULL = {"mb": 100.0, "writers": 16, "src": 16, "dst": 32, "steady": 10.0, "warmup": 2.0}
FULL |= {"after": 5.0, "timeout": 900.0}
QUICK = {"mb": 5.0, "writers": 4, "src": 4, "dst": 8, "steady": 4.0, "warmup": 1.0}
QUICK |= {"after": 2.0, "timeout": 180.0}


def now() -> float:
    return time.monotonic()


# -- what the clients saw ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Op:
    """One client operation (a put or delete, retries included): first attempt → answer."""

    began: float
    ended: float
    key: bytes
    ok: bool

    @property
    def latency(self) -> float:
        return self.ended - self.began


@dataclass(frozen=True, slots=True)
class Attempt:
    """One RPC of a write: ``outcome`` is ``ok``, ``sealed`` (UNAVAILABLE from a sealed source),
    ``layout`` (FAILED_PRECONDITION with ``x-layout``: another generation) or a status code."""

    began: float
    ended: float
    partition: int
    key: bytes
    outcome: str


def _outcome(e: grpc.aio.AioRpcError) -> str:
    if e.code() == grpc.StatusCode.UNAVAILABLE and "sealed" in (e.details() or ""):
        return "sealed"
    if header_value(e.trailing_metadata(), LAYOUT_HEADER):
        return "layout"
    return e.code().name


class _RecordingStub:
    """A data stub that records every Put/Delete RPC (the client's retries are separate RPCs)."""

    def __init__(self, inner: Any, rows: list[Attempt]) -> None:
        self._inner = inner
        self._rows = rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def Put(self, request: Any, **kwargs: Any) -> Any:
        return await self._record(self._inner.Put, request, kwargs)

    async def Delete(self, request: Any, **kwargs: Any) -> Any:
        return await self._record(self._inner.Delete, request, kwargs)

    async def _record(self, call: Any, request: Any, kwargs: dict[str, Any]) -> Any:
        began = now()
        try:
            reply = await call(request, **kwargs)
        except grpc.aio.AioRpcError as e:
            self._rows.append(
                Attempt(began, now(), request.partition.partition, request.key, _outcome(e))
            )
            raise
        self._rows.append(Attempt(began, now(), request.partition.partition, request.key, "ok"))
        return reply


class RecordingConnector:
    """``GrpcConnector`` whose data stubs record every write RPC into ``rows``."""

    def __init__(self) -> None:
        self._inner = GrpcConnector()
        self.rows: list[Attempt] = []

    def data(self, address: str) -> data_pb2_grpc.DataServiceAsyncStub:
        stub = _RecordingStub(self._inner.data(address), self.rows)
        return cast("data_pb2_grpc.DataServiceAsyncStub", stub)

    def replication(self, address: str) -> data_pb2_grpc.ReplicationServiceAsyncStub:
        return self._inner.replication(address)

    async def refusal(self, address: str, detail: str, budget: float) -> str | None:
        return await self._inner.refusal(address, detail, budget)

    async def close(self) -> None:
        await self._inner.close()


class TimedClient(DataClient):
    """The routing client, recording each put/delete (retries included) as an :class:`Op`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ops: list[Op] = []

    async def put(self, zone: str, key: bytes, value: bytes) -> WriteResult:
        return await self._timed(key, super().put(zone, key, value))

    async def delete_with_result(self, zone: str, key: bytes) -> WriteResult:
        return await self._timed(key, super().delete_with_result(zone, key))

    async def _timed(self, key: bytes, call: Awaitable[WriteResult]) -> WriteResult:
        began = now()
        try:
            result = await call
        except PlacementError:
            self.ops.append(Op(began, now(), key, False))
            raise
        self.ops.append(Op(began, now(), key, True))
        return result


# -- what etcd saw -----------------------------------------------------------------------------


@dataclass
class Phases:
    """Layout writes seen through the watch: ``(phase, leader's ts in monotonic seconds,
    arrival)``; phase "done" = the reshard ended (layout without one)."""

    offset: float  # unix − monotonic, to place the leader's timestamps on this clock
    changes: list[tuple[str, float, float]] = field(default_factory=list)
    attempt: int = 0
    generation: int = 0
    partitions: int = 0
    sealed: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    def at(self, phase: str) -> float | None:
        return next((t for p, t, _ in self.changes if p == phase), None)

    def arrived(self, phase: str) -> float | None:
        return next((a for p, _, a in self.changes if p == phase), None)


async def watch_layout(etcd: EtcdClient, keys: KeySpace, start: int, phases: Phases) -> None:
    async with etcd.watch(keys.layout(ZONE), start_revision=start) as w:
        async for batch in w:
            arrived = now()
            for event in batch.events:
                if not event.kv.value:
                    continue
                value = decode_layout(event.kv.value)
                if not isinstance(value, LayoutValue):
                    continue
                r = value.layout.reshard
                phase = r.phase.value if r is not None else "done"
                if r is not None:
                    phases.attempt = r.attempt
                if phases.changes and phases.changes[-1][0] == phase:
                    continue
                phases.changes.append((phase, value.ts / 1000 - phases.offset, arrived))
                phases.generation = value.layout.generation
                phases.partitions = value.layout.partitions
                if phase == "seal":
                    phases.sealed.set()
                if phase in ("done", "abort"):
                    phases.finished.set()


@dataclass
class Reports:
    """Per partition, the most keys/bytes its reports said it copied, and when it drained."""

    keys: dict[int, int] = field(default_factory=dict)
    bytes: dict[int, int] = field(default_factory=dict)
    drained: dict[int, float] = field(default_factory=dict)
    puts: int = 0


async def watch_reports(etcd: EtcdClient, keys: KeySpace, start: int, out: Reports) -> None:
    prefix = keys.zone_reshard_prefix(ZONE)
    async with etcd.watch(prefix, prefix_range_end(prefix), start_revision=start) as w:
        async for batch in w:
            for event in batch.events:
                parsed = keys.parse(event.kv.key)
                if not event.kv.value or parsed is None or parsed.partition is None:
                    continue
                report = decode_reshard_report(event.kv.value)
                if not isinstance(report, ReshardReport):
                    continue
                p = parsed.partition
                out.puts += 1
                out.keys[p] = max(out.keys.get(p, 0), report.keys)
                out.bytes[p] = max(out.bytes.get(p, 0), report.bytes)
                if report.drained and p not in out.drained:
                    out.drained[p] = report.ts / 1000


@dataclass
class StatusSeen:
    """What ``GetZoneStatus`` (``placectl zone status``) showed while the reshard ran."""

    polls: int = 0
    resharding: int = 0
    max_bytes_copied: int = 0
    max_keys_copied: int = 0
    bytes_to_copy: int = 0
    first_eta_s: float = 0.0
    errors: int = 0


async def poll_status(api: PlacementClient, seen: StatusSeen) -> None:
    request = driver_pb2.GetZoneRequest(name=ZONE)
    while True:
        try:
            s = await api.call(lambda stub, t: stub.GetZoneStatus(request, timeout=t))
        except PlacementError:
            seen.errors += 1
        else:
            seen.polls += 1
            if s.state == driver_pb2.RESHARDING:
                seen.resharding += 1
                seen.max_bytes_copied = max(seen.max_bytes_copied, s.bytes_copied)
                seen.max_keys_copied = max(seen.max_keys_copied, s.keys_copied)
                seen.bytes_to_copy = max(seen.bytes_to_copy, s.bytes_to_copy)
                if s.eta_seconds and not seen.first_eta_s:
                    seen.first_eta_s = s.eta_seconds
        await asyncio.sleep(STATUS_EVERY)


# -- probes ------------------------------------------------------------------------------------


@dataclass
class Probe:
    """Writes one key that moves out of ``source``: slowly, back to back from SEAL to the flip."""

    source: int
    key: bytes
    ops: list[Op] = field(default_factory=list)
    attempted: int = 0
    acked: int = 0


def probe_keys(src: int, dst: int) -> list[Probe]:
    wanted = set(Moves(src, dst).sources)
    found: dict[int, bytes] = {}
    i = 0
    while len(found) < len(wanted):
        key = b"probe-%d" % i
        moves = key_moves(key, src, dst)
        if moves is not None and moves[0] in wanted:
            found.setdefault(moves[0], key)
        i += 1
    return [Probe(s, k) for s, k in sorted(found.items())]


async def run_probe(probe: Probe, client: DataClient, phases: Phases, stop: asyncio.Event) -> None:
    def fast() -> bool:
        flip = phases.arrived("cleanup") or phases.arrived("abort")
        return phases.sealed.is_set() and (flip is None or now() < flip + PROBE_FAST_AFTER_FLIP)

    while not stop.is_set():
        probe.attempted += 1
        seq = probe.attempted
        began = now()
        try:
            await client.put(ZONE, probe.key, b"%d" % seq)
        except PlacementError:
            probe.ops.append(Op(began, now(), probe.key, False))
        else:
            probe.ops.append(Op(began, now(), probe.key, True))
            probe.acked = seq
        if fast():
            continue
        if not phases.sealed.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(phases.sealed.wait(), PROBE_GAP)
        else:
            await asyncio.sleep(PROBE_GAP)


@dataclass(frozen=True, slots=True)
class Pause:
    """One source partition's cut-over as its probe saw it (seconds; None = not observed)."""

    source: int
    #: First RPC refused as sealed → acknowledgement of that write (a lower bound).
    refused: float | None
    #: max(last ack before it, SEAL written) → acknowledgement of the blocked write.
    bound: float | None
    refusals: int
    failed: bool


def probe_pause(
    probe: Probe, attempts: Sequence[Attempt], seal_at: float | None, flip_at: float | None
) -> Pause:
    """'bound': the longest the probe's key went without an acknowledged write from SEAL
    written until PROBE_FAST_AFTER_FLIP after the flip (the probe writes back to back then) —
    whether its writes were refused and retried or held at the agent until the flip.
    'refused': first RPC refused as sealed → acknowledgement of the write it belonged to."""
    sealed = sorted(a.began for a in attempts if a.key == probe.key and a.outcome == "sealed")
    ops = sorted(probe.ops, key=lambda o: o.ended)
    if seal_at is None:
        return Pause(probe.source, None, None, len(sealed), False)
    end = (flip_at if flip_at is not None else float("inf")) + PROBE_FAST_AFTER_FLIP
    bound: float | None = None
    failed = False
    t = seal_at
    for o in ops:
        if o.ended <= seal_at or o.began > end:
            continue
        failed = failed or not o.ok
        if o.ok:
            bound = max(bound or 0.0, o.ended - t)
            t = o.ended
    refused = None
    if sealed:
        blocked = next((o for o in ops if o.began <= sealed[0] <= o.ended), None)
        if blocked is not None:
            refused = blocked.ended - sealed[0]
    return Pause(probe.source, refused, bound, len(sealed), failed)


# -- windows -----------------------------------------------------------------------------------


@dataclass
class Window:
    label: str
    start: float
    end: float
    ops: list[Op]
    failed: int
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def rate(self) -> float:
        return len(self.ops) / self.seconds if self.seconds > 0 else 0.0

    def ms(self, q: float) -> float:
        return 1000 * percentile([o.latency for o in self.ops], q) if self.ops else float("nan")

    @property
    def max_ms(self) -> float:
        return 1000 * max((o.latency for o in self.ops), default=0.0)

    def per_second(self) -> list[int]:
        buckets = [0] * int(self.seconds)
        for o in self.ops:
            i = int(o.ended - self.start)
            if 0 <= i < len(buckets):
                buckets[i] += 1
        return buckets


def window(label: str, ops: Sequence[Op], start: float, end: float) -> Window:
    """Writes acknowledged in [start, end) (latency = their whole time, even from before)."""
    inside = [o for o in ops if start <= o.ended < end]
    return Window(
        label, start, end, [o for o in inside if o.ok], sum(1 for o in inside if not o.ok)
    )


class CpuMeter:
    def __init__(self, cluster: Cluster) -> None:
        self.procs = {c.name: psutil.Process(c.proc.pid) for c in cluster.children if c.proc}
        self.procs["bench"] = psutil.Process()

    def sample(self) -> dict[str, float]:
        out = {}
        for name, p in self.procs.items():
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                out[name] = t.user + t.system
        return out

    @staticmethod
    def share(
        before: dict[str, float], after: dict[str, float], seconds: float
    ) -> dict[str, float]:
        """% of one core per process."""
        return {n: 100 * (after[n] - before[n]) / seconds for n in after if n in before}


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Result:
    args: argparse.Namespace
    started_unix: float = 0.0
    generation_before: int = 0
    preload_keys: int = 0
    preload_bytes: int = 0
    preload_s: float = 0.0
    moved_keys: int = 0
    moved_bytes: int = 0
    alter_at: float = 0.0
    alter_acked_s: float = 0.0
    phases: Phases | None = None
    reports: Reports = field(default_factory=Reports)
    status: StatusSeen = field(default_factory=StatusSeen)
    windows: list[Window] = field(default_factory=list)
    moving_during: Window | None = None
    writer_attempts: Counter[str] = field(default_factory=Counter)
    cutover_writer_max_ms: float = 0.0
    pauses: list[Pause] = field(default_factory=list)
    probe_writes: int = 0
    probe_ms: tuple[float, float] = (0.0, 0.0)
    server_pause_ms: dict[int, float] = field(default_factory=dict)
    check: CheckResult | None = None
    writers_acked: int = 0
    writers_attempted: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)
    work_dir: Path = Path()
    wall_s: float = 0.0


async def until(check: Callable[[], Awaitable[bool]], what: str, within: float) -> None:
    deadline = now() + within
    while not await check():
        if now() > deadline:
            raise RuntimeError(f"timed out after {within:.0f} s waiting for {what}")
        await asyncio.sleep(0.2)


async def prepare_zone(
    api: PlacementClient, client: DataClient, etcd: EtcdClient, keys: KeySpace, partitions: int
) -> int:
    """Create the zone; wait until its layout is in force, every partition takes a write and
    every in-sync set holds all agents. Returns the layout's generation."""
    config = driver_pb2.ZoneConfig(partitions=partitions, replicas=REPLICAS)
    request = driver_pb2.CreateZoneRequest(name=ZONE, config=config)
    await api.call(lambda s, t: s.CreateZone(request, timeout=t))
    generation = 0

    async def layout_in_force() -> bool:
        nonlocal generation
        zone = await api.call(
            lambda s, t: s.GetZone(driver_pb2.GetZoneRequest(name=ZONE), timeout=t)
        )
        generation = zone.layout.generation
        return zone.layout.partitions == partitions and not zone.layout.HasField("reshard")

    await until(layout_in_force, "the zone's layout", 120.0)
    targets: dict[int, bytes] = {}
    i = 0
    while len(targets) < partitions:
        key = b"ready-%d" % i
        targets.setdefault(partition_of(key, partitions), key)
        i += 1
    for key in targets.values():
        await client.put(ZONE, key, b"ready")
    await wait_in_sync(etcd, keys, partitions)
    return generation


async def wait_in_sync(etcd: EtcdClient, keys: KeySpace, partitions: int) -> None:
    async def full() -> bool:
        found = await etcd.list_prefix(keys.zone_isr_prefix(ZONE))
        n = 0
        for kv in found.kvs:
            isr = decode_isr(kv.value)
            parsed = keys.parse(kv.key)
            if (
                isinstance(isr, InSyncSet)
                and parsed is not None
                and parsed.partition is not None
                and parsed.partition < partitions
                and len(isr.members) == AGENTS
            ):
                n += 1
        return n >= partitions

    await until(full, f"all {AGENTS} agents in every in-sync set", 120.0)


def bulk_value(i: int, size: int, block: bytes) -> bytes:
    return (b"%08d:" % i + block)[:size]


async def preload(client: DataClient, args: argparse.Namespace, result: Result) -> bytes:
    count = int(args.mb * (1 << 20)) // args.value_size
    block = os.urandom(args.value_size).hex()[: args.value_size].encode()  # ASCII: cheap to check
    queue = iter(range(count))
    started = now()

    async def loader() -> None:
        for i in queue:
            key = b"bulk-%07d" % i
            value = bulk_value(i, args.value_size, block)
            await client.put(ZONE, key, value)
            result.preload_bytes += len(key) + len(value)
            if key_moves(key, args.src, args.dst) is not None:
                result.moved_keys += 1
                result.moved_bytes += len(key) + len(value)

    await asyncio.gather(*(loader() for _ in range(args.preload_concurrency)))
    result.preload_keys = count
    result.preload_s = now() - started
    return block


async def run(cluster: Cluster, opts: UpOptions, args: argparse.Namespace, result: Result) -> None:
    keys = KeySpace(cluster.prefix)
    await wait_ready(cluster, opts, demo_zone=False)
    record = result.work_dir / "writers.jsonl"
    writer_conn = RecordingConnector()
    probe_conn = RecordingConnector()
    async with (
        PlacementClient(cluster.driver_apis, deadline=30.0) as api,
        EtcdClient([cluster.etcd_endpoint], call_timeout=10.0) as etcd,
        DataClient(cluster.driver_apis, deadline=30.0) as client,
        TimedClient(cluster.driver_apis, deadline=30.0, connector=writer_conn) as writers_client,
        DataClient(
            cluster.driver_apis, deadline=30.0, backoff=PROBE_RETRY, connector=probe_conn
        ) as probe_client,
    ):
        result.generation_before = await prepare_zone(api, client, etcd, keys, args.src)
        print(f"zone {ZONE}: {args.src} partitions in force, in sync", flush=True)
        block = await preload(client, args, result)
        print(
            f"preloaded {result.preload_bytes / 1e6:.1f} MB ({result.preload_keys} keys) in "
            f"{result.preload_s:.1f} s; {result.moved_bytes / 1e6:.1f} MB of it moves",
            flush=True,
        )
        await wait_in_sync(etcd, keys, args.src)
        await asyncio.sleep(1.0)

        phases = Phases(offset=time.time() - time.monotonic())
        result.phases = phases
        stop = asyncio.Event()
        writers = asyncio.create_task(
            run_writers(
                writers_client,
                ZONE,
                args.writers,
                args.keys_per_writer,
                86400.0,
                record,
                stop,
                seed=1,
            )
        )
        probes = probe_keys(args.src, args.dst)
        probe_tasks = [
            asyncio.create_task(run_probe(p, probe_client, phases, stop)) for p in probes
        ]
        meter = CpuMeter(cluster)
        background: list[asyncio.Task[None]] = []
        try:
            revision = await etcd.current_revision()  # watches open now, long before the alter
            background = [
                asyncio.create_task(watch_layout(etcd, keys, revision + 1, phases)),
                asyncio.create_task(watch_reports(etcd, keys, revision + 1, result.reports)),
                asyncio.create_task(poll_status(api, result.status)),
            ]
            await asyncio.sleep(args.warmup)
            print(f"before: {args.steady:.0f} s of {args.writers} writers", flush=True)
            cpu0, t0 = meter.sample(), now()
            await asyncio.sleep(args.steady)
            cpu1 = meter.sample()
            print(f"alter --partitions {args.dst}", flush=True)
            result.alter_at = t1 = now()
            alter = driver_pb2.AlterZoneRequest(
                name=ZONE,
                config=driver_pb2.ZoneConfig(partitions=args.dst),
                update_fields=["partitions"],
            )
            await api.call(lambda s, t: s.AlterZone(alter, timeout=t))
            result.alter_acked_s = now() - t1
            try:
                await asyncio.wait_for(phases.finished.wait(), args.timeout)
            except TimeoutError:
                result.problems.append(
                    f"the reshard did not finish within {args.timeout:.0f} s; phases seen: "
                    + ", ".join(p for p, _, _ in phases.changes)
                )
            done_at = phases.at("done") or now()
            t2 = max(done_at, t1 + 1e-3)
            cpu2 = meter.sample()
            print(
                f"reshard ended ({phases.changes[-1][0] if phases.changes else '?'}); "
                f"after: {args.after:.0f} s",
                flush=True,
            )
            await asyncio.sleep(args.after)
            t3 = now()
        finally:
            stop.set()
            stats = await writers
            await asyncio.gather(*probe_tasks)
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

        ops = writers_client.ops
        before = window("before", ops, t0, t1)
        before.cpu = CpuMeter.share(cpu0, cpu1, t1 - t0)
        during = window("during", ops, t1, t2)
        during.cpu = CpuMeter.share(cpu1, cpu2, t2 - t1)
        after = window("after", ops, t2, t3)
        result.windows = [before, during, after]
        moving = [o for o in ops if key_moves(o.key, args.src, args.dst) is not None]
        result.moving_during = window("during, moving keys only", moving, t1, t2)
        result.writer_attempts = Counter(a.outcome for a in writer_conn.rows if t1 <= a.began < t2)
        seal_at, flip_at = phases.at("seal"), phases.at("cleanup")
        if seal_at is not None and flip_at is not None:
            result.cutover_writer_max_ms = 1000 * max(
                (o.latency for o in moving if o.ok and o.began < flip_at and o.ended > seal_at),
                default=0.0,
            )
        result.pauses = [probe_pause(p, probe_conn.rows, seal_at, flip_at) for p in probes]
        dump_timeline(result.work_dir / "timeline.jsonl", t1, phases, probe_conn.rows)
        probe_ops = [o for p in probes for o in p.ops if o.ok and t0 <= o.ended < t1]
        result.probe_writes = sum(len(p.ops) for p in probes)
        if probe_ops:
            lat = [o.latency for o in probe_ops]
            result.probe_ms = (1000 * percentile(lat, 50), 1000 * percentile(lat, 99))
        result.writers_acked, result.writers_attempted = stats.acked, stats.attempted

        # -- the checks --
        if phases.at("abort") is not None:
            result.problems.append("the reshard aborted")
        if phases.at("done") is not None and phases.partitions != args.dst:
            result.problems.append(f"the layout ended at {phases.partitions} partitions")
        if phases.at("done") is not None and phases.generation != result.generation_before + 1:
            result.problems.append(
                f"generation {result.generation_before} → {phases.generation}, not +1"
            )
        print("checking every acknowledged write and every replica ...", flush=True)
        # DataClient.scan sizes its merge from the cached routes: this client's are from before
        # the reshard (--from partitions), and the scan would miss every partition added since.
        await client.routes(ZONE, refresh=True)
        result.check = await check_workload(client, ZONE, record, settle=30.0)
        if not result.check.ok:
            result.problems.append(f"check_workload: {result.check.as_json()}")
        bad = 0
        found = 0
        async for key, value in client.scan(ZONE, prefix=b"bulk-"):
            found += 1
            i = int(key[5:])
            if value != bulk_value(i, args.value_size, block):
                bad += 1
        if found != result.preload_keys or bad:
            result.problems.append(
                f"preloaded keys: {found} of {result.preload_keys} readable, "
                f"{bad} with a wrong value"
            )
        for p in probes:
            got = await client.get(ZONE, p.key)
            allowed = {b"%d" % s for s in range(max(p.acked, 1), p.attempted + 1)}
            if p.acked and got not in allowed:
                result.problems.append(
                    f"probe key {p.key!r} holds {got!r}; its last acknowledged value is {p.acked}"
                )
    result.server_pause_ms = server_pauses(result)


def dump_timeline(path: Path, t1: float, phases: Phases, rows: Sequence[Attempt]) -> None:
    """The phases and every probe RPC, in seconds after the alter (for a closer look)."""
    with path.open("w", encoding="utf-8") as out:
        for phase, at, arrived in phases.changes:
            line = {"phase": phase, "written": round(at - t1, 4), "seen": round(arrived - t1, 4)}
            out.write(json.dumps(line) + "\n")
        for a in rows:
            line = {
                "probe": a.partition,
                "key": a.key.decode(),
                "began": round(a.began - t1, 4),
                "ended": round(a.ended - t1, 4),
                "outcome": a.outcome,
            }
            out.write(json.dumps(line) + "\n")


LOG_SEAL = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \S+ replica\.data\.primary "
    r"(\S+)/(\d+)@\d+: sealed for reshard (\d+) "
)


def server_pauses(result: Result) -> dict[int, float]:
    """Per source partition, ms from its seal as its primary logged it (after the seal's write
    committed) to the flip (the leader's timestamp of the CLEANUP layout write)."""
    phases = result.phases
    if phases is None or phases.at("cleanup") is None:
        return {}
    flip_unix = cast(float, phases.at("cleanup")) + phases.offset
    sealed: dict[int, float] = {}
    for log in sorted((result.work_dir / "cluster" / "logs").glob("node-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            m = LOG_SEAL.match(line)
            if m is None or m.group(3) != ZONE or int(m.group(5)) != phases.attempt:
                continue
            t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1e3
            p = int(m.group(4))
            sealed[p] = min(t, sealed.get(p, t))
    return {p: 1000 * (flip_unix - t) for p, t in sorted(sealed.items())}


def tracebacks(work_dir: Path) -> list[str]:
    out = []
    for log in sorted((work_dir / "cluster" / "logs").glob("*.log")):
        n = log.read_text(errors="replace").count("Traceback")
        if n:
            out.append(f"{log.name}: {n} traceback(s)")
    return out


# -- report ------------------------------------------------------------------------------------


def fmt(seconds: float | None, unit: str = "s") -> str:
    if seconds is None:
        return "—"
    return f"{1000 * seconds:.0f} ms" if unit == "ms" else f"{seconds:.2f} s"


def window_row(w: Window) -> str:
    per_s = w.per_second()
    return (
        f"| {w.label} | {w.seconds:.1f} | {len(w.ops)} | **{w.rate:.0f}** | "
        f"{min(per_s) if per_s else '—'} | {w.ms(50):.1f} | **{w.ms(99):.1f}** | {w.max_ms:.0f} | "
        f"{w.failed} |"
    )


def report(result: Result) -> str:
    args = result.args
    phases = result.phases or Phases(offset=0.0)
    exe = (
        os.path.relpath(sys.executable, ROOT)
        if sys.executable.startswith(str(ROOT))
        else sys.executable
    )
    command = " ".join(shlex.quote(a) for a in [exe, "bench/reshard_bench.py", *sys.argv[1:]])
    before = result.windows[0] if result.windows else None
    during = result.windows[1] if len(result.windows) > 1 else None
    ratio = during.rate / before.rate if before and during and before.rate else float("nan")
    copy_at, seal_at, flip_at, done_at = (phases.at(p) for p in ("copy", "seal", "cleanup", "done"))
    copy_s = seal_at - copy_at if copy_at is not None and seal_at is not None else None
    reported = sum(result.reports.bytes.get(p, 0) for p in Moves(args.src, args.dst).destinations)
    reported_keys = sum(
        result.reports.keys.get(p, 0) for p in Moves(args.src, args.dst).destinations
    )
    copy_mbps = reported / 1e6 / copy_s if copy_s else float("nan")
    preload_mbps = result.moved_bytes / 1e6 / copy_s if copy_s else float("nan")
    total_s = done_at - result.alter_at if done_at is not None else None
    bounds = [p.bound for p in result.pauses if p.bound is not None]
    longest = max(bounds, default=None)
    worst = max(result.pauses, key=lambda p: p.bound or -1.0, default=None)
    failed_pause = any(p.failed for p in result.pauses)
    throughput_ok = ratio >= GOAL_THROUGHPUT
    pause_ok = longest is not None and 1000 * longest <= GOAL_PAUSE_MS and not failed_pause
    mbps = args.catch_up_mbps if args.catch_up_mbps is not None else AGENT_DEFAULT_MBPS
    verdict = "FAILED" if result.problems else "passed"
    lines = [
        "# Re-sharding benchmark"
        + (" (QUICK RUN — not the benchmark's figures)" if args.quick else ""),
        "",
        "Produced by `bench/reshard_bench.py` (do not edit by hand). Real processes on one",
        f"machine: one etcd, one placement driver, {AGENTS} replica agents (`placectl agent run`,",
        f"`--catch-up-mbps {mbps:g}`"
        + (" (the agents' default)" if args.catch_up_mbps is None else "")
        + (", `--catch-up-fixed`" if args.catch_up_fixed else ", yielding to client writes")
        + "), started like `placectl up`.",
        f"Zone `{ZONE}`: {args.src} → **{args.dst}** partitions, {REPLICAS} replicas; "
        f"{result.preload_bytes / 1e6:.1f} MB preloaded ({result.preload_keys} values of "
        f"{args.value_size} B); {args.writers} writers running throughout.",
        "",
        f"**Correctness check: {verdict}.**"
        + (
            ""
            if result.problems
            else " Every acknowledged write readable with its value, every "
            "stable replica identical (`check_workload`), every preloaded key and every probe's "
            "last acknowledged value read back."
        ),
        *[f"- **{p}**" for p in result.problems],
        "",
        "## Goals",
        "",
        "| goal | measured | |",
        "|---|---:|---|",
        f"| write throughput during the reshard ≥ {100 * GOAL_THROUGHPUT:.0f} % of before | "
        f"{100 * ratio:.0f} % ({during.rate if during else 0:.0f} vs "
        f"{before.rate if before else 0:.0f} writes/s) | {'met' if throughput_ok else 'NOT met'} |",
        f"| longest per-partition write pause at the cut-over ≤ {GOAL_PAUSE_MS:.0f} ms | "
        + (
            f"{1000 * longest:.0f} ms (partition {worst.source})"
            if longest is not None and worst
            else "not observed"
        )
        + f" | {'met' if pause_ok else 'NOT met'} |",
        "",
        "## Figures",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| **total reshard time** (alter sent → layout {args.dst} in force, no reshard) | "
        f"**{fmt(total_s)}** |",
        f"| AlterZone answered after | {fmt(result.alter_acked_s, 'ms')} |",
        f"| bytes the copy moved (destinations' reports, max per partition) | "
        f"{reported / 1e6:.1f} MB, {reported_keys} keys |",
        f"| of which preloaded (keys whose partition changes, computed) | "
        f"{result.moved_bytes / 1e6:.1f} MB, {result.moved_keys} keys |",
        f"| `zone status` during the reshard: most bytes copied / bytes to copy shown | "
        f"{result.status.max_bytes_copied / 1e6:.1f} MB / "
        f"{result.status.bytes_to_copy / 1e6:.1f} MB "
        f"({result.status.resharding} of {result.status.polls} polls said RESHARDING) |",
        f"| COPY phase (COPY written → SEAL written) | {fmt(copy_s)} |",
        f"| **copied MB/s** (reported bytes ÷ COPY phase) | **{copy_mbps:.1f}** |",
        f"| copied MB/s, preloaded moving bytes only ÷ COPY phase | {preload_mbps:.1f} |",
        f"| SEAL → flip (SEAL written → CLEANUP written, zone-wide) | "
        f"{fmt(flip_at - seal_at if flip_at and seal_at else None, 'ms')} |",
        f"| **longest per-partition pause** (probe: see below) | **{fmt(longest, 'ms')}** |",
        f"| longest writer write to a moving key that spanned SEAL → flip | "
        f"{result.cutover_writer_max_ms:.0f} ms |",
        f"| writer RPCs during the reshard: refused as sealed / re-routed (`x-layout`) | "
        f"{result.writer_attempts.get('sealed', 0)} / {result.writer_attempts.get('layout', 0)} |",
        "",
        "### Phases",
        "",
        "Each row is one layout write, timed by the leader's own timestamp in it (`ts`); 'seen'",
        "is when the benchmark's etcd watch delivered it.",
        "",
        "| phase | written at (s after the alter) | seen at | lasted |",
        "|---|---:|---:|---:|",
    ]
    for i, (phase, at, arrived) in enumerate(phases.changes):
        nxt = phases.changes[i + 1][1] if i + 1 < len(phases.changes) else None
        lines.append(
            f"| {phase} | {at - result.alter_at:.3f} | {arrived - result.alter_at:.3f} | "
            f"{fmt(nxt - at if nxt is not None else None)} |"
        )
    lines += [
        "",
        "### Writes",
        "",
        f"{args.writers} writers (`run_writers`: each owns {args.keys_per_writer} keys, one "
        "operation in flight, values `v{seq}` of a few bytes, 10 % deletes; the routing client's",
        "default retry: 50 ms doubling to 1 s, jittered). A write counts in the window where it "
        "was acknowledged; its latency is first attempt → acknowledgement, retries included.",
        "",
        "| window | seconds | acked | writes/s | slowest 1-s bucket | p50 ms | p99 ms | max ms "
        "| failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[window_row(w) for w in result.windows],
        *([window_row(result.moving_during)] if result.moving_during else []),
        "",
        f"Writes per second, before: {before.per_second() if before else []}",
        "",
        f"Writes per second, during: {during.per_second() if during else []}",
        "",
    ]
    for w in (before, during):
        if w and w.cpu:
            shares = ", ".join(f"{n} {v:.0f} %" for n, v in sorted(w.cpu.items()))
            lines.append(
                f"CPU {w.label} (% of one core; {os.cpu_count()} cores): {shares}; "
                f"all {sum(w.cpu.values()):.0f} %."
            )
            lines.append("")
    lines += [
        "### Cut-over, per source partition",
        "",
        f"One probe per source partition writes one key that moves out of it: every "
        f"{PROBE_GAP * 1000:.0f} ms, and back to back (retry every 10 ms) from the moment the",
        "SEAL layout write is seen until 0.5 s after the flip is seen. 'bound' = the longest "
        "the key went without an acknowledged write from SEAL written until 0.5 s after the "
        "flip: the pause, measured as a client sees it (a write refused by the seal waits at "
        "the agent for the flip, up to 1 s, then is re-routed; the bound includes that "
        "re-route). 'refused' = first RPC answered 'sealed' → that write's acknowledgement "
        "(empty when none was: the write waited at the agent). 'server' = the flip (CLEANUP "
        "written) − the source primary's log line 'sealed for reshard' (logged once the "
        "seal's write committed: refusals begin just before).",
        f"Probe writes outside the cut-over, before: p50 {result.probe_ms[0]:.1f} ms, p99 "
        f"{result.probe_ms[1]:.1f} ms ({result.probe_writes} probe writes in all).",
        "",
        "| source | bound ms | refused ms | refused RPCs | server ms |",
        "|---:|---:|---:|---:|---:|",
    ]
    for p in result.pauses:
        server = result.server_pause_ms.get(p.source)
        lines.append(
            f"| {p.source} | {fmt(p.bound, 'ms').removesuffix(' ms')}"
            f"{' (write FAILED)' if p.failed else ''} | {fmt(p.refused, 'ms').removesuffix(' ms')} "
            f"| {p.refusals} | {f'{server:.0f}' if server is not None else '—'} |"
        )
    if result.status.polls and not result.status.bytes_to_copy:
        result.notes.append(
            "`zone status` showed 0 bytes to copy: it multiplies the sizes agents report (every "
            "10 s, DataConfig.size_interval), and none was reported for the zone's data yet."
        )
    check = result.check
    lines += [
        "",
        "### Check",
        "",
        (
            f"`check_workload`: {check.attempted_writes} attempted, {check.acked_writes} "
            f"acknowledged writes on {check.keys} keys; lost {check.lost}, wrong {check.wrong}, "
            f"replica lost {check.replica_lost}, replica wrong {check.replica_wrong}, divergent "
            f"{check.divergent_replicas}, unreachable {check.unreachable_replicas}; "
            f"{check.partitions_checked} partitions, {check.replicas_checked} replicas read."
            if check
            else "`check_workload` did not run."
        ),
        "",
        "Notes:",
        *([f"- {n}" for n in result.notes] or ["- none"]),
        "",
        "## What each number means",
        "",
        "- **before / during / after**: *before* = the last "
        f"{args.steady:g} s before the AlterZone call (after {args.warmup:g} s of warm-up); "
        "*during* = from sending AlterZone to the leader's write of the layout "
        f"({args.dst} partitions, no reshard) that ends it; *after* = the next {args.after:g} s. "
        "writes/s = writer operations acknowledged in the window ÷ its length; p50/p99/max over "
        "those operations. The probes' writes are not counted (they add ~"
        f"{len(result.pauses)}×{1 / PROBE_GAP:.0f} writes/s to every window).",
        "- **throughput during ÷ before**: the goal's ratio (≥ 70 %).",
        "- **total reshard time**: AlterZone sent → the leader's `ts` on the layout write that "
        "cleared the reshard (every phase, clean-up included).",
        "- **phases**: PREPARE (the new partitions placed, their replicas in sync), COPY (the "
        "destinations pull their keys, throttled by `--catch-up-mbps` per agent), SEAL (sources "
        "refuse writes to moving keys; destinations drain the rest unthrottled), CLEANUP (flipped: "
        "the new layout is in force; sources delete moved keys). Times are the leader's `ts` in "
        "each layout write, seen through an etcd watch on the layout key (not a poll).",
        "- **copied MB/s**: key + value bytes the destinations' reshard reports say they copied "
        "(each destination's largest report, watched in etcd — the COPY and SEAL tail, preloaded "
        "and written keys) ÷ the COPY phase's length. The second figure uses only the preloaded "
        "bytes whose partition changes (exact, from `key_moves`).",
        "- **longest per-partition pause**: the largest probe 'bound' (above). The zone-wide "
        "SEAL → flip interval is the leader's view of the same window; the writers' longest "
        "write to a moving key across it adds the default retry backoff.",
        "- **check**: the writers' record through `check_workload` (API scan + every stable "
        "replica read directly), then every preloaded key through a scan, then each probe key.",
        "",
        "## Run",
        "",
        f"- command: `{command}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(result.started_unix))}; "
        f"wall time {result.wall_s:.0f} s; logs and `timeline.jsonl` (the phases and every "
        f"probe RPC, in seconds after the alter) in `{result.work_dir}`",
        *machine(),
        "- load (`uptime`) at start / end (other work on the machine shares its cores, and the "
        "benchmark's client runs on them too):",
        *[f"  - `{x}`" for x in result.loads],
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small run: ~5 MB, 4 writers, 4 → 8")
    parser.add_argument("--mb", type=float, help="MiB to preload (default 100; quick 5)")
    parser.add_argument("--writers", type=int, help="recorded writers (default 16; quick 4)")
    parser.add_argument("--from", dest="src", type=int, help="partitions before (16; quick 4)")
    parser.add_argument("--to", dest="dst", type=int, help="partitions after (32; quick 8)")
    parser.add_argument("--value-size", type=int, default=64 << 10, help="preload value bytes")
    parser.add_argument(
        "--catch-up-mbps",
        type=float,
        help=f"every agent's --catch-up-mbps (default: the agents' own, {AGENT_DEFAULT_MBPS:g})",
    )
    parser.add_argument(
        "--catch-up-fixed",
        action="store_true",
        help="every agent with --catch-up-fixed: copies always at --catch-up-mbps, never"
        " yielding to client writes (what agents did before yielding)",
    )
    parser.add_argument("--keys-per-writer", type=int, default=100)
    parser.add_argument("--preload-concurrency", type=int, default=32)
    parser.add_argument("--steady", type=float, help="seconds of the before window (10; quick 4)")
    parser.add_argument("--warmup", type=float, help="seconds of writes before it (2; quick 1)")
    parser.add_argument("--after", type=float, help="seconds after the reshard (5; quick 2)")
    parser.add_argument("--timeout", type=float, help="seconds the reshard may take (900; 180)")
    parser.add_argument(
        "--out",
        type=Path,
        help=f"results file (default {RESULTS.relative_to(ROOT)}; with --quick a temp file)",
    )
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.out is None:
        args.out = Path(tempfile.gettempdir()) / "reshard_quick.md" if args.quick else RESULTS
    if args.src == args.dst or min(args.src, args.dst) < 1:
        parser.error("--from and --to must be positive and differ")
    if not 1 <= args.value_size <= 1 << 20:
        parser.error("--value-size must be 1 .. 1048576")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = Result(args, started_unix=time.time())
    started = now()
    result.work_dir = Path(tempfile.mkdtemp(prefix="reshard-bench-"))
    print(f"work dir (logs): {result.work_dir}", flush=True)
    result.loads.append(load())
    agent_args = (
        () if args.catch_up_mbps is None else ("--catch-up-mbps", f"{args.catch_up_mbps:g}")
    ) + (("--catch-up-fixed",) if args.catch_up_fixed else ())
    # plaintext, as the recorded figures were measured (TLS's cost: bench/tls_bench.py)
    opts = UpOptions(
        nodes=AGENTS, drivers=1, api_port=0, live=False, agent_args=agent_args, insecure=True
    )
    cluster = start_cluster(opts, result.work_dir / "cluster", Console(quiet=True))
    try:
        asyncio.run(run(cluster, opts, args, result))
    except KeyboardInterrupt:
        print("interrupted; stopping every process", file=sys.stderr)
        return 130
    except Exception as e:  # the figures so far still go out, marked FAILED
        result.problems.append(f"the run failed: {type(e).__name__}: {e}")
    finally:
        stuck = cluster.stop()
        if stuck:
            print(f"not reaped: {[c.name for c in stuck]}", file=sys.stderr)
        else:  # the data (3 × --mb and etcd's) goes; the logs and timeline stay
            for data in ("agents", "etcd"):
                shutil.rmtree(result.work_dir / "cluster" / data, ignore_errors=True)
    result.notes += tracebacks(result.work_dir)
    result.loads.append(load())
    result.wall_s = now() - started
    text = report(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    print(f"written to {args.out}", flush=True)
    if result.problems:
        print("FAILED: " + "; ".join(result.problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
