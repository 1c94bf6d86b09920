"""The per-key linearizability check (placement/data/linearizability.py): histories made by a
register that really is atomic — one sequential writer whose writes take effect inside their
intervals (or, unacknowledged, any time after they were sent, or never), readers that read at an
instant inside theirs — always pass; a read that returns a value a completed write had already
replaced before the read began always fails, as do reads that go back in time."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from placement.data.linearizability import RegisterOp, check_key

W, R = True, False


def op(invoked: float, completed: float, write: bool, value: str | None) -> RegisterOp:
    return RegisterOp(invoked, completed, write, value)


@st.composite
def atomic_histories(draw: st.DrawFn, puts_only: bool = False) -> list[RegisterOp]:
    """One writer, readers, and the register's true timeline; every read sees the value at a
    random instant of its interval."""
    ops: list[RegisterOp] = []
    effects: list[tuple[float, str | None]] = []  # (instant, value) of the writes that happened
    t = 0.0
    for seq in range(draw(st.integers(0, 8))):
        duration = draw(st.floats(0.1, 2.0))
        value = f"v{seq}" if puts_only or draw(st.booleans()) else None
        acked = draw(st.booleans()) or draw(st.booleans())
        if acked:
            effects.append((t + draw(st.floats(0, 1)) * duration, value))
            ops.append(op(t, t + duration, W, value))
        else:
            if draw(st.booleans()):  # it happened after all, maybe after it "failed"
                effects.append((t + draw(st.floats(0, 3)) * duration, value))
            ops.append(op(t, math.inf, W, value))
        t += duration + draw(st.floats(0.01, 0.5))  # the next is sent after the answer
    effects.sort()
    for _ in range(draw(st.integers(0, 12))):
        start = draw(st.floats(0, t + 1))
        length = draw(st.floats(0.01, 2.0))
        at = start + draw(st.floats(0, 1)) * length
        seen = [v for when, v in effects if when <= at]
        ops.append(op(start, start + length, R, seen[-1] if seen else None))
    return ops


@settings(max_examples=400, deadline=None)
@given(atomic_histories())
def test_an_atomic_register_is_always_linearizable(ops: list[RegisterOp]) -> None:
    assert check_key(ops) == "ok"


@settings(max_examples=400, deadline=None)
@given(atomic_histories(puts_only=True), st.data())
def test_a_read_of_a_replaced_value_is_always_caught(
    ops: list[RegisterOp], data: st.DataObject
) -> None:
    writes = [o for o in ops if o.write and not o.optional]
    reads = [o for o in ops if not o.write]
    # (an acknowledged write, a read) where a later acknowledged write completed before the
    # read began: the older value can no longer be read.
    stale = [
        (w, r)
        for i, w in enumerate(writes)
        for r in reads
        if any(later.completed < r.invoked for later in writes[i + 1 :]) and r.value != w.value
    ]
    if not stale:
        return
    old, read = data.draw(st.sampled_from(stale))
    broken = [o for o in ops if o is not read] + [op(read.invoked, read.completed, R, old.value)]
    assert check_key(broken) == "violation"


def test_hand_written_histories() -> None:
    # A read concurrent with a write may return either value.
    assert check_key([op(0, 2, W, "a"), op(1, 3, R, "a")]) == "ok"
    assert check_key([op(0, 2, W, "a"), op(1, 3, R, None)]) == "ok"
    # After the write completed, the old value is gone.
    assert check_key([op(0, 2, W, "a"), op(3, 4, R, None)]) == "violation"
    # Two reads one after the other, during a write: new, then old, is going back in time.
    history = [op(0, 10, W, "a"), op(1, 2, R, "a"), op(3, 4, R, None)]
    assert check_key(history) == "violation"
    assert check_key([op(0, 10, W, "a"), op(1, 2, R, None), op(3, 4, R, "a")]) == "ok"
    # An unacknowledged write may land late, even after the next one began — but never
    # before its own invocation, and a value nobody wrote is never read.
    late = [op(0, math.inf, W, "a"), op(5, 6, W, "b"), op(7, 8, R, "a")]
    assert check_key(late) == "ok"
    assert check_key([op(5, math.inf, W, "a"), op(1, 2, R, "a")]) == "violation"
    assert check_key([op(0, 1, W, "a"), op(2, 3, R, "zz")]) == "violation"
    # An unacknowledged write that never happened.
    assert check_key([op(0, math.inf, W, "a"), op(5, 6, R, None)]) == "ok"


def test_a_long_history_of_one_writer_and_readers_is_checked_quickly() -> None:
    ops = []
    for i in range(600):
        ops.append(op(i, i + 0.5, W, f"v{i}"))
        ops.append(op(i + 0.6, i + 0.9, R, f"v{i}"))
        ops.append(op(i + 0.2, i + 0.3, R, f"v{i - 1}" if i else None))
    assert check_key(ops, budget=50_000) == "ok"
