"""Process-wide settings of the long-running services (driver, agent, fleet simulator) and of
the Spark engine's planning worker (``pipeline.spark_plan``).

**The cyclic garbage collector** (design/decisions.md, "Garbage collector"). CPython frees almost
every object by reference counting; the cyclic collector only finds cycles. By default it runs a
young collection every 700 net allocations of container objects and, every 100 of those, a full
one that walks the whole heap — and a service's heap is large and long-lived (imported modules,
the driver's decoded view and caches, an agent's records). Profiles of a node join showed the
collector at about 10 % of the driver's and the agents' event-loop threads. :func:`tune_gc`
moves everything alive at start-up (modules, classes, functions) into the permanent generation
(``gc.freeze``), so no full collection walks it again, and raises the young threshold to
:data:`YOUNG_THRESHOLD`, so the short-lived cycles of a busy loop (futures, exceptions with
their tracebacks) are still collected, in larger and rarer batches. Memory held by garbage
cycles is bounded by that threshold's worth of allocations.
"""

from __future__ import annotations

import gc

#: Net allocations of container objects between young collections (CPython's default: 700).
YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    """Freeze what is alive now and collect young garbage less often (see the module)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
