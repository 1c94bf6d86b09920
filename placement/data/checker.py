"""The lost-write checker: holds the data plane to what a recorded workload was promised
(design/data-plane.md; the record: :mod:`placement.data.workload`).

**The rule** (:func:`allowed_states`, pure). For one key, its operations in ``seq`` order (one
writer, one at a time): the key may hold the result of the *last acknowledged* operation, or of
any *later* attempted-but-unacknowledged one — nothing else. With no acknowledged operation it
may also be absent. The result of a put is its value, of a delete "absent". An observation that
is another value this key was once given is **lost** (an acknowledged write was undone); a value
never written to the key is **wrong**.

**Linearizability.** When the run had readers, every key's writes and reads (with their
intervals) must be linearizable (:mod:`placement.data.linearizability`): a read never returns a
value older than one a completed write replaced before the read began, and reads never go back.

**The check** reads the zone through the API (a scan of the run's prefix), then every replica of
every partition's stable set directly (``ReplicationService.ReadReplica``): all replicas of a
partition must be identical and each must satisfy the rule. Replica reads are repeated for up to
``settle`` seconds while they disagree (a learner may still be catching up).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from placement.core.retry import Clock
from placement.data.client import DataClient, ReplicaCopy
from placement.data.linearizability import RegisterOp, check_keys
from placement.data.partitioning import partition_of
from placement.data.workload import Attempt, Record, load_record
from placement.errors import InvalidInput, PlacementError

Judgement = Literal["ok", "lost", "wrong"]
#: Examples kept per kind of violation in a result.
EXAMPLES = 10
#: Concurrent ReadReplica scans while checking.
READ_FANOUT = 16


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
    #: Reads the run recorded; keys whose history is not linearizable; keys the search gave up.
    reads: int = 0
    nonlinearizable: int = 0
    undecided: int = 0

    @property
    def ok(self) -> bool:
        return not (
            self.nonlinearizable
            or self.lost
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
            "reads": self.reads,
            "nonlinearizable": self.nonlinearizable,
            "undecided": self.undecided,
            "examples": list(self.examples),
        }


def register_histories(record: Record) -> dict[str, list[RegisterOp]]:
    """Each key's writes and reads as register operations (an unacknowledged write: completed
    at infinity — it may take effect any time after it was sent, or never)."""
    ops: dict[str, list[RegisterOp]] = {}
    for a in record.attempts:
        if a.invoked is None:
            continue
        done = a.completed if a.acked and a.completed is not None else math.inf
        ops.setdefault(a.key, []).append(RegisterOp(a.invoked, done, True, a.value))
    for r in record.reads:
        ops.setdefault(r.key, []).append(RegisterOp(r.invoked, r.completed, False, r.value))
    return ops


def linearizability(record: Record) -> tuple[int, int, list[str]]:
    """``(nonlinearizable keys, undecided keys, examples)`` of a run with readers (zeros for
    a run without reads or without times)."""
    if not record.reads or not record.timed:
        return 0, 0, []
    verdicts = check_keys(sorted(register_histories(record).items()))
    bad = [v for v in verdicts if v.verdict == "violation"]
    examples = [f"{v.key}: its {v.operations} writes and reads are not linearizable" for v in bad][
        :EXAMPLES
    ]
    return len(bad), sum(1 for v in verdicts if v.verdict == "undecided"), examples


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
    nonlinearizable, undecided, examples = linearizability(record)
    examples += api_verdict.examples
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
        reads=len(record.reads),
        nonlinearizable=nonlinearizable,
        undecided=undecided,
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
