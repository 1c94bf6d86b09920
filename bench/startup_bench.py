"""How long ``placectl`` takes to start: a bare interpreter, ``placectl --help`` and one read.

    .venv/bin/python bench/startup_bench.py [--runs 20] [--baseline GIT_REF]

Runs each command ``--runs`` times as a fresh process (like hyperfine: wall time from spawn to
exit) and reports the median and the minimum. ``placectl zone status X`` goes to a local gRPC
server that serves nothing, so the one call fails at once with ``UNIMPLEMENTED`` (exit 1) and the
time is startup plus one round trip, not a retry loop. ``--baseline`` also measures that commit of
this repository (exported to a temporary directory) for comparison. The table goes to
``bench/results/startup.md`` with the machine it ran on.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "startup.md"
#: ``python -m placement`` is ``placectl`` in every commit (the console script's module moved).
PLACECTL = [sys.executable, "-m", "placement"]


@contextmanager
def refusing_server() -> Iterator[str]:
    """A gRPC server with no services: every call ends at once with UNIMPLEMENTED."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def time_runs(argv: Sequence[str], tree: Path, runs: int, expect: int) -> list[float]:
    # ``python -c`` puts the working directory first on sys.path: run in ``tree`` itself.
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # The warm-up run writes the tree's bytecode (``__pycache__``), as an installed product has
    # it (pip compiles at install, an editable checkout on its first run); with
    # PYTHONDONTWRITEBYTECODE set, as it may be in a developer's shell, every timed run would
    # compile the modules it imports again (about 0.2 s of ``placectl plan``).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run(argv, env=env, cwd=tree, capture_output=True, check=False)  # warm caches
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, cwd=tree, capture_output=True, check=False)
        times.append(time.perf_counter() - start)
        if done.returncode != expect:
            raise SystemExit(f"{argv}: exit {done.returncode}, expected {expect}: {done.stderr!r}")
    return times


def measure(tree: Path, endpoint: str, runs: int) -> dict[str, list[float]]:
    return {
        "python -c pass": time_runs([sys.executable, "-c", "pass"], tree, runs, 0),
        "placectl --help": time_runs([*PLACECTL, "--help"], tree, runs, 0),
        "placectl zone status X": time_runs(
            [*PLACECTL, "--endpoint", endpoint, "zone", "status", "X"], tree, runs, 1
        ),
    }


@contextmanager
def exported(ref: str) -> Iterator[Path]:
    """The tree of commit ``ref`` in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True
        ).stdout
        tar = Path(tmp) / "tree.tar"
        tar.write_bytes(archive)
        with tarfile.open(tar) as t:
            t.extractall(Path(tmp) / "tree", filter="data")
        yield Path(tmp) / "tree"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def table(label: str, results: dict[str, list[float]]) -> list[str]:
    base = statistics.median(results["python -c pass"])
    lines = [
        f"### {label}",
        "",
        "| command | median (s) | min (s) | median over bare interpreter (s) |",
        "|---|---|---|---|",
    ]
    for name, times in results.items():
        median = statistics.median(times)
        lines.append(f"| `{name}` | {median:.3f} | {min(times):.3f} | {median - base:+.3f} |")
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--baseline", help="Also measure this git ref (e.g. the commit before).")
    args = parser.parse_args()
    sections: list[str] = []
    with refusing_server() as endpoint:
        if args.baseline:
            with exported(args.baseline) as tree:
                before = measure(tree, endpoint, args.runs)
            sections += table(f"Before: `{args.baseline}`", before)
        after = measure(ROOT, endpoint, args.runs)
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    sections += table(f"This tree (HEAD `{head}`, working tree as measured)", after)
    report = [
        "# placectl startup",
        "",
        "`python bench/startup_bench.py --runs N [--baseline REF]`: N fresh processes per command, "
        "wall time from spawn to exit. `zone status X` calls a local gRPC server that answers "
        "UNIMPLEMENTED at once (exit 1): startup plus one round trip.",
        "",
        f"Machine: {len(os.sched_getaffinity(0))} CPU(s) (nproc), {cpu_model()}; Python "
        f"{platform.python_version()}; {args.runs} runs per command.",
        "",
        *sections,
    ]
    RESULTS.write_text("\n".join(report))
    print("\n".join(report))


if __name__ == "__main__":
    main()
