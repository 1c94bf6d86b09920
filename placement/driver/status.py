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
    NO_LEADER    (with ``leader=False``) no driver leads: whatever else holds, nothing moves

With an ``outlook`` (``driver.core.zone_outlook``: what a pass would still do) READY and HOLDDOWN
are checked against the leader's own rules: a data-node change due but not recorded, partitions
off target or moves waiting for a departed node are REBALANCING; a held change not recorded yet
is HOLDDOWN (design/control-plane.md, "Zone status").

Transitions: READY -> HOLDDOWN (a node joins/leaves, delay > 0) -> READY (it came back in time)
or -> REBALANCING (delay expired, targets differ); READY -> REBALANCING (config change, or delay
0); REBALANCING -> READY/HOLDDOWN when every pending is finished.

Progress: ``partitions_done`` counts partitions 0..P-1 that have a stable key and no pending.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from placement.core.layout import Reshard, ReshardPhase
from placement.core.model import ZoneSpec
from placement.driver.datanodes import holddown_remaining
from placement.metastore.codec import Assignment, Corrupt, DataNodes, LayoutValue, ReshardReport
from placement.metastore.keys import AssignField
from placement.metastore.transitions import PartitionState


class ZoneStatusState(StrEnum):
    READY = "READY"
    HOLDDOWN = "HOLDDOWN"
    REBALANCING = "REBALANCING"
    RESHARDING = "RESHARDING"
    #: No driver leads: nothing moves and no primary lease is renewed until one is elected.
    NO_LEADER = "NO_LEADER"


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
class RebalanceProgress:
    """A rebalance's bytes left and ETA (:func:`rebalance_progress`)."""

    bytes_to_move: int
    eta_s: float  # 0 = unknown (nothing finished yet)


@dataclass(frozen=True, slots=True)
class ZoneStatus:
    state: ZoneStatusState
    partitions_total: int
    partitions_done: int
    holddown_remaining_s: float = 0.0
    reshard: ReshardProgress | None = None
    #: Why the state is what it is, or what else an operator should know (one line each).
    details: tuple[str, ...] = ()
    #: Data nodes placement uses (None: not known to the caller).
    eligible_nodes: int | None = None
    #: Fewer eligible data nodes than the zone's replicas: each partition has fewer replicas.
    under_replicated: bool = False
    #: Partitions whose assignment is not (or not yet) the placement target.
    off_target: int = 0
    rebalance: RebalanceProgress | None = None


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


def rebalance_progress(
    partitions: Mapping[int, PartitionState], sizes: Mapping[int, int], now_ms: int
) -> RebalanceProgress | None:
    """Bytes left to copy and an ETA of the zone's rebalance round (None: nothing pending).

    ``sizes``: partition -> bytes of its largest reported replica. Bytes left: each pending
    partition's size times its joining members. The round is the pending keys' trigger revision
    (the newest); it started at their earliest ``ts``; partitions whose stable carries that
    trigger finished in it. ETA = what is left ÷ the rate so far, in partition bytes (or in
    partitions when the finished ones hold no data); 0 while nothing has finished."""
    pending = {p: s for p, s in partitions.items() if s.pending is not None}
    if not pending:
        return None
    left_bytes = 0
    rounds: list[tuple[int, int]] = []
    for p, state in pending.items():
        new = set(state.peers(AssignField.PENDING) or ())
        joining = new - set(state.peers(AssignField.STABLE) or ())
        left_bytes += sizes.get(p, 0) * len(joining)
        entry = state.entry(AssignField.PENDING)
        value = entry.value if entry is not None else None
        if isinstance(value, Assignment):
            rounds.append((value.trigger, value.ts))
    if not rounds:
        return RebalanceProgress(left_bytes, 0.0)
    trigger = max(t for t, _ in rounds)
    started = min(ts for t, ts in rounds if t == trigger)
    finished = []
    for p, state in partitions.items():
        entry = state.entry(AssignField.STABLE)
        value = entry.value if entry is not None else None
        if p not in pending and isinstance(value, Assignment) and value.trigger == trigger:
            finished.append(p)
    elapsed = (now_ms - started) / 1000
    if not finished or elapsed <= 0:
        return RebalanceProgress(left_bytes, 0.0)
    done_bytes = sum(sizes.get(p, 0) for p in finished)
    todo_bytes = sum(sizes.get(p, 0) for p in pending)
    if done_bytes > 0:
        eta = todo_bytes / (done_bytes / elapsed)
    else:
        eta = len(pending) / (len(finished) / elapsed)
    return RebalanceProgress(left_bytes, eta)


