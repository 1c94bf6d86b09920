"""A writer workload that records what it was promised, for the checker that holds the data plane
to it (design/data-plane.md: no acknowledged write is lost; every replica of stable holds every
acknowledged write).

**Writers.** Each of ``writers`` writers owns a disjoint key set ``{run}-w{writer}-k{i}`` and
issues one operation at a time: mostly puts of ``v{seq}`` (``seq`` counts the writer's
operations, so every value is unique per key), sometimes deletes. Every operation leaves two
lines in the JSONL record, each flushed at once so a killed run keeps its record:

    {"t":"run","run":"3fa2c1","zone":"z","key_prefix":"3fa2c1-","writers":8,"keys_per_writer":50}
    {"t":"attempt","w":3,"seq":17,"key":"3fa2c1-w3-k7","op":"put","value":"v17","at":1.204}
    {"t":"ack","w":3,"seq":17,"index":123,"epoch":4,"at":1.231}      # or
    {"t":"fail","w":3,"seq":17,"kind":"DataUnavailable","error":"..."}

An attempt without an ``ack`` (failed, or cut off by a kill) may or may not have happened.

**Readers** (``readers``, none by default) read random keys of the run concurrently and record
each completed read with its interval (``at``: seconds since the run began, on one clock):

    {"t":"read","r":1,"key":"3fa2c1-w0-k3","value":"v12","inv":1.210,"res":1.219}

A read that failed observed nothing and is not recorded. With the intervals, the checker holds
every key's history to linearizability (:mod:`placement.data.linearizability`).

The rule every key must obey and the check: :mod:`placement.data.checker`.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from placement.core.retry import Clock
from placement.data.client import DataClient
from placement.errors import InvalidInput, PlacementError

Op = Literal["put", "delete"]
#: A reader's pause after a failed read (the client has already retried within its deadline).
READ_RETRY = 0.05


# -- the record --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attempt:
    """One operation as recorded: ``value`` is None for a delete."""

    writer: int
    seq: int
    key: str
    op: Op
    value: str | None
    acked: bool = False
    index: int = 0
    epoch: int = 0
    #: Seconds since the run began: sent, acknowledged (None: not recorded / not acknowledged).
    invoked: float | None = None
    completed: float | None = None


@dataclass(frozen=True, slots=True)
class Read:
    """One completed read: ``value`` None = absent."""

    reader: int
    key: str
    value: str | None
    invoked: float
    completed: float


@dataclass(frozen=True, slots=True)
class Record:
    run: str
    zone: str
    key_prefix: str
    attempts: tuple[Attempt, ...]
    reads: tuple[Read, ...] = ()

    @property
    def timed(self) -> bool:
        """Every attempt carries its invocation time (records before readers did not)."""
        return all(a.invoked is not None for a in self.attempts)

    @property
    def acked(self) -> int:
        return sum(1 for a in self.attempts if a.acked)


class Recorder:
    """Appends record lines to an open text file, flushing each (a killed run keeps its record)."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out

    def _line(self, data: Mapping[str, Any]) -> None:
        self._out.write(json.dumps(data, separators=(",", ":")) + "\n")
        self._out.flush()

    def header(self, run: str, zone: str, key_prefix: str, writers: int, keys: int) -> None:
        self._line(
            {
                "t": "run",
                "run": run,
                "zone": zone,
                "key_prefix": key_prefix,
                "writers": writers,
                "keys_per_writer": keys,
                "started_unix": round(time.time(), 3),
            }
        )

    def attempt(
        self, writer: int, seq: int, key: str, op: Op, value: str | None, at: float
    ) -> None:
        self._line(
            {
                "t": "attempt", "w": writer, "seq": seq, "key": key, "op": op, "value": value,
                "at": round(at, 6),
            }
        )  # fmt: skip

    def ack(self, writer: int, seq: int, index: int, epoch: int, at: float) -> None:
        self._line(
            {
                "t": "ack", "w": writer, "seq": seq, "index": index, "epoch": epoch,
                "at": round(at, 6),
            }
        )  # fmt: skip

    def read(self, reader: int, key: str, value: str | None, invoked: float, at: float) -> None:
        self._line(
            {
                "t": "read", "r": reader, "key": key, "value": value,
                "inv": round(invoked, 6), "res": round(at, 6),
            }
        )  # fmt: skip

    def fail(self, writer: int, seq: int, kind: str, error: str) -> None:
        self._line({"t": "fail", "w": writer, "seq": seq, "kind": kind, "error": error})


