"""Control-plane benchmark (issue 3): node join → every partition stable, etcd txns per moved
partition, and GetAssignments throughput against a direct etcd range read.

One run::

    .venv/bin/python bench/control_plane_bench.py [--partitions 1000] [--agents 5] [--repeat 3]

Each repetition starts a fresh cluster of real processes: etcd (free 127.0.0.1 ports, a temp data
dir), one placement driver (``python -m placement driver run``) and ``agents - 1`` replica agents
(``python -m placement agent run``, which register themselves in etcd). It creates zone ``bench``
(P partitions, R replicas, scale-up/down delays 0), waits for READY, then starts the last agent and
measures, from a watch of the whole prefix opened before the agent starts:

* the time from the new node's registration (its node key's PUT) to the revision at which no
  partition has pending or planned any more (every partition stable on the new target), with the
  phases in between (driver notices → data-nodes write → triggers → first/last finish), and the
  time a client polling ``GetZoneStatus`` sees READY again;
* etcd write transactions in that window: ``end - start`` revision (every write txn bumps the
  revision by one; lease keep-alives do not), and per key kind the number of distinct revisions
  touching it (assign / primary move / primary renewal / datanodes / nodes / other); moved
  partitions = partitions whose stable changed.

After the last repetition, on that cluster (READY, all agents): N sequential and N concurrent
(``--concurrency`` in flight) ``GetAssignments`` of the whole zone through the API (paginated as
the API does, ``placement.api.client.PlacementClient``) against a direct etcd read of the same keys
(assign range + primary range in one read-only txn, as the API reads them, decoded with
``metastore.codec``) and a plain ``EtcdClient.list_prefix`` of ``{p}/assign/{zone}/`` + decoding.

Writes ``bench/results/control_plane.md`` (table, command, machine, load, date) and prints the
same table. Every process it starts runs in its own process group and is stopped (SIGTERM, then
SIGKILL of the group) on exit, exception, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import grpc

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from placement.api.client import ApiError, PlacementClient  # noqa: E402
from placement.driver.core import build_view, plan_pass  # noqa: E402
from placement.local.cluster import free_ports  # noqa: E402
from placement.local.etcd import BACKEND_BATCHING  # noqa: E402
from placement.metastore.codec import (  # noqa: E402
    Assignment,
    DataNodes,
    InSyncSet,
    PrimaryLease,
    decode_assignment,
    decode_datanodes,
    decode_isr,
    decode_primary,
)
from placement.metastore.etcd import EtcdClient  # noqa: E402
from placement.metastore.keys import AssignField, KeyKind, KeySpace, prefix_range_end  # noqa: E402
from placement.metastore.kv import EventKind, KeyValue, Range, WatchBatch  # noqa: E402
from placement.metastore.txn import Get  # noqa: E402
from placement.v1 import driver_pb2  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "control_plane.md"
PREFIX = "/placement"
ZONE = "bench"
START_TIMEOUT = 60.0
STOP_GRACE = 10.0


class Stopped(Exception):
    """SIGTERM arrived: unwind and stop every child."""


# -- processes ---------------------------------------------------------------------------------


#: Every child ever started (pid = its process group), for the last-resort cleanup in main().
_ALL_PIDS: list[int] = []


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    proc: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    #: Keep a pipe to its stdin (``proc.stdin``) for commands, instead of /dev/null.
    interactive: bool = False

    async def start(self, *, announce: str | None = None) -> str:
        """Start in its own session; with ``announce``, return the first stdout line starting
        with it (the child's "serving on" line)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.started_at = time.monotonic()
        with self.log.open("ab") as err:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                cwd=ROOT,
                stdout=asyncio.subprocess.PIPE if announce else asyncio.subprocess.DEVNULL,
                stderr=err,
                stdin=asyncio.subprocess.PIPE if self.interactive else asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        _ALL_PIDS.append(self.proc.pid)
        if announce is None:
            return ""
        assert self.proc.stdout is not None
        async with asyncio.timeout(START_TIMEOUT):
            while True:
                raw = await self.proc.stdout.readline()
                if not raw:
                    raise RuntimeError(f"{self.name} exited early; see {self.log}")
                line = raw.decode().strip()
                if line.startswith(announce):
                    return line

    async def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_GRACE):
                    await proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        if proc.stdout is not None:
            with contextlib.suppress(Exception):
                await proc.stdout.read()


def kill_leftovers() -> None:
    """Synchronous last resort (after the event loop is gone): SIGKILL every group still there."""
    for pid in _ALL_PIDS:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


@dataclass
class Cluster:
    base: Path
    etcd: str = ""
    api: str = ""
    children: list[Child] = field(default_factory=list)
    agents: dict[str, Child] = field(default_factory=dict)

    async def stop(self) -> None:
        """Driver first (so it does not react to agents leaving), then agents, then etcd."""
        order = [c for c in self.children if c.name == "driver"]
        order += [c for c in reversed(self.children) if c.name not in ("driver", "etcd")]
        order += [c for c in self.children if c.name == "etcd"]
        for child in order:
            await asyncio.shield(child.stop())

    def check(self) -> None:
        for child in self.children:
            if child.proc is not None and child.proc.returncode is not None:
                raise RuntimeError(f"{child.name} exited ({child.proc.returncode}); {child.log}")


def _py() -> list[str]:
    return [sys.executable, "-m", "placement"]


#: Seconds between the benchmark's GetZoneStatus polls during a join. Each answer builds the
#: zone's status (P=1,000) on the driver's loop; at 50 ms the polls took a third of the
#: driver's CPU during the join they time (py-spy, 2026-12-05), so the observer slowed what it
#: observed. The join's end comes from the watch, not from these polls.
STATUS_POLL = 0.25