def zone_status(
    spec: ZoneSpec,
    partitions: Mapping[int, PartitionState],
    datanodes: DataNodes | Corrupt | None,
    now_s: float,
    reshard: ReshardProgress | None = None,
    *,
    outlook: ZoneOutlookFacts | None = None,
    leader: bool = True,
    sizes: Mapping[int, int] | None = None,
    cordoned: frozenset[str] = frozenset(),
) -> ZoneStatus:
    """The status of ``spec``'s zone.

    ``partitions``: the zone's partition states (e.g. ``Metastore.read_zone(z).partitions``);
    ``datanodes``: the decoded ``{p}/datanodes/{zone}`` value (None when absent); ``now_s``: unix
    seconds (the caller's clock). With ``outlook`` (what a pass would still do,
    ``driver.core.zone_outlook``) READY means nothing is left to do: a registered node not yet
    in the data nodes, a partition off its target or a move waiting for a node that left is
    REBALANCING, a membership change not yet recorded is HOLDDOWN. ``leader`` False: NO_LEADER,
    whatever the rest says (in ``details``). ``sizes`` (partition -> bytes): a rebalance's
    bytes left and ETA. ``cordoned``: nodes an operator cordons (they may hold nothing).
    """
    found = _zone_status(spec, partitions, datanodes, now_s, reshard, cordoned)
    details: list[str] = []
    state, held = found.state, found.holddown_remaining_s
    eligible: int | None = None
    off_target = 0
    if outlook is not None:
        eligible = len(outlook.eligible)
        off_target = len(outlook.off_target)
        if outlook.unplaceable:
            details.append(f"cannot be placed: {outlook.unplaceable}")
        if state in (ZoneStatusState.READY, ZoneStatusState.HOLDDOWN):
            if outlook.datanodes_due:
                state = ZoneStatusState.REBALANCING
                details.append("a data-node change is due and not applied yet")
            elif outlook.off_target or outlook.stuck:
                state = ZoneStatusState.REBALANCING
            elif outlook.held_s is not None and state is ZoneStatusState.READY:
                state, held = ZoneStatusState.HOLDDOWN, outlook.held_s
        if outlook.off_target and not any(s.pending for s in partitions.values()):
            details.append(
                f"{len(outlook.off_target)} partition(s) off target (a cancelled move, or a"
                " change not triggered yet): the next trigger moves them"
            )
        if outlook.stuck:
            details.append(f"{outlook.stuck} move(s) wait for a node that left: to be cancelled")
    under = eligible is not None and 0 < eligible < spec.replicas
    if under:
        details.append(
            f"under-replicated: {spec.replicas} replicas wanted, {eligible} eligible data"
            f" node(s), so {eligible} per partition"
        )
    if eligible == 0:
        details.append("no eligible data node matches the zone's selector")
    progress = None
    if state is ZoneStatusState.REBALANCING:
        progress = rebalance_progress(partitions, sizes or {}, int(now_s * 1000))
    if not leader:
        details.insert(
            0, f"no driver leads: nothing moves until one is elected (else {state.value})"
        )
        state = ZoneStatusState.NO_LEADER
    return ZoneStatus(
        state,
        found.partitions_total,
        found.partitions_done,
        held if state is ZoneStatusState.HOLDDOWN else 0.0,
        found.reshard,
        tuple(details),
        eligible,
        under,
        off_target,
        progress,
    )


class ZoneOutlookFacts(Protocol):
    """What :func:`zone_status` reads of ``driver.core.ZoneOutlook``."""

    @property
    def datanodes_due(self) -> bool: ...
    @property
    def held_s(self) -> float | None: ...
    @property
    def eligible(self) -> tuple[str, ...]: ...
    @property
    def off_target(self) -> tuple[int, ...]: ...
    @property
    def stuck(self) -> int: ...
    @property
    def unplaceable(self) -> str: ...


def _zone_status(
    spec: ZoneSpec,
    partitions: Mapping[int, PartitionState],
    datanodes: DataNodes | Corrupt | None,
    now_s: float,
    reshard: ReshardProgress | None,
    cordoned: frozenset[str],
) -> ZoneStatus:
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
    if rebalancing or not triggered(spec, stables, applied, cordoned):
        return ZoneStatus(ZoneStatusState.REBALANCING, total, done)
    if isinstance(datanodes, DataNodes):
        remaining = holddown_remaining(spec, datanodes, int(now_s * 1000))
        if remaining is not None:
            return ZoneStatus(ZoneStatusState.HOLDDOWN, total, done, remaining)
    return ZoneStatus(ZoneStatusState.READY, total, done)


def triggered(
    spec: ZoneSpec,
    stables: Sequence[tuple[str, ...]],
    applied: tuple[str, ...] | None,
    cordoned: frozenset[str] = frozenset(),
) -> bool:
    """Whether stable already reflects the zone's config and applied data nodes, as far as can
    be told without placing: the window between a change and the driver's pending writes must
    not read as READY. ``stables``: stable peers of the partitions that exist; a ``cordoned``
    data node may hold nothing (it takes no new replica)."""
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
    return spec.partitions * width < len(applied) or holding >= set(applied) - cordoned
