"""Data-plane benchmark: write throughput/latency with and without a concurrent rebalance, and
catch-up speed of a joining node.

One run::

    .venv/bin/python bench/data_plane_bench.py [--partitions 8] [--replicas 3] [--writers 16]
        [--seconds 15] [--preload-mb 64]

Real processes, started the way ``bench/control_plane_bench.py`` starts them (its helpers are
reused): etcd, one placement driver (``python -m placement driver run``), replica agents
(``python -m placement agent run``: the real data plane, default ``--catch-up-mbps 64``,
``--isr-timeout 3``).

Cluster A (3 agents, zone P×R): ``--writers`` asyncio tasks each ``DataService.Put`` 256-byte
values straight to the partition's primary (routes read from etcd: ``{p}/primary/...`` and the
node records; ``FAILED_PRECONDITION`` + ``x-primary`` is followed at once; other errors re-read
the routes after 50 ms). Latency = first attempt → acknowledgement, retries and redirects
included. Two windows of ``--seconds``: (1) idle cluster; (2) a 4th agent is spawned at the start
of the window, so partitions move to it (data catch-up) under load; the time until the zone has
settled (no pending/planned, the new node in stable) is reported. Afterwards every stable member
of every partition is read (``ReadReplica``) and compared with the others and with the last
acknowledged value of every key.

Cluster B (fresh, 3 agents): ``--preload-mb`` of 64 KiB values (``--preload-concurrency`` Puts in
flight), then a 4th agent joins; from its registration until every partition that moved to it
has it in the ISR (``{p}/isr/...``, polled every 25 ms), bytes copied = key+value bytes of those
partitions (``ReadReplica`` on the new node afterwards) ÷ time.

Writes ``bench/results/data_plane.md`` and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import psutil

ROOT = Path(__file__).resolve().parents[1]
for extra in (str(ROOT), str(ROOT / "bench")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

from control_plane_bench import (  # noqa: E402
    PREFIX,
    ZONE,
    Child,
    Cluster,
    Stopped,
    create_zone_and_wait,
    kill_leftovers,
    sigterm_raises,
    start_driver,
    start_etcd,
)

from placement.data.client import DataClient  # noqa: E402
from placement.data.partitioning import partition_of  # noqa: E402
from placement.errors import PlacementError  # noqa: E402
from placement.metastore.codec import (  # noqa: E402
    InSyncSet,
    NodeRecord,
    PrimaryLease,
    decode_isr,
    decode_node,
    decode_primary,
)
from placement.metastore.etcd import EtcdClient  # noqa: E402
from placement.metastore.keys import KeySpace  # noqa: E402
from placement.metastore.store import Metastore  # noqa: E402
from placement.v1 import common_pb2, data_pb2, data_pb2_grpc  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "data_plane.md"
NOTES: list[str] = []  # stalls observed (reported as found)
FACTS: list[str] = []  # what the client saw (reported after the CPU line)
GIVE_UP = 30.0  # a Put not acknowledged within this (retries included) counts as failed


# -- processes ---------------------------------------------------------------------------------


async def start_agent(cluster: Cluster, node: str) -> tuple[str, float]:
    """A data-plane agent; returns its address and the monotonic time it announced (it
    announces after registering its node key)."""
    agent = Child(
        node,
        [
            sys.executable, "-m", "placement", "agent", "run",
            "--etcd", cluster.etcd,
            "--node", node,
            "--listen", "127.0.0.1:0",
            "--data-dir", str(cluster.base / "agents" / node),
            "--prefix", PREFIX,
        ],
        cluster.base / "logs" / f"{node}.log",
    )  # fmt: skip
    (cluster.base / "agents" / node).mkdir(parents=True, exist_ok=True)
    cluster.children.append(agent)
    cluster.agents[node] = agent
    line = await agent.start(announce=f"agent {node} listening on ")
    return line.rsplit(" ", 1)[1], time.monotonic()


async def until(check: Callable[[], Awaitable[bool]], what: str, within: float = 120.0) -> float:
    start = time.monotonic()
    while not await check():
        if time.monotonic() - start > within:
            raise RuntimeError(f"timed out after {within:.0f}s waiting for {what}")
        await asyncio.sleep(0.05)
    return time.monotonic()


# -- routing -----------------------------------------------------------------------------------


class Router:
    """Partition → primary address, from etcd; one channel per address."""

    def __init__(self, client: EtcdClient, keys: KeySpace, partitions: int) -> None:
        self.client, self.keys, self.partitions = client, keys, partitions
        self.addr: dict[int, str] = {}
        self.channels: dict[str, grpc.aio.Channel] = {}
        self._refreshing: asyncio.Task[None] | None = None
        self._last = 0.0
        self.refreshes = 0

    async def refresh(self) -> None:
        if self._refreshing is None or self._refreshing.done():
            if time.monotonic() - self._last < 0.05:
                return
            self._refreshing = asyncio.create_task(self._refresh())
        await asyncio.shield(self._refreshing)

    async def _refresh(self) -> None:
        self.refreshes += 1
        nodes: dict[str, str] = {}
        for kv in (await self.client.list_prefix(self.keys.nodes_prefix())).kvs:
            rec = decode_node(kv.value)
            if isinstance(rec, NodeRecord):
                nodes[rec.name] = rec.address
        base = self.keys.zone_primary_prefix(ZONE)
        for kv in (await self.client.list_prefix(base)).kvs:
            tail = kv.key[len(base) :]
            lease = decode_primary(kv.value)
            if tail.isdigit() and isinstance(lease, PrimaryLease) and lease.node in nodes:
                self.addr[int(tail)] = nodes[lease.node]
        self._last = time.monotonic()

    def data(self, address: str) -> data_pb2_grpc.DataServiceAsyncStub:
        return data_pb2_grpc.DataServiceStub(self._channel(address))  # type: ignore[return-value]

    def replication(self, address: str) -> data_pb2_grpc.ReplicationServiceAsyncStub:
        return data_pb2_grpc.ReplicationServiceStub(self._channel(address))  # type: ignore[return-value]

    def _channel(self, address: str) -> grpc.aio.Channel:
        if address not in self.channels:
            self.channels[address] = grpc.aio.insecure_channel(
                address,
                options=[
                    ("grpc.max_receive_message_length", 64 << 20),
                    ("grpc.max_send_message_length", 64 << 20),
                ],
            )
        return self.channels[address]

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()


@dataclass
class Stats:
    latencies: list[float] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    redirects: int = 0
    failed: int = 0
    failures: Counter[str] = field(default_factory=Counter)


async def put(router: Router, key: bytes, value: bytes, stats: Stats) -> float | None:
    """Put through the primary; the latency, or None when it gave up after GIVE_UP s."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    p = partition_of(key, router.partitions)
    request = data_pb2.PutRequest(
        partition=common_pb2.PartitionRef(zone=ZONE, partition=p), key=key, value=value
    )
    last = ""
    while loop.time() - start < GIVE_UP:
        address = router.addr.get(p)
        if address is None:
            await router.refresh()
            if router.addr.get(p) is None:
                await asyncio.sleep(0.05)
            continue
        try:
            await router.data(address).Put(request, timeout=10)
            return loop.time() - start
        except grpc.aio.AioRpcError as e:
            code = e.code()
            if code == grpc.StatusCode.FAILED_PRECONDITION:
                hint = dict(e.trailing_metadata() or ()).get("x-primary", "")
                node, _, where = str(hint).partition("@")
                if node and where and where != address:
                    stats.redirects += 1
                    router.addr[p] = where
                    continue
            last = f"{code.name}: {e.details()}"
            stats.errors[code.name] += 1
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                break
            await asyncio.sleep(0.05)
            await router.refresh()
    stats.failed += 1
    stats.failures[last[:160]] += 1
    return None


