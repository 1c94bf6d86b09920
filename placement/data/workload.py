"""A writer workload that records what it was promised, and a checker that holds the data plane
to it (design/data-plane.md: no acknowledged write is lost; every replica of stable holds every
acknowledged write).

**Writers.** Each of ``writers`` writers owns a disjoint key set ``{run}-w{writer}-k{i}`` and
issues one operation at a time: mostly puts of ``v{seq}`` (``seq`` counts the writer's
operations, so every value is unique per key), sometimes deletes. Every operation leaves two
lines in the JSONL record, each flushed at once so a killed run keeps its record:

    {"t":"run","run":"3fa2c1","zone":"z","key_prefix":"3fa2c1-","writers":8,"keys_per_writer":50}
    {"t":"attempt","w":3,"seq":17,"key":"3fa2c1-w3-k7","op":"put","value":"v17"}
    {"t":"ack","w":3,"seq":17,"index":123,"epoch":4}      # or
    {"t":"fail","w":3,"seq":17,"kind":"DataUnavailable","error":"..."}

An attempt without an ``ack`` (failed, or cut off by a kill) may or may not have happened.

**The rule** (:func:`allowed_states`, pure). For one key, its operations in ``seq`` order (one
writer, one at a time): the key may hold the result of the *last acknowledged* operation, or of
any *later* attempted-but-unacknowledged one — nothing else. With no acknowledged operation it
may also be absent. The result of a put is its value, of a delete "absent". An observation that
is another value this key was once given is **lost** (an acknowledged write was undone); a value
never written to the key is **wrong**.

**The check** reads the zone through the API (a scan of the run's prefix), then every replica of
every partition's stable set directly (``ReplicationService.ReadReplica``): all replicas of a
partition must be identical and each must satisfy the rule. Replica reads are repeated for up to
``settle`` seconds while they disagree (a learner may still be catching up).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from placement.core.retry import Clock
from placement.data.client import DataClient, ReplicaCopy
from placement.data.partitioning import partition_of
from placement.errors import InvalidInput, PlacementError

Op = Literal["put", "delete"]
Judgement = Literal["ok", "lost", "wrong"]
#: Examples kept per kind of violation in a result.
EXAMPLES = 10
#: Concurrent ReadReplica scans while checking.
READ_FANOUT = 16


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


@dataclass(frozen=True, slots=True)
class Record:
    run: str
    zone: str
    key_prefix: str
    attempts: tuple[Attempt, ...]

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

    def attempt(self, writer: int, seq: int, key: str, op: Op, value: str | None) -> None:
        self._line({"t": "attempt", "w": writer, "seq": seq, "key": key, "op": op, "value": value})

    def ack(self, writer: int, seq: int, index: int, epoch: int) -> None:
        self._line({"t": "ack", "w": writer, "seq": seq, "index": index, "epoch": epoch})

    def fail(self, writer: int, seq: int, kind: str, error: str) -> None:
        self._line({"t": "fail", "w": writer, "seq": seq, "kind": kind, "error": error})


def _field(data: Mapping[str, Any], name: str, kind: type, line: int) -> Any:
    value = data.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise InvalidInput(
            "--record", f"line {line}: {name!r} missing or not {kind.__name__}", "pass a record"
        )
    return value


def parse_record(lines: Iterable[str]) -> Record:
    """The record from its JSONL lines. A torn last line (a killed writer) is ignored; anything
    else malformed raises InvalidInput naming the line."""
    header: Mapping[str, Any] | None = None
    attempts: dict[tuple[int, int], Attempt] = {}
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
        ident = (_field(data, "w", int, n), _field(data, "seq", int, n))
        if kind == "attempt":
            op = data.get("op")
            if op not in ("put", "delete"):
                raise InvalidInput("--record", f"line {n}: op {op!r} is not put/delete", "")
            key = _field(data, "key", str, n)
            value = _field(data, "value", str, n) if op == "put" else None
            if owner.setdefault(key, ident[0]) != ident[0]:
                raise InvalidInput("--record", f"line {n}: key {key!r} has two writers", "")
            attempts[ident] = Attempt(ident[0], ident[1], key, op, value)
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
    )


def load_record(path: Path) -> Record:
    try:
        with path.open(encoding="utf-8") as f:
            return parse_record(f)
    except OSError as e:
        raise InvalidInput("--record", f"cannot read {path}: {e.strerror}", "pass a record") from e


# -- the rule (pure) ---------------------------------------------------------------------------


def histories(attempts: Iterable[Attempt]) -> dict[str, list[Attempt]]:
    """Each key's attempts in issue order."""
    by_key: dict[str, list[Attempt]] = {}
    for a in sorted(attempts, key=lambda a: (a.writer, a.seq)):
        by_key.setdefault(a.key, []).append(a)
    return by_key


