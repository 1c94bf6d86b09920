"""The workload's record and verdict: generated histories against the rule (hypothesis), replica
comparison, and the writers plus checker against an in-memory fake of the data client."""

from __future__ import annotations

import asyncio
import io
import json
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.data.checker import (
    Unreachable,
    allowed_states,
    check_workload,
    divergent_replicas,
    evaluate,
    judge,
    judge_keys,
)
from placement.data.client import (
    DataUnavailable,
    ReplicaCopy,
    WriteResult,
    ZoneRoutes,
    build_routes,
)
from placement.data.partitioning import partition_of
from placement.data.workload import (
    Attempt,
    Record,
    Recorder,
    parse_record,
    percentile,
    run_writers,
)
from placement.errors import InvalidInput

# -- generated histories -----------------------------------------------------------------------

#: One op: (is_delete, acked, applied_if_unacked)
ops = st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), min_size=1, max_size=12)


def history_of(spec: list[tuple[bool, bool, bool]], key: str = "k") -> list[Attempt]:
    return [
        Attempt(0, seq, key, "delete" if d else "put", None if d else f"v{seq}", acked)
        for seq, (d, acked, _) in enumerate(spec, 1)
    ]


def simulate(spec: list[tuple[bool, bool, bool]]) -> str | None:
    """A legal outcome: acknowledged ops happened; each unacknowledged one maybe."""
    state: str | None = None
    for seq, (d, acked, applied) in enumerate(spec, 1):
        if acked or applied:
            state = None if d else f"v{seq}"
    return state


@given(ops)
def test_every_legal_outcome_is_ok(spec: list[tuple[bool, bool, bool]]) -> None:
    assert judge(history_of(spec), simulate(spec)) == "ok"


@given(ops)
def test_losing_the_last_acknowledged_write_is_lost(spec: list[tuple[bool, bool, bool]]) -> None:
    history = history_of(spec)
    acked = [i for i, a in enumerate(history) if a.acked]
    if not acked:
        return
    allowed = allowed_states(history)
    # any earlier state (an earlier op's result, or the initial absence) that the rule excludes
    earlier = [None, *(a.value for a in history[: acked[-1]])]
    for state in earlier:
        if state not in allowed:
            assert judge(history, state) == "lost"


@given(ops, st.text(min_size=1, max_size=5))
def test_a_value_never_written_is_wrong(spec: list[tuple[bool, bool, bool]], junk: str) -> None:
    value = f"x{junk}"  # the workload writes only v{seq}
    assert judge(history_of(spec), value) == "wrong"


def test_the_rule_on_hand_written_histories() -> None:
    put1 = Attempt(0, 1, "k", "put", "v1", acked=True)
    put2 = Attempt(0, 2, "k", "put", "v2")
    delete3 = Attempt(0, 3, "k", "delete", None, acked=True)
    put4 = Attempt(0, 4, "k", "put", "v4")
    assert allowed_states([put1, put2]) == {"v1", "v2"}
    assert allowed_states([put1, put2, delete3]) == {None}
    assert allowed_states([put1, put2, delete3, put4]) == {None, "v4"}
    assert allowed_states([put2]) == {None, "v2"}
    assert judge([put1, put2, delete3], "v2") == "lost"
    assert judge([put1, put2, delete3], "v1") == "lost"
    assert judge([put1], None) == "lost"