@dataclass
class Window:
    label: str
    seconds: float
    writers: int
    stats: Stats
    #: CPU seconds per process (user + system) during the window; "bench" = this process.
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def acked(self) -> int:
        return len(self.stats.latencies)

    def pct(self, q: float) -> float:
        lat = sorted(self.stats.latencies)
        return 1000 * lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")

    def per_second(self) -> list[int]:
        buckets = [0] * int(self.seconds)
        for t in self.stats.ack_times:
            if 0 <= int(t) < len(buckets):
                buckets[int(t)] += 1
        return buckets


Send = Callable[[bytes, bytes, Stats], Awaitable[float | None]]


def direct_sender(router: Router) -> Send:
    """One unary ``DataService.Put`` per write, routed by the benchmark itself."""
    return lambda key, value, stats: put(router, key, value, stats)


def client_sender(client: DataClient) -> Send:
    """The product's :class:`DataClient` (routes from the drivers; writes to one agent go out
    together in ``WriteBatch`` calls)."""

    async def send(key: bytes, value: bytes, stats: Stats) -> float | None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            await client.put(ZONE, key, value)
        except PlacementError as e:
            stats.failed += 1
            stats.failures[str(e)[:160]] += 1
            return None
        return loop.time() - start

    return send


async def write_window(
    send: Send,
    label: str,
    writers: int,
    seconds: float,
    value_size: int,
    acked: dict[bytes, bytes],
    keys_per_writer: int = 2000,
) -> Window:
    """``writers`` tasks Put for ``seconds``; acknowledgements after the end are not counted."""
    stats = Stats()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    end = t0 + seconds
    rng = random.Random(len(label))
    tag = label[:1].encode()

    async def writer(w: int) -> None:
        seq = 0
        while loop.time() < end:
            key = b"%s%02d-%05d" % (tag, w, seq % keys_per_writer)
            value = (b"%d:%d:" % (w, seq)).ljust(value_size, bytes([97 + rng.randrange(26)]))
            seq += 1
            latency = await send(key, value, stats)
            if latency is None:
                continue
            now = loop.time()
            acked[key] = value  # each key has one writer, writing sequentially
            if now <= end:
                stats.latencies.append(latency)
                stats.ack_times.append(now - t0)

    await asyncio.gather(*(writer(w) for w in range(writers)))
    return Window(label, seconds, writers, stats)


