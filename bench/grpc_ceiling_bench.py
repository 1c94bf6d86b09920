"""What one machine's CPU allows a write path built on Python gRPC, before any data-plane work.

One run::

    .venv/bin/python bench/grpc_ceiling_bench.py [--writers 16] [--seconds 10]

A write of the data plane costs at least one ``DataService.Put`` round trip (client → primary),
plus the primary's appends to its followers and an fsync on each of three replicas
(design/data-plane.md, "Writes"). This benchmark measures the floor of those parts on this
machine, with nothing else running in them:

* **Put round trip**: a server process (``--serve``: :func:`placement.rpc.bind_server`, a
  ``DataService`` whose ``Put`` answers at once, no storage) and this process as the client
  (:func:`placement.rpc.channel` with ``DATA_PROFILE``; ``--writers`` tasks, one Put of a
  256-byte value in flight each, as ``bench/data_plane_bench.py`` writes). It records calls/s
  and the CPU of both processes (user + system, ``psutil``), hence CPU ms per call.
* **Replicate as a unary call** (what the pair link paid before it became a stream): an empty
  ``ReplicateRequest`` answered at once, as one call of the bench's own unary method with
  ``Replicate``'s messages, both ends, before any append is applied; and a request of two
  appends (one 256-byte entry each, as a primary sends for two partitions' writes) answered
  with two ``AppendResponse``.
* **Replicate as a stream message**: the same two-append request as one message each way on a
  long-lived ``ReplicationService.Replicate`` stream (the pair stream's method),
  ``--writers`` streams with one message in flight each.
* **fsync**: latency of ``os.fsync`` after a 4 KiB write in the data directory's file system
  (a sqlite WAL commit with ``synchronous=FULL`` costs one).

From those it derives the most writes per second the cores could acknowledge if a write cost
only its Put, and if it cost its Put plus one Replicate call to each of two followers (no
batching). Writes ``bench/results/grpc_ceiling.md`` and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from data_plane_bench import machine  # noqa: E402

from placement.rpc import DATA_PROFILE, bind_server, channel  # noqa: E402
from placement.v1 import common_pb2, data_pb2, data_pb2_grpc  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "grpc_ceiling.md"
ANNOUNCE = "ceiling server listening on "


class _Data(data_pb2_grpc.DataServiceServicer):
    async def Put(self, request: Any, context: Any) -> data_pb2.WriteResponse:
        return data_pb2.WriteResponse(index=1, lease_epoch=1)


def _replies(request: data_pb2.ReplicateRequest) -> data_pb2.ReplicateResponse:
    return data_pb2.ReplicateResponse(
        replies=[
            data_pb2.AppendResponse(outcome=data_pb2.APPEND_OK, last_index=a.prev_index + 1)
            for a in request.appends
        ]
    )


class _Replication(data_pb2_grpc.ReplicationServiceServicer):
    async def Replicate(
        self, requests: AsyncIterator[data_pb2.ReplicateRequest], context: Any
    ) -> AsyncIterator[data_pb2.ReplicateResponse]:
        async for request in requests:
            yield _replies(request)


#: The bench's own unary method with Replicate's messages (the pair link's call before it became
#: a stream): ``/{ECHO}/Unary``.
ECHO = "bench.Echo"


async def _unary(request: data_pb2.ReplicateRequest, context: Any) -> data_pb2.ReplicateResponse:
    return _replies(request)


async def serve() -> None:
    server, address = bind_server("127.0.0.1:0")
    data_pb2_grpc.add_DataServiceServicer_to_server(_Data(), server)
    data_pb2_grpc.add_ReplicationServiceServicer_to_server(_Replication(), server)
    echo = grpc.unary_unary_rpc_method_handler(
        _unary,
        request_deserializer=data_pb2.ReplicateRequest.FromString,
        response_serializer=data_pb2.ReplicateResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(ECHO, {"Unary": echo}),))
    await server.start()
    print(ANNOUNCE + address, flush=True)
    await server.wait_for_termination()


@dataclass
class Measured:
    what: str
    calls: int
    seconds: float
    client_cpu_s: float
    server_cpu_s: float

    @property
    def per_s(self) -> float:
        return self.calls / self.seconds

    @property
    def ms_per_call(self) -> float:
        return 1000 * (self.client_cpu_s + self.server_cpu_s) / self.calls


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


async def measure(
    what: str,
    call: Callable[[], Awaitable[object]],
    writers: int,
    seconds: float,
    server: psutil.Process,
) -> Measured:
    me = psutil.Process()
    for _ in range(200):  # warm the channel and both processes up
        await call()
    loop = asyncio.get_running_loop()
    calls = 0

    async def writer(end: float) -> None:
        nonlocal calls
        while loop.time() < end:
            await call()
            calls += 1

    c0, s0, t0 = cpu_seconds(me), cpu_seconds(server), loop.time()
    await asyncio.gather(*(writer(t0 + seconds) for _ in range(writers)))
    elapsed = loop.time() - t0
    return Measured(what, calls, elapsed, cpu_seconds(me) - c0, cpu_seconds(server) - s0)


def fsync_ms(directory: Path, samples: int = 500) -> tuple[float, float]:
    path = directory / "fsync.probe"
    times: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(samples):
            os.write(fd, b"x" * 4096)
            t = time.perf_counter()
            os.fsync(fd)
            times.append(1000 * (time.perf_counter() - t))
    finally:
        os.close(fd)
        path.unlink()
    times.sort()
    return statistics.median(times), times[int(0.99 * (len(times) - 1))]


async def run(args: argparse.Namespace, address: str, server: psutil.Process) -> list[Measured]:
    ch = channel(address, DATA_PROFILE)
    try:
        data: Any = data_pb2_grpc.DataServiceStub(ch)
        replication: Any = data_pb2_grpc.ReplicationServiceStub(ch)
        put = data_pb2.PutRequest(key=b"k" * 12, value=b"v" * args.value_size)
        empty = data_pb2.ReplicateRequest(from_node="n1", to_node="n2")
        batch = data_pb2.ReplicateRequest(
            from_node="n1",
            to_node="n2",
            appends=[
                data_pb2.AppendRequest(
                    partition=common_pb2.PartitionRef(zone="bench", partition=p),
                    lease_epoch=3,
                    primary="n1",
                    prev_index=1000,
                    prev_epoch=3,
                    entries=[
                        data_pb2.LogEntry(
                            index=1001, epoch=3, key=b"k" * 12, value=b"v" * args.value_size
                        )
                    ],
                    commit_index=999,
                )
                for p in (0, 1)
            ],
        )
        unary = ch.unary_unary(
            f"/{ECHO}/Unary",
            request_serializer=data_pb2.ReplicateRequest.SerializeToString,
            response_deserializer=data_pb2.ReplicateResponse.FromString,
        )
        streams = [replication.Replicate() for _ in range(args.writers)]

        async def ping() -> object:
            stream = streams.pop()
            try:
                await stream.write(batch)
                return await stream.read()
            finally:
                streams.append(stream)

        rows: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("Put", lambda: data.Put(put, timeout=10)),
            ("Replicate (empty, unary)", lambda: unary(empty, timeout=10)),
            ("Replicate, 2 appends (unary)", lambda: unary(batch, timeout=10)),
            ("Replicate, 2 appends (stream message)", ping),
        ]
        return [await measure(w, call, args.writers, args.seconds, server) for w, call in rows]
    finally:
        await ch.close()


def report(
    args: argparse.Namespace, results: list[Measured], sync: tuple[float, float], load: str
) -> str:
    cores = os.cpu_count() or 1
    put, rep, unary_batch, stream = results
    only_put = 1000 * cores / put.ms_per_call
    with_appends = 1000 * cores / (put.ms_per_call + 2 * rep.ms_per_call)
    with_messages = 1000 * cores / (put.ms_per_call + 2 * stream.ms_per_call)
    inside = sys.executable.startswith(str(ROOT))
    exe = os.path.relpath(sys.executable, ROOT) if inside else "python"
    command = " ".join(shlex.quote(a) for a in [exe, "bench/grpc_ceiling_bench.py", *sys.argv[1:]])
    rows = [
        f"| {m.what} | {m.per_s:.0f} | {100 * m.client_cpu_s / m.seconds:.0f} | "
        f"{100 * m.server_cpu_s / m.seconds:.0f} | {m.ms_per_call:.3f} |"
        for m in results
    ]
    return "\n".join(
        [
            "# The gRPC ceiling of this machine",
            "",
            "Produced by `bench/grpc_ceiling_bench.py` (do not edit by hand). Two processes on",
            "one machine: a server answering at once (no storage) and a client with",
            f"{args.writers} tasks, one call in flight each, through the product's channel and",
            f"server factories (`placement.rpc`); {args.seconds:.0f} s per row. CPU in % of",
            "one core (user + system); the server's gRPC threads count too.",
            "",
            "| call | calls/s | client CPU % | server CPU % | CPU ms per call (both ends) |",
            "|---|---:|---:|---:|---:|",
            *rows,
            "",
            f"fsync after a 4 KiB write: p50 {sync[0]:.3f} ms, p99 {sync[1]:.3f} ms.",
            "",
            "## What that allows",
            "",
            f"- A write that cost nothing but its Put round trip: at most **{only_put:.0f}"
            f" writes/s** on these {cores} cores.",
            "- A write that also cost one unary `Replicate` call to each of two followers (R=3,"
            " no batching across writes; the pair link before it became a stream), before any"
            f" storage or replication logic: at most **{with_appends:.0f} writes/s**.",
            "- The same with one message each way per follower on the `Replicate` pair stream"
            f" instead of a call: at most **{with_messages:.0f} writes/s** (a two-append batch as"
            " a stream"
            f" message costs ×{stream.ms_per_call / unary_batch.ms_per_call:.2f} of the same"
            " batch as a unary call).",
            "",
            "Compare the CPU per acknowledged write the data plane spends end to end in",
            "`bench/results/data_plane.md` (its quiet window).",
            "",
            "## Run",
            "",
            f"- command: `{command}`",
            f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
            *machine(),
            f"- load (`uptime`) at the end: `{load}`",
            "",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--value-size", type=int, default=256)
    parser.add_argument("--data-dir", type=Path, default=None, help="where to time fsync")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve())
        return 0
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        if not line.startswith(ANNOUNCE):
            raise RuntimeError(f"the server did not start: {line!r}")
        results = asyncio.run(run(args, line.removeprefix(ANNOUNCE), psutil.Process(child.pid)))
    finally:
        child.terminate()
        child.wait(10)
    with tempfile.TemporaryDirectory(dir=args.data_dir) as d:
        sync = fsync_ms(Path(d))
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    text = report(args, results, sync, load)
    args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
