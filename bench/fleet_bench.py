"""Fleet benchmark (issue 14): many simulated agents speaking the real replica protocol against
the real driver and a real etcd.

One run::

    .venv/bin/python bench/fleet_bench.py --nodes 1000 --zones 100 --partitions 1000 \\
        --replicas 3 --processes 4

Real processes, started the way ``bench/control_plane_bench.py`` starts them (its helpers are
imported): etcd (free 127.0.0.1 ports, a temp data dir), one placement driver (``python -m
placement driver run --metrics-listen ...``) and ``--processes`` fleet processes (``python -m
replica.sim``: each runs its share of the nodes, every node a real agent without a data plane —
its own gRPC server, sqlite store and etcd registration lease; design/control-plane.md,
"Measurements"). The scenario, each step timed from this benchmark's own watch of the whole
prefix (opened before the first zone is created):

1. **create** ``--zones`` zones of ``--partitions`` × ``--replicas`` (scale-up/down delay 0)
   through the API → every zone READY (``GetZoneStatus``), then until every first member's
   adopt has ended (``placement_driver_adopts``);
2. **idle** ``--idle`` seconds: the steady state (primary-lease renewals only);
3. **join**: one more node starts (in fleet process 0) → every partition stable;
4. **leave**: one node stops gracefully (its lease revoked, its key gone at once) → stable;
5. **rolling restart** of ``--restart-fraction`` of the nodes, ``--restart-batch`` at a time
   (each node: lease revoked, server stopped, started again on its data dir, registered again)
   after every zone's scale-down delay was set to ``--restart-delay`` (so a restart moves
   nothing; 0 = no alter, every restart moves replicas away and back) → stable.

"Stable" = no partition has pending or planned, every zone's data-nodes record says what the
phase expects (the joiner in, the leaver out, no membership change held down), and every zone
answers READY; the phase ends at the last of: the revision after which no pending/planned was
left, the last data-nodes write. Per phase: duration, moves (pending written, partitions whose
stable changed), whether the final stable is exactly the placement function's target
(``placement.algo.place`` on the phase's final node set from the assignment before), CPU
seconds of each process (``/proc``), the driver's peak RSS (sampled each second), its pass time
(``placement_driver_pass_seconds`` histogram scraped from ``--metrics-listen`` at both ends:
p50/p99/max as bucket upper bounds), and whether the driver lost its election (any event on
``{prefix}/leader/`` keys, or its terms counter grew). At the end: etcd's key count and database
size (etcd's ``/metrics``).

Writes ``--output`` (default ``bench/results/fleet.md``) with the command, machine, load and
date, and prints it. A phase that does not settle within ``--phase-timeout`` ends the run: the
report says which and keeps what was measured. Every process runs in its own process group and
is stopped on exit, exception, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for extra in (str(ROOT), str(ROOT / "bench")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

from control_plane_bench import (  # noqa: E402
    PREFIX,
    Child,
    Cluster,
    Stopped,
    _machine_busy,
    _proc_cpu,
    command_line,
    create_zone,
    kill_leftovers,
    load,
    run_section,
    sigterm_raises,
    start_driver,
    start_etcd,
)

from placement.algo.place import place  # noqa: E402
from placement.api.client import ApiError, PlacementClient  # noqa: E402
from placement.core.model import Node, ZoneSpec  # noqa: E402
from placement.local.cluster import free_ports  # noqa: E402
from placement.metastore.codec import (  # noqa: E402
    Assignment,
    DataNodes,
    decode_assignment,
    decode_datanodes,
    decode_zone_spec,
)
from placement.metastore.etcd import EtcdClient  # noqa: E402
from placement.metastore.keys import AssignField, KeyKind, KeySpace, prefix_range_end  # noqa: E402
from placement.metastore.kv import EventKind, WatchBatch  # noqa: E402
from placement.v1 import driver_pb2  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "fleet.md"
#: How often the settle check asks every zone's status once the watch says it is quiet.
SETTLE_POLL = 0.5
#: Status calls in flight while checking every zone, and seconds between two such checks (each
#: status is a placement of the zone on the driver: the check must not load what it measures).
STATUS_CONCURRENCY = 4
STATUS_EVERY = 2.0
#: Seconds between background scrapes of the driver's metrics (the fallback when a busy driver
#: does not answer a phase's own scrape). Not more often: a scrape computes every zone's status
#: gauges on the driver (``Driver.gauges`` → ``zone_outlook`` → placement, per zone).
SCRAPE_EVERY = 30.0


@dataclass(frozen=True)
class Params:
    nodes: int = 1000
    zones: int = 100
    partitions: int = 1000
    replicas: int = 3
    processes: int = 4
    sim_lease_ttl: int = 5
    driver_lease_ttl: int = 5
    idle: float = 20.0
    restart_fraction: float = 0.1
    restart_batch: int = 10
    restart_delay: float = 30.0
    restart_downtime: float = 1.0
    phase_timeout: float = 1800.0
    data_root: Path | None = None
    driver_flags: tuple[str, ...] = ()
    driver_rss_limit: float = 8192.0
    fleet_nice: int = 10
    etcd_batching: bool = True

    def names(self) -> list[str]:
        return [node_name(i) for i in range(1, self.nodes + 1)]


def node_name(i: int) -> str:
    return f"n{i:04d}"


def zone_name(i: int) -> str:
    return f"z{i:03d}"


# -- fleet processes ---------------------------------------------------------------------------


class FleetProcess:
    """One ``python -m replica.sim`` child and its command pipe (one command at a time)."""

    def __init__(self, child: Child, names: list[str]) -> None:
        self.child = child
        self.names = names
        self.lock = asyncio.Lock()
        self.ready_line = ""

    async def command(self, line: str) -> str:
        proc = self.child.proc
        assert proc is not None
        assert proc.stdin is not None
        assert proc.stdout is not None
        async with self.lock:
            proc.stdin.write(line.encode() + b"\n")
            await proc.stdin.drain()
            raw = await proc.stdout.readline()
        answer = raw.decode().strip()
        if not answer.startswith(("ok ", "stats ")):
            raise RuntimeError(f"{self.child.name}: {line!r} answered {answer!r}")
        return answer

    def base_and_ready_rss(self) -> tuple[float, float]:
        words = self.ready_line.split()
        return float(words[words.index("base_rss_mb") + 1]), float(words[words.index("rss_mb") + 1])


async def start_fleet(cluster: Cluster, params: Params, data_root: Path) -> list[FleetProcess]:
    names = params.names()
    share = -(-len(names) // params.processes)
    fleet: list[FleetProcess] = []
    for k in range(params.processes):
        mine = names[k * share : (k + 1) * share]
        child = Child(
            f"fleet{k}",
            [
                "nice", "-n", str(params.fleet_nice),
                sys.executable, "-m", "replica.sim",
                "--etcd", cluster.etcd,
                "--prefix", PREFIX,
                "--data-root", str(data_root),
                "--nodes", ",".join(mine),
                "--lease-ttl", str(params.sim_lease_ttl),
            ],
            cluster.base / "logs" / f"fleet{k}.log",
            interactive=True,
        )  # fmt: skip
        cluster.children.append(child)
        fleet.append(FleetProcess(child, mine))

    async def start(process: FleetProcess) -> None:
        process.ready_line = await process.child.start(announce="sim ready ")

    await asyncio.gather(*(start(p) for p in fleet))
    return fleet


def owner(fleet: list[FleetProcess], name: str) -> FleetProcess:
    for process in fleet:
        if name in process.names:
            return process
    return fleet[0]


# -- what the watch sees -----------------------------------------------------------------------


@dataclass
class Seen:
    """The prefix as this benchmark's watch has applied it (only what the phases ask)."""

    keys: KeySpace
    pending: set[bytes] = field(default_factory=set)
    planned: set[bytes] = field(default_factory=set)
    stable: set[bytes] = field(default_factory=set)
    primaries: set[bytes] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    datanodes: dict[str, DataNodes] = field(default_factory=dict)
    revision: int = 0
    #: When (monotonic) and at which revision pending ∪ planned last became empty.
    quiet_at: float = 0.0
    quiet_revision: int = 0
    datanodes_at: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    #: (monotonic time, "put"/"delete", node) of every node-key event.
    node_events: list[tuple[float, str, str]] = field(default_factory=list)

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def apply(self, batch: WatchBatch, now: float) -> None:
        busy = bool(self.pending or self.planned)
        for e in batch.events:
            put = e.kind is EventKind.PUT
            parsed = self.keys.parse(e.kv.key)
            if parsed is None:
                continue
            kind = parsed.kind
            if kind is KeyKind.ASSIGN:
                if parsed.field is AssignField.PENDING:
                    (self.pending.add if put else self.pending.discard)(e.kv.key)
                    if put:
                        self.count("pending puts")
                elif parsed.field is AssignField.PLANNED:
                    (self.planned.add if put else self.planned.discard)(e.kv.key)
                elif parsed.field is AssignField.STABLE:
                    (self.stable.add if put else self.stable.discard)(e.kv.key)
                    if put:
                        self.count("stable puts")
            elif kind is KeyKind.PRIMARY:
                (self.primaries.add if put else self.primaries.discard)(e.kv.key)
                self.count("primary writes")
            elif kind is KeyKind.TERM:
                self.count("lease term writes")
            elif kind is KeyKind.PROGRESS:
                self.count("reports" if put else "report deletes")
            elif kind is KeyKind.NODE:
                (self.nodes.add if put else self.nodes.discard)(parsed.name)
                self.node_events.append((now, "put" if put else "delete", parsed.name))
            elif kind is KeyKind.DATANODES:
                self.datanodes_at = now
                if put:
                    record = decode_datanodes(e.kv.value)
                    if isinstance(record, DataNodes):
                        self.datanodes[parsed.name] = record
                else:
                    self.datanodes.pop(parsed.name, None)
            elif kind is KeyKind.LEADER:
                self.count("leader events")
        self.revision = batch.revision
        if busy and not self.pending and not self.planned:
            self.quiet_at, self.quiet_revision = now, batch.revision

    def quiet(self) -> bool:
        return not self.pending and not self.planned


