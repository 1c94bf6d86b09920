"""A zone's data layout and the re-sharding phase machine (design/resharding.md), as pure values.

A zone's **layout** is ``(generation, partitions)``: what is in force for its keys. The zone
config's ``partitions`` is what the operator wants; while the two differ a **reshard** runs from
the layout's count to the wanted one, through the phases PREPARE → COPY → SEAL → (flip) →
CLEANUP, or is aborted (from PREPARE, COPY or SEAL → ABORT) back to the old count.

:func:`next_step` decides, from facts the driver gathers, which transition is due;
:func:`check_alter` whether an operator's partition change may be accepted. Which partitions lose
and gain keys is :class:`Moves`; which keys move is
:func:`placement.data.partitioning.key_moves`.

Pure code: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from fractions import Fraction

from placement.core.limits import MAX_PARTITIONS
from placement.core.zonespec import check_count
from placement.errors import InvalidInput, PlacementError


class ReshardPhase(StrEnum):
    PREPARE = "prepare"
    COPY = "copy"
    SEAL = "seal"
    CLEANUP = "cleanup"
    ABORT = "abort"


#: A destination is caught up (COPY may end in SEAL) when no source has more entries than this
#: not copied yet: the seal's write pause is then about the time to copy this many.
SEAL_LAG = 1000

#: Phases before the flip: the old layout is in force and the reshard may still be aborted.
BEFORE_FLIP = frozenset({ReshardPhase.PREPARE, ReshardPhase.COPY, ReshardPhase.SEAL})


class ReshardRunning(PlacementError):
    """A partition change was asked while a reshard of the zone runs and cannot take it."""


def check_partitions(value: object, field: str = "partitions") -> int:
    """``value`` if it is a partition count (1..MAX_PARTITIONS), else InvalidInput naming
    ``field`` (the zone validator's own check)."""
    return check_count(value, MAX_PARTITIONS, field)


@dataclass(frozen=True, slots=True)
class Moves:
    """Which partitions lose keys (``sources``) and which gain them (``destinations``) when a
    zone goes from ``old`` to ``new`` partitions by jump hashing: a grow moves keys only into
    the new partitions, a shrink only out of the removed ones (design/resharding.md)."""

    old: int
    new: int

    def __post_init__(self) -> None:
        check_partitions(self.old, "old")
        check_partitions(self.new, "new")

    @property
    def sources(self) -> range:
        if self.new > self.old:  # grow: any old partition may lose keys to a new one
            return range(self.old)
        return range(self.new, self.old)  # shrink: only the removed ones lose keys

    @property
    def destinations(self) -> range:
        if self.new > self.old:
            return range(self.old, self.new)
        return range(self.new) if self.new < self.old else range(0)

    @property
    def moving_share(self) -> Fraction:
        """The expected share of the zone's keys that move, exactly: ``|P'-P| / max(P, P')``.
        A grow moves this share of **every** source's keys; a shrink all of the removed
        partitions' keys, which hold this share of the zone's in expectation."""
        return Fraction(abs(self.new - self.old), max(self.new, self.old))

    def moved(self, amounts: Mapping[int, int]) -> int:
        """How much of ``amounts`` (partition under ``old`` -> its keys, or its bytes; a
        partition absent counts 0) moves: for a grow the sources' total times
        :attr:`moving_share` (the expected value, rounded down), for a shrink exactly the
        removed partitions' total. Re-sharding's "keys or bytes to copy"."""
        total = sum(amounts.get(p, 0) for p in self.sources)
        if self.new > self.old:
            return int(total * self.moving_share)
        return total


@dataclass(frozen=True, slots=True)
class Reshard:
    """A running reshard from ``source`` to ``target`` partitions. ``attempt`` is the zone
    config's revision that asked for it: unique and increasing, it names the attempt's seals
    and reports."""

    attempt: int
    source: int
    target: int
    phase: ReshardPhase

    def __post_init__(self) -> None:
        if isinstance(self.attempt, bool) or not isinstance(self.attempt, int) or self.attempt < 1:
            raise InvalidInput("reshard.attempt", f"{self.attempt!r} is not a revision", "use ≥ 1")
        check_partitions(self.source, "reshard.source")
        check_partitions(self.target, "reshard.target")
        if self.source == self.target:
            raise InvalidInput(
                "reshard.target", f"equals the source count {self.source}", "change the count"
            )
        ReshardPhase(self.phase)

    @property
    def moves(self) -> Moves:
        return Moves(self.source, self.target)

    @property
    def flipped(self) -> bool:
        return self.phase is ReshardPhase.CLEANUP


@dataclass(frozen=True, slots=True)
class ZoneLayout:
    """The layout in force (``generation``, ``partitions``) and the reshard, if one runs.

    Before the flip the layout holds the reshard's source count; from the flip (CLEANUP) on, the
    next generation and the target count."""

    generation: int
    partitions: int
    reshard: Reshard | None = None

    def __post_init__(self) -> None:
        if isinstance(self.generation, bool) or not isinstance(self.generation, int):
            raise InvalidInput("generation", f"{self.generation!r} is not an integer", "use ≥ 1")
        if self.generation < 1:
            raise InvalidInput("generation", f"{self.generation} is below 1", "use ≥ 1")
        check_partitions(self.partitions)
        r = self.reshard
        if r is not None:
            in_force = r.target if r.flipped else r.source
            if self.partitions != in_force:
                raise InvalidInput(
                    "partitions",
                    f"{self.partitions} in force, but a reshard {r.source} → {r.target} in"
                    f" phase {r.phase} has {in_force} in force",
                    "keep the layout and its reshard consistent",
                )

    def existing(self) -> range:
        """Partitions that exist (hold keys or receive them): all of both counts while a
        reshard runs — a grow's new partitions from PREPARE on, a shrink's removed ones until
        its clean-up ends."""
        if self.reshard is None:
            return range(self.partitions)
        return range(max(self.reshard.source, self.reshard.target))


class Step(StrEnum):
    """The transition :func:`next_step` asks for (design/resharding.md, "Every transaction")."""

    INIT = "init_layout"
    BEGIN = "begin"
    ADVANCE = "advance"
    FLIP = "flip"
    ABORT = "abort"
    FINISH = "finish"


@dataclass(frozen=True, slots=True)
class ReshardFacts:
    """What the driver observed for the running attempt (each False when unknown):

    * ``ready``: every destination has stable, a primary lease and an ISR of the zone's minimum;
    * ``caught_up``: every destination reports every source within the seal lag;
    * ``drained``: every destination reports drained (copied every source up to its seal);
    * ``purged``: CLEANUP — every source reports its moved keys deleted (a shrink: its removed
      partitions' keys are gone); ABORT — every destination reports its copies deleted (a
      grow: its new partitions' keys are gone).
    """

    ready: bool = False
    caught_up: bool = False
    drained: bool = False
    purged: bool = False


@dataclass(frozen=True, slots=True)
class Transition:
    step: Step
    layout: ZoneLayout


def next_step(
    layout: ZoneLayout | None,
    wanted: int,
    facts: ReshardFacts,
    *,
    wanted_revision: int,
    created_revision: int,
) -> Transition | None:
    """The transition due for a zone whose config wants ``wanted`` partitions (the config was
    last written at ``wanted_revision`` and created at ``created_revision``), or None.

    A zone's first layout has generation ``created_revision``: greater than every generation of
    an earlier zone of the same name (each of its flips was a write before this zone's
    creation), so a client's cached layout of a dropped zone never matches. A count other than
    the running reshard's source or target waits for it to end (the API refuses it anyway)."""
    if layout is None:
        return Transition(Step.INIT, ZoneLayout(created_revision, wanted))
    r = layout.reshard
    if r is None:
        if wanted == layout.partitions:
            return None
        begun = Reshard(wanted_revision, layout.partitions, wanted, ReshardPhase.PREPARE)
        return Transition(Step.BEGIN, replace(layout, reshard=begun))
    if r.phase in BEFORE_FLIP and wanted == r.source:
        return Transition(Step.ABORT, replace(layout, reshard=replace(r, phase=ReshardPhase.ABORT)))
    if r.phase is ReshardPhase.PREPARE and facts.ready:
        return Transition(
            Step.ADVANCE, replace(layout, reshard=replace(r, phase=ReshardPhase.COPY))
        )
    if r.phase is ReshardPhase.COPY and facts.caught_up:
        return Transition(
            Step.ADVANCE, replace(layout, reshard=replace(r, phase=ReshardPhase.SEAL))
        )
    if r.phase is ReshardPhase.SEAL and facts.drained:
        flipped = ZoneLayout(
            layout.generation + 1, r.target, replace(r, phase=ReshardPhase.CLEANUP)
        )
        return Transition(Step.FLIP, flipped)
    if r.phase in (ReshardPhase.CLEANUP, ReshardPhase.ABORT) and facts.purged:
        return Transition(Step.FINISH, replace(layout, reshard=None))
    return None


def check_alter(layout: ZoneLayout | None, zone: str, current: int, requested: int) -> None:
    """May an operator change zone ``zone``'s partition count from ``current`` (its config) to
    ``requested``? Raises :class:`ReshardRunning` (with what to do instead) when not; the count's
    range is the zone validator's business."""
    r = layout.reshard if layout is not None else None
    if r is None or requested == current:
        return
    if requested == r.source and r.phase in BEFORE_FLIP:
        return  # aborts the reshard
    what = f"zone {zone} is re-sharding {r.source} → {r.target} (phase {r.phase})"
    if r.phase in BEFORE_FLIP:
        fix = f"wait for it to finish, or alter --partitions {r.source} to abort it"
    else:
        fix = "wait for its clean-up to finish, then change the count again"
    raise ReshardRunning(f"{what}: {fix}")


@dataclass(frozen=True, slots=True)
class CancelReshard:
    """What cancelling a zone's reshard (``placectl rebalance cancel ZONE``) does: alter the
    config back to ``count`` (None: write nothing), whether the cancel holds, and what to tell
    the operator."""

    count: int | None
    accepted: bool
    detail: str


def cancel_reshard(layout: ZoneLayout | None, zone: str) -> CancelReshard:
    """Cancelling is aborting: altering the count back to the reshard's source, allowed exactly
    when :func:`check_alter` allows that abort (before the flip); again while it aborts holds."""
    r = layout.reshard if layout is not None else None
    if r is None:
        why = f"zone {zone} is not re-sharding (name a partition to cancel its rebalance)"
        return CancelReshard(None, False, why)
    moving = f"re-sharding {r.source} → {r.target}"
    if r.phase is ReshardPhase.ABORT:
        return CancelReshard(None, True, f"{moving} is already being aborted")
    if r.phase not in BEFORE_FLIP:
        why = (
            f"{moving} has flipped to {r.target} partitions (phase {r.phase}): it can no longer"
            " be cancelled; wait for its clean-up to finish"
        )
        return CancelReshard(None, False, why)
    return CancelReshard(r.source, True, f"{moving} aborted: the zone keeps {r.source} partitions")