# -- etcd views --------------------------------------------------------------------------------


async def zone_view(
    store: Metastore, client: EtcdClient, keys: KeySpace
) -> tuple[dict[int, tuple[str, ...]], bool, dict[int, InSyncSet]]:
    """Stable peers per partition, whether any pending/planned exists, the ISRs."""
    state = await store.read_zone(ZONE)
    stables: dict[int, tuple[str, ...]] = {}
    moving = False
    for p, s in state.partitions.items():
        if s.stable is not None:
            stables[p] = s.stable.value.peers  # type: ignore[union-attr]
        if s.pending is not None or s.planned is not None:
            moving = True
    isrs: dict[int, InSyncSet] = {}
    base = keys.zone_isr_prefix(ZONE)
    for kv in (await client.list_prefix(base)).kvs:
        tail = kv.key[len(base) :]
        isr = decode_isr(kv.value)
        if tail.isdigit() and isinstance(isr, InSyncSet):
            isrs[int(tail)] = isr
    return stables, moving, isrs


async def settled(store: Metastore, client: EtcdClient, keys: KeySpace, partitions: int) -> bool:
    stables, moving, isrs = await zone_view(store, client, keys)
    return (
        not moving
        and len(stables) == partitions
        and all(p in isrs and set(isrs[p].members) == set(stables[p]) for p in stables)
    )


async def describe(store: Metastore, client: EtcdClient, keys: KeySpace, partitions: int) -> str:
    stables, moving, isrs = await zone_view(store, client, keys)
    bad = [
        f"p{p}: stable {stables.get(p)} ISR {isrs[p].members if p in isrs else None}"
        for p in range(partitions)
        if p not in isrs or set(isrs[p].members) != set(stables.get(p) or ())
    ]
    return f"pending/planned present: {moving}; ISR ≠ stable: " + ("; ".join(bad) or "none")


