"""Idle cost of a READY cluster: CPU per process, in-sync-set churn and errors at rest.

One run::

    .venv/bin/python bench/idle_bench.py [--partitions 64 1000] [--agents 5] [--drivers 1]
        [--replicas 3] [--window 20] [--settle 5]

For each partition count: a fresh local cluster (``placement.local.cluster``: etcd, drivers and
agents as real subprocesses, the way ``placectl up`` starts them), one zone ``idle`` of P×R
created through ``placectl``; once ``zone status`` says READY, every partition's in-sync set equals
its stable assignment (the data plane settled) and ``--settle`` seconds passed, no
client traffic at all for ``--window`` seconds, during which it measures:

* CPU of every process (user + system seconds from ``psutil`` over the window, in % of one core),
  and the machine's load average;
* in-sync-set changes: ISR keys (``{p}/isr/...``) whose mod revision changed during the window;
* errors at rest: agent log lines of the window that mention ``DEADLINE_EXCEEDED`` or a refused
  write.

The goal of design/data-plane.md's scale work is ≤ 3% of a core for an agent hosting 600
replicas, ≤ 20% of one core for the whole P=1,000 cluster, and zero ISR changes and errors at
rest. Writes ``bench/results/idle.md`` and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from placement.core.retry import RetryPolicy, retry  # noqa: E402
from placement.errors import StoreUnavailable  # noqa: E402
from placement.local.cluster import Cluster, UpOptions, start_cluster, wait_ready  # noqa: E402
from placement.metastore.codec import InSyncSet, decode_isr  # noqa: E402
from placement.metastore.etcd import EtcdClient  # noqa: E402
from placement.metastore.keys import KeySpace  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "idle.md"
ZONE = "idle"
ERROR_MARKS = ("DEADLINE_EXCEEDED", "write refused")


@dataclass(frozen=True)
class Sample:
    partitions: int
    ready_s: float
    in_sync_s: float  # zone created -> every in-sync set equals stable
    cpu: dict[str, float]  # process name -> % of one core over the window
    replicas: dict[str, int]  # agent -> replicas hosted (from stable)
    isr_changes: int
    isr_keys: int
    errors: dict[str, int]  # agent -> error lines in the window
    load: tuple[float, float, float]


def placectl(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "placement", "--endpoint", ",".join(cluster.driver_apis), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def wait_zone_ready(cluster: Cluster, timeout: float) -> float:
    start = time.monotonic()
    while True:
        status = placectl(cluster, "zone", "status", ZONE, "--json")
        if status.returncode == 0 and json.loads(status.stdout)["state"] == "READY":
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise SystemExit(f"zone not READY after {timeout:.0f}s: {status.stdout}{status.stderr}")
        time.sleep(1.0)


def stables(cluster: Cluster) -> dict[int, set[str]]:
    result = placectl(cluster, "assignments", ZONE, "--json")
    if result.returncode != 0:
        return {}
    return {
        int(row["partition"]): set(row.get("stable") or [])
        for row in json.loads(result.stdout)["partitions"]
    }


async def isr_members(cluster: Cluster) -> dict[int, set[str]]:
    keys = KeySpace(cluster.prefix)
    async with EtcdClient([cluster.etcd_endpoint], call_timeout=20.0) as client:
        found = await client.list_prefix(keys.isr_prefix())
    out: dict[int, set[str]] = {}
    for kv in found.kvs:
        parsed = keys.parse(kv.key)
        isr = decode_isr(kv.value)
        if parsed is not None and parsed.partition is not None and isinstance(isr, InSyncSet):
            out[parsed.partition] = set(isr.members)
    return out


def wait_in_sync(cluster: Cluster, partitions: int, timeout: float) -> float:
    """Seconds until every partition's in-sync set equals its stable assignment (the data plane
    has settled: every replica created, copied and joined)."""
    start = time.monotonic()
    while True:
        want = stables(cluster)
        try:
            have = asyncio.run(isr_members(cluster))
        except StoreUnavailable:
            have = {}
        if len(want) == partitions and all(have.get(p) == peers for p, peers in want.items()):
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            done = sum(1 for p, peers in want.items() if have.get(p) == peers)
            raise SystemExit(f"only {done} of {partitions} partitions in sync after {timeout:.0f}s")
        time.sleep(1.0)


async def isr_revisions(cluster: Cluster) -> dict[bytes, int]:
    """Every ISR key's mod revision; patient, since a busy cluster may answer slowly."""
    keys = KeySpace(cluster.prefix)
    async with EtcdClient([cluster.etcd_endpoint], call_timeout=20.0) as client:
        found = await retry(
            lambda: client.list_prefix(keys.isr_prefix()),
            policy=RetryPolicy(initial=0.5, cap=2.0),
            retry_on=(StoreUnavailable,),
            sleep=asyncio.sleep,
            attempts=10,
        )
    return {kv.key: kv.mod_revision for kv in found.kvs}


