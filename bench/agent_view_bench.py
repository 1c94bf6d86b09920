"""What an agent's view of etcd costs per change as the fleet grows (design/data-plane.md, "The
agent's view of etcd").

    .venv/bin/python bench/agent_view_bench.py [--sizes 1000,10000,100000] [--changes 200]

A real etcd; ``--sizes`` stable assignment keys under the assign prefix (zones of 1,000
partitions, written in transactions of 100); then ``--changes`` single-key writes to it, one at
a time, each waited for by two consumers of the same prefix, each on its own ``ListWatch`` and
its own ``View`` (replica/data/view.py) — the agent's data plane keeps one view of six such
prefixes:

* **snapshot** (how the agent followed its prefixes before the follower): on each wake-up take
  the list-watch's snapshot (a copy of the prefix) and apply every key whose mod revision
  differs from the previous snapshot's, and every key gone;
* **follower** (the agent now): on each wake-up take the keys changed since the last one from a
  ``Follower`` and apply those, read live.

Each consumer's figure is the CPU its wake-ups spent between the wait returning and the next
wait (``time.thread_time``; nothing is awaited in between), summed over the changes, per change.
``--output`` writes the table.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for extra in (str(ROOT), str(ROOT / "bench")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

from run_info import run_section, uptime  # noqa: E402

from placement.local.cluster import free_ports  # noqa: E402
from placement.local.etcd import EtcdMember, etcd_binary  # noqa: E402
from placement.metastore.codec import Assignment, encode_assignment  # noqa: E402
from placement.metastore.etcd import EtcdClient  # noqa: E402
from placement.metastore.keys import AssignField, KeySpace  # noqa: E402
from placement.metastore.kv import KeyValue  # noqa: E402
from placement.metastore.listwatch import ListWatch  # noqa: E402
from placement.metastore.txn import Put  # noqa: E402
from replica.data.view import View  # noqa: E402

PARTITIONS_PER_ZONE = 1000
PEERS = ("n1", "n2", "n3")


def _key(keys: KeySpace, i: int) -> bytes:
    return keys.assign(
        f"z{i // PARTITIONS_PER_ZONE:04d}", i % PARTITIONS_PER_ZONE, AssignField.STABLE
    )


async def _populate(client: EtcdClient, keys: KeySpace, start: int, end: int) -> None:
    value = encode_assignment(Assignment(PEERS, 1, 0, 2))
    for first in range(start, end, 100):
        ops = [Put(_key(keys, i), value) for i in range(first, min(end, first + 100))]
        await client.txn((), ops)


class Consumer:
    """One way of following the prefix into a View, with the CPU its wake-ups took."""

    def __init__(self, keys: KeySpace, watch: ListWatch, follow: bool) -> None:
        self.view = View(keys)
        self.watch = watch
        self.follower = watch.follow() if follow else None
        self.seen_snapshot: Mapping[bytes, KeyValue] = watch.snapshot().kvs
        self.view.apply(watch.live().keys(), watch.live())
        self.cpu = 0.0
        self.wakeups = 0
        self.revision = watch.revision
        self.progressed = asyncio.Event()

    async def run(self) -> None:
        seen = -1
        snapshot = self.watch.snapshot()
        while True:
            if self.follower is not None:
                seen = await self.watch.wait_change(seen)
                started = time.thread_time()
                self.view.apply(self.follower.take(), self.watch.live())
                self.revision = self.watch.revision
            else:
                snapshot = await self.watch.wait_newer(snapshot)
                started = time.thread_time()
                old, new = self.seen_snapshot, snapshot.kvs
                changed = [
                    k
                    for k, kv in new.items()
                    if (o := old.get(k)) is None or o.mod_revision != kv.mod_revision
                ]
                changed.extend(old.keys() - new.keys())
                self.view.apply(changed, new)
                self.seen_snapshot = new
                self.revision = snapshot.revision
            self.cpu += time.thread_time() - started
            self.wakeups += 1
            self.progressed.set()


async def measure(client: EtcdClient, keys: KeySpace, changes: int) -> dict[str, tuple[float, int]]:
    prefix = keys.assign_prefix()
    async with ListWatch(client, prefix) as a, ListWatch(client, prefix) as b:
        consumers = {"snapshot": Consumer(keys, a, False), "follower": Consumer(keys, b, True)}
        tasks = [asyncio.create_task(c.run()) for c in consumers.values()]
        try:
            value = encode_assignment(Assignment(("n2", "n3", "n4"), 1, 0, 3))
            for i in range(changes):
                revision = await client.put(_key(keys, i * 7 % max(1, len(a.live()))), value)
                async with asyncio.timeout(30):
                    for c in consumers.values():
                        while c.revision < revision:
                            c.progressed.clear()
                            await c.progressed.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        assert consumers["snapshot"].view.assignments == consumers["follower"].view.assignments
        return {name: (c.cpu, c.wakeups) for name, c in consumers.items()}


async def run(sizes: list[int], changes: int) -> list[tuple[int, dict[str, tuple[float, int]]]]:
    keys = KeySpace("/bench")
    rows = []
    with tempfile.TemporaryDirectory(prefix="agent-view-bench-") as tmp:
        member = EtcdMember(etcd_binary(), Path(tmp), "bench", tuple(free_ports(3)))  # type: ignore[arg-type]
        member.start()
        try:
            async with EtcdClient([member.endpoint]) as client:
                written = 0
                for size in sizes:
                    await _populate(client, keys, written, size)
                    written = size
                    rows.append((size, await measure(client, keys, changes)))
                    print(f"{size} keys: {rows[-1][1]}", flush=True)
        finally:
            member.kill()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    started, load = time.time(), [uptime()]
    rows = asyncio.run(run([int(s) for s in args.sizes.split(",")], args.changes))
    load.append(uptime())
    lines = [
        "| keys in the prefix | snapshot: µs per change | follower: µs per change | ratio |",
        "|---:|---:|---:|---:|",
    ]
    for size, found in rows:
        per = {name: 1e6 * cpu / max(1, wakeups) for name, (cpu, wakeups) in found.items()}
        ratio = per["snapshot"] / per["follower"] if per["follower"] else float("inf")
        lines.append(
            f"| {size:,} | {per['snapshot']:,.0f} | {per['follower']:,.0f} | ×{ratio:,.0f} |"
        )
    lines += ["", *run_section(started, load, "start / end")]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output is not None:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