async def wait_settled(
    store: Metastore,
    client: EtcdClient,
    keys: KeySpace,
    partitions: int,
    what: str,
    notes: list[str],
    within: float = 30.0,
) -> None:
    """Until ISR = stable everywhere; on timeout note each partition's state and go on."""
    try:
        await until(lambda: settled(store, client, keys, partitions), what, within)
    except RuntimeError as e:
        note = f"{e}: {await describe(store, client, keys, partitions)}"
        print(note, flush=True)
        notes.append(note)


async def until_or_note(
    check: Callable[[], Awaitable[bool]],
    what: str,
    within: float,
    store: Metastore,
    client: EtcdClient,
    keys: KeySpace,
    args: argparse.Namespace,
) -> float:
    """``until``; on timeout note the zone's state and return the time anyway."""
    try:
        return await until(check, what, within)
    except RuntimeError as e:
        note = f"{e}: {await describe(store, client, keys, args.partitions)}"
        print(note, flush=True)
        NOTES.append(note)
        return time.monotonic()


async def read_replica(
    router: Router, address: str, p: int, limit: int = 256
) -> dict[bytes, bytes] | None:
    out: dict[bytes, bytes] = {}
    after = b""
    while True:
        reply = await router.replication(address).ReadReplica(
            data_pb2.ReadReplicaRequest(
                partition=common_pb2.PartitionRef(zone=ZONE, partition=p),
                start_after=after,
                limit=limit,
            ),
            timeout=30,
        )
        if not reply.hosted:
            return None
        out.update((i.key, i.value) for i in reply.items)
        if not reply.more or not reply.items:
            return out
        after = reply.items[-1].key


async def node_addresses(client: EtcdClient, keys: KeySpace) -> dict[str, str]:
    out: dict[str, str] = {}
    for kv in (await client.list_prefix(keys.nodes_prefix())).kvs:
        rec = decode_node(kv.value)
        if isinstance(rec, NodeRecord):
            out[rec.name] = rec.address
    return out


async def verify(
    router: Router,
    store: Metastore,
    client: EtcdClient,
    keys: KeySpace,
    partitions: int,
    acked: dict[bytes, bytes],
) -> list[str]:
    """Every stable member holds the same data, and every key's last acknowledged value."""
    problems: list[str] = []
    stables, _, _ = await zone_view(store, client, keys)
    nodes = await node_addresses(client, keys)
    for p, peers in sorted(stables.items()):
        want = {k: v for k, v in acked.items() if partition_of(k, partitions) == p}
        copies = {n: await read_replica(router, nodes[n], p) for n in peers}
        first = copies[peers[0]]
        for n, copy in copies.items():
            if copy is None:
                problems.append(f"partition {p}: {n} (stable member) hosts no complete replica")
                continue
            if copy != first:
                problems.append(f"partition {p}: {n} differs from {peers[0]}")
            lost = sum(1 for k, v in want.items() if copy.get(k) != v)
            if lost:
                problems.append(f"partition {p}: {n} lacks {lost} last-acknowledged values")
    return problems


# -- phases ------------------------------------------------------------------------------------


@dataclass
class RebalanceResult:
    spawn_to_registered_s: float = 0.0
    registered_to_settled_s: float = 0.0
    moved_to_new: int = 0


@dataclass
class CatchUpResult:
    preload_bytes: int = 0
    preload_s: float = 0.0
    registered_to_first_pending_s: float = 0.0
    registered_to_last_isr_s: float = 0.0
    first_pending_to_last_isr_s: float = 0.0
    registered_to_settled_s: float = 0.0
    moved: int = 0
    moved_bytes: int = 0
    per_partition: list[tuple[int, int, float]] = field(default_factory=list)
    size_keys: dict[int, int] = field(default_factory=dict)


