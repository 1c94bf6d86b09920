"""Agent store benchmark: what a re-sharding's data movement costs the replica store, per byte
(design/data-plane.md, "State on an agent").

One run::

    .venv/bin/python bench/store_bench.py [--mb 50] [--out bench/results/store.md]

The agent's real store (``AgentStore.open`` on a temporary directory: its WAL, ``synchronous=FULL``
and its connection settings) driven through the real ``DataStore`` calls, in one thread, with the
shapes a re-sharding of 64 KiB values makes:

1. **preload**: ``--mb`` of 64 KiB values into partition 0, 16 per transaction;
2. **foreground**: 4,000 writes of 256 B (overwrites of 500 keys), 8 per transaction — a group
   commit's worth of client writes;
3. **copy**: half the preloaded values written again as new keys of partition 1, 16 per
   transaction (a destination's copy pages);
4. **purge**: those keys deleted from partition 0, 64 per transaction (CLEANUP's purge);
5. **trim**: partition 0's log forgotten down to its newest 1,000 entries (``trim``, which an agent
   runs every ``log_keep // 4`` entries).

Each phase is timed (wall, and the thread's CPU) and its bytes written to the disk are read from
``/proc/self/io`` (``write_bytes``: what the kernel sent to storage, WAL and checkpoints included).

Two configurations, each on a fresh directory, in one run:

* **before**: the connection as it was before this benchmark's change: sqlite's defaults on this
  build (``cache_size`` 2 MB, no memory map, ``secure_delete`` ON in Debian's build);
* **after**: the agent's connection settings (memory map, 64 MiB cache, ``secure_delete`` FAST).

Writes ``--out`` and prints it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for extra in (str(ROOT), str(ROOT / "bench")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

from run_info import run_section, uptime  # noqa: E402

from replica.data.storage import DataStore, Entry  # noqa: E402
from replica.records import AgentStore  # noqa: E402

ZONE = "bench"
VALUE = 64 << 10
#: sqlite's own defaults on this build: what the agent's connection ran with before.
DEFAULTS = ("PRAGMA cache_size = -2000", "PRAGMA mmap_size = 0", "PRAGMA secure_delete = 1")


def written_bytes() -> int:
    """Bytes this process has sent to storage so far (``/proc/self/io`` ``write_bytes``)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no write_bytes")


@dataclass
class Phase:
    name: str
    wall: float
    cpu: float
    disk: int
    payload: int


@dataclass
class Config:
    name: str
    defaults: bool
    phases: list[Phase] = field(default_factory=list)


class Log:
    """Appends entries to one partition of a store, numbering them."""

    def __init__(self, data: DataStore, partition: int) -> None:
        self.data = data
        self.partition = partition
        self.last = 0

    def write(self, writes: list[tuple[bytes, bytes | None]]) -> None:
        entries = [
            Entry(self.last + i, 1, k, v or b"", v is None) for i, (k, v) in enumerate(writes, 1)
        ]
        self.last += len(entries)
        self.data.append(ZONE, self.partition, entries, self.last)


def timed(config: Config, name: str, payload: int, work: Callable[[], None]) -> None:
    disk, wall, cpu = written_bytes(), time.perf_counter(), time.thread_time()
    work()
    config.phases.append(
        Phase(
            name,
            time.perf_counter() - wall,
            time.thread_time() - cpu,
            written_bytes() - disk,
            payload,
        )
    )


def run(config: Config, directory: Path, mb: float) -> None:
    store = AgentStore.open(directory, "n1")
    try:
        conn = store._conn
        if config.defaults:
            for pragma in DEFAULTS:
                conn.execute(pragma)
        data = store.data
        source, destination = Log(data, 0), Log(data, 1)
        count = int(mb * (1 << 20)) // VALUE
        keys = [b"key-%06d" % i for i in range(count)]
        value = os.urandom(VALUE)
        moved = keys[::2]

        def preload() -> None:
            for i in range(0, count, 16):
                source.write([(k, value) for k in keys[i : i + 16]])

        def foreground() -> None:
            small = os.urandom(256)
            for i in range(0, 4000, 8):
                source.write([(b"small-%03d" % ((i + j) % 500), small) for j in range(8)])

        def copy() -> None:
            for i in range(0, len(moved), 16):
                destination.write([(k, value) for k in moved[i : i + 16]])

        def purge() -> None:
            for i in range(0, len(moved), 64):
                source.write([(k, None) for k in moved[i : i + 64]])

        def trim() -> None:
            data.trim(ZONE, 0, 1000)

        timed(config, "preload", count * VALUE, preload)
        timed(config, "foreground", 4000 * 256, foreground)
        timed(config, "copy", len(moved) * VALUE, copy)
        timed(config, "purge", len(moved) * VALUE, purge)
        timed(config, "trim", 0, trim)
    finally:
        store.close()


def report(configs: list[Config], mb: float, started: float, load: list[str]) -> str:
    lines = [
        "# Agent store benchmark",
        "",
        "Produced by `bench/store_bench.py` (do not edit by hand): the agent's real store"
        " (`AgentStore.open`: WAL, `synchronous=FULL`) driven through `DataStore` in one thread"
        f" with a re-sharding's shapes, {mb:g} MB of 64 KiB values. See the script's docstring"
        " for the phases and the configurations.",
        "",
        "| configuration | sqlite settings |",
        "|---|---|",
    ]
    for c in configs:
        settings = (
            "defaults (2 MB cache, no mmap, secure_delete ON)"
            if c.defaults
            else "the agent's (64 MiB cache, mmap 1 GiB, secure_delete FAST)"
        )
        lines.append(f"| {c.name} | {settings} |")
    lines += [
        "",
        "Per phase: wall ms, the thread's CPU ms, and MB written to the disk (`/proc/self/io`"
        " `write_bytes`; the payload is the values' bytes the phase writes or deletes).",
        "",
    ]
    names = [p.name for p in configs[0].phases]
    lines.append("| phase | payload MB | " + " | ".join(c.name for c in configs) + " |")
    lines.append("|---|---:|" + "---:|" * len(configs))
    for i, name in enumerate(names):
        cells = []
        for c in configs:
            p = c.phases[i]
            ms, cpu, mb = p.wall * 1000, p.cpu * 1000, p.disk / 1e6
            cells.append(f"{ms:.0f} ms, CPU {cpu:.0f} ms, {mb:.1f} MB")
        payload = configs[0].phases[i].payload / 1e6
        lines.append(f"| {name} | {payload:.1f} | " + " | ".join(cells) + " |")
    base, last = configs[0], configs[-1]
    lines += ["", f"**{last.name} against {base.name}** (same run):", ""]
    for i, name in enumerate(names):
        b, a = base.phases[i], last.phases[i]
        disk = f"disk ×{a.disk / b.disk:.2f}" if b.disk else "disk —"
        lines.append(
            f"- {name}: wall ×{a.wall / b.wall:.2f}, CPU ×{a.cpu / max(b.cpu, 1e-9):.2f}, {disk}"
        )
    lines += ["", *run_section(started, load, "start / end")]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50.0, help="MB of 64 KiB values to preload")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/store.md")
    args = parser.parse_args()
    if args.mb <= 0:
        parser.error("--mb must be above 0")
    started, load = time.time(), [uptime()]
    configs = [
        Config("before", defaults=True),
        Config("after", defaults=False),
    ]
    with tempfile.TemporaryDirectory(prefix="store-bench-") as tmp:
        for c in configs:
            run(c, Path(tmp) / c.name, args.mb)
    load.append(uptime())
    text = report(configs, args.mb, started, load)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
