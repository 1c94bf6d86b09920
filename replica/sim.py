"""A fleet of simulated replica agents in one process, for benchmarks (``bench/fleet_bench.py``).

Each simulated node is a real agent without a data plane: its own ``grpc.aio`` server on a free
127.0.0.1 port serving the real ``ReplicaService`` (:func:`replica.server.start_agent`: the
protocol core, the per-partition locks, a real sqlite :class:`replica.records.AgentStore` in
its own data dir), the plain catch-up of an agent without a data plane
(:func:`replica.service.record_catch_up`: creates the replica record, copies nothing), and the
real :class:`replica.registration.Registration`: its node record under its own etcd lease, its
move reports under that lease. What is shared by the nodes of one process: the event loop and
one :class:`EtcdClient` (one gRPC channel to etcd; every node still has its own lease and
keep-alive stream). No data plane: no in-sync sets, no primary-lease hand-over on stop.

Run::

    python -m replica.sim --etcd HOST:PORT --data-root DIR --nodes n0001,n0002,... \
        [--prefix /placement] [--lease-ttl 5] [--attribute rack=r1]

It prints ``sim ready N nodes rss_mb X base_rss_mb Y`` once every node serves and is registered,
then takes one command a line on stdin and answers one line each on stdout:

* ``start NAME`` — start (and register) a node, new or stopped; ``ok start NAME``;
* ``stop NAME`` — graceful stop: revoke its lease (the node key goes at once), stop its server
  (grace 1 s), close its store; ``ok stop NAME``;
* ``restart NAME`` — ``stop`` then ``start``; ``ok restart NAME``;
* ``stats`` — ``stats nodes N rss_mb X``.

A command that fails answers ``err COMMAND NAME: reason``. SIGTERM, SIGINT or the end of stdin
stop every node gracefully and end the process (exit 0); a fatal store error of any node ends it
with exit 1. A node's data dir is ``DATA_ROOT/NAME`` (kept across a restart, like a real one);
point ``--data-root`` at a tmpfs (``/dev/shm``) to make the stores' fsyncs cheap.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import resource
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from placement.aio import stop_on_signals
from placement.errors import PlacementError
from placement.metastore.codec import NodeRecord
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace
from placement.runtime import tune_gc
from replica.registration import Registration, parse_attributes
from replica.server import RunningAgent, start_agent

log = logging.getLogger(__name__)

#: Nodes started at once while the process comes up (etcd lease grants and registrations).
START_CONCURRENCY = 16
#: Grace of a node's server stop: in-flight RPCs finish (a real agent's default is 5 s).
STOP_GRACE = 1.0


def rss_mb() -> float:
    """Resident set size of this process now, in MiB (from ``/proc/self/statm``)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return pages * resource.getpagesize() / 2**20