async def cluster_a(
    args: argparse.Namespace, base: Path
) -> tuple[Window, Window, RebalanceResult, list[str]]:
    keys = KeySpace(PREFIX)
    cluster = Cluster(base)
    try:
        await start_etcd(cluster)
        await start_driver(cluster, [])
        await asyncio.gather(*(start_agent(cluster, f"n{k}") for k in (1, 2, 3)))
        from placement.api.client import PlacementClient

        async with (
            PlacementClient([cluster.api], deadline=30.0) as api,
            EtcdClient([cluster.etcd], call_timeout=10.0) as client,
        ):
            await create_zone_and_wait(cluster, api, 4, args.partitions, args.replicas)
            store = Metastore(client, keys)
            await wait_settled(store, client, keys, args.partitions, "ISR = stable", NOTES)
            router = Router(client, keys, args.partitions)
            writes = DataClient([cluster.api], deadline=GIVE_UP)
            send = client_sender(writes) if args.client == "batched" else direct_sender(router)
            try:
                await router.refresh()
                acked: dict[bytes, bytes] = {}
                await write_window(send, "warmup", args.writers, 2.0, args.value_size, acked)
                print("window 1: no rebalance", flush=True)
                procs = {c.name: psutil.Process(c.proc.pid) for c in cluster.children if c.proc}
                procs["bench"] = psutil.Process()
                before = {name: cpu_seconds(p) for name, p in procs.items()}
                quiet = await write_window(
                    send, "quiet", args.writers, args.seconds, args.value_size, acked
                )
                quiet.cpu = {name: cpu_seconds(p) - before[name] for name, p in procs.items()}
                print(f"  {quiet.acked / quiet.seconds:.0f} writes/s", flush=True)
                print("window 2: n4 joins", flush=True)
                result = RebalanceResult()
                spawned = time.monotonic()
                joiner = asyncio.create_task(start_agent(cluster, "n4"))
                busy = await write_window(
                    send, "rebalance", args.writers, args.seconds, args.value_size, acked
                )
                _, registered = await joiner
                result.spawn_to_registered_s = registered - spawned
                print(f"  {busy.acked / busy.seconds:.0f} writes/s", flush=True)

                async def done() -> bool:
                    stables, moving, _ = await zone_view(store, client, keys)
                    if moving or not any("n4" in s for s in stables.values()):
                        return False
                    return await settled(store, client, keys, args.partitions)

                at = await until_or_note(
                    done, "the zone to settle after n4 joined", 90.0, store, client, keys, args
                )
                result.registered_to_settled_s = at - registered
                stables, _, _ = await zone_view(store, client, keys)
                result.moved_to_new = sum(1 for s in stables.values() if "n4" in s)
                problems = await verify(router, store, client, keys, args.partitions, acked)
                calls, carried = writes.write_batches()
                if calls:
                    FACTS.append(
                        f"Client batches: {carried} writes in {calls} `WriteBatch` calls"
                        f" ({carried / calls:.2f} per call), all windows and retries counted."
                    )
            finally:
                await writes.close()
                await router.close()
    finally:
        await cluster.stop()
    return quiet, busy, result, problems


