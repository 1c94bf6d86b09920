"""Zone status from etcd-derived values only (pure), so every driver instance can answer it.

States (``ZoneStatusState``), checked in this order::

    REBALANCING  some partition 0..P-1 has a pending key (a rebalance is in progress), or the
                 driver has not yet turned a change into pending keys: a partition without stable
                 (being created), a stable whose size is not min(replicas, data nodes), a stable
                 naming a node that is no longer a data node, or a data node that holds nothing
                 although there are enough replicas to give it some (``triggered`` is False)
    HOLDDOWN     no pending, but the datanodes key holds a membership change waiting for its
                 scale-up/scale-down delay (``holddown_remaining_s`` = seconds until it is due)
    READY        neither

Transitions: READY -> HOLDDOWN (a node joins/leaves, delay > 0) -> READY (it came back in time)
or -> REBALANCING (delay expired, targets differ); READY -> REBALANCING (config change, or delay
0); REBALANCING -> READY/HOLDDOWN when every pending is finished.

Progress: ``partitions_done`` counts partitions 0..P-1 that have a stable key and no pending.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from placement.core.model import ZoneSpec
from placement.driver.datanodes import holddown_remaining
from placement.metastore.codec import Corrupt, DataNodes
from placement.metastore.keys import AssignField
from placement.metastore.transitions import PartitionState


class ZoneStatusState(StrEnum):
    READY = "READY"
    HOLDDOWN = "HOLDDOWN"
    REBALANCING = "REBALANCING"


@dataclass(frozen=True, slots=True)
class ZoneStatus:
    state: ZoneStatusState
    partitions_total: int
    partitions_done: int
    holddown_remaining_s: float = 0.0


def zone_status(
    spec: ZoneSpec,
    partitions: Mapping[int, PartitionState],
    datanodes: DataNodes | Corrupt | None,
    now_s: float,
) -> ZoneStatus:
    """The status of ``spec``'s zone.

    ``partitions``: the zone's partition states (e.g. ``Metastore.read_zone(z).partitions``);
    ``datanodes``: the decoded ``{p}/datanodes/{zone}`` value (None when absent); ``now_s``: unix
    seconds (the caller's clock).
    """
    total = spec.partitions
    done = 0
    rebalancing = False
    stables: list[tuple[str, ...]] = []
    for p in range(total):
        state = partitions.get(p)
        if state is None:
            continue
        if state.pending is not None:
            rebalancing = True
        elif state.stable is not None:
            done += 1
        stables.append(state.peers(AssignField.STABLE) or ())
    applied = datanodes.applied if isinstance(datanodes, DataNodes) else None
    if rebalancing or not triggered(spec, stables, applied):
        return ZoneStatus(ZoneStatusState.REBALANCING, total, done)
    if isinstance(datanodes, DataNodes):
        remaining = holddown_remaining(spec, datanodes, int(now_s * 1000))
        if remaining is not None:
            return ZoneStatus(ZoneStatusState.HOLDDOWN, total, done, remaining)
    return ZoneStatus(ZoneStatusState.READY, total, done)


def triggered(
    spec: ZoneSpec, stables: Sequence[tuple[str, ...]], applied: tuple[str, ...] | None
) -> bool:
    """Whether stable already reflects the zone's config and applied data nodes, as far as can
    be told without placing: the window between a change and the driver's pending writes must
    not read as READY. ``stables``: stable peers of the partitions that exist."""
    if len(stables) < spec.partitions:
        return False
    if applied is None:
        return True  # no membership record yet: nothing to compare with
    width = min(spec.replicas, len(applied))
    if any(len(peers) != width for peers in stables):
        return False
    holding = {node for peers in stables for node in peers}
    if not holding <= set(applied):
        return False
    return spec.partitions * width < len(applied) or holding == set(applied)
