"""A zone's data nodes after the scale-up and scale-down delays (holddown). Pure: no I/O, no clock.

The registered nodes matching a zone's selector are *observed*; the set placement uses is
*applied*. Additions (observed - applied) are applied once they have been pending for
``scale_up_delay`` seconds, removals (applied - observed) once pending for ``scale_down_delay``;
the two timers run independently. A timer starts when its kind of change goes from "none pending"
to "some pending" and stops (is cleared) when none is pending any more — so a node that leaves and
returns before the scale-down delay expires leaves ``applied`` untouched: nothing moves.

States of a zone's membership (per kind of change, additions and removals alike)::

    STEADY (nothing pending) --change seen--> HELD (since = now)
    HELD --membership back to applied--> STEADY (nothing applied)
    HELD --now >= since + delay--> STEADY (change applied: applied := applied ± change)

A zone with no record yet (just created) applies the observed set at once: there is nothing to
protect from flapping before anything was placed.
"""

from __future__ import annotations

from collections.abc import Iterable, Set

from placement.core.model import ZoneSpec
from placement.metastore.codec import DataNodes, NodeRecord


def matching_nodes(spec: ZoneSpec, nodes: Iterable[NodeRecord]) -> tuple[str, ...]:
    """Sorted names of the registered nodes whose attributes match the zone's selector."""
    return tuple(
        sorted(
            n.name
            for n in nodes
            if all(n.attributes.get(k) == v for k, v in spec.node_selector.items())
        )
    )


def advance(
    spec: ZoneSpec,
    previous: DataNodes | None,
    observed: Iterable[str],
    now_ms: int,
    drained: Set[str] = frozenset(),
) -> DataNodes:
    """The data-node record after looking at the ``observed`` matching set at ``now_ms``;
    removals of ``drained`` nodes (an operator drains them) apply at once, without the
    scale-down delay.

    ``previous`` is the stored record (``None``: none yet, the observed set is applied at once).
    The returned record carries epoch/ts 0; the writer stamps them. Compare with
    :meth:`DataNodes.same_content` to decide whether anything needs writing.
    """
    seen = tuple(sorted(set(observed)))
    if previous is None:
        return DataNodes(applied=seen, observed=seen, up_since=None, down_since=None)
    applied = set(previous.applied)
    adds = set(seen) - applied
    removes = applied - set(seen)
    up_since = (previous.up_since if previous.up_since is not None else now_ms) if adds else None
    down_since = (
        (previous.down_since if previous.down_since is not None else now_ms) if removes else None
    )
    if up_since is not None and now_ms - up_since >= spec.scale_up_delay * 1000:
        applied |= adds
        up_since = None
    if down_since is not None and now_ms - down_since >= spec.scale_down_delay * 1000:
        applied -= removes
        down_since = None
    elif removes & drained:
        applied -= removes & drained
        down_since = down_since if removes - drained else None
    return DataNodes(
        applied=tuple(sorted(applied)), observed=seen, up_since=up_since, down_since=down_since
    )


def holddown_remaining(spec: ZoneSpec, record: DataNodes, now_ms: int) -> float | None:
    """Seconds until the next held change is due (>= 0), or ``None`` when nothing is held."""
    due: list[float] = []
    if record.up_since is not None:
        due.append(record.up_since / 1000 + spec.scale_up_delay)
    if record.down_since is not None:
        due.append(record.down_since / 1000 + spec.scale_down_delay)
    if not due:
        return None
    return max(0.0, min(due) - now_ms / 1000)