def allowed_states(history: Sequence[Attempt]) -> frozenset[str | None]:
    """What the key may hold (None = absent): the last acknowledged result or a later attempt's;
    with nothing acknowledged also the initial absence."""
    last_ack = max((i for i, a in enumerate(history) if a.acked), default=-1)
    allowed: set[str | None] = {history[last_ack].value} if last_ack >= 0 else {None}
    allowed.update(a.value for a in history[last_ack + 1 :])
    return frozenset(allowed)


def judge(history: Sequence[Attempt], observed: str | None) -> Judgement:
    if observed in allowed_states(history):
        return "ok"
    if observed is None or any(a.value == observed for a in history):
        return "lost"
    return "wrong"


def expected_text(history: Sequence[Attempt]) -> str:
    return " or ".join(sorted(_show(v) for v in allowed_states(history)))


def _show(value: str | None) -> str:
    return "<absent>" if value is None else value


@dataclass(frozen=True, slots=True)
class KeysVerdict:
    """Keys judged against one observation (the API, or one replica)."""

    checked: int
    lost: tuple[str, ...]
    wrong: tuple[str, ...]
    examples: tuple[str, ...]


def judge_keys(
    by_key: Mapping[str, Sequence[Attempt]],
    observed: Mapping[str, str],
    *,
    where: str,
    key_prefix: str,
) -> KeysVerdict:
    """Every key of ``by_key`` against ``observed`` (absent = not in it); an observed key under
    ``key_prefix`` that this run never wrote is wrong."""
    lost: list[str] = []
    wrong: list[str] = []
    examples: list[str] = []
    for key, history in sorted(by_key.items()):
        seen = observed.get(key)
        verdict = judge(history, seen)
        if verdict != "ok":
            (lost if verdict == "lost" else wrong).append(key)
            if len(examples) < EXAMPLES:
                examples.append(
                    f"{where}: {key} = {_show(seen)}, expected {expected_text(history)} ({verdict})"
                )
    for key in sorted(set(observed) - set(by_key)):
        if key.startswith(key_prefix):
            wrong.append(key)
            if len(examples) < EXAMPLES:
                examples.append(f"{where}: {key} = {observed[key]} was never written (wrong)")
    return KeysVerdict(len(by_key), tuple(lost), tuple(wrong), tuple(examples))


@dataclass(frozen=True, slots=True)
class Unreachable:
    """A stable member whose copy could not be read (no address, down, not serving)."""

    node: str
    reason: str


ReplicaRead = ReplicaCopy | Unreachable


