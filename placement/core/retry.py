"""The one retry policy: capped exponential backoff with jitter; clock and random source injected.

Every retry loop in the product — election, registration, watches, the driver's resends and store
calls, the API and data clients — takes its delays from a :class:`RetryPolicy`, either through
:func:`retry` (call until success) or a :class:`Backoff` (a loop that decides itself when to try
again). Pure: nothing here sleeps on its own; ``sleep`` and ``rng`` are parameters
(design/architecture.md, "One of each").
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

_T = TypeVar("_T")
Sleep = Callable[[float], Awaitable[None]]
Rng = Callable[[], float]
#: An injected time source in seconds (``time.time`` or ``time.monotonic`` in production).
Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempt ``n`` (from 0) waits ``d·U(floor, 1)`` with ``d = min(cap, initial·factorⁿ)``.

    ``floor=0`` is full jitter, ``floor=0.5`` "equal" jitter, ``floor=1`` no jitter.
    """

    initial: float = 0.05
    cap: float = 2.0
    factor: float = 2.0
    floor: float = 0.0

    def __post_init__(self) -> None:
        if not (0 < self.initial <= self.cap and self.factor >= 1 and 0 <= self.floor <= 1):
            raise ValueError(f"invalid retry policy {self!r}")

    def ceiling(self, attempt: int) -> float:
        """The largest delay of attempt ``attempt``."""
        return min(self.cap, self.initial * self.factor ** min(max(attempt, 0), 60))

    def delay(self, attempt: int, rng: Rng = random.random) -> float:
        d = self.ceiling(attempt)
        return d * (self.floor + (1.0 - self.floor) * rng())


class Backoff:
    """A loop's running position in a :class:`RetryPolicy`: ``next()`` is the next delay and
    advances; ``reset()`` after a success starts again from the smallest delay."""

    __slots__ = ("_attempt", "_rng", "policy")

    def __init__(self, policy: RetryPolicy, rng: Rng = random.random) -> None:
        self.policy = policy
        self._rng = rng
        self._attempt = 0

    def next(self) -> float:
        delay = self.policy.delay(self._attempt, self._rng)
        self._attempt += 1
        return delay

    def reset(self) -> None:
        self._attempt = 0


async def retry(
    op: Callable[[], Awaitable[_T]],
    *,
    policy: RetryPolicy,
    retry_on: tuple[type[BaseException], ...],
    sleep: Sleep,
    attempts: int | None = None,
    rng: Rng = random.random,
) -> _T:
    """Call ``op`` until it returns, retrying ``retry_on`` errors with ``policy``'s backoff;
    after ``attempts`` tries (None = forever) the last error is raised."""
    attempt = 0
    while True:
        try:
            return await op()
        except retry_on:
            attempt += 1
            if attempts is not None and attempt >= attempts:
                raise
            await sleep(policy.delay(attempt, rng))