class SimNode:
    """One simulated agent: server + store + registration, started and stopped as one."""

    def __init__(self, name: str, data_dir: Path, attributes: dict[str, str]) -> None:
        self.name = name
        self.data_dir = data_dir
        self.attributes = attributes
        self.running: RunningAgent | None = None
        self.registration: Registration | None = None

    async def start(
        self,
        client: EtcdClient,
        keys: KeySpace,
        ttl: int,
        on_fatal: _Fatal,
        store_thread: ThreadPoolExecutor,
    ) -> None:
        if self.running is not None:
            raise PlacementError(f"node {self.name} is running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # No etcd client for the agent itself: no data plane, so the catch-up is the plain
        # record_catch_up (creates the replica record, copies nothing).
        running = await start_agent(
            self.name, "127.0.0.1:0", self.data_dir, on_fatal=on_fatal, store_executor=store_thread
        )
        registration = Registration(
            client,
            keys,
            NodeRecord(self.name, running.address, dict(self.attributes)),
            ttl=ttl,
            on_change=running.set_serving,
            on_fatal=on_fatal,
        )
        try:
            await registration.start()
        except BaseException:
            await running.stop(STOP_GRACE)
            raise
        running.agent.reporter = registration.report
        self.running, self.registration = running, registration

    async def stop(self) -> None:
        running, registration = self.running, self.registration
        self.running = self.registration = None
        try:
            if registration is not None:
                await registration.stop()  # revoke: the node key goes at once
        finally:
            if running is not None:
                await running.stop(STOP_GRACE)


class _Fatal:
    """A node's store failed to commit: the process stops (like a real agent, exit 1)."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self.errors: list[BaseException] = []

    def __call__(self, error: BaseException) -> None:
        self.errors.append(error)
        self.stop.set()


class Fleet:
    """The simulated nodes of this process."""

    def __init__(
        self,
        client: EtcdClient,
        keys: KeySpace,
        data_root: Path,
        attributes: dict[str, str],
        ttl: int,
        on_fatal: _Fatal,
    ) -> None:
        self.client = client
        self.keys = keys
        self.data_root = data_root
        self.attributes = attributes
        self.ttl = ttl
        self.on_fatal = on_fatal
        self.nodes: dict[str, SimNode] = {}
        #: The one thread running every node's store calls: a thread per node was 265 threads
        #: per process, hundreds of them runnable at once under a burst of adopts.
        self.store_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sim-store")

    def node(self, name: str) -> SimNode:
        if name not in self.nodes:
            self.nodes[name] = SimNode(name, self.data_root / name, self.attributes)
        return self.nodes[name]

    async def start(self, name: str) -> None:
        await self.node(name).start(
            self.client, self.keys, self.ttl, self.on_fatal, self.store_thread
        )

    async def stop(self, name: str) -> None:
        if name not in self.nodes:
            raise PlacementError(f"no node {name} here")
        await self.nodes[name].stop()

    async def start_all(self, names: Sequence[str]) -> None:
        slots = asyncio.Semaphore(START_CONCURRENCY)

        async def one(name: str) -> None:
            async with slots:
                await self.start(name)

        await asyncio.gather(*(one(n) for n in names))

    async def stop_all(self) -> None:
        running = [n for n in self.nodes.values() if n.running is not None]
        await asyncio.gather(*(n.stop() for n in running), return_exceptions=True)

    def running(self) -> int:
        return sum(1 for n in self.nodes.values() if n.running is not None)

    async def command(self, line: str) -> str:
        words = line.split()
        if not words:
            return "err empty command"
        verb, names = words[0], words[1:]
        try:
            if verb == "stats":
                return f"stats nodes {self.running()} rss_mb {rss_mb():.1f}"
            if verb not in ("start", "stop", "restart") or len(names) != 1:
                return f"err {line.strip()}: unknown command"
            (name,) = names
            if verb in ("stop", "restart"):
                await self.stop(name)
            if verb in ("start", "restart"):
                await self.start(name)
            return f"ok {verb} {name}"
        except (PlacementError, OSError) as e:
            return f"err {verb} {' '.join(names)}: {e}"


async def _stdin_lines() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def run(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    on_fatal = _Fatal(stop)
    base = rss_mb()
    names = [n for n in args.nodes.split(",") if n]
    async with EtcdClient(args.etcd) as client:
        fleet = Fleet(
            client,
            KeySpace(args.prefix),
            args.data_root,
            parse_attributes(args.attribute),
            args.lease_ttl,
            on_fatal,
        )
        try:
            with stop_on_signals(stop):
                await fleet.start_all(names)
                print(
                    f"sim ready {fleet.running()} nodes rss_mb {rss_mb():.1f} "
                    f"base_rss_mb {base:.1f}",
                    flush=True,
                )
                reader = await _stdin_lines()
                stopped = asyncio.create_task(stop.wait())
                while not stop.is_set():
                    read = asyncio.create_task(reader.readline())
                    await asyncio.wait({read, stopped}, return_when=asyncio.FIRST_COMPLETED)
                    if not read.done():
                        read.cancel()
                        break
                    raw = read.result()
                    if not raw:
                        break  # stdin closed: the harness went away
                    print(await fleet.command(raw.decode()), flush=True)
                stopped.cancel()
        finally:
            await fleet.stop_all()
            fleet.store_thread.shutdown(wait=True)
    for error in on_fatal.errors:
        log.critical("a node's store failed: %s", error)
    return 1 if on_fatal.errors else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replica.sim", description=__doc__)
    parser.add_argument("--etcd", required=True, help="etcd endpoint(s) HOST:PORT[,...]")
    parser.add_argument("--prefix", default="/placement")
    parser.add_argument("--data-root", type=Path, required=True, help="a data dir per node")
    parser.add_argument("--nodes", required=True, help="comma-separated node names to start")
    parser.add_argument("--lease-ttl", type=int, default=5, help="registration lease TTL (s)")
    parser.add_argument("--attribute", action="append", default=[], help="K=V on every node")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    tune_gc()
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