def divergent_replicas(copies: Sequence[ReplicaCopy]) -> list[tuple[str, str]]:
    """``(node, why)`` for every copy that differs from the partition's most common content
    (ties go to the earliest in stable order, i.e. the preferred primary) or hosts nothing."""
    hosted = [c for c in copies if c.hosted]
    missing = [(c.node, "hosts no copy") for c in copies if not c.hosted]
    if not hosted:
        return missing
    contents = [frozenset(c.items.items()) for c in hosted]
    counts = Counter(contents)
    best = max(counts.values())
    reference = next(i for i, c in enumerate(contents) if counts[c] == best)
    ref = hosted[reference]
    found = list(missing)
    for c, content in zip(hosted, contents, strict=True):
        if content == contents[reference]:
            continue
        keys = {k for k in set(c.items) | set(ref.items) if c.items.get(k) != ref.items.get(k)}
        sample = min(keys)
        found.append(
            (
                c.node,
                f"{len(keys)} key(s) differ from {ref.node}, e.g. {_text(sample)}: "
                f"{_show(_opt_text(c.items.get(sample)))} vs "
                f"{_show(_opt_text(ref.items.get(sample)))} "
                f"(last/commit index {c.last_index}/{c.commit_index} vs "
                f"{ref.last_index}/{ref.commit_index})",
            )
        )
    return found


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


def _opt_text(raw: bytes | None) -> str | None:
    return None if raw is None else _text(raw)


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The checker's verdict. ``ok`` when nothing is lost, wrong, divergent or unreadable."""

    zone: str
    run: str
    attempted_writes: int
    acked_writes: int
    keys: int
    lost: int
    wrong: int
    replica_lost: int
    replica_wrong: int
    divergent_replicas: int
    unreachable_replicas: int
    partitions_checked: int
    replicas_checked: int
    examples: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.wrong
            or self.replica_lost
            or self.replica_wrong
            or self.divergent_replicas
            or self.unreachable_replicas
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "zone": self.zone,
            "run": self.run,
            "attempted_writes": self.attempted_writes,
            "acked_writes": self.acked_writes,
            "keys": self.keys,
            "lost": self.lost,
            "wrong": self.wrong,
            "replica_lost": self.replica_lost,
            "replica_wrong": self.replica_wrong,
            "divergent_replicas": self.divergent_replicas,
            "unreachable_replicas": self.unreachable_replicas,
            "partitions_checked": self.partitions_checked,
            "replicas_checked": self.replicas_checked,
            "examples": list(self.examples),
        }


def evaluate(
    record: Record,
    api: Mapping[str, str],
    partitions: int,
    replicas: Mapping[int, Sequence[ReplicaRead]],
) -> CheckResult:
    """The whole verdict from what was read (pure): ``api`` = the run's keys as the API returned
    them; ``replicas[p]`` = each stable member's copy of partition ``p``."""
    by_key = histories(record.attempts)
    api_verdict = judge_keys(by_key, api, where="api", key_prefix=record.key_prefix)
    examples = list(api_verdict.examples)
    keys_of: dict[int, dict[str, Sequence[Attempt]]] = {}
    for key, history in by_key.items():
        keys_of.setdefault(partition_of(key.encode(), partitions), {})[key] = history
    replica_lost = replica_wrong = divergent = unreachable = checked = 0
    for p in range(partitions):
        reads = replicas.get(p, ())
        copies = [r for r in reads if isinstance(r, ReplicaCopy)]
        for r in reads:
            if isinstance(r, Unreachable):
                unreachable += 1
                examples.append(f"{record.zone}/{p} {r.node}: unreadable ({r.reason})")
        checked += len(copies)
        for node, why in divergent_replicas(copies):
            divergent += 1
            examples.append(f"{record.zone}/{p} {node}: divergent: {why}")
        for copy in copies:
            if not copy.hosted:
                continue
            texts = {_text(k): _text(v) for k, v in copy.items.items()}
            verdict = judge_keys(
                keys_of.get(p, {}),
                texts,
                where=f"{record.zone}/{p} {copy.node}",
                key_prefix=record.key_prefix,
            )
            replica_lost += len(verdict.lost)
            replica_wrong += len(verdict.wrong)
            examples.extend(verdict.examples)
    return CheckResult(
        zone=record.zone,
        run=record.run,
        attempted_writes=len(record.attempts),
        acked_writes=record.acked,
        keys=len(by_key),
        lost=len(api_verdict.lost),
        wrong=len(api_verdict.wrong),
        replica_lost=replica_lost,
        replica_wrong=replica_wrong,
        divergent_replicas=divergent,
        unreachable_replicas=unreachable,
        partitions_checked=partitions,
        replicas_checked=checked,
        examples=tuple(examples[: EXAMPLES * 3]),
    )


