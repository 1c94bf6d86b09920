"""Per-key linearizability of a recorded workload's register histories (pure; design/data-plane.md,
"Checking a workload").

A key is a register: puts set it, deletes clear it, reads return what it holds. Each operation has
the interval it was in flight, from invocation to completion on the client's clock. The history is
**linearizable** when every operation can be given one instant inside its interval such that, in
the order of those instants, every read returns what the writes before it left (Herlihy & Wing). An
acknowledged write must take effect inside its interval; an unacknowledged one (failed, timed out,
cut off) may take effect at any instant after its invocation, or never. Keys are independent
(linearizability is compositional), so each key is checked on its own.

The search is Wing & Gong's, with Lowe's memo of (operations placed, register value): from the
operations not placed yet, one whose invocation is not after the earliest completion among them
may go next. A read that may go next and returns the current value is placed at once — placing it
earlier only removes a constraint — so only writes branch; a history of one sequential writer
and any number of readers stays close to linear. ``budget`` bounds the states one key may take; a
key that exhausts it is reported undecided, never as a violation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

#: States the search may visit for one key before it gives up (undecided).
BUDGET = 200_000

Verdict = Literal["ok", "violation", "undecided"]


@dataclass(frozen=True, slots=True)
class RegisterOp:
    """One operation on a key: a write of ``value`` (None = delete) or a read that returned
    ``value`` (None = absent). ``completed`` is ``math.inf`` for an unacknowledged write."""

    invoked: float
    completed: float
    write: bool
    value: str | None

    @property
    def optional(self) -> bool:
        """An unacknowledged write: it may never have happened."""
        return self.write and math.isinf(self.completed)


def check_key(
    ops: Sequence[RegisterOp], initial: str | None = None, budget: int = BUDGET
) -> Verdict:
    """Whether ``ops`` (one key's, any order) are linearizable from ``initial``."""
    written = {op.value for op in ops if op.write} | {initial}
    if any(not op.write and op.value not in written for op in ops):
        return "violation"  # a read of a value nobody wrote
    order = sorted(range(len(ops)), key=lambda i: (ops[i].invoked, ops[i].completed))
    required = 0
    for i, op in enumerate(ops):
        if not op.optional:
            required |= 1 << i
    seen: set[tuple[int, str | None]] = set()
    stack: list[tuple[int, str | None]] = [(0, initial)]
    visited = 0
    while stack:
        done, value = _place_reads(ops, order, *stack.pop())
        if done & required == required:
            return "ok"
        if (done, value) in seen:
            continue
        seen.add((done, value))
        visited += 1
        if visited > budget:
            return "undecided"
        horizon = _horizon(ops, order, done)
        for i in order:
            op = ops[i]
            if op.invoked > horizon:
                break
            if done >> i & 1 or not op.write:
                continue
            stack.append((done | 1 << i, op.value))
    return "violation"


def _horizon(ops: Sequence[RegisterOp], order: Sequence[int], done: int) -> float:
    """The earliest completion among the operations not placed yet: nothing invoked after it
    may be placed before that operation."""
    return min((ops[i].completed for i in order if not done >> i & 1), default=math.inf)


def _place_reads(
    ops: Sequence[RegisterOp], order: Sequence[int], done: int, value: str | None
) -> tuple[int, str | None]:
    """Place every read that may go next and returns ``value``, until none is left."""
    while True:
        horizon = _horizon(ops, order, done)
        placed = done
        for i in order:
            op = ops[i]
            if op.invoked > horizon:
                break
            if not placed >> i & 1 and not op.write and op.value == value:
                placed |= 1 << i
        if placed == done:
            return done, value
        done = placed


@dataclass(frozen=True, slots=True)
class KeyVerdict:
    key: str
    verdict: Verdict
    operations: int


def check_keys(histories: Iterable[tuple[str, Sequence[RegisterOp]]]) -> list[KeyVerdict]:
    """:func:`check_key` of every key (each starts absent)."""
    return [KeyVerdict(key, check_key(ops), len(ops)) for key, ops in histories]