def hosted(cluster: Cluster) -> dict[str, int]:
    counts: dict[str, int] = {}
    for peers in stables(cluster).values():
        for node in peers:
            counts[node] = counts.get(node, 0) + 1
    return counts


def log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def count_errors(path: Path, offset: int) -> int:
    with path.open("rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", "replace")
    return sum(1 for line in text.splitlines() if any(m in line for m in ERROR_MARKS))


def cpu_seconds(proc: psutil.Process) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def measure(partitions: int, args: argparse.Namespace, console: Console) -> Sample:
    base = Path(tempfile.mkdtemp(prefix=f"idle-bench-{partitions}-"))
    # plaintext, as the recorded figures were measured (TLS's cost: bench/tls_bench.py)
    opts = UpOptions(
        nodes=args.agents,
        drivers=args.drivers,
        data_dir=base,
        api_port=0,
        live=False,
        insecure=True,
    )
    cluster = start_cluster(opts, base, console)
    try:
        asyncio.run(wait_ready(cluster, opts, demo_zone=False))
        created = placectl(
            cluster,
            *("zone", "create", ZONE, "--partitions", str(partitions)),
            *("--replicas", str(args.replicas)),
        )
        if created.returncode != 0:
            raise SystemExit(created.stderr)
        ready_s = wait_zone_ready(cluster, args.ready_timeout)
        in_sync_s = ready_s + wait_in_sync(cluster, partitions, args.ready_timeout)
        time.sleep(args.settle)
        procs = {c.name: psutil.Process(c.proc.pid) for c in cluster.children if c.proc}
        agents = [c for c in cluster.children if c.name.startswith("node-")]
        offsets = {c.name: log_size(c.log) for c in agents}
        isr_before = asyncio.run(isr_revisions(cluster))
        before = {name: cpu_seconds(p) for name, p in procs.items()}
        t0 = time.monotonic()
        time.sleep(args.window)
        after = {name: cpu_seconds(p) for name, p in procs.items()}
        elapsed = time.monotonic() - t0
        load = os.getloadavg()
        isr_after = asyncio.run(isr_revisions(cluster))
        changed = sum(
            1 for k in set(isr_before) | set(isr_after) if isr_before.get(k) != isr_after.get(k)
        )
        return Sample(
            partitions=partitions,
            ready_s=ready_s,
            in_sync_s=in_sync_s,
            cpu={n: 100.0 * (after[n] - before[n]) / elapsed for n in procs},
            replicas=hosted(cluster),
            isr_changes=changed,
            isr_keys=len(isr_after),
            errors={c.name: count_errors(c.log, offsets[c.name]) for c in agents},
            load=load,
        )
    finally:
        cluster.stop()


def report(samples: list[Sample], args: argparse.Namespace) -> str:
    cpu_model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip()
            break
    lines = [
        "# Idle cost of a READY cluster",
        "",
        f"`python bench/idle_bench.py --partitions {' '.join(map(str, args.partitions))} "
        f"--agents {args.agents} --drivers {args.drivers} --replicas {args.replicas} "
        f"--window {args.window} --settle {args.settle}`",
        "",
        f"Machine: {os.cpu_count()} CPU(s), {cpu_model}; Python {platform.python_version()}. "
        "No client traffic during the window; CPU in % of one core (user + system).",
        "",
    ]
    for s in samples:
        total = sum(s.cpu.values())
        lines += [
            f"## P={s.partitions}, R={args.replicas}, {args.agents} agents",
            "",
            f"READY {s.ready_s:.1f} s and every in-sync set = stable {s.in_sync_s:.1f} s after the"
            " zone was created; load average at the end of the "
            f"window {s.load[0]:.2f} / {s.load[1]:.2f} / {s.load[2]:.2f}.",
            "",
            "| process | replicas hosted | CPU % of a core | error lines at rest |",
            "|---|---|---|---|",
        ]
        for name, pct in sorted(s.cpu.items()):
            lines.append(
                f"| {name} | {s.replicas.get(name, '')} | {pct:.1f} | {s.errors.get(name, '')} |"
            )
        lines += [
            f"| **all** | {sum(s.replicas.values())} | **{total:.1f}** | "
            f"{sum(s.errors.values())} |",
            "",
            f"In-sync-set changes during the window: **{s.isr_changes}** of {s.isr_keys} keys.",
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[64, 1000])
    parser.add_argument("--agents", type=int, default=5)
    parser.add_argument("--drivers", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    args = parser.parse_args()
    console = Console(quiet=True)
    samples = [measure(p, args, console) for p in args.partitions]
    text = report(samples, args)
    RESULTS.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