async def watch_prefix(client: EtcdClient, seen: Seen, start: int, ready: asyncio.Event) -> None:
    prefix = seen.keys.prefix.encode() + b"/"
    async with client.watch(
        prefix, prefix_range_end(prefix), start_revision=start + 1, prev_kv=False
    ) as watch:
        ready.set()
        async for batch in watch:
            seen.apply(batch, time.monotonic())


# -- driver, etcd and /proc figures ------------------------------------------------------------


def scrape(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=20.0) as r:
            return str(r.read().decode())
    except (urllib.error.URLError, OSError):
        return ""


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def samples(text: str) -> dict[str, float]:
    """Prometheus text → ``{"name{labels}": value}``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            with contextlib.suppress(ValueError):
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


PASS = "placement_driver_pass_seconds"
ADOPTS = "placement_driver_adopts"


def pass_buckets(metrics: dict[str, float]) -> dict[float, float]:
    """Cumulative pass counts by bucket upper bound (inf included)."""
    out: dict[float, float] = {}
    for name, value in metrics.items():
        if name.startswith(PASS + "_bucket{"):
            le = re.search(r'le="([^"]+)"', name)
            if le:
                out[float(le.group(1))] = value
    return out


@dataclass
class PassStats:
    count: int
    mean_ms: float
    p50: str
    p99: str
    max: str
    over_100ms: int


def _bound(le: float) -> str:
    return "> 60 s (+Inf bucket)" if le == float("inf") else f"≤ {1000 * le:g} ms"


def pass_stats(before: dict[str, float], after: dict[str, float]) -> PassStats | None:
    b0, b1 = pass_buckets(before), pass_buckets(after)
    if not b1:
        return None
    diff = {le: b1[le] - b0.get(le, 0.0) for le in sorted(b1)}
    count = int(diff.get(float("inf"), 0))
    total = after.get(PASS + "_sum", 0.0) - before.get(PASS + "_sum", 0.0)
    if count == 0:
        return PassStats(0, 0.0, "-", "-", "-", 0)

    def quantile(q: float) -> str:
        for le, cumulative in diff.items():
            if cumulative >= q * count:
                return _bound(le)
        return _bound(float("inf"))

    prev, top = 0.0, float("inf")
    for le, cumulative in diff.items():
        if cumulative > prev:
            top = le
        prev = cumulative
    under = diff.get(0.1, 0.0)
    return PassStats(
        count, 1000 * total / count, quantile(0.5), quantile(0.99), _bound(top), int(count - under)
    )


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@dataclass
class Probe:
    """The figures taken at both ends of a phase."""

    at: float
    cpu: dict[str, float]
    driver: dict[str, float]
    counts: dict[str, int]


class Meter:
    """CPU, RSS and driver metrics of the cluster's processes."""

    def __init__(self, cluster: Cluster, driver_metrics: str, fleet: list[FleetProcess]) -> None:
        self.cluster = cluster
        self.driver_metrics = driver_metrics
        self.fleet = fleet
        self.rss: list[tuple[float, float]] = []
        self.exceeded: str | None = None
        self.last_metrics: dict[str, float] = {}

    def pid(self, name: str) -> int:
        for child in self.cluster.children:
            if child.name == name and child.proc is not None:
                return child.proc.pid
        return 0

    def cpu(self) -> dict[str, float]:
        out = {
            "driver": _proc_cpu(self.pid("driver")),
            "etcd": _proc_cpu(self.pid("etcd")),
            "fleet processes": sum(
                _proc_cpu(p.child.proc.pid) for p in self.fleet if p.child.proc is not None
            ),
            "benchmark (watch, status polls)": time.process_time(),
            "machine (all processes)": _machine_busy(),
        }
        return out

    async def probe(self, seen: Seen) -> Probe:
        """The figures now; the driver's metrics from a fresh scrape, or — when a busy driver
        does not answer in time — the last one :meth:`scrape_driver` got."""
        text = await asyncio.to_thread(scrape, self.driver_metrics)
        metrics = samples(text) if text else self.last_metrics
        return Probe(time.monotonic(), self.cpu(), metrics, dict(seen.counts))

    async def scrape_driver(self) -> None:
        """Keep :attr:`last_metrics` at most :data:`SCRAPE_EVERY` old."""
        while True:
            text = await asyncio.to_thread(scrape, self.driver_metrics)
            if text:
                self.last_metrics = samples(text)
            await asyncio.sleep(SCRAPE_EVERY)

    async def sample_rss(self, limit_mb: float) -> None:
        """Sample the driver's RSS each second; past ``limit_mb`` SIGKILL it (the machine is
        shared: a driver that grows without bound would take everyone's memory)."""
        pid = self.pid("driver")
        while True:
            rss = rss_mb(pid)
            self.rss.append((time.monotonic(), rss))
            if rss > limit_mb and self.exceeded is None:
                self.exceeded = f"driver RSS {rss:.0f} MiB passed the limit {limit_mb:.0f} MiB"
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            await asyncio.sleep(1.0)

    def peak_rss(self, start: float, end: float) -> float:
        return max((r for t, r in self.rss if start - 1.0 <= t <= end + 1.0), default=0.0)


