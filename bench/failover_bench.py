"""Failover benchmark: the write-unavailability window a retrying client sees when a primary's
agent is SIGKILLed, SIGTERMed, or its node drained (design/data-plane.md, "A new primary";
design/control-plane.md, "Drain").

One run::

    .venv/bin/python bench/failover_bench.py [--trials 2] [--partitions 8] [--primary-lease 10]
        [--events kill,term,drain]

Each trial is a fresh cluster of real processes started the way ``bench/data_plane_bench.py``
starts them (etcd, one driver with ``--primary-lease``, three agents), zone P×3. One writer per
partition Puts continuously through the partition's primary (routes from etcd, ``x-primary``
redirects followed). After 3 s of writes the benchmark SIGKILLs the agent that is primary of
partition 0 — ``kill``: SIGKILL; ``term``: SIGTERM (the agent hands its leases over before it
deregisters); ``drain``: ``DrainNode`` (leases, then replicas, move away) — and, for every
partition that agent led, measures the window: the longest time without an acknowledged write
from the event until 3 s after writes resumed (the kill's: until the first write sent after it
was acknowledged — a dead primary's lease must expire first; goal ≤ primary lease + 1 s).
Afterwards every acknowledged value is read back from the new primaries. Writes
``bench/results/failover.md`` and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from data_plane_bench import (  # noqa: E402
    PREFIX,
    ZONE,
    Cluster,
    Router,
    Stats,
    create_zone_and_wait,
    machine,
    put,
    start_agent,
    start_driver,
    start_etcd,
    wait_settled,
)

from placement.api.client import PlacementClient  # noqa: E402
from placement.data.partitioning import partition_of  # noqa: E402
from placement.metastore.codec import (  # noqa: E402
    LeaseTerm,
    PrimaryLease,
    decode_primary,
    decode_term,
)
from placement.metastore.etcd import EtcdClient  # noqa: E402
from placement.metastore.keys import KeySpace  # noqa: E402
from placement.metastore.store import Metastore  # noqa: E402
from placement.v1 import common_pb2, data_pb2, driver_pb2  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "failover.md"
EVENTS = ("kill", "kill-renewed", "term", "drain")


async def leaders(client: EtcdClient, keys: KeySpace) -> dict[int, str]:
    base = keys.zone_primary_prefix(ZONE)
    out: dict[int, str] = {}
    for kv in (await client.list_prefix(base)).kvs:
        lease = decode_primary(kv.value)
        tail = kv.key[len(base) :]
        if tail.isdigit() and isinstance(lease, PrimaryLease):
            out[int(tail)] = lease.node
    return out


async def renewed(client: EtcdClient, keys: KeySpace) -> None:
    """Returns as soon as the lease term of partition 0's holder gets a later end (it was just
    renewed: every lease the holder has lasts that much longer)."""
    kv = (await client.get(keys.primary(ZONE, 0))).first()
    lease = decode_primary(kv.value) if kv is not None else None
    assert isinstance(lease, PrimaryLease), "partition 0 has no primary lease"
    key = keys.term(lease.node)

    async def until() -> int:
        kv = (await client.get(key)).first()
        term = decode_term(kv.value) if kv is not None else None
        return term.until if isinstance(term, LeaseTerm) else 0

    first = await until()
    while await until() <= first:  # noqa: ASYNC110 - polls etcd
        await asyncio.sleep(0.01)


async def trial(args: argparse.Namespace, base: Path, event: str) -> dict[int, float]:
    """The write-unavailability window per partition the victim led (seconds)."""
    keys = KeySpace(PREFIX)
    cluster = Cluster(base)
    try:
        await start_etcd(cluster)
        await start_driver(cluster, ["--primary-lease", str(args.primary_lease)])
        await asyncio.gather(*(start_agent(cluster, f"n{k}") for k in (1, 2, 3)))
        async with (
            PlacementClient([cluster.api], deadline=30.0) as api,
            EtcdClient([cluster.etcd], call_timeout=10.0) as client,
        ):
            await create_zone_and_wait(cluster, api, 3, args.partitions, 3, args.scale_down_delay)
            store = Metastore(client, keys)
            await wait_settled(store, client, keys, args.partitions, "ISR = stable", [])
            router = Router(client, keys, args.partitions)
            await router.refresh()
            keys_of: dict[int, bytes] = {}
            i = 0
            while len(keys_of) < args.partitions:
                key = f"failover-{i}".encode()
                keys_of.setdefault(partition_of(key, args.partitions), key)
                i += 1
            acks: dict[int, list[tuple[float, float]]] = {p: [] for p in keys_of}  # (sent, acked)
            last: dict[int, bytes] = {}
            stop = asyncio.Event()

            async def writer(p: int) -> None:
                seq = 0
                while not stop.is_set():
                    value = b"%d" % seq
                    started = time.monotonic()
                    if await put(router, keys_of[p], value, Stats()) is not None:
                        acks[p].append((started, time.monotonic()))
                        last[p] = value
                    seq += 1

            tasks = [asyncio.create_task(writer(p)) for p in keys_of]
            await asyncio.sleep(3.0)
            if event == "kill-renewed":  # the worst moment: right after a renewal
                await renewed(client, keys)
            led = await leaders(client, keys)
            victim = led[0]
            hit = sorted(p for p, node in led.items() if node == victim)
            killed = time.monotonic()
            if event == "drain":
                request = driver_pb2.DrainNodeRequest(node=victim, drain=True)
                await api.call(lambda s, t: s.DrainNode(request, timeout=t))
            else:
                sig = signal.SIGKILL if event.startswith("kill") else signal.SIGTERM
                cluster.agents[victim].proc.send_signal(sig)  # type: ignore[union-attr]
            deadline = killed + args.primary_lease * 3 + 30
            while time.monotonic() < deadline and not all(  # noqa: ASYNC110 - polls the writers
                any(sent > killed for sent, _ in acks[p]) for p in hit
            ):
                await asyncio.sleep(0.05)
            # The window closes only once the victim is done: its process exited (kill, term)
            # or its node holds nothing (drain) — then 3 s more, so a later stall counts too.
            await victim_done(api, cluster, victim, event, deadline)
            await asyncio.sleep(3.0)
            stop.set()
            await asyncio.gather(*tasks)
            gaps = {p: window(acks[p], killed) for p in hit}
            await router.refresh()
            for p, value in last.items():  # every last acknowledged value is still there
                reply = await router.data(router.addr[p]).Get(
                    data_pb2.GetRequest(
                        partition=common_pb2.PartitionRef(zone=ZONE, partition=p), key=keys_of[p]
                    ),
                    timeout=10,
                )
                if not reply.found or reply.value != value:
                    raise SystemExit(f"p{p}: acknowledged {value!r}, read {reply}")
            await router.close()
            return gaps
    finally:
        await cluster.stop()


async def victim_done(
    api: PlacementClient, cluster: Cluster, victim: str, event: str, deadline: float
) -> None:
    proc = cluster.agents[victim].proc
    drain = event == "drain"
    request = driver_pb2.GetNodeStatusRequest(node=victim) if drain else None
    while time.monotonic() < deadline:
        if request is not None:
            found = await api.call(lambda s, t: s.GetNodeStatus(request, timeout=t))
            if found.safe_to_stop:
                return
        elif proc is None or proc.returncode is not None:
            return
        await asyncio.sleep(0.1)
    raise SystemExit(f"{victim} not done after the {event}")


def window(acks: list[tuple[float, float]], event: float) -> float:
    """The longest time without an acknowledged write from ``event`` on: from the event (or
    an acknowledgement after it) to the next acknowledgement of a write *sent* after the event
    (one in flight at the event may be acknowledged by the old primary just before it died)."""
    times = sorted(acked for sent, acked in acks if sent > event)
    if not times:
        return float("inf")
    edges = [event, *times]
    return max(b - a for a, b in itertools.pairwise(edges))


def report(args: argparse.Namespace, trials: dict[str, list[dict[int, float]]]) -> str:
    goal = args.primary_lease + 1.0
    lines = [
        "# Write unavailability: a primary's agent killed, stopped or drained",
        "",
        f"`python bench/failover_bench.py --trials {args.trials} --partitions {args.partitions}"
        f" --primary-lease {args.primary_lease:g} --events {args.events}"
        f" --scale-down-delay {args.scale_down_delay:g}`",
        "",
        *machine(),
        "",
        f"Three agents, zone P={args.partitions}, R=3, min in-sync 2, scale-down delay"
        f" {args.scale_down_delay:g} s; one writer per partition"
        " (a retrying client: redirects followed, other errors retried after 50 ms); after 3 s"
        " of writes the agent leading partition 0 is SIGKILLed (`kill`), SIGTERMed (`term`) or"
        " its node drained (`drain`); `kill-renewed` SIGKILLs it right after its lease of partition"
        " 0 was renewed (the worst moment: a whole lease to wait). Window = the longest time"
        " without an acknowledged write,"
        " from the event until 3 s after writes resumed, per partition that agent led. After a"
        " kill a new primary must wait for the old lease to expire: goal ≤ primary lease + 1 s ="
        f" {goal:g} s; a stop or a drain hands the leases over first.",
        "",
        "| event | trial | partitions the victim led | window per partition (s) | worst (s) |",
        "|---|---:|---:|---|---:|",
    ]
    for event, runs in trials.items():
        for i, gaps in enumerate(runs, 1):
            per = ", ".join(f"p{p}: {g:.2f}" for p, g in sorted(gaps.items()))
            lines.append(f"| {event} | {i} | {len(gaps)} | {per} | {max(gaps.values()):.2f} |")
    lines.append("")
    for event, runs in trials.items():
        worst = [max(g.values()) for g in runs]
        verdict = (
            f" ({'within' if max(worst) <= goal else 'OVER'} the {goal:g} s goal)"
            if event.startswith("kill")
            else ""
        )
        lines.append(
            f"- `{event}`: worst window median {statistics.median(worst):.2f} s, max"
            f" {max(worst):.2f} s{verdict}."
        )
    lines += ["", "Every last acknowledged value read back from the new primaries.", ""]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, list[dict[int, float]]]:
    out: dict[str, list[dict[int, float]]] = {}
    for event in args.events.split(","):
        if event not in EVENTS:
            raise SystemExit(f"--events: {event!r} is not one of {', '.join(EVENTS)}")
        for i in range(args.trials):
            base = Path(tempfile.mkdtemp(prefix=f"failover-bench-{event}-{i}-"))
            try:
                gaps = await trial(args, base, event)
            finally:
                shutil.rmtree(base, ignore_errors=True)
            per = ", ".join(f"p{p} {g:.2f}s" for p, g in sorted(gaps.items()))
            print(f"{event} trial {i + 1}: {per}")
            out.setdefault(event, []).append(gaps)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--events", default=",".join(EVENTS))
    parser.add_argument(
        "--scale-down-delay",
        type=float,
        default=60.0,
        help="the zone's: a stopped agent's replicas stay (a restart must not move data)",
    )
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--primary-lease", type=float, default=10.0)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    text = report(args, asyncio.run(run(args)))
    args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