def _field(data: Mapping[str, Any], name: str, kind: type, line: int) -> Any:
    value = data.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise InvalidInput(
            "--record", f"line {line}: {name!r} missing or not {kind.__name__}", "pass a record"
        )
    return value


def _maybe_time(data: Mapping[str, Any], name: str, line: int) -> float | None:
    """An optional time field (seconds, a JSON number; None when absent)."""
    return None if data.get(name) is None else _time(data, name, line)


def _time(data: Mapping[str, Any], name: str, line: int) -> float:
    """A time field: seconds, a non-negative JSON number."""
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise InvalidInput(
            "--record", f"line {line}: {name!r} missing or not a time in seconds", "pass a record"
        )
    return float(value)


def parse_record(lines: Iterable[str]) -> Record:
    """The record from its JSONL lines. A torn last line (a killed writer) is ignored; anything
    else malformed raises InvalidInput naming the line."""
    header: Mapping[str, Any] | None = None
    attempts: dict[tuple[int, int], Attempt] = {}
    reads: list[Read] = []
    owner: dict[str, int] = {}
    rows = list(lines)
    for n, text in enumerate(rows, 1):
        if not text.strip():
            continue
        try:
            data = json.loads(text)
        except ValueError as e:
            if n == len(rows):
                break
            raise InvalidInput("--record", f"line {n} is not JSON", "pass a workload record") from e
        if not isinstance(data, dict):
            raise InvalidInput("--record", f"line {n} is not an object", "pass a workload record")
        kind = data.get("t")
        if kind == "run":
            if header is not None:
                raise InvalidInput("--record", f"line {n}: a second run header", "one run a file")
            header = data
            continue
        if header is None:
            raise InvalidInput("--record", f"line {n} comes before the run header", "")
        if kind == "read":
            value = data.get("value")
            if value is not None and not isinstance(value, str):
                raise InvalidInput("--record", f"line {n}: 'value' is not a string or null", "")
            reads.append(Read(_field(data, "r", int, n), _field(data, "key", str, n), value,
                              _time(data, "inv", n), _time(data, "res", n)))  # fmt: skip
            continue
        ident = (_field(data, "w", int, n), _field(data, "seq", int, n))
        if kind == "attempt":
            op = data.get("op")
            if op not in ("put", "delete"):
                raise InvalidInput("--record", f"line {n}: op {op!r} is not put/delete", "")
            key = _field(data, "key", str, n)
            value = _field(data, "value", str, n) if op == "put" else None
            if owner.setdefault(key, ident[0]) != ident[0]:
                raise InvalidInput("--record", f"line {n}: key {key!r} has two writers", "")
            attempts[ident] = Attempt(
                ident[0], ident[1], key, op, value, invoked=_maybe_time(data, "at", n)
            )
        elif kind in ("ack", "fail"):
            found = attempts.get(ident)
            if found is None:
                raise InvalidInput("--record", f"line {n}: {kind} of an unknown attempt", "")
            if kind == "ack":
                attempts[ident] = Attempt(
                    found.writer,
                    found.seq,
                    found.key,
                    found.op,
                    found.value,
                    True,
                    _field(data, "index", int, n),
                    _field(data, "epoch", int, n),
                    found.invoked,
                    _maybe_time(data, "at", n),
                )
        else:
            raise InvalidInput("--record", f"line {n}: unknown line type {kind!r}", "")
    if header is None:
        raise InvalidInput("--record", "no run header", "pass a file `workload run` wrote")
    return Record(
        _field(header, "run", str, 1),
        _field(header, "zone", str, 1),
        _field(header, "key_prefix", str, 1),
        tuple(sorted(attempts.values(), key=lambda a: (a.writer, a.seq))),
        tuple(reads),
    )


def load_record(path: Path) -> Record:
    try:
        with path.open(encoding="utf-8") as f:
            return parse_record(f)
    except OSError as e:
        raise InvalidInput("--record", f"cannot read {path}: {e.strerror}", "pass a record") from e


# -- the writers -------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class WorkloadStats:
    """What a run did: ``latencies`` are seconds per acknowledged write."""

    run: str
    key_prefix: str
    attempted: int = 0
    acked: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    elapsed: float = 0.0
    reads: int = 0
    read_failures: int = 0

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 99)

    @property
    def throughput(self) -> float:
        return self.acked / self.elapsed if self.elapsed > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "key_prefix": self.key_prefix,
            "attempted": self.attempted,
            "acked": self.acked,
            "failures": dict(sorted(self.failures.items())),
            "elapsed_s": round(self.elapsed, 3),
            "acked_per_s": round(self.throughput, 1),
            "p50_ms": round(self.p50 * 1000, 2),
            "p99_ms": round(self.p99 * 1000, 2),
            "reads": self.reads,
            "read_failures": self.read_failures,
        }