async def start_etcd(cluster: Cluster, *, batching: bool = True) -> None:
    """One etcd on loopback, with the product's backend batching (``placectl up``'s) unless
    ``batching`` is False (etcd's defaults, for an A/B)."""
    client_port, peer_port = free_ports(2)
    client_url = f"http://127.0.0.1:{client_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    etcd = Child(
        "etcd",
        [
            "/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else "etcd",
            "--name", "bench",
            "--data-dir", str(cluster.base / "etcd"),
            "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"bench={peer_url}",
            "--logger", "zap",
            "--log-outputs", "stderr",
            *(BACKEND_BATCHING if batching else ()),
        ],
        cluster.base / "logs" / "etcd.log",
    )  # fmt: skip
    cluster.children.append(etcd)
    await etcd.start()
    cluster.etcd = f"127.0.0.1:{client_port}"
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        cluster.check()
        healthy = await asyncio.to_thread(_etcd_healthy, cluster.etcd)
        if healthy:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"etcd not healthy; see {etcd.log}")


def _etcd_healthy(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{endpoint}/health", timeout=1.0) as r:
            return b'"health":"true"' in r.read()
    except (urllib.error.URLError, OSError):
        return False


async def start_driver(cluster: Cluster, extra: Sequence[str]) -> None:
    (port,) = free_ports(1)
    driver = Child(
        "driver",
        [
            *_py(), "driver", "run",
            "--etcd", cluster.etcd,
            "--listen", f"127.0.0.1:{port}",
            "--id", "bench-driver",
            "--prefix", PREFIX,
            "--lease-ttl", "2",
            *extra,
        ],
        cluster.base / "logs" / "driver.log",
    )  # fmt: skip
    cluster.children.append(driver)
    line = await driver.start(announce="driver ")
    # "driver ID serving on HOST:PORT"
    cluster.api = line.rsplit(" ", 1)[1]


async def start_agent(cluster: Cluster, node: str) -> Child:
    agent = Child(
        node,
        [
            *_py(), "agent", "run",
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
    await agent.start(announce=f"agent {node} listening on ")
    return agent


# -- API helpers -------------------------------------------------------------------------------


async def eventually(
    check: Callable[[], Awaitable[bool]], what: str, cluster: Cluster, within: float = 300.0
) -> None:
    deadline = time.monotonic() + within
    while not await check():
        cluster.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {within:.0f}s waiting for {what}")
        await asyncio.sleep(0.05)


async def data_settled(client: EtcdClient, keys: KeySpace, partitions: int) -> bool:
    """Every partition's in-sync set names exactly its stable replicas, and every replica's
    size is reported: the data plane has created, copied and joined every replica, and the
    agents' first size round (every ``size_interval``, 10 s) is behind (the join starts from a
    settled cluster, not inside a round that puts every replica's size key at once)."""
    stable: dict[int, set[str]] = {}
    for kv in (await client.list_prefix(keys.zone_assign_prefix(ZONE))).kvs:
        parsed = keys.parse(kv.key)
        if parsed is None or parsed.field is not AssignField.STABLE or parsed.partition is None:
            continue
        value = decode_assignment(kv.value)
        if isinstance(value, Assignment):
            stable[parsed.partition] = set(value.peers)
    if len(stable) != partitions:
        return False
    for kv in (await client.list_prefix(keys.zone_isr_prefix(ZONE))).kvs:
        parsed = keys.parse(kv.key)
        isr = decode_isr(kv.value)
        if parsed is None or parsed.partition is None or not isinstance(isr, InSyncSet):
            continue
        if set(isr.members) != stable.get(parsed.partition):
            return False
    sized = {
        (parsed.partition, parsed.node)
        for kv in (await client.list_prefix(keys.sizes_prefix() + ZONE.encode() + b"/")).kvs
        if (parsed := keys.parse(kv.key)) is not None
    }
    isrs = {
        parsed.partition
        for kv in (await client.list_prefix(keys.zone_isr_prefix(ZONE))).kvs
        if (parsed := keys.parse(kv.key)) is not None
    }
    return isrs == set(stable) and all((p, n) in sized for p, ns in stable.items() for n in ns)


async def zone_status(api: PlacementClient) -> driver_pb2.ZoneStatus:
    request = driver_pb2.GetZoneRequest(name=ZONE)
    return await api.call(lambda s, t: s.GetZoneStatus(request, timeout=t))


async def get_all_assignments(api: PlacementClient) -> int:
    """The whole zone through the API, page by page as the API hands them out; partitions read."""
    token = ""
    count = 0
    while True:
        request = driver_pb2.GetAssignmentsRequest(zone=ZONE, page_token=token)
        page = await api.call(lambda s, t, r=request: s.GetAssignments(r, timeout=t))  # type: ignore[misc]
        count += len(page.assignments)
        token = page.next_page_token
        if not token:
            return count


@dataclass(frozen=True, slots=True)
class DirectView:
    partition: int
    stable: tuple[str, ...] | None
    pending: tuple[str, ...] | None
    planned: tuple[str, ...] | None
    primary: str
    expiry_ms: int


def _peers(raw: bytes | None) -> tuple[str, ...] | None:
    if raw is None:
        return None
    decoded = decode_assignment(raw)
    return decoded.peers if isinstance(decoded, Assignment) else None


def decode_views(
    keys: KeySpace, assign: Sequence[KeyValue], primaries: Sequence[KeyValue], total: int
) -> list[DirectView]:
    """The same decoding the API does (key parse, assignment + primary codec), minus protobuf."""
    by_partition: dict[int, dict[AssignField, bytes]] = {}
    for kv in assign:
        parsed = keys.parse(kv.key)
        if parsed is None or parsed.kind is not KeyKind.ASSIGN or parsed.partition is None:
            continue
        assert parsed.field is not None
        by_partition.setdefault(parsed.partition, {})[parsed.field] = kv.value
    base = keys.zone_primary_prefix(ZONE)
    primary_of: dict[int, bytes] = {}
    for kv in primaries:
        tail = kv.key[len(base) :]
        if tail.isdigit():
            primary_of[int(tail)] = kv.value
    views = []
    for p in range(total):
        found = by_partition.get(p, {})
        lease = decode_primary(primary_of[p]) if p in primary_of else None
        node, expiry = (lease.node, lease.expiry) if isinstance(lease, PrimaryLease) else ("", 0)
        views.append(
            DirectView(
                p,
                _peers(found.get(AssignField.STABLE)),
                _peers(found.get(AssignField.PENDING)),
                _peers(found.get(AssignField.PLANNED)),
                node,
                expiry,
            )
        )
    return views


async def direct_txn(client: EtcdClient, keys: KeySpace, total: int) -> int:
    """Assign range + primary range in one read-only txn (one revision), decoded."""
    assign_prefix = keys.zone_assign_prefix(ZONE)
    primary_prefix = keys.zone_primary_prefix(ZONE)
    found = await client.txn(
        (),
        (
            Get(assign_prefix, prefix_range_end(assign_prefix)),
            Get(primary_prefix, prefix_range_end(primary_prefix)),
        ),
    )
    assign, primaries = found.responses
    assert isinstance(assign, Range)
    assert isinstance(primaries, Range)
    return len(decode_views(keys, assign.kvs, primaries.kvs, total))


async def direct_list_prefix(client: EtcdClient, keys: KeySpace, total: int) -> int:
    """``list_prefix`` (1000-key pages pinned to one revision) of assign/{zone}/, decoded (no
    primaries: the brief's plain range read)."""
    found = await client.list_prefix(keys.zone_assign_prefix(ZONE))
    return len(decode_views(keys, found.kvs, (), total))


# -- CPU accounting --------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> float:
    """utime + stime of one process in seconds (0 when gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _machine_busy() -> float:
    """CPU seconds the whole machine spent busy (all cores) since boot."""
    first = Path("/proc/stat").read_text().splitlines()[0].split()
    values = [int(v) for v in first[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / _TICK


#: ``--profile DIR``: py-spy samples every driver and agent process from registration to
#: stable, one collapsed-stack file per process (``DIR/run*/NAME.txt``).
PROFILE: Path | None = None
PROFILE_PERF = False


def start_profiles(cluster: Cluster, run: str) -> list[subprocess.Popen[bytes]]:
    """py-spy on every Python child (not etcd), sampling without pausing it; with
    ``--profile-perf``, one ``perf record -g`` of every child, etcd included (native frames:
    the interpreter, gRPC's core, SQLite, the kernel)."""
    if PROFILE is None:
        return []
    out = PROFILE / run
    out.mkdir(parents=True, exist_ok=True)
    children = [c for c in cluster.children if c.proc is not None]
    if PROFILE_PERF:
        pids = ",".join(str(c.proc.pid) for c in children if c.proc is not None)
        argv = ["perf", "record", "-F", "499", "-g", "-p", pids, "-o", str(out / "perf.data")]
        return [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    spy = [str(Path(sys.executable).parent / "py-spy"), "record", "--nonblocking", "-r", "250"]
    return [
        subprocess.Popen(
            [*spy, "-f", "raw", "-p", str(c.proc.pid), "-o", str(out / f"{c.name}.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for c in children
        if c.proc is not None and c.name != "etcd"
    ]


def stop_profiles(spies: list[subprocess.Popen[bytes]]) -> None:
    for spy in spies:
        spy.send_signal(signal.SIGINT)
    for spy in spies:
        spy.wait(timeout=30)


def cpu_snapshot(cluster: Cluster, new_node: str) -> dict[str, float]:
    """CPU seconds so far per role: driver, etcd, old agents, the new agent, this benchmark,
    and the machine as a whole."""
    out = {"driver": 0.0, "etcd": 0.0, "agents (old)": 0.0, "agent (new)": 0.0}
    for child in cluster.children:
        if child.proc is None:
            continue
        used = _proc_cpu(child.proc.pid)
        if child.name in ("driver", "etcd"):
            out[child.name] += used
        elif child.name == new_node:
            out["agent (new)"] += used
        else:
            out["agents (old)"] += used
    out["benchmark (watch, status polls)"] = time.process_time()
    out["machine (all processes)"] = _machine_busy()
    return out


# -- one join measurement ----------------------------------------------------------------------


@dataclass
class JoinResult:
    spawn_to_registered_s: float
    registered_to_datanodes_s: float
    datanodes_to_first_trigger_s: float
    triggers_s: float
    first_trigger_to_first_finish_s: float
    finishes_s: float
    registered_to_stable_s: float
    registered_to_ready_api_s: float
    premature_ready_s: float | None
    stable_puts: int
    reordered: int
    #: (keys, build_view ms, plan_pass ms) on the prefix at READY and with every pending written.
    pass_ready: tuple[int, float, float]
    pass_moving: tuple[int, float, float]
    #: node -> (primary leases held, partitions naming it first in stable), 2 s after stable.
    primaries: dict[str, tuple[int, int]]
    cpu: dict[str, float]
    moved: int
    pending_written: int
    txns: int
    by_kind: dict[str, int]
    #: kind -> keys of it put or deleted in the window (every watcher receives each one)
    keys_by_kind: dict[str, int]
    new_node_partitions: int
    start_revision: int
    end_revision: int


def classify(keys: KeySpace, event_kind: EventKind, kv: KeyValue, prev: KeyValue | None) -> str:
    parsed = keys.parse(kv.key)
    if parsed is None:
        return "other"
    if parsed.kind is KeyKind.ASSIGN:
        return "assign"
    if parsed.kind is KeyKind.PRIMARY:
        if event_kind is EventKind.DELETE or prev is None:
            return "primary (grant/move)"
        new, old = decode_primary(kv.value), decode_primary(prev.value)
        if isinstance(new, PrimaryLease) and isinstance(old, PrimaryLease):
            return "primary (renewal)" if new.node == old.node else "primary (grant/move)"
        return "primary (grant/move)"
    if parsed.kind is KeyKind.DATANODES:
        return "datanodes"
    if parsed.kind is KeyKind.NODE:
        return "nodes"
    return str(parsed.kind.value)


async def read_stables(
    client: EtcdClient, keys: KeySpace, revision: int
) -> dict[int, tuple[str, ...]]:
    """Every partition's stable peers (in order: first = preferred primary) at ``revision``."""
    found = await client.list_prefix(keys.zone_assign_prefix(ZONE), revision=revision)
    out: dict[int, tuple[str, ...]] = {}
    for kv in found.kvs:
        parsed = keys.parse(kv.key)
        if parsed is not None and parsed.field is AssignField.STABLE:
            assert parsed.partition is not None
            decoded = decode_assignment(kv.value)
            out[parsed.partition] = (
                tuple(decoded.peers) if isinstance(decoded, Assignment) else ("<corrupt>",)
            )
    return out


async def primary_balance(
    client: EtcdClient, keys: KeySpace, partitions: int
) -> dict[str, tuple[int, int]]:
    """Per node: primary leases held and partitions whose stable names it first."""
    assign_prefix = keys.zone_assign_prefix(ZONE)
    primary_prefix = keys.zone_primary_prefix(ZONE)
    found = await client.txn(
        (),
        (
            Get(assign_prefix, prefix_range_end(assign_prefix)),
            Get(primary_prefix, prefix_range_end(primary_prefix)),
        ),
    )
    assign, leases = found.responses
    assert isinstance(assign, Range)
    assert isinstance(leases, Range)
    held: dict[str, int] = {}
    preferred: dict[str, int] = {}
    for view in decode_views(keys, assign.kvs, leases.kvs, partitions):
        if view.primary:
            held[view.primary] = held.get(view.primary, 0) + 1
        if view.stable:
            preferred[view.stable[0]] = preferred.get(view.stable[0], 0) + 1
    return {n: (held.get(n, 0), preferred.get(n, 0)) for n in sorted({*held, *preferred})}


async def pass_cost(
    client: EtcdClient, keys: KeySpace, revision: int, runs: int = 7
) -> tuple[int, float, float]:
    """The driver's per-pass CPU work, re-run here (in this process, after the join) on the
    whole prefix as it was at ``revision``: ``build_view`` (decode every key) and ``plan_pass``.
    Medians in ms."""
    prefix = keys.prefix.encode() + b"/"
    found = await client.list_prefix(prefix, revision=revision)
    kvs = {kv.key: kv for kv in found.kvs}
    view_ms: list[float] = []
    plan_ms: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        view = build_view(keys, kvs, revision)
        t1 = time.perf_counter()
        plan_pass(view, int(time.time() * 1000))
        t2 = time.perf_counter()
        view_ms.append(1000 * (t1 - t0))
        plan_ms.append(1000 * (t2 - t1))
    return len(kvs), statistics.median(view_ms), statistics.median(plan_ms)


async def measure_join(
    cluster: Cluster,
    client: EtcdClient,
    api: PlacementClient,
    keys: KeySpace,
    node: str,
    partitions: int,
) -> JoinResult:
    start_revision = await client.current_revision()
    before = await read_stables(client, keys, start_revision)
    prefix = keys.prefix.encode() + b"/"
    node_key = keys.node(node)
    datanodes_key = keys.datanodes(ZONE)

    t: dict[str, float] = {}
    rev: dict[str, int] = {}
    polls: dict[str, int] = {}
    cpu_at: dict[str, dict[str, float]] = {}
    spies: list[subprocess.Popen[bytes]] = []
    pending: set[bytes] = set()
    planned: set[bytes] = set()
    revisions: dict[int, dict[str, int]] = {}  # revision -> kind -> keys of it written there
    pending_written = 0
    stable_puts = 0
    done = asyncio.Event()
    datanodes_seen = asyncio.Event()
    watch_ready = asyncio.Event()

    def mark(name: str, revision: int, now: float) -> None:
        if name not in t:
            t[name] = now
            rev[name] = revision

    def on_batch(batch: WatchBatch, now: float) -> None:
        nonlocal pending_written, stable_puts
        for e in batch.events:
            revision = e.kv.mod_revision
            kinds = revisions.setdefault(revision, {})
            kind = classify(keys, e.kind, e.kv, e.prev_kv)
            assigned = keys.parse(e.kv.key) if kind == "assign" else None
            if assigned is not None and assigned.field is not None:
                kind = f"assign:{assigned.field.value}"  # keys counted per field, txns per kind
            kinds[kind] = kinds.get(kind, 0) + 1
            if e.kv.key == node_key and e.kind is EventKind.PUT:
                mark("registered", revision, now)
                cpu_at.setdefault("registered", cpu_snapshot(cluster, node))
                if not spies:
                    spies.extend(start_profiles(cluster, cluster.base.name))
            elif e.kv.key == datanodes_key and e.kind is EventKind.PUT:
                record = decode_datanodes(e.kv.value)
                if isinstance(record, DataNodes) and node in record.applied:
                    mark("datanodes", revision, now)
                    datanodes_seen.set()
            parsed = keys.parse(e.kv.key)
            if parsed is None or parsed.kind is not KeyKind.ASSIGN:
                continue
            if parsed.field is AssignField.PENDING:
                if e.kind is EventKind.PUT:
                    if e.kv.key not in pending:
                        pending_written += 1
                    pending.add(e.kv.key)
                    mark("first_trigger", revision, now)
                    t["last_trigger"] = now
                    rev["last_trigger"] = revision
                else:
                    pending.discard(e.kv.key)
            elif parsed.field is AssignField.PLANNED:
                (planned.add if e.kind is EventKind.PUT else planned.discard)(e.kv.key)
            elif parsed.field is AssignField.STABLE and e.kind is EventKind.PUT:
                stable_puts += 1
                if "first_trigger" in t:
                    mark("first_finish", revision, now)
                    t["last_finish"] = now
                    rev["last_finish"] = revision
        if "datanodes" in t and "first_trigger" in t and not pending and not planned:
            mark("stable", batch.revision, now)
            cpu_at.setdefault("stable", cpu_snapshot(cluster, node))
            stop_profiles(spies)
            spies.clear()
            done.set()

    async def watcher() -> None:
        async with client.watch(
            prefix, prefix_range_end(prefix), start_revision=start_revision + 1, prev_kv=True
        ) as watch:
            watch_ready.set()
            async for batch in watch:
                on_batch(batch, time.monotonic())

    async def ready_poller() -> None:
        """What a client polling GetZoneStatus sees once the data nodes include the new node:
        the first READY (possibly before any pending exists: a premature READY), and READY
        after it saw REBALANCING."""
        await datanodes_seen.wait()
        rebalancing = False
        while True:
            status = await zone_status(api)
            now = time.monotonic()
            if status.state == driver_pb2.REBALANCING:
                rebalancing = True
            elif status.state == driver_pb2.READY:
                if "ready_api_first" not in t:
                    t["ready_api_first"] = now
                    polls["premature"] = 0 if rebalancing else 1
                if rebalancing:
                    t["ready_api"] = now
                    return
            polls["count"] = polls.get("count", 0) + 1
            await asyncio.sleep(STATUS_POLL)

    watch_task = asyncio.create_task(watcher())
    await watch_ready.wait()
    poll_task = asyncio.create_task(ready_poller())
    try:
        spawned = time.monotonic()
        await start_agent(cluster, node)

        async def finished() -> bool:
            if watch_task.done():
                watch_task.result()
            return done.is_set() and poll_task.done()

        await eventually(finished, f"the zone to settle on {node}", cluster)
        poll_task.result()
    finally:
        for task in (watch_task, poll_task):
            task.cancel()
        await asyncio.gather(watch_task, poll_task, return_exceptions=True)

    end_revision = rev["stable"]
    pass_ready = await pass_cost(client, keys, start_revision)
    pass_moving = await pass_cost(client, keys, rev["last_trigger"])
    await asyncio.sleep(max(0.0, t["stable"] + 2.0 - time.monotonic()))
    primaries = await primary_balance(client, keys, partitions)
    after = await read_stables(client, keys, end_revision)
    moved = sum(1 for p in range(partitions) if set(before.get(p, ())) != set(after.get(p, ())))
    reordered = sum(
        1
        for p in range(partitions)
        if before.get(p) != after.get(p) and set(before.get(p, ())) == set(after.get(p, ()))
    )
    on_new = sum(1 for v in after.values() if node in v)
    window = {r: kinds for r, kinds in revisions.items() if start_revision < r <= end_revision}
    by_kind: dict[str, int] = {}
    keys_by_kind: dict[str, int] = {}
    for kinds in window.values():
        for coarse in {kind.split(":")[0] for kind in kinds}:
            by_kind[coarse] = by_kind.get(coarse, 0) + 1
        for kind, written in kinds.items():
            keys_by_kind[kind] = keys_by_kind.get(kind, 0) + written
    return JoinResult(
        spawn_to_registered_s=t["registered"] - spawned,
        registered_to_datanodes_s=t["datanodes"] - t["registered"],
        datanodes_to_first_trigger_s=t["first_trigger"] - t["datanodes"],
        triggers_s=t["last_trigger"] - t["first_trigger"],
        first_trigger_to_first_finish_s=t["first_finish"] - t["first_trigger"],
        finishes_s=t["last_finish"] - t["first_finish"],
        registered_to_stable_s=t["stable"] - t["registered"],
        registered_to_ready_api_s=t["ready_api"] - t["registered"],
        premature_ready_s=(
            t["ready_api_first"] - t["registered"] if polls.get("premature") else None
        ),
        stable_puts=stable_puts,
        pass_ready=pass_ready,
        pass_moving=pass_moving,
        primaries=primaries,
        reordered=reordered,
        cpu={k: cpu_at["stable"][k] - cpu_at["registered"][k] for k in cpu_at["stable"]},
        moved=moved,
        pending_written=pending_written,
        txns=end_revision - start_revision,
        by_kind=by_kind,
        keys_by_kind=keys_by_kind,
        new_node_partitions=on_new,
        start_revision=start_revision,
        end_revision=end_revision,
    )


# -- cluster set-up ----------------------------------------------------------------------------


async def create_zone(api: PlacementClient, request: driver_pb2.CreateZoneRequest) -> None:
    """CreateZone until it is there (ALREADY_EXISTS counts: a retried call may have landed)."""
    while True:
        try:
            await api.call(lambda s, t: s.CreateZone(request, timeout=t))
            return
        except ApiError as e:
            if e.code == grpc.StatusCode.ALREADY_EXISTS:
                return
            if not e.unavailable:
                raise
        await asyncio.sleep(0.1)


async def create_zone_and_wait(
    cluster: Cluster,
    api: PlacementClient,
    agents: int,
    partitions: int,
    replicas: int,
    scale_down_delay: float = 0.0,
) -> None:
    async def nodes_up() -> bool:
        found = await api.call(lambda s, t: s.ListNodes(driver_pb2.ListNodesRequest(), timeout=t))
        return len(found.nodes) >= agents - 1

    await eventually(nodes_up, f"{agents - 1} registered nodes", cluster)
    request = driver_pb2.CreateZoneRequest(
        name=ZONE,
        config=driver_pb2.ZoneConfig(
            partitions=partitions,
            replicas=replicas,
            scale_up_delay_seconds=0.0,
            scale_down_delay_seconds=scale_down_delay,
        ),
    )
    await create_zone(api, request)

    async def ready() -> bool:
        try:
            status = await zone_status(api)
        except ApiError:
            return False
        return status.state == driver_pb2.READY and status.partitions_done == partitions

    await eventually(ready, "zone READY", cluster)


# -- throughput --------------------------------------------------------------------------------


@dataclass
class Throughput:
    name: str
    calls: int
    concurrency: int
    seconds: float
    partitions: int

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds

    @property
    def partitions_per_s(self) -> float:
        return self.partitions / self.seconds


async def run_calls(
    name: str, call: Callable[[], Awaitable[int]], calls: int, concurrency: int
) -> Throughput:
    await call()  # warm-up (channel, caches)
    remaining = calls
    total = 0

    async def worker() -> None:
        nonlocal remaining, total
        while remaining > 0:
            remaining -= 1
            got = await call()  # not `total += await ...`: that reads total before awaiting
            total += got

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Throughput(name, calls, concurrency, time.perf_counter() - started, total)


async def throughput(
    api: PlacementClient, client: EtcdClient, keys: KeySpace, partitions: int, calls: int, conc: int
) -> list[Throughput]:
    variants: list[tuple[str, Callable[[], Awaitable[int]]]] = [
        ("API GetAssignments (gRPC → driver → etcd)", lambda: get_all_assignments(api)),
        (
            "direct etcd txn (assign + primary ranges) + decode",
            lambda: direct_txn(client, keys, partitions),
        ),
        (
            "direct etcd list_prefix(assign/zone/) + decode",
            lambda: direct_list_prefix(client, keys, partitions),
        ),
    ]
    out = []
    for concurrency in (1, conc):
        for name, call in variants:
            out.append(await run_calls(name, call, calls, concurrency))
    return out


# -- report ------------------------------------------------------------------------------------


def med(values: Sequence[float]) -> str:
    return (
        f"{statistics.median(values):.2f} ({min(values):.2f} … {max(values):.2f})"
        if len(values) > 1
        else f"{values[0]:.2f}"
    )


def machine() -> tuple[str, str]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    return "\n".join(lscpu.splitlines()[:15]), platform.python_version()


def tree_state() -> str:
    """HEAD and the uncommitted changes to the code under test (the tree moves meanwhile)."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    status = subprocess.run(
        ["git", "status", "--porcelain", "--", "placement", "replica"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    changed = sorted(line[3:] for line in status if line.strip() and "/v1/" not in line)
    if not changed:
        return f"git {head or '?'} (clean)"
    return f"git {head or '?'} + uncommitted changes to " + ", ".join(f"`{c}`" for c in changed)


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _row(label: str, values: Sequence[float], integer: bool = False) -> str:
    if integer:
        m = statistics.median(values)
        if len(set(values)) == 1:
            return f"| {label} | {m:.0f} |"
        return f"| {label} | {m:.0f} ({min(values):.0f} … {max(values):.0f}) |"
    return f"| {label} | {med(values)} |"


def _variant(args: argparse.Namespace, joins: list[JoinResult], v: JoinResult) -> list[str]:
    flags = " ".join(driver_flags_of(args, args.variant_per_node))
    base = statistics.median(j.registered_to_stable_s for j in joins)
    return [
        f"### Throttle variant: one more fresh cluster with `{flags}`",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| registered → every partition stable (s) | {v.registered_to_stable_s:.2f} "
        f"(× {v.registered_to_stable_s / base:.2f} of the median above) |",
        f"| first → last finish (s) | {v.finishes_s:.2f} |",
        f"| moves/s | {v.moved / v.registered_to_stable_s:.1f} |",
        f"| etcd txns per moved partition (all / assign) | {v.txns / max(v.moved, 1):.2f} / "
        f"{v.by_kind.get('assign', 0) / max(v.moved, 1):.2f} |",
        *[
            f"| CPU s {role} (% of one core) | {v.cpu[role]:.1f} "
            f"({100 * v.cpu[role] / v.registered_to_stable_s:.0f}) |"
            for role in v.cpu
        ],
        "",
    ]


def _pass_row(label: str, costs: Sequence[tuple[int, float, float]]) -> str:
    keys = statistics.median(c[0] for c in costs)
    return f"| {label} | {keys:.0f} | {med([c[1] for c in costs])} | {med([c[2] for c in costs])} |"


def _share(joins: Sequence[JoinResult], role: str) -> float:
    return statistics.median(100 * j.cpu[role] / j.registered_to_stable_s for j in joins)


def report(
    args: argparse.Namespace,
    joins: list[JoinResult],
    tput: list[Throughput],
    loads: list[str],
    variant: JoinResult | None,
    wall: float,
) -> str:
    n = len(joins)
    flags = " ".join(["--lease-ttl 2", *driver_flags_of(args)])
    lines = [
        "# Control-plane benchmark",
        "",
        "Produced by `bench/control_plane_bench.py` (do not edit by hand). Real processes: one",
        f"etcd, one placement driver (`{flags}`; defaults otherwise: `--max-moves 1024`,",
        "`--max-moves-per-node 256`, `--max-mib-per-node 256`, pass tick 0.5 s, Rebalance",
        "resend backoff U(0, min(1 s, 0.05 s·2ⁿ))), replica agents (`placectl agent run`: the",
        "real data plane; every replica is created, copied and joins the in-sync set before the",
        "driver switches stable).",
        "The join starts once the zone is READY and every in-sync set equals stable.",
        f"Zone: P={args.partitions}, R={args.replicas}, scale-up/down delay 0, "
        f"{args.agents - 1} agents, then agent n{args.agents} joins.",
        f"Join figures: median (min … max) over {n} fresh cluster(s). Times are taken when the",
        "benchmark's own watch of the whole prefix delivers the event (so both ends include the",
        'same watch-delivery latency). "Stable" = the revision after which no partition has',
        "pending or planned (data nodes already include the new node).",
        "",
        "## Node join → every partition stable",
        "",
        "| figure | value |",
        "|---|---:|",
    ]
    timings: list[tuple[str, Callable[[JoinResult], float]]] = [
        ("agent process spawn → node key registered (s)", lambda j: j.spawn_to_registered_s),
        ("**registered → every partition stable (s)**", lambda j: j.registered_to_stable_s),
        (
            "registered → GetZoneStatus polls READY after REBALANCING (s, "
            f"{STATUS_POLL * 1000:.0f} ms poll)",
            lambda j: j.registered_to_ready_api_s,
        ),
        (
            "  registered → data-nodes key applies the node (s)",
            lambda j: j.registered_to_datanodes_s,
        ),
        (
            "  data nodes written → first pending written (s)",
            lambda j: j.datanodes_to_first_trigger_s,
        ),
        ("  first → last pending written (trigger txns) (s)", lambda j: j.triggers_s),
        ("  first pending → first finish (s)", lambda j: j.first_trigger_to_first_finish_s),
        ("  first → last finish (s)", lambda j: j.finishes_s),
        ("moves/s (moved ÷ registered→stable)", lambda j: j.moved / j.registered_to_stable_s),
        ("**etcd txns per moved partition (all)**", lambda j: j.txns / max(j.moved, 1)),
        (
            "**etcd txns per moved partition (assign keys only)**",
            lambda j: j.by_kind.get("assign", 0) / max(j.moved, 1),
        ),
    ]
    counts: list[tuple[str, Callable[[JoinResult], float]]] = [
        ("moved partitions (replica set of stable changed)", lambda j: j.moved),
        ("stable keys written (finishes)", lambda j: j.stable_puts),
        ("  of which only reordered (same replicas, new preferred primary)", lambda j: j.reordered),
        ("pending keys written", lambda j: j.pending_written),
        ("partitions on the new node after", lambda j: j.new_node_partitions),
        ("etcd write txns in the window (end − start revision)", lambda j: j.txns),
    ]
    for label, get in timings:
        lines.append(_row(label, [float(get(j)) for j in joins]))
    for label, get in counts:
        lines.append(_row(label, [float(get(j)) for j in joins], integer=True))
    for kind in sorted({k for j in joins for k in j.by_kind}):
        values = [float(j.by_kind.get(kind, 0)) for j in joins]
        lines.append(_row(f"txns touching `{kind}` keys (distinct revisions)", values, True))
    for kind in sorted({k for j in joins for k in j.keys_by_kind}):
        values = [float(j.keys_by_kind.get(kind, 0)) for j in joins]
        lines.append(_row(f"`{kind}` keys put or deleted", values, True))
    lines += [
        "",
        "Driver pass cost, re-run in this process after the join on the whole prefix as etcd had",
        "it (`driver.core.build_view` decodes every key, then `plan_pass`; the driver runs one",
        "pass per watch wake-up and per 0.5 s tick, on its single event loop):",
        "",
        "| snapshot | keys | build_view (ms) | plan_pass (ms) |",
        "|---|---:|---:|---:|",
        _pass_row("READY (before the join)", [j.pass_ready for j in joins]),
        _pass_row("every pending written", [j.pass_moving for j in joins]),
    ]
    last = joins[-1]
    lines += [
        "",
        "Primary leases 2 s after stable (last repetition): node = leases held / partitions whose"
        " stable names it first (preferred primary): "
        + ", ".join(f"{n} {h}/{p}" for n, (h, p) in last.primaries.items())
        + ".",
    ]
    reelected = sum(1 for j in joins if j.by_kind.get("leader", 0))
    lines += [
        "",
        f"The driver lost its election lease and was re-elected during {reelected} of {n} join(s)"
        " (txns on `leader` keys in the window; with `--lease-ttl 2` a keep-alive every 0.67 s"
        " must get through the driver's event loop).",
    ]
    premature = [j.premature_ready_s for j in joins if j.premature_ready_s is not None]
    lines += [
        "",
        "Per repetition: "
        + "; ".join(
            f"#{i + 1}: {j.registered_to_stable_s:.2f} s, {j.moved} moved, {j.txns} txns "
            f"(rev {j.start_revision}→{j.end_revision})"
            for i, j in enumerate(joins)
        )
        + ".",
        "",
        "Where the CPU went between registration and stable (CPU seconds of each process from",
        "`/proc/PID/stat`; the machine figure is every process on the box, incl. other engineers'",
        "tests; % = share of one core over the window):",
        "",
        "| process | CPU s | % of one core |",
        "|---|---:|---:|",
        *[
            f"| {role} | {med([j.cpu[role] for j in joins])} | {_share(joins, role):.0f} |"
            for role in joins[0].cpu
        ],
        "",
        f"GetZoneStatus answered READY *before* any pending existed (after the data-nodes write, "
        f"before the triggers) in {len(premature)} of {n} repetition(s)"
        + (
            f" (at {', '.join(f'{x:.2f}' for x in premature)} s after registration)."
            if premature
            else "."
        ),
        "",
        *(_variant(args, joins, variant) if variant is not None else []),
        "## GetAssignments vs a direct etcd read of the same keys",
        "",
        f"Whole zone (P={args.partitions}) per call; {args.calls} calls per row after one warm-up",
        "call; same run, same cluster (READY, all agents up, driver idle apart from its 0.5 s tick",
        "and lease renewals). The API does one read-only txn (assign range + primary range) and",
        "decodes into protobuf, the client pages with `next_page_token` (default page 1000).",
        "",
        "| variant | in flight | calls/s | partitions/s | ms/call | × API |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in tput:
        api_row = next(
            r for r in tput if r.concurrency == row.concurrency and r.name.startswith("API")
        )
        ratio = row.calls_per_s / api_row.calls_per_s
        lines.append(
            f"| {row.name} | {row.concurrency} | {row.calls_per_s:.1f} | "
            f"{row.partitions_per_s:,.0f} | {1000 * row.seconds / row.calls:.1f} | {ratio:.2f} |"
        )
    command = command_line("bench/control_plane_bench.py", sys.argv[1:])
    lines += run_section(command, wall, loads, "at start, before each join, at the end")
    return "\n".join(lines)


def command_line(script: str, argv: Sequence[str]) -> str:
    """How this benchmark was run, as a shell command from the repository's root."""
    exe = (
        os.path.relpath(sys.executable, ROOT)
        if sys.executable.startswith(str(ROOT))
        else sys.executable
    )
    return " ".join(shlex.quote(a) for a in [exe, script, *argv])


def run_section(command: str, wall: float, loads: Sequence[str], when: str) -> list[str]:
    """The "## Run" section of a results file: command, date, tree, Python, the load ``when``
    (e.g. "at start, before each join, at the end"), ``lscpu``."""
    lscpu, python = machine()
    return [
        "",
        "## Run",
        "",
        f"- command: `{command}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; wall time {wall:.0f} s",
        f"- tree: {tree_state()}",
        f"- Python {python} ({platform.python_implementation()}), "
        f"{platform.system()} {platform.release()}",
        f"- load (`uptime`) {when} (2 cores; other engineers'",
        "  work ran concurrently, so absolute times are noisy):",
        *[f"  - `{x}`" for x in loads],
        "",
        "`lscpu | head -15`:",
        "",
        "```",
        lscpu,
        "```",
        "",
    ]


# -- main --------------------------------------------------------------------------------------


def driver_flags_of(args: argparse.Namespace, per_node: int | None = None) -> list[str]:
    flags: list[str] = []
    if args.max_moves is not None:
        flags += ["--max-moves", str(args.max_moves)]
    if args.max_mib_per_node is not None:
        flags += ["--max-mib-per-node", str(args.max_mib_per_node)]
    per_node = per_node if per_node is not None else args.max_moves_per_node
    if per_node is not None:
        flags += ["--max-moves-per-node", str(per_node)]
    return flags


async def one_cluster(
    args: argparse.Namespace, base: Path, flags: Sequence[str], with_throughput: bool
) -> tuple[JoinResult, list[Throughput]]:
    """A fresh cluster: etcd, driver, agents - 1 agents, the zone; then the join (and the
    throughput comparison when asked); every process stopped on the way out."""
    keys = KeySpace(PREFIX)
    cluster = Cluster(base)
    tput: list[Throughput] = []
    try:
        await start_etcd(cluster)
        await start_driver(cluster, flags)
        await asyncio.gather(*(start_agent(cluster, f"n{k}") for k in range(1, args.agents)))
        async with (
            PlacementClient([cluster.api], deadline=30.0) as api,
            EtcdClient([cluster.etcd], call_timeout=10.0) as client,
        ):
            await create_zone_and_wait(cluster, api, args.agents, args.partitions, args.replicas)
            await eventually(
                lambda: data_settled(client, keys, args.partitions),
                "every in-sync set = stable (the data plane settled)",
                cluster,
            )
            result = await measure_join(
                cluster, client, api, keys, f"n{args.agents}", args.partitions
            )
            if with_throughput:
                await asyncio.sleep(1.0)
                tput = await throughput(
                    api, client, keys, args.partitions, args.calls, args.concurrency
                )
    finally:
        await cluster.stop()
    return result, tput


async def run(
    args: argparse.Namespace,
) -> tuple[list[JoinResult], list[Throughput], list[str], JoinResult | None]:
    joins: list[JoinResult] = []
    tput: list[Throughput] = []
    loads = [load()]
    root = Path(tempfile.mkdtemp(prefix="control-plane-bench-"))
    print(f"work dir (logs): {root}", flush=True)
    for i in range(args.repeat):
        loads.append(load())
        result, rows = await one_cluster(
            args, root / f"run{i + 1}", driver_flags_of(args), i == args.repeat - 1
        )
        joins.append(result)
        tput = rows or tput
        print(
            f"join #{i + 1}: registered → stable {result.registered_to_stable_s:.2f} s, "
            f"{result.moved} moved, {result.txns} txns {result.by_kind}",
            flush=True,
        )
    for row in tput:
        print(f"{row.name} ×{row.concurrency}: {row.calls_per_s:.1f} calls/s", flush=True)
    variant: JoinResult | None = None
    if args.variant_per_node is not None:
        loads.append(load())
        flags = driver_flags_of(args, args.variant_per_node)
        variant, _ = await one_cluster(args, root / "variant", flags, False)
        print(
            f"variant {' '.join(flags)}: registered → stable "
            f"{variant.registered_to_stable_s:.2f} s",
            flush=True,
        )
    loads.append(load())
    return joins, tput, loads, variant


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise Stopped()

    previous = signal.signal(signal.SIGTERM, handler)
    # Explicit: a background job of a non-interactive shell inherits SIGINT ignored.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--agents", type=int, default=5, help="agents after the join")
    parser.add_argument("--repeat", type=int, default=3, help="fresh clusters (joins)")
    parser.add_argument("--calls", type=int, default=40, help="GetAssignments calls per row")
    parser.add_argument("--concurrency", type=int, default=8, help="calls in flight")
    parser.add_argument("--max-moves", type=int, default=None, help="driver --max-moves")
    parser.add_argument(
        "--max-moves-per-node", type=int, default=None, help="driver --max-moves-per-node"
    )
    parser.add_argument(
        "--max-mib-per-node", type=int, default=None, help="driver --max-mib-per-node"
    )
    parser.add_argument(
        "--variant-per-node",
        type=int,
        default=None,
        help="one extra join with this driver --max-moves-per-node (throttle effect)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="py-spy every driver and agent from registration to stable into this directory",
    )
    parser.add_argument(
        "--profile-perf", action="store_true", help="with --profile: perf record instead"
    )
    args = parser.parse_args(argv)
    global PROFILE, PROFILE_PERF
    PROFILE, PROFILE_PERF = args.profile, args.profile_perf
    started = time.monotonic()
    with sigterm_raises():
        try:
            joins, tput, loads, variant = asyncio.run(run(args))
        except (KeyboardInterrupt, Stopped):
            print("interrupted; every process stopped", file=sys.stderr)
            return 130
        finally:
            kill_leftovers()
    text = report(args, joins, tput, loads, variant, time.monotonic() - started)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