# -- the checker (I/O) -------------------------------------------------------------------------


async def read_stable_replicas(client: DataClient, zone: str) -> tuple[int, dict[int, list[Any]]]:
    """``(P, {p: [ReplicaCopy | Unreachable per stable member]})`` from fresh routes."""
    routes = await client.routes(zone, refresh=True)
    semaphore = asyncio.Semaphore(READ_FANOUT)

    async def read(p: int, node: str) -> ReplicaRead:
        address = routes.addresses.get(node)
        if address is None:
            return Unreachable(node, "not registered (no address)")
        async with semaphore:
            try:
                return await client.read_replica(zone, p, node, address)
            except PlacementError as e:
                return Unreachable(node, str(e))

    jobs = [(p, node) for p in range(routes.partitions) for node in routes.route(p).stable]
    results = await asyncio.gather(*(read(p, node) for p, node in jobs))
    found: dict[int, list[Any]] = {p: [] for p in range(routes.partitions)}
    for (p, _), result in zip(jobs, results, strict=True):
        found[p].append(result)
    return routes.partitions, found


async def check_workload(
    client: DataClient,
    zone: str,
    record_path: Path,
    *,
    settle: float = 10.0,
    clock: Clock = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> CheckResult:
    """Read the zone through the API and every stable replica directly; judge them (see the
    module docstring). Replica reads repeat for up to ``settle`` seconds while not all agree."""
    record = load_record(record_path)
    if record.zone != zone:
        raise InvalidInput("--zone", f"the record is of zone {record.zone!r}", "pass that zone")
    api: dict[str, str] = {}
    async for key, value in client.scan(zone, prefix=record.key_prefix.encode()):
        api[_text(key)] = _text(value)
    give_up = clock() + settle
    while True:
        partitions, replicas = await read_stable_replicas(client, zone)
        result = evaluate(record, api, partitions, replicas)
        replicas_fine = not (
            result.divergent_replicas
            or result.unreachable_replicas
            or result.replica_lost
            or result.replica_wrong
        )
        if replicas_fine or clock() >= give_up:
            return result
        await sleep(0.5)


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
    run_id: str | None = None,
    seed: int | None = None,
    clock: Clock = time.monotonic,
) -> WorkloadStats:
    """Run ``writers`` sequential writers for ``duration`` seconds (or until ``stop_event`` is
    set, or each did ``max_ops_per_writer`` operations), recording every attempt and outcome to
    ``record_path`` (overwritten). An operation in flight when time is up is let finish."""
    if writers < 1:
        raise InvalidInput("--writers", f"{writers} is not positive", "e.g. 8")
    if keys_per_writer < 1:
        raise InvalidInput("--keys-per-writer", f"{keys_per_writer} is not positive", "e.g. 50")
    if not duration > 0:
        raise InvalidInput("--duration", f"{duration} is not positive", "seconds, e.g. 30")
    if not 0.0 <= delete_ratio <= 1.0:
        raise InvalidInput("--delete-ratio", f"{delete_ratio} is not in 0..1", "e.g. 0.1")
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
                recorder.attempt(w, seq, key, op, value)
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
                    continue
                stats.latencies.append(clock() - began)
                stats.acked += 1
                recorder.ack(w, seq, result.index, result.lease_epoch)

        async with asyncio.TaskGroup() as group:
            for w in range(writers):
                group.create_task(writer(w))
    stats.elapsed = clock() - start
    return stats
