"""Background data movement that yields to client writes (design/data-plane.md, "Catch-up
yields to writes").

An agent's catch-up throttle (``follower.TokenBucket``: learners' catch-up and re-sharding's
copies) is configured with a ceiling, ``--catch-up-mbps``. At that rate a copy competes with the
agent's client writes for one store thread, its pair links and the cores: on 2 cores a re-sharding
copy at 1 MB/s per agent took a third of the write throughput of 16 writers. So the agent runs the
bucket below its ceiling while its client writes are slower than they were without it, the way
LEDBAT-style background transfers yield to foreground traffic:

* every ``WINDOW`` seconds it takes the client writes its primaries acknowledged in that window
  (:class:`WriteGauge`) and their mean latency, from the call to the acknowledgement;
* the **base** is the lowest mean of the windows of the last ``HORIZON`` seconds that had at least
  ``MIN_WRITES`` writes: what a write costs here when little competes with it;
* a window slower than ``TOLERANCE`` × base + ``SLACK`` cuts the rate to ``CUT`` of itself, never
  below ``FLOOR`` of the ceiling (a copy always finishes); any other window raises it by ``STEP``
  of the ceiling, up to the ceiling; a window with fewer than ``MIN_WRITES`` writes raises it too.

Pure: :class:`YieldingRate` is stepped by the data plane's loop with what the gauge counted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

#: Seconds per step.
WINDOW = 1.0
#: Seconds of windows the base is the lowest of.
HORIZON = 30.0
#: Fewer acknowledged writes than this in a window: no foreground to yield to.
MIN_WRITES = 16
#: A window slower than TOLERANCE × base + SLACK seconds means the movement hurts writes.
TOLERANCE = 1.25
SLACK = 0.002
#: A cut multiplies the rate by CUT; a raise adds STEP of the ceiling; the rate stays at or above
#: FLOOR of the ceiling.
CUT = 0.7
STEP = 0.1
FLOOR = 0.2


@dataclass
class WriteGauge:
    """Client writes acknowledged by this agent's primaries since the last :meth:`take`."""

    count: int = 0
    seconds: float = 0.0

    def record(self, seconds: float) -> None:
        self.count += 1
        self.seconds += seconds

    def take(self) -> tuple[int, float]:
        """``(writes, their mean latency in seconds)`` since the last call, and start over."""
        count, seconds = self.count, self.seconds
        self.count, self.seconds = 0, 0.0
        return count, (seconds / count if count else 0.0)


class YieldingRate:
    """The catch-up rate, stepped once per window (see the module docstring). A ceiling of 0 or
    less is unlimited and never changes."""

    def __init__(self, ceiling: float) -> None:
        self.ceiling = ceiling
        self.rate = ceiling
        self._means: deque[float] = deque(maxlen=max(1, round(HORIZON / WINDOW)))

    @property
    def base(self) -> float | None:
        """The lowest mean latency of the recent busy windows (None: none yet)."""
        busy = [m for m in self._means if m > 0]
        return min(busy) if busy else None

    def step(self, writes: int, mean: float) -> float:
        """One window: ``writes`` acknowledged with ``mean`` latency; returns the new rate."""
        if self.ceiling <= 0:
            return self.rate
        busy = writes >= MIN_WRITES
        self._means.append(mean if busy else 0.0)
        base = self.base
        if busy and base is not None and mean > base * TOLERANCE + SLACK:
            self.rate = max(self.ceiling * FLOOR, self.rate * CUT)
        else:
            self.rate = min(self.ceiling, self.rate + self.ceiling * STEP)
        return self.rate