@settings(max_examples=100)
@given(st.lists(ops, min_size=1, max_size=6), st.data())
def test_evaluate_counts_each_violation(
    specs: list[list[tuple[bool, bool, bool]]], data: st.DataObject
) -> None:
    # one writer per key, as the workload does
    record = Record(
        "r",
        "z",
        "r-",
        tuple(
            Attempt(i, a.seq, a.key, a.op, a.value, a.acked)
            for i, spec in enumerate(specs)
            for a in history_of(spec, f"r-w{i}-k0")
        ),
    )
    observed = {
        f"r-w{i}-k0": v for i, spec in enumerate(specs) if (v := simulate(spec)) is not None
    }
    result = evaluate(record, observed, 1, {})
    assert result.ok
    assert result.keys == len(specs)
    assert result.acked_writes == sum(acked for spec in specs for _, acked, _ in spec)
    # a value nobody wrote, then a key of the run nobody wrote
    victim = data.draw(st.integers(0, len(specs) - 1))
    key = f"r-w{victim}-k0"
    broken = dict(observed)
    broken[key] = "garbage"
    assert evaluate(record, broken, 1, {}).wrong == 1
    broken[f"r-w{victim}-k99"] = "v1"  # a key of the run nobody wrote
    assert evaluate(record, broken, 1, {}).wrong == 2


# -- the record --------------------------------------------------------------------------------


def write_record(events: list[tuple[str, int, int, str, str | None]]) -> str:
    out = io.StringIO()
    rec = Recorder(out)
    rec.header("r", "z", "r-", 2, 3)
    for kind, w, seq, key, value in events:
        if kind == "attempt":
            rec.attempt(w, seq, key, "put" if value is not None else "delete", value, seq)
        elif kind == "ack":
            rec.ack(w, seq, 10 + seq, 2, seq + 0.5)
        else:
            rec.fail(w, seq, "DataUnavailable", "no primary")
    return out.getvalue()


def test_record_round_trip_and_a_torn_last_line() -> None:
    text = write_record(
        [
            ("attempt", 0, 1, "r-w0-k0", "v1"),
            ("ack", 0, 1, "", None),
            ("attempt", 1, 1, "r-w1-k0", None),
            ("fail", 1, 1, "", None),
            ("attempt", 0, 2, "r-w0-k0", "v2"),
        ]
    )
    record = parse_record((text + '{"t":"ack","w":0,').splitlines(keepends=True))
    assert (record.run, record.zone, record.key_prefix) == ("r", "z", "r-")
    assert [(a.writer, a.seq, a.op, a.value, a.acked) for a in record.attempts] == [
        (0, 1, "put", "v1", True),
        (0, 2, "put", "v2", False),
        (1, 1, "delete", None, False),
    ]
    assert record.attempts[0].index == 11
    assert record.acked == 1