def writer_key(key_prefix: str, writer: int, i: int) -> str:
    return f"{key_prefix}w{writer}-k{i}"


async def run_writers(
    client: DataClient,
    zone: str,
    writers: int,
    keys_per_writer: int,
    duration: float,
    record_path: Path,
    stop_event: asyncio.Event | None = None,
    *,
    delete_ratio: float = 0.1,
    max_ops_per_writer: int | None = None,
    readers: int = 0,
    run_id: str | None = None,
    seed: int | None = None,
    clock: Clock = time.monotonic,
    progress: Callable[[WorkloadStats, float], None] | None = None,
) -> WorkloadStats:
    """Run ``writers`` sequential writers for ``duration`` seconds (or until ``stop_event`` is
    set, or each did ``max_ops_per_writer`` operations), recording every attempt and outcome to
    ``record_path`` (overwritten), while ``readers`` readers read random keys of the run until
    the writers are done. An operation in flight when time is up is let finish.
    ``progress(stats, elapsed)`` is called after every operation with the live counts."""
    if writers < 1:
        raise InvalidInput("--writers", f"{writers} is not positive", "e.g. 8")
    if keys_per_writer < 1:
        raise InvalidInput("--keys-per-writer", f"{keys_per_writer} is not positive", "e.g. 50")
    if not duration > 0:
        raise InvalidInput("--duration", f"{duration} is not positive", "seconds, e.g. 30")
    if not 0.0 <= delete_ratio <= 1.0:
        raise InvalidInput("--delete-ratio", f"{delete_ratio} is not in 0..1", "e.g. 0.1")
    if readers < 0:
        raise InvalidInput("--readers", f"{readers} is negative", "e.g. 2, or 0 for none")
    run = run_id or secrets.token_hex(3)
    key_prefix = f"{run}-"
    stop = stop_event or asyncio.Event()
    stats = WorkloadStats(run, key_prefix)
    base_seed = seed if seed is not None else random.randrange(1 << 30)
    start = clock()
    end = start + duration
    try:
        out = record_path.open("w", encoding="utf-8")
    except OSError as e:
        raise InvalidInput("--record", f"cannot write {record_path}: {e.strerror}", "") from e
    with out:
        recorder = Recorder(out)
        recorder.header(run, zone, key_prefix, writers, keys_per_writer)

        async def writer(w: int) -> None:
            rng = random.Random(base_seed + w)
            seq = 0
            while not stop.is_set() and clock() < end:
                if max_ops_per_writer is not None and seq >= max_ops_per_writer:
                    return
                seq += 1
                key = writer_key(key_prefix, w, rng.randrange(keys_per_writer))
                op: Op = "delete" if rng.random() < delete_ratio else "put"
                value = f"v{seq}" if op == "put" else None
                recorder.attempt(w, seq, key, op, value, clock() - start)
                stats.attempted += 1
                began = clock()
                try:
                    if value is not None:
                        result = await client.put(zone, key.encode(), value.encode())
                    else:
                        result = await client.delete_with_result(zone, key.encode())
                except PlacementError as e:
                    kind = type(e).__name__
                    stats.failures[kind] = stats.failures.get(kind, 0) + 1
                    recorder.fail(w, seq, kind, str(e))
                else:
                    done = clock()
                    stats.latencies.append(done - began)
                    stats.acked += 1
                    recorder.ack(w, seq, result.index, result.lease_epoch, done - start)
                if progress is not None:
                    progress(stats, clock() - start)

        writing = asyncio.Event()  # set once every writer is done: the readers stop

        async def reader(r: int) -> None:
            rng = random.Random(base_seed + writers + r)
            while not writing.is_set():
                key = writer_key(key_prefix, rng.randrange(writers), rng.randrange(keys_per_writer))
                began = clock() - start
                try:
                    got = await client.get(zone, key.encode())
                except PlacementError:
                    stats.read_failures += 1
                    await asyncio.sleep(READ_RETRY)
                    continue
                text = None if got is None else got.decode("utf-8", "backslashreplace")
                recorder.read(r, key, text, began, clock() - start)
                stats.reads += 1

        async def writers_then_stop() -> None:
            try:
                async with asyncio.TaskGroup() as writing_group:
                    for w in range(writers):
                        writing_group.create_task(writer(w))
            finally:
                writing.set()

        async with asyncio.TaskGroup() as group:
            group.create_task(writers_then_stop())
            for r in range(readers):
                group.create_task(reader(r))
    stats.elapsed = clock() - start
    return stats