def etcd_figures(endpoint: str) -> dict[str, float]:
    metrics = samples(scrape(f"http://{endpoint}/metrics"))
    return {
        "keys": metrics.get("etcd_debugging_mvcc_keys_total", 0.0),
        "db_bytes": metrics.get("etcd_mvcc_db_total_size_in_bytes", 0.0),
        "db_in_use_bytes": metrics.get("etcd_mvcc_db_total_size_in_use_in_bytes", 0.0),
    }


# -- assignments and the placement check -------------------------------------------------------


async def read_zones(
    client: EtcdClient, keys: KeySpace
) -> tuple[dict[str, ZoneSpec], dict[str, dict[int, tuple[str, ...]]]]:
    """Every zone's spec and stable assignment (preferred primary first), at one revision each."""
    specs: dict[str, ZoneSpec] = {}
    for kv in (await client.list_prefix(keys.zones_prefix())).kvs:
        spec = decode_zone_spec(kv.value)
        if isinstance(spec, ZoneSpec):
            specs[spec.name] = spec
    stables: dict[str, dict[int, tuple[str, ...]]] = {z: {} for z in specs}
    for kv in (await client.list_prefix(keys.assign_prefix(), page_size=10_000)).kvs:
        parsed = keys.parse(kv.key)
        if parsed is None or parsed.field is not AssignField.STABLE:
            continue
        assert parsed.partition is not None
        value = decode_assignment(kv.value)
        peers = tuple(value.peers) if isinstance(value, Assignment) else ("<corrupt>",)
        stables.setdefault(parsed.name, {})[parsed.partition] = peers
    return specs, stables


def off_target(
    specs: dict[str, ZoneSpec],
    before: dict[str, dict[int, tuple[str, ...]]] | None,
    after: dict[str, dict[int, tuple[str, ...]]],
    nodes: Sequence[str],
) -> int:
    """Partitions whose stable is not a placement target on ``nodes``: not what ``place`` gives
    fed the stable itself (a balanced, settled zone is that fixed point whatever the fleet), or
    missing. The driver breaks ties with the fleet's loads as zones happened to be placed
    (design/placement.md, "Fleet-wide balance"), so the exact target from ``before`` depends
    on that history; ``before`` is kept for the callers' symmetry and the moves are counted
    apart (:func:`moved`)."""
    del before
    eligible = [Node(n) for n in sorted(nodes)]
    wrong = 0
    for zone, spec in specs.items():
        settled = after.get(zone, {})
        target = place(spec, eligible, {p: list(v) for p, v in settled.items()}).assignments
        got = after.get(zone, {})
        wrong += sum(1 for p, peers in enumerate(target) if got.get(p) != tuple(peers))
    return wrong