@pytest.mark.parametrize(
    ("lines", "words"),
    [
        (['{"t":"attempt","w":0,"seq":1,"key":"k","op":"put","value":"v1"}'], "header"),
        (['{"t":"run","run":"r","zone":"z","key_prefix":"r-"}', "not json", "{}"], "line 2"),
        (
            ['{"t":"run","run":"r","zone":"z","key_prefix":"r-"}', '{"t":"ack","w":0,"seq":1}'],
            "unknown attempt",
        ),
        ([], "no run header"),
    ],
)
def test_bad_records_name_the_line(lines: list[str], words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        parse_record(lines)


# -- replicas ----------------------------------------------------------------------------------


def copy(node: str, items: dict[bytes, bytes], hosted: bool = True) -> ReplicaCopy:
    return ReplicaCopy(node, hosted, items)


def test_divergent_replicas_against_the_majority() -> None:
    same = {b"a": b"1", b"b": b"2"}
    assert divergent_replicas([copy("n1", same), copy("n2", dict(same))]) == []
    found = divergent_replicas([copy("n1", {b"a": b"1"}), copy("n2", same), copy("n3", same)])
    assert [n for n, _ in found] == ["n1"]
    assert "b" in found[0][1]
    assert "from n2" in found[0][1]
    assert [n for n, _ in divergent_replicas([copy("n1", same), copy("n2", {}, False)])] == ["n2"]
    assert divergent_replicas([]) == []


def test_evaluate_checks_each_replica_against_the_rule() -> None:
    key = "r-w0-k0"
    record = Record("r", "z", "r-", (Attempt(0, 1, key, "put", "v1", True),))
    partitions = 3
    p = partition_of(key.encode(), partitions)
    good = {key.encode(): b"v1", b"foreign": b"x"}
    replicas: dict[int, list[ReplicaCopy | Unreachable]] = {
        p: [copy("n1", good), copy("n2", dict(good)), copy("n3", dict(good))]
    }
    ok = evaluate(record, {key: "v1"}, partitions, replicas)
    assert ok.ok
    assert (ok.replicas_checked, ok.partitions_checked) == (3, 3)

    replicas[p][2] = copy("n3", {b"foreign": b"x"})
    bad = evaluate(record, {key: "v1"}, partitions, replicas)
    assert not bad.ok
    assert (bad.replica_lost, bad.divergent_replicas, bad.lost) == (1, 1, 0)
    assert any("n3" in e and "lost" in e for e in bad.examples)

    replicas[p][2] = Unreachable("n3", "UNAVAILABLE")
    assert evaluate(record, {key: "v1"}, partitions, replicas).unreachable_replicas == 1
    assert evaluate(record, {}, partitions, {}).lost == 1


def test_judge_keys_ignores_foreign_keys() -> None:
    verdict = judge_keys({}, {"other": "x", "r-w9-k9": "v1"}, where="api", key_prefix="r-")
    assert verdict.wrong == ("r-w9-k9",)


def test_percentile() -> None:
    assert percentile([], 50) == 0.0
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([3.0], 99) == 3.0


# -- writers and checker against a fake client -------------------------------------------------


@dataclass
class FakeData:
    """An in-memory zone of ``partitions`` partitions on 3 identical replicas; every
    ``fail_every``-th write fails, applied or not at random (an unknown outcome)."""

    partitions: int = 4
    fail_every: int = 5
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    kv: dict[bytes, bytes] = field(default_factory=dict)
    writes: int = 0
    #: Reads answer the first value a key ever held (a replica that stopped applying writes).
    stale_reads: bool = False
    first: dict[bytes, bytes] = field(default_factory=dict)

    def _maybe_fail(self, apply: Callable[[], object]) -> None:
        self.writes += 1
        if self.writes % self.fail_every == 0:
            if self.rng.random() < 0.5:
                apply()
            raise DataUnavailable("put", "z", 0, "n1@h:1: UNAVAILABLE", 15.0)

    async def put(self, zone: str, key: bytes, value: bytes) -> WriteResult:
        await asyncio.sleep(0)
        self.first.setdefault(key, value)
        self._maybe_fail(lambda: self.kv.__setitem__(key, value))
        self.kv[key] = value
        return WriteResult(self.writes, 1)

    async def get(self, zone: str, key: bytes) -> bytes | None:
        await asyncio.sleep(0)
        return self.first.get(key) if self.stale_reads else self.kv.get(key)

    async def delete_with_result(self, zone: str, key: bytes) -> WriteResult:
        await asyncio.sleep(0)
        self._maybe_fail(lambda: self.kv.pop(key, None))
        existed = self.kv.pop(key, None) is not None
        return WriteResult(self.writes, 1, existed)

    async def scan(self, zone: str, prefix: bytes = b"") -> AsyncIterator[tuple[bytes, bytes]]:
        for k in sorted(self.kv):
            if k.startswith(prefix):
                yield k, self.kv[k]

    async def routes(self, zone: str, *, refresh: bool = False) -> ZoneRoutes:
        nodes = [("n1", "h:1"), ("n2", "h:2"), ("n3", "h:3")]
        rows = [(p, "n1", ["n1", "n2", "n3"]) for p in range(self.partitions)]
        return build_routes(zone, self.partitions, rows, nodes)

    async def read_replica(self, zone: str, partition: int, node: str, address: str) -> ReplicaCopy:
        items = {k: v for k, v in self.kv.items() if partition_of(k, self.partitions) == partition}
        return ReplicaCopy(node, True, items)


async def test_writers_record_everything_and_the_checker_passes(tmp_path: Path) -> None:
    fake = FakeData()
    record = tmp_path / "run.jsonl"
    stats = await run_writers(
        fake,  # type: ignore[arg-type]
        "z",
        3,
        4,
        60.0,
        record,
        max_ops_per_writer=40,
        delete_ratio=0.2,
        readers=2,
        seed=1,
        run_id="t1",
    )
    assert stats.attempted == 120
    assert stats.reads > 0
    assert stats.acked + sum(stats.failures.values()) == 120
    assert stats.failures["DataUnavailable"] == 24
    assert len(stats.latencies) == stats.acked
    assert stats.p50 <= stats.p99
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert lines[0]["t"] == "run"
    assert sum(1 for x in lines if x["t"] == "attempt") == 120
    assert all(x["key"].startswith("t1-w") for x in lines if x["t"] == "attempt")

    result = await check_workload(fake, "z", record, settle=0)  # type: ignore[arg-type]
    assert result.ok, result.examples
    assert result.reads == stats.reads
    assert result.nonlinearizable == 0
    assert result.acked_writes == stats.acked
    assert result.replicas_checked == 3 * fake.partitions

    # lose an acknowledged write everywhere: the checker says so and names the key
    acked_puts = {(x["w"], x["seq"]) for x in lines if x["t"] == "ack"}
    last_put = next(
        x
        for x in reversed(lines)
        if x["t"] == "attempt" and x["op"] == "put" and (x["w"], x["seq"]) in acked_puts
    )
    assert fake.kv.get(last_put["key"].encode()) == last_put["value"].encode()
    del fake.kv[last_put["key"].encode()]
    broken = await check_workload(fake, "z", record, settle=0)  # type: ignore[arg-type]
    assert not broken.ok
    assert broken.lost == 1
    assert broken.replica_lost == 3
    assert any(last_put["key"] in e for e in broken.examples)


async def test_reads_of_a_replica_that_stopped_applying_are_not_linearizable(
    tmp_path: Path,
) -> None:
    fake = FakeData(fail_every=1000, stale_reads=True)
    record = tmp_path / "stale.jsonl"
    stats = await run_writers(
        fake,  # type: ignore[arg-type]
        "z",
        2,
        2,
        60.0,
        record,
        max_ops_per_writer=30,
        delete_ratio=0.0,
        readers=2,
        seed=3,
    )
    assert stats.reads > 0
    result = await check_workload(fake, "z", record, settle=0)  # type: ignore[arg-type]
    assert not result.ok
    assert result.nonlinearizable > 0
    assert result.lost == 0  # the data is all there: only the reads were stale
    assert any("not linearizable" in e for e in result.examples)


async def test_the_check_refuses_a_record_of_another_zone(tmp_path: Path) -> None:
    record = tmp_path / "r.jsonl"
    await run_writers(FakeData(), "z", 1, 1, 5.0, record, max_ops_per_writer=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="--zone"):
        await check_workload(FakeData(), "other", record)  # type: ignore[arg-type]


async def test_stop_event_ends_the_writers(tmp_path: Path) -> None:
    stop = asyncio.Event()
    stop.set()
    stats = await run_writers(FakeData(), "z", 2, 2, 5.0, tmp_path / "r.jsonl", stop)  # type: ignore[arg-type]
    assert stats.attempted == 0


@pytest.mark.parametrize(
    ("writers", "keys", "duration", "field_name"),
    [(0, 1, 1.0, "--writers"), (1, 0, 1.0, "--keys-per-writer"), (1, 1, 0.0, "--duration")],
)
async def test_bad_workload_parameters(
    tmp_path: Path, writers: int, keys: int, duration: float, field_name: str
) -> None:
    with pytest.raises(InvalidInput, match=field_name):
        await run_writers(FakeData(), "z", writers, keys, duration, tmp_path / "r")  # type: ignore[arg-type]