async def cluster_b(args: argparse.Namespace, base: Path) -> CatchUpResult:
    keys = KeySpace(PREFIX)
    cluster = Cluster(base)
    out = CatchUpResult()
    try:
        await start_etcd(cluster)
        await start_driver(cluster, [])
        await asyncio.gather(*(start_agent(cluster, f"n{k}") for k in (1, 2, 3)))
        from placement.api.client import PlacementClient

        async with (
            PlacementClient([cluster.api], deadline=30.0) as api,
            EtcdClient([cluster.etcd], call_timeout=10.0) as client,
        ):
            await create_zone_and_wait(cluster, api, 4, args.partitions, args.replicas)
            store = Metastore(client, keys)
            await wait_settled(store, client, keys, args.partitions, "ISR = stable", NOTES)
            router = Router(client, keys, args.partitions)
            try:
                await router.refresh()
                count = int(args.preload_mb * (1 << 20)) // args.bulk_value
                value = os.urandom(args.bulk_value)
                stats = Stats()
                queue = iter(range(count))
                print(f"preload: {count} × {args.bulk_value} B", flush=True)
                started = time.monotonic()

                async def loader() -> None:
                    for i in queue:
                        key = b"bulk-%06d" % i
                        if await put(router, key, value, stats) is not None:
                            out.preload_bytes += len(key) + len(value)

                await asyncio.gather(*(loader() for _ in range(args.preload_concurrency)))
                out.preload_s = time.monotonic() - started
                if stats.failed:
                    raise RuntimeError(f"preload: {stats.failed} Puts failed: {stats.failures}")
                print(
                    f"  {out.preload_bytes / 1e6:.1f} MB in {out.preload_s:.1f} s "
                    f"(errors {dict(stats.errors)})",
                    flush=True,
                )
                await wait_settled(store, client, keys, args.partitions, "ISR = stable", NOTES)
                await asyncio.sleep(1.0)

                in_isr: dict[int, float] = {}
                first_pending: list[float] = []
                stop = asyncio.Event()

                async def poll() -> None:
                    while not stop.is_set():
                        state = await store.read_zone(ZONE)
                        now = time.monotonic()
                        if not first_pending and any(
                            s.pending is not None and "n4" in s.pending.value.peers  # type: ignore[union-attr]
                            for s in state.partitions.values()
                        ):
                            first_pending.append(now)
                        _, _, isrs = await zone_view(store, client, keys)
                        now = time.monotonic()
                        for p, isr in isrs.items():
                            if "n4" in isr.members and p not in in_isr:
                                in_isr[p] = now
                        await asyncio.sleep(0.025)

                poller = asyncio.create_task(poll())
                print("n4 joins", flush=True)
                _, registered = await start_agent(cluster, "n4")

                async def done() -> bool:
                    stables, moving, _ = await zone_view(store, client, keys)
                    if moving or not any("n4" in s for s in stables.values()):
                        return False
                    return await settled(store, client, keys, args.partitions)

                at = await until_or_note(
                    done, "n4's replicas in the ISR (cluster B)", 120.0, store, client, keys, args
                )
                stop.set()
                await poller
                stables, _, _ = await zone_view(store, client, keys)
                moved = sorted(p for p, s in stables.items() if "n4" in s)
                nodes = await node_addresses(client, keys)
                for p in moved:
                    copy = await read_replica(router, nodes["n4"], p, limit=32)
                    size = sum(len(k) + len(v) for k, v in (copy or {}).items())
                    out.moved_bytes += size
                    out.per_partition.append((p, size, in_isr.get(p, at) - registered))
                    out.size_keys[p] = len(copy or {})
                out.moved = len(moved)
                last = max((in_isr.get(p, at) for p in moved), default=at)
                out.registered_to_last_isr_s = last - registered
                out.registered_to_settled_s = at - registered
                if first_pending:
                    out.registered_to_first_pending_s = first_pending[0] - registered
                    out.first_pending_to_last_isr_s = last - first_pending[0]
            finally:
                await router.close()
    finally:
        await cluster.stop()
    return out


# -- report ------------------------------------------------------------------------------------


def machine() -> list[str]:
    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    return [
        f"- machine: {os.cpu_count()} CPUs (`nproc` {os.cpu_count()}), {model}, "
        f"{mem_kb / (1 << 20):.1f} GiB RAM",
        f"- Python {platform.python_version()}, {platform.system()} {platform.release()}",
    ]


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def cpu_lines(w: Window) -> list[str]:
    """Where the quiet window's CPU went, and what that cost per write allows on this machine."""
    total = sum(w.cpu.values())
    per_write_ms = 1000 * total / w.acked if w.acked else float("nan")
    cores = os.cpu_count() or 1
    shares = ", ".join(f"{name} {100 * s / w.seconds:.0f} %" for name, s in sorted(w.cpu.items()))
    return [
        f"CPU during the quiet window (% of one core; the machine has {cores}): {shares}; "
        f"all **{100 * total / w.seconds:.0f} %**. That is **{per_write_ms:.2f} ms of CPU per "
        f"acknowledged write** (client, three agents, driver, etcd), so at this cost the "
        f"{cores} cores allow at most {1000 * cores / per_write_ms:.0f} writes/s.",
    ]


