"""Zone status from etcd-derived values only (pure), so every driver instance can answer it.

States (``ZoneStatusState``), checked in this order::

    RESHARDING   the zone's layout carries a reshard (design/resharding.md): its phase, the keys
                 and bytes copied, the bytes expected to move and an ETA (``reshard_progress``)
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

from placement.core.layout import Reshard, ReshardPhase
from placement.core.model import ZoneSpec
from placement.driver.datanodes import holddown_remaining
from placement.metastore.codec import Corrupt, DataNodes, LayoutValue, ReshardReport
from placement.metastore.keys import AssignField
from placement.metastore.transitions import PartitionState


class ZoneStatusState(StrEnum):
    READY = "READY"
    HOLDDOWN = "HOLDDOWN"
    REBALANCING = "REBALANCING"
    RESHARDING = "RESHARDING"


@dataclass(frozen=True, slots=True)
class ReshardProgress:
    """A running reshard as status shows it (design/resharding.md)."""

    reshard: Reshard
    keys_copied: int
    bytes_copied: int
    #: The sources' reported sizes times the share of keys that move.
    bytes_to_copy: int
    #: Seconds left at the copy's rate since the layout's last phase change; 0 = unknown.
    eta_s: float


@dataclass(frozen=True, slots=True)
class ZoneStatus:
    state: ZoneStatusState
    partitions_total: int
    partitions_done: int
    holddown_remaining_s: float = 0.0
    reshard: ReshardProgress | None = None


def reshard_progress(
    layout: LayoutValue,
    reports: Mapping[int, ReshardReport],
    sizes: Mapping[int, int],
    now_ms: int,
) -> ReshardProgress | None:
    """``layout``'s reshard with its progress: ``reports`` (partition -> its reshard report),
    ``sizes`` (partition -> bytes its replicas report, the largest); None without a reshard."""
    r = layout.layout.reshard
    if r is None:
        return None
    mine = [rep for rep in reports.values() if rep.attempt == r.attempt]
    keys = sum(rep.keys for rep in mine)
    copied = sum(rep.bytes for rep in mine)
    to_copy = r.moves.moved(sizes)  # grow: (P'-P)/P' of every source; shrink: the removed
    elapsed_s = max(0.0, (now_ms - layout.ts) / 1000)
    eta = 0.0
    if copied and elapsed_s > 0 and to_copy > copied and r.phase is ReshardPhase.COPY:
        eta = (to_copy - copied) / (copied / elapsed_s)
    return ReshardProgress(r, keys, copied, to_copy, eta)


def zone_status(
    spec: ZoneSpec,
    partitions: Mapping[int, PartitionState],
    datanodes: DataNodes | Corrupt | None,
    now_s: float,
    reshard: ReshardProgress | None = None,
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
    if reshard is not None:
        return ZoneStatus(ZoneStatusState.RESHARDING, total, done, reshard=reshard)
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