def moved(
    before: dict[str, dict[int, tuple[str, ...]]], after: dict[str, dict[int, tuple[str, ...]]]
) -> int:
    return sum(
        1
        for zone, parts in after.items()
        for p, peers in parts.items()
        if set(peers) != set(before.get(zone, {}).get(p, ()))
    )


# -- phases ------------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    seconds: float | None
    detail: str
    start: Probe
    end: Probe
    peak_rss_mb: float
    passes: PassStats | None
    leader_events: int
    terms: float
    moved: int | None = None
    off_target: int | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def delta(self, what: str) -> int:
        return self.end.counts.get(what, 0) - self.start.counts.get(what, 0)

    @property
    def wall(self) -> float:
        return self.end.at - self.start.at

    def cpu(self, role: str) -> float:
        return self.end.cpu[role] - self.start.cpu[role]


class PhaseTimeout(Exception):
    """A phase did not settle in time, or the run had to stop (a child died, the driver's
    memory passed ``--driver-rss-limit``)."""


class Bench:
    def __init__(
        self,
        params: Params,
        cluster: Cluster,
        fleet: list[FleetProcess],
        api: PlacementClient,
        client: EtcdClient,
        seen: Seen,
        meter: Meter,
    ) -> None:
        self.params = params
        self.cluster = cluster
        self.fleet = fleet
        self.api = api
        self.client = client
        self.seen = seen
        self.meter = meter
        self.zones = [zone_name(i) for i in range(1, params.zones + 1)]
        self.phases: list[Phase] = []
        #: The phase under way: name, its first probe, its start; and the milestones it reached.
        self.current: tuple[str, Probe, float] | None = None
        self.marks: dict[str, str] = {}
        self._noted = 0.0
        self.log: list[str] = []

    def check(self) -> None:
        if self.meter.exceeded is not None:
            raise PhaseTimeout(self.meter.exceeded)
        try:
            self.cluster.check()
        except RuntimeError as e:
            raise PhaseTimeout(str(e)) from e

    def say(self, text: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {text}"
        self.log.append(line)
        print(line, flush=True)

    async def status(self, zone: str) -> int:
        request = driver_pb2.GetZoneRequest(name=zone)
        try:
            found = await self.api.call(lambda s, t: s.GetZoneStatus(request, timeout=t))
        except ApiError:
            return -1
        return int(found.state)

    async def all_ready(self) -> bool:
        slots = asyncio.Semaphore(STATUS_CONCURRENCY)
        ready = True

        async def one(zone: str) -> None:
            nonlocal ready
            if not ready:
                return
            async with slots:
                if ready and await self.status(zone) != driver_pb2.READY:
                    ready = False

        await asyncio.gather(*(one(z) for z in self.zones))
        return ready

    async def settle(
        self, what: str, since: float, expect: Callable[[Seen], bool], started: float
    ) -> float:
        """Wait until the watch is quiet and ``expect`` holds, then every zone READY; returns
        the end time: the last of ``since``, the quiet point and the last data-nodes write."""
        deadline = started + self.params.phase_timeout
        asked = 0.0
        while True:
            self.check()
            now = time.monotonic()
            if now > deadline:
                raise PhaseTimeout(
                    f"{what}: not stable after {self.params.phase_timeout:.0f} s "
                    f"({len(self.seen.pending)} pending, {len(self.seen.planned)} planned)"
                )
            self.progress(what, started)
            if self.seen.quiet() and expect(self.seen) and now - asked >= STATUS_EVERY:
                asked = now
                quiet_at, dn_at = self.seen.quiet_at, self.seen.datanodes_at
                unchanged = await self.all_ready() and self.seen.quiet() and expect(self.seen)
                if unchanged and (self.seen.quiet_at, self.seen.datanodes_at) == (quiet_at, dn_at):
                    return max(since, quiet_at, dn_at)
            await asyncio.sleep(SETTLE_POLL)

    def progress(self, what: str, started: float) -> None:
        """A line in the run log every 30 s while a phase waits."""
        now = time.monotonic()
        if now - max(self._noted, started) > 30.0:
            self._noted = now
            self.say(
                f"  {what}: {now - started:.0f} s, {len(self.seen.pending)} pending, "
                f"{len(self.seen.planned)} planned, {len(self.seen.stable)} stable, "
                f"{len(self.seen.primaries)} leases, {len(self.seen.nodes)} nodes registered, "
                f"{self.seen.counts.get('reports', 0)} reports"
            )

    async def begin(self, name: str) -> tuple[Probe, float]:
        start = await self.meter.probe(self.seen)
        self.current = (name, start, time.monotonic())
        self.marks = {}
        return start, self.current[2]

    async def incomplete(self, error: str) -> None:
        """Record the phase under way as it stands when the run had to stop."""
        if self.current is None:
            return
        name, start, started = self.current
        self.current = None
        await self.phase(
            f"{name} (did not settle)",
            None,
            f"stopped after {time.monotonic() - started:.0f} s: {error}; the watch had "
            f"{len(self.seen.stable)} stable, {len(self.seen.pending)} pending, "
            f"{len(self.seen.primaries)} primary leases, {len(self.seen.nodes)} nodes registered",
            start,
            **self.marks,
        )

    async def phase(
        self,
        name: str,
        seconds: float | None,
        detail: str,
        start: Probe,
        **extra: object,
    ) -> Phase:
        end = await self.meter.probe(self.seen)
        passes = pass_stats(start.driver, end.driver)
        terms = end.driver.get("placement_driver_terms_total", 0.0) - start.driver.get(
            "placement_driver_terms_total", 0.0
        )
        phase = Phase(
            name,
            seconds,
            detail,
            start,
            end,
            self.meter.peak_rss(start.at, end.at),
            passes,
            end.counts.get("leader events", 0) - start.counts.get("leader events", 0),
            terms,
            moved=extra.pop("moved", None),  # type: ignore[arg-type]
            off_target=extra.pop("off_target", None),  # type: ignore[arg-type]
            extra={k: str(v) for k, v in extra.items()},
        )
        self.phases.append(phase)
        self.current = None
        shown = (
            "-"
            if passes is None
            else f"{passes.count} (mean {passes.mean_ms:.0f} ms, p50 {passes.p50}, p99 "
            f"{passes.p99}, max {passes.max})"
        )
        self.say(
            f"{name}: {'-' if seconds is None else f'{seconds:.1f} s'}; {detail}; passes "
            f"{shown}; driver CPU {phase.cpu('driver'):.1f} s; leader events "
            f"{phase.leader_events}"
        )
        return phase

    # -- the scenario --

    async def create(self) -> None:
        p = self.params
        start, t0 = await self.begin("create")
        slots = asyncio.Semaphore(8)

        async def one(zone: str) -> None:
            request = driver_pb2.CreateZoneRequest(
                name=zone,
                config=driver_pb2.ZoneConfig(
                    partitions=p.partitions,
                    replicas=p.replicas,
                    scale_up_delay_seconds=0.0,
                    scale_down_delay_seconds=0.0,
                ),
            )
            async with slots:
                await create_zone(self.api, request)

        await asyncio.gather(*(one(z) for z in self.zones))
        created = time.monotonic() - t0
        self.marks["CreateZone calls (s)"] = f"{created:.1f}"
        total = p.zones * p.partitions
        stable_all = await self.wait_count("create", lambda s: len(s.stable) >= total, t0)
        self.marks["create → every partition's stable written (s)"] = f"{stable_all - t0:.1f}"
        leases = await self.wait_count("create", lambda s: len(s.primaries) >= total, t0)
        self.marks["create → every primary lease granted (s)"] = f"{leases - t0:.1f}"
        await self.settle("create", t0, lambda s: len(s.stable) >= total, t0)
        ready = time.monotonic() - t0
        self.marks["create → every zone READY (GetZoneStatus) (s)"] = f"{ready:.1f}"
        adopts = await self.adopts_settle(p.zones * p.partitions * p.replicas)
        specs, stables = await read_zones(self.client, self.seen.keys)
        wrong = off_target(specs, None, stables, sorted(self.seen.nodes))
        await self.phase(
            "create",
            ready,
            f"{p.zones} zones × {p.partitions} partitions × R={p.replicas}; CreateZone calls "
            f"{created:.1f} s",
            start,
            off_target=wrong,
            **self.marks,
            **{"create → last adopt ended (s)": f"{adopts[0] - t0:.1f} ({adopts[1]} adopts)"},
        )

    async def wait_count(self, what: str, cond: Callable[[Seen], bool], started: float) -> float:
        """Until ``cond`` holds on the watch (at most the phase's time from ``started``)."""
        deadline = started + self.params.phase_timeout
        while not cond(self.seen):
            self.check()
            if time.monotonic() > deadline:
                raise PhaseTimeout(f"{what}: not there after {self.params.phase_timeout:.0f} s")
            self.progress(what, started)
            await asyncio.sleep(0.1)
        return time.monotonic()

    async def adopts_settle(self, expected: int, quiet_for: float = 30.0) -> tuple[float, int]:
        """Until the driver's metrics count ``expected`` adopts ended (done, stale or left to
        the sweep), or none ended for ``quiet_for``: when the last one ended, and how many."""

        async def ended() -> int:
            metrics = samples(await asyncio.to_thread(scrape, self.meter.driver_metrics))
            return int(sum(v for k, v in metrics.items() if k.startswith(ADOPTS + "_total{")))

        last, count = time.monotonic(), await ended()
        deadline = time.monotonic() + self.params.phase_timeout
        while count < expected and time.monotonic() - last < quiet_for:
            self.check()
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
            now_count = await ended()
            if now_count != count:
                last, count = time.monotonic(), now_count
        return last, count

    async def idle(self) -> None:
        if self.params.idle <= 0:
            return
        start, _ = await self.begin("idle")
        await asyncio.sleep(self.params.idle)
        await self.phase("idle", None, f"{self.params.idle:.0f} s, nothing changes", start)

    def node_event(self, kind: str, node: str, after: float) -> float | None:
        for t, k, n in self.seen.node_events:
            if k == kind and n == node and t >= after:
                return t
        return None

    async def membership(self, name: str, node: str, verb: str) -> None:
        """One node joins (``start``) or leaves (``stop``): its key's event → stable."""
        specs, before = await read_zones(self.client, self.seen.keys)
        start, t0 = await self.begin(name)
        await owner(self.fleet, node).command(f"{verb} {node}")
        kind = "put" if verb == "start" else "delete"
        while (at := self.node_event(kind, node, t0)) is None:
            self.check()
            await asyncio.sleep(0.05)
        self.marks["command → node key event (s)"] = f"{at - t0:.2f}"
        joined = verb == "start"

        def expect(seen: Seen) -> bool:
            return len(seen.datanodes) == len(self.zones) and all(
                (node in d.applied) == joined and set(d.applied) == set(d.observed)
                for d in seen.datanodes.values()
            )

        end = await self.settle(name, at, expect, t0)
        _, after = await read_zones(self.client, self.seen.keys)
        await self.phase(
            name,
            end - at,
            f"node {node} {'registered' if joined else 'key deleted'} → every partition stable",
            start,
            moved=moved(before, after),
            off_target=off_target(specs, before, after, sorted(self.seen.nodes)),
            **self.marks,
        )

    async def rolling_restart(self) -> None:
        p = self.params
        live = sorted(self.seen.nodes)
        count = max(1, round(p.restart_fraction * len(live)))
        step = max(1, len(live) // count)
        chosen = live[::step][:count]
        if p.restart_delay > 0:
            await self.alter_delay(p.restart_delay)
        specs, before = await read_zones(self.client, self.seen.keys)
        start, t0 = await self.begin("rolling restart")
        for i in range(0, len(chosen), p.restart_batch):
            batch = chosen[i : i + p.restart_batch]
            await asyncio.gather(*(owner(self.fleet, n).command(f"stop {n}") for n in batch))
            await asyncio.sleep(p.restart_downtime)
            await asyncio.gather(*(owner(self.fleet, n).command(f"start {n}") for n in batch))
        restarted = time.monotonic()
        downtimes = []
        for node in chosen:
            gone = self.node_event("delete", node, t0)
            back = self.node_event("put", node, gone or t0)
            if gone is not None and back is not None:
                downtimes.append(back - gone)
        everyone = set(live)

        def expect(seen: Seen) -> bool:
            return seen.nodes >= everyone and all(
                set(d.applied) == everyone and set(d.observed) == everyone
                for d in seen.datanodes.values()
            )

        end = await self.settle("rolling restart", restarted, expect, t0)
        _, after = await read_zones(self.client, self.seen.keys)
        await self.phase(
            "rolling restart",
            end - t0,
            f"{len(chosen)} nodes, {p.restart_batch} at a time, each down "
            f"{p.restart_downtime:g} s, scale-down delay "
            f"{p.restart_delay:g} s → every node back and every partition stable",
            start,
            moved=moved(before, after),
            off_target=off_target(specs, before, after, sorted(self.seen.nodes)),
            **{
                "restarts issued (s)": f"{restarted - t0:.1f}",
                "node down (key deleted → put again), median/max (s)": (
                    f"{sorted(downtimes)[len(downtimes) // 2]:.2f} / {max(downtimes):.2f}"
                    if downtimes
                    else "-"
                ),
            },
        )

    async def alter_delay(self, delay: float) -> None:
        for zone in self.zones:
            request = driver_pb2.AlterZoneRequest(
                name=zone,
                config=driver_pb2.ZoneConfig(scale_down_delay_seconds=delay),
                update_fields=["scale_down_delay"],
            )
            await self.api.call(lambda s, t, r=request: s.AlterZone(r, timeout=t))  # type: ignore[misc]
        await self.settle("alter", time.monotonic(), lambda s: True, time.monotonic())


#: (log file glob, what the line says): counted in the processes' logs after the run.
LOG_SIGNS: tuple[tuple[str, str], ...] = (
    ("driver.log", "stepping down"),
    ("driver.log", "no etcd quorum"),
    ("driver.log", "failed:"),
    ("fleet*.log", ": lease lost"),
    ("fleet*.log", "registration failed"),
    ("etcd.log", "apply request took too long"),
)


def log_signs(logs: Path) -> list[tuple[str, str, int, str]]:
    """(files, sign, lines, first such line) for every sign of :data:`LOG_SIGNS`."""
    out = []
    for pattern, sign in LOG_SIGNS:
        count, first = 0, ""
        for path in sorted(logs.glob(pattern)):
            with path.open(errors="replace") as f:
                for line in f:
                    if sign in line:
                        count += 1
                        first = first or line.strip()[:300]
        out.append((pattern, sign, count, first))
    return out


@dataclass
class Outcome:
    params: Params
    phases: list[Phase]
    error: str | None
    log: list[str]
    loads: list[str]
    fleet_rss: list[tuple[int, float, float]]
    etcd: dict[str, float]
    driver_peak_rss_mb: float
    sim_idle_cpu_share: float | None
    wall: float
    signs: list[tuple[str, str, int, str]] = field(default_factory=list)
    work: str = ""


async def run(params: Params, work: Path, loads: list[str] | None = None) -> Outcome:
    """The whole scenario on a fresh cluster under ``work``; every process stopped on the way
    out. A phase that does not settle ends the run (``Outcome.error``)."""
    loads = loads if loads is not None else []
    started = time.monotonic()
    keys = KeySpace(PREFIX)
    cluster = Cluster(work)
    data_root = Path(tempfile.mkdtemp(prefix="fleet-", dir=params.data_root))
    error: str | None = None
    phases: list[Phase] = []
    log: list[str] = []
    fleet_rss: list[tuple[int, float, float]] = []
    etcd: dict[str, float] = {}
    peak = 0.0
    idle_share: float | None = None
    tasks: list[asyncio.Task[None]] = []
    try:
        await start_etcd(cluster, batching=params.etcd_batching)
        (metrics_port,) = free_ports(1)
        await start_driver(
            cluster,
            [
                "--lease-ttl", str(params.driver_lease_ttl),
                "--metrics-listen", f"127.0.0.1:{metrics_port}",
                "--log-level", "WARNING",
                *params.driver_flags,
            ],
        )  # fmt: skip
        fleet = await start_fleet(cluster, params, data_root)
        for process in fleet:
            base, ready = process.base_and_ready_rss()
            fleet_rss.append((len(process.names), base, ready))
        meter = Meter(cluster, f"http://127.0.0.1:{metrics_port}/metrics", fleet)
        seen = Seen(keys)
        async with (
            PlacementClient([cluster.api], deadline=120.0, call_timeout=60.0) as api,
            EtcdClient([cluster.etcd], call_timeout=60.0) as client,
        ):
            revision = await client.current_revision()
            for kv in (await client.list_prefix(keys.nodes_prefix(), revision=revision)).kvs:
                parsed = keys.parse(kv.key)
                if parsed is not None and parsed.kind is KeyKind.NODE:
                    seen.nodes.add(parsed.name)
            watching = asyncio.Event()
            tasks.append(asyncio.create_task(watch_prefix(client, seen, revision, watching)))
            tasks.append(asyncio.create_task(meter.sample_rss(params.driver_rss_limit)))
            tasks.append(asyncio.create_task(meter.scrape_driver()))
            await watching.wait()
            bench = Bench(params, cluster, fleet, api, client, seen, meter)
            log = bench.log
            phases = bench.phases
            bench.say(f"{len(seen.nodes)} nodes registered; logs in {work / 'logs'}")
            try:
                await bench.create()
                loads.append(load())
                await bench.idle()
                if bench.phases and bench.phases[-1].name == "idle":
                    idle = bench.phases[-1]
                    idle_share = idle.cpu("fleet processes") / idle.wall / params.nodes
                await bench.membership("join", node_name(params.nodes + 1), "start")
                loads.append(load())
                await bench.membership("leave", node_name(params.nodes), "stop")
                loads.append(load())
                if params.restart_fraction > 0:
                    await bench.rolling_restart()
                    loads.append(load())
            except (PhaseTimeout, Stopped) as e:
                error = str(e) or "stopped by SIGTERM"
                bench.say(f"stopped: {error}")
                await bench.incomplete(error)
            etcd = await asyncio.to_thread(etcd_figures, cluster.etcd)
            peak = max((r for _, r in meter.rss), default=0.0)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await cluster.stop()
        shutil.rmtree(data_root, ignore_errors=True)
        shutil.rmtree(work / "etcd", ignore_errors=True)  # on tmpfs: memory; the logs stay
    return Outcome(
        params, phases, error, log, loads, fleet_rss, etcd, peak, idle_share,
        time.monotonic() - started, log_signs(work / "logs"), str(work),
    )  # fmt: skip


# -- report ------------------------------------------------------------------------------------


def _num(value: float | int | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def report(outcome: Outcome, command: str) -> str:
    p = outcome.params
    per_node = [(ready - base) / max(n, 1) for n, base, ready in outcome.fleet_rss if ready > base]
    lines = [
        "# Fleet benchmark",
        "",
        "Produced by `bench/fleet_bench.py` (do not edit by hand). Real processes: one etcd, one",
        f"placement driver (`--lease-ttl {p.driver_lease_ttl}`"
        + (f" {' '.join(p.driver_flags)}" if p.driver_flags else "")
        + "; its other flags at their defaults), and "
        f"{p.processes} fleet processes (`python -m replica.sim`) running {p.nodes} simulated",
        "nodes: each a real replica agent without a data plane (its own gRPC server on a",
        "127.0.0.1 port, the real protocol and sqlite store — on tmpfs — and its own etcd",
        f"registration lease, TTL {p.sim_lease_ttl} s; catch-up = create the replica record).",
        f"Zones: {p.zones} × {p.partitions} partitions × R={p.replicas}, no failure domain.",
        f"etcd's data dir: `{outcome.work}/etcd` (`/dev/shm` is a tmpfs: no disk fsync stalls).",
        'Times come from the benchmark\'s own watch of the whole prefix; "stable" = no',
        "pending/planned, the data-nodes records as the phase expects, every zone READY.",
        "",
    ]
    if outcome.error:
        lines += [f"**Incomplete run**: {outcome.error}.", ""]
    lines += [
        "## Phases",
        "",
        "| phase | time (s) | moved partitions | pending written | stable ≠ placement target |"
        " driver CPU s (% of a core) | driver peak RSS (MiB) | passes | pass mean (ms) |"
        " pass p50 | pass p99 | pass max | passes > 100 ms | leader lost |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|---|",
    ]
    for ph in outcome.phases:
        cpu = ph.cpu("driver")
        ps = ph.passes
        lost = "yes" if ph.leader_events or ph.terms else "no"
        lines.append(
            f"| {ph.name} | {_num(ph.seconds)} | {_num(ph.moved, '{:d}')} | "
            f"{ph.delta('pending puts')} | {_num(ph.off_target, '{:d}')} | "
            f"{cpu:.1f} ({100 * cpu / max(ph.wall, 1e-9):.0f} %) | {ph.peak_rss_mb:.0f} | "
            f"{ps.count if ps else '-'} | {f'{ps.mean_ms:.0f}' if ps else '-'} | "
            f"{ps.p50 if ps else '-'} | {ps.p99 if ps else '-'} | {ps.max if ps else '-'} | "
            f"{ps.over_100ms if ps else '-'} | {lost} |"
        )
    lines += [
        "",
        "Pass time percentiles are the upper bounds of the driver's histogram buckets "
        "(1, 2.5, 5, 10, 25, 50, 100, 150, 250, 500 ms, 1, 2.5, 5, 10, 30, 60 s, +Inf).",
        '"stable ≠ placement target": partitions whose stable is not exactly `place(spec, the',
        "phase's final nodes, current = stable before the phase)`; for `create` the target is",
        "placed from nothing, so it counts moves made meanwhile too (pending written during",
        "`create` = nodes whose registration lapsed and came back).",
        "",
        "CPU seconds per process over each phase (wall = the phase's measuring window, from its",
        "command to the end of its checks; % = share of one core):",
        "",
        "| phase | wall (s) | " + " | ".join(outcome.phases[0].end.cpu) + " |"
        if outcome.phases
        else "",
        "|---|---:|" + "---:|" * (len(outcome.phases[0].end.cpu) if outcome.phases else 0),
    ]
    for ph in outcome.phases:
        lines.append(
            f"| {ph.name} | {ph.wall:.1f} | "
            + " | ".join(
                f"{ph.cpu(role):.1f} ({100 * ph.cpu(role) / max(ph.wall, 1e-9):.0f} %)"
                for role in ph.end.cpu
            )
            + " |"
        )
    lines += ["", "Per phase:", ""]
    for ph in outcome.phases:
        counts = ", ".join(
            f"{k} {ph.delta(k)}"
            for k in (
                "pending puts",
                "stable puts",
                "primary writes",
                "lease term writes",
                "reports",
                "report deletes",
            )
        )
        lines.append(f"- **{ph.name}**: {ph.detail}; {counts}.")
        for k, v in ph.extra.items():
            lines.append(f"  - {k}: {v}")
    lines += [
        "",
        "## Fleet, etcd and driver",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| etcd keys (all: `etcd_debugging_mvcc_keys_total`) | "
        f"{outcome.etcd.get('keys', 0):,.0f} |",
        f"| etcd database size (MiB; in use) | {outcome.etcd.get('db_bytes', 0) / 2**20:.1f} "
        f"({outcome.etcd.get('db_in_use_bytes', 0) / 2**20:.1f}) |",
        f"| driver peak RSS over the run (MiB, sampled each second) | "
        f"{outcome.driver_peak_rss_mb:.0f} |",
        "| fleet process RSS before its nodes / with them (MiB) | "
        + "; ".join(f"{base:.0f} / {ready:.0f} ({n} nodes)" for n, base, ready in outcome.fleet_rss)
        + " |",
        f"| memory per simulated node (MiB) | {_num(min(per_node) if per_node else None, '{:.2f}')}"
        f"–{_num(max(per_node) if per_node else None, '{:.2f}')} |",
        "| idle CPU per simulated node (% of a core; keep-alives, during `idle`) | "
        + _num(
            None if outcome.sim_idle_cpu_share is None else 100 * outcome.sim_idle_cpu_share,
            "{:.3f}",
        )
        + " |",
        "",
        "## What the logs say",
        "",
        "| log | lines saying | count | first |",
        "|---|---|---:|---|",
        *[
            f"| {files} | `{sign}` | {count} | {first.replace('|', '/')} |"
            for files, sign, count, first in outcome.signs
        ],
        "",
        "## Run log",
        "",
        "```",
        *outcome.log,
        "```",
    ]
    lines += run_section(
        command, outcome.wall, outcome.loads, "at start, after each phase, at the end"
    )
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--zones", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--processes", type=int, default=4, help="fleet processes")
    parser.add_argument("--sim-lease-ttl", type=int, default=5, help="each node's lease (s)")
    parser.add_argument("--driver-lease-ttl", type=int, default=5, help="election lease (s)")
    parser.add_argument("--idle", type=float, default=20.0, help="idle phase (s; 0 = none)")
    parser.add_argument("--restart-fraction", type=float, default=0.1)
    parser.add_argument("--restart-batch", type=int, default=10)
    parser.add_argument(
        "--restart-delay", type=float, default=30.0, help="zones' scale-down delay for restarts"
    )
    parser.add_argument(
        "--restart-downtime", type=float, default=1.0, help="seconds a restarted node is down"
    )
    parser.add_argument("--phase-timeout", type=float, default=1800.0)
    parser.add_argument(
        "--data-root",
        type=Path,
        default=Path("/dev/shm") if Path("/dev/shm").is_dir() else None,
        help="where the nodes' sqlite stores go (default: /dev/shm, a tmpfs)",
    )
    parser.add_argument(
        "--driver-flag", action="append", default=[], help="extra driver flag (repeatable)"
    )
    parser.add_argument(
        "--driver-rss-limit",
        type=float,
        default=8192.0,
        help="MiB; the driver is killed (and the run ends) past it",
    )
    parser.add_argument(
        "--etcd-on-disk",
        action="store_true",
        help="etcd's data dir under the system temp dir instead of --data-root",
    )
    parser.add_argument(
        "--fleet-nice",
        type=int,
        default=10,
        help="niceness of the fleet processes: the simulated nodes stand for other machines, so "
        "they yield the CPU to etcd and the driver under test (0: compete equally)",
    )
    parser.add_argument(
        "--etcd-default-batching",
        action="store_true",
        help="etcd with its own backend batching (100 ms, 10,000 writes) instead of the "
        "product's (placement.local.etcd.BACKEND_BATCHING), for an A/B",
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def raise_fd_limit() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    params = Params(
        nodes=args.nodes,
        zones=args.zones,
        partitions=args.partitions,
        replicas=args.replicas,
        processes=args.processes,
        sim_lease_ttl=args.sim_lease_ttl,
        driver_lease_ttl=args.driver_lease_ttl,
        idle=args.idle,
        restart_fraction=args.restart_fraction,
        restart_batch=args.restart_batch,
        restart_delay=args.restart_delay,
        restart_downtime=args.restart_downtime,
        phase_timeout=args.phase_timeout,
        data_root=args.data_root,
        driver_flags=tuple(args.driver_flag),
        driver_rss_limit=args.driver_rss_limit,
        fleet_nice=args.fleet_nice,
        etcd_batching=not args.etcd_default_batching,
    )
    raise_fd_limit()
    # etcd's data dir is under the work dir: on tmpfs with the nodes' stores unless asked not to
    # (this machine's disk is shared, and its fsyncs stall for up to a second under others' load)
    work = Path(
        tempfile.mkdtemp(prefix="fleet-bench-", dir=None if args.etcd_on_disk else args.data_root)
    )
    print(f"work dir (logs): {work}", flush=True)
    loads = [load()]
    with sigterm_raises():
        try:
            outcome = asyncio.run(run(params, work, loads))
        except (KeyboardInterrupt, Stopped):
            print("interrupted; every process stopped", file=sys.stderr)
            return 130
        finally:
            kill_leftovers()
    loads.append(load())
    command = command_line("bench/fleet_bench.py", sys.argv[1:] if argv is None else argv)
    text = report(outcome, command)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)
    return 1 if outcome.error else 0


if __name__ == "__main__":
    sys.exit(main())