def window_row(w: Window) -> str:
    per_s = w.per_second()
    s = w.stats
    errors = ", ".join(f"{k} {v}" for k, v in sorted(s.errors.items())) or "0"
    return (
        f"| {w.label} | {w.acked / w.seconds:.0f} | {min(per_s) if per_s else 0} | "
        f"{w.pct(0.5):.1f} | {w.pct(0.99):.1f} | {1000 * max(s.latencies, default=0):.0f} | "
        f"{s.redirects} | {errors} | {s.failed} |"
    )


def report(
    args: argparse.Namespace,
    quiet: Window,
    busy: Window,
    rebalance: RebalanceResult,
    problems: list[str],
    catch: CatchUpResult,
    loads: list[str],
    wall: float,
) -> str:
    exe = (
        os.path.relpath(sys.executable, ROOT)
        if sys.executable.startswith(str(ROOT))
        else sys.executable
    )
    command = " ".join(shlex.quote(a) for a in [exe, "bench/data_plane_bench.py", *sys.argv[1:]])
    mbps = catch.moved_bytes / 1e6 / catch.registered_to_last_isr_s
    pure = (
        catch.moved_bytes / 1e6 / catch.first_pending_to_last_isr_s
        if catch.first_pending_to_last_isr_s
        else float("nan")
    )
    lines = [
        "# Data-plane benchmark",
        "",
        "Produced by `bench/data_plane_bench.py` (do not edit by hand). Real processes: one etcd,",
        "one placement driver (`python -m placement driver run --lease-ttl 2`, defaults",
        "otherwise), replica agents (`python -m placement agent run`: the data plane with its",
        "defaults, `--catch-up-mbps 64` (DataConfig.catch_up_bytes_per_s = 64e6, a token bucket",
        "on the learner), `--isr-timeout 3`, sqlite `synchronous=FULL`). All on one machine.",
        f"Zone: P={args.partitions}, R={args.replicas}; 3 agents, then n4 joins.",
        "",
        "## Writes (cluster A)",
        "",
        f"{args.writers} asyncio writers in the benchmark process, one write in flight each,",
        f"{args.value_size}-byte values, {2000} keys per writer (overwrites), "
        + (
            "through the product's `DataClient` (`--client batched`: routes from the drivers;"
            " the writes ready for one agent go out together in one `WriteBatch` call while"
            " the previous one is in flight; redirects and retries inside the client, so the"
            " redirect and error columns stay 0)"
            if args.client == "batched"
            else "one gRPC `DataService.Put` per write (`--client direct`) straight to the"
            " partition's primary (routes from etcd; `x-primary` redirects followed; other"
            " errors: 50 ms pause + route re-read)"
        )
        + "; latency = first attempt",
        f"→ acknowledgement, retries included; {args.seconds:.0f} s window after a 2 s warm-up).",
        '"rebalance": agent n4 spawned at the start of the window.',
        "",
        "| window | acked writes/s | slowest 1-s bucket (writes) | p50 ms | p99 ms | max ms "
        "| redirects | retried errors | failed (>30 s) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
        window_row(quiet),
        window_row(busy),
        "",
        f"Writes per second, no rebalance: {quiet.per_second()}",
        "",
        f"Writes per second, rebalance: {busy.per_second()}",
        "",
        *cpu_lines(quiet),
        "",
        *[line for fact in FACTS for line in (fact, "")],
        f"Rebalance: n4 spawned → registered {rebalance.spawn_to_registered_s:.2f} s; "
        f"registered → zone settled (no pending/planned, n4 in stable, ISR = stable everywhere) "
        f"**{rebalance.registered_to_settled_s:.2f} s**; {rebalance.moved_to_new} partitions "
        "have n4 in stable.",
        "",
        "Check after the windows (ReadReplica of every stable member of every partition): "
        + ("all copies identical and hold every last-acknowledged value." if not problems else ""),
        *[f"- **{p}**" for p in problems],
        "",
        "Stalls observed during the run (waits that timed out; the benchmark went on):",
        *([f"- **{n}**" for n in NOTES] or ["- none"]),
        "",
        "## Catch-up speed (cluster B, fresh)",
        "",
        f"Preload: {catch.preload_bytes / 1e6:.1f} MB ({args.bulk_value} B values, "
        f"{args.preload_concurrency} Puts in flight) in {catch.preload_s:.1f} s = "
        f"{catch.preload_bytes / 1e6 / catch.preload_s:.1f} MB/s acknowledged "
        f"(×{args.replicas} replicas written). Then n4 joins with no client load.",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| partitions moved to n4 | {catch.moved} |",
        f"| bytes copied (key+value of those partitions, ReadReplica on n4) | "
        f"{catch.moved_bytes / 1e6:.1f} MB |",
        f"| registered → first pending naming n4 (control plane) (s) | "
        f"{catch.registered_to_first_pending_s:.2f} |",
        f"| first pending → last of n4's replicas in the ISR (s) | "
        f"{catch.first_pending_to_last_isr_s:.2f} |",
        f"| **registered → every moved replica in the ISR (s)** | "
        f"{catch.registered_to_last_isr_s:.2f} |",
        f"| **catch-up speed (bytes ÷ registered → in ISR) (MB/s)** | {mbps:.1f} |",
        f"| catch-up speed (bytes ÷ first pending → in ISR) (MB/s) | {pure:.1f} |",
        "| registered → zone settled (stable switched) (s) | "
        f"{catch.registered_to_settled_s:.2f} |",
        "| throttle (DataConfig.catch_up_bytes_per_s, per agent) | 64e6 B/s |",
        "",
        "Per moved partition (registered → n4 in its ISR): "
        + "; ".join(
            f"p{p}: {size / 1e6:.1f} MB, {catch.size_keys[p]} keys, {t:.2f} s"
            for p, size, t in catch.per_partition
        )
        + ".",
        "",
        "## Run",
        "",
        f"- command: `{command}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; wall time {wall:.0f} s",
        *machine(),
        "- load (`uptime`) at start / between clusters / end (other engineers' test suites may",
        "  run concurrently on the 2 cores, and the benchmark client shares them):",
        *[f"  - `{x}`" for x in loads],
        "",
    ]
    return "\n".join(lines)


