"""Retrying with capped exponential backoff and full jitter (pure; the sleep is injected).

One policy for the driver's etcd and agent calls and the data client's retries.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

_T = TypeVar("_T")
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter: attempt ``n`` waits ``U(0, min(cap, initial·2ⁿ))``."""

    initial: float = 0.05
    cap: float = 2.0
    factor: float = 2.0

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        return rng() * min(self.cap, self.initial * self.factor ** min(attempt, 60))


async def retry(
    op: Callable[[], Awaitable[_T]],
    *,
    policy: RetryPolicy,
    retry_on: tuple[type[BaseException], ...],
    sleep: Sleep,
    attempts: int | None = None,
    rng: Callable[[], float] = random.random,
) -> _T:
    """The one retry helper: call ``op`` until it returns, retrying ``retry_on`` errors with
    ``policy``'s backoff; after ``attempts`` tries (None = forever) the last error is raised."""
    attempt = 0
    while True:
        try:
            return await op()
        except retry_on:
            attempt += 1
            if attempts is not None and attempt >= attempts:
                raise
            await sleep(policy.delay(attempt, rng))