async def run(
    args: argparse.Namespace,
) -> tuple[Window, Window, RebalanceResult, list[str], CatchUpResult, list[str]]:
    root = Path(tempfile.mkdtemp(prefix="data-plane-bench-"))
    print(f"work dir (logs): {root}", flush=True)
    loads = [load()]
    quiet, busy, rebalance, problems = await cluster_a(args, root / "a")
    print(f"rebalance settled {rebalance.registered_to_settled_s:.2f} s; {problems}", flush=True)
    loads.append(load())
    catch = await cluster_b(args, root / "b")
    loads.append(load())
    return quiet, busy, rebalance, problems, catch, loads


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument(
        "--client",
        choices=("batched", "direct"),
        default="batched",
        help="batched: the product's DataClient (WriteBatch); direct: one unary Put per write",
    )
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--value-size", type=int, default=256)
    parser.add_argument("--preload-mb", type=float, default=64.0)
    parser.add_argument("--bulk-value", type=int, default=64 << 10)
    parser.add_argument("--preload-concurrency", type=int, default=32)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    started = time.monotonic()
    with sigterm_raises():
        try:
            result = asyncio.run(run(args))
        except (KeyboardInterrupt, Stopped):
            print("interrupted; every process stopped", file=sys.stderr)
            return 130
        finally:
            kill_leftovers()
    text = report(args, *result, wall=time.monotonic() - started)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
