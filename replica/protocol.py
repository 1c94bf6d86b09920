"""Pure core of the replica agent's rebalance protocol (design/replica-protocol.md).

No I/O, no clock, no protobuf: every function maps (record, request) to a ``Decision`` — the next
record, the answer and the effects the I/O layer must execute. The service persists the record
(and the storage effects) in one transaction *before* it answers, so an answer is never
contradicted by a restart.

Ordering. Requests are ordered by ``(revision, epoch)`` lexicographically: ``revision`` is the
pending key's etcd ``mod_revision`` (unique per rebalance), ``epoch`` the driver leader's term.
The revision alone identifies a rebalance; its peers are not re-checked on a resend.

State machine of one partition on one agent ``me`` (the ``move`` of the record;
A = accepted_revision, C = cancelled_revision, r = the request's revision)::

    IDLE            move is None
    IN_PROGRESS(r)  me joins move r and is catching up (a catch-up task runs; not hosted)
    FAILED(r)       the catch-up for r failed; waits for a resend of r (retry) or a cancel
    DONE(r)         move r finished locally; config == new
    CANCELLED(r)    move r was cancelled (or abandoned for a cancelled newer revision)

    any    --Rebalance r<A | r==A, lower epoch | r==C-->          unchanged            STALE
    any    --Rebalance r>A, me in new, not hosted-->              IN_PROGRESS(r)       ACCEPTED
             [StopCatchUp(older), StartCatchUp(r)]
    any    --Rebalance r>A, me in new, hosted, not in sync-->     IN_PROGRESS(r)       ACCEPTED
             [StopCatchUp(older), StartCatchUp(r)]  (the catch-up ends when the ISR names me)
    any    --Rebalance r>A, nothing to copy-->                    DONE(r), config=new  DONE
             [StopCatchUp(older), DiscardReplica if an older catch-up left a partial replica]
    IN_PROGRESS(r) / DONE(r) --Rebalance r, epoch >=-->           epoch adopted   ACCEPTED / DONE
    FAILED(r)      --Rebalance r, epoch >=-->                     IN_PROGRESS(r)       ACCEPTED
             [StartCatchUp(r)]
    IN_PROGRESS(r) / FAILED(r) --Cancel r-->                      CANCELLED(r), config=old
             [StopCatchUp(r), DiscardReplica]                                          CANCELLED
    CANCELLED(r)   --Cancel r-->                                  unchanged            CANCELLED
    other  --Cancel r>=A-->  an older unfinished move is abandoned (as on a supersede);
             config==old -> NOTHING_TO_CANCEL; config==new -> ALREADY_DONE;
             neither -> config=old, NOTHING_TO_CANCEL
    any    --Cancel (r, epoch) < (A, accepted_epoch)-->           unchanged            CANCEL_STALE
    IN_PROGRESS(r) --catch-up succeeded-->  DONE(r), config=new, hosted  [CreateReplica]
    IN_PROGRESS(r) --catch-up failed-->     FAILED(r)
    any    --Retire (s, epoch) < (A, accepted_epoch)-->           unchanged            RETIRE_STALE
    any    --Retire s, named by stable / an unfinished move / a DONE move >= s-->  unchanged  KEPT
    hosted --Retire s, named by none of them, the ISR names me-->  unchanged      RETIRE_IN_SYNC
    hosted --Retire s, named by none of them-->   hosted=False [DiscardReplica]        RETIRED
    not hosted --Retire s, named by none of them-->               unchanged            RETIRED

Every non-stale Rebalance or Cancel sets ``(A, accepted_epoch) := (r, epoch)``; every non-stale
Cancel also sets ``C := r``, so cancel always wins over a resend of the same rebalance. Retire
(``s`` = the etcd revision of the transaction that committed stable) never changes A.

**In sync** (``in_sync``: the partition's in-sync set names this node, or no set exists yet —
design/data-plane.md): a hosted replica is not necessarily a current one — its node may have
been dropped from the in-sync set (it was down, or not registered) and missed writes. So a member
of ``new`` that is hosted but not in sync catches up like a joining one (its learner pulls from
the primary until the primary adds it) before it answers DONE: a move never finishes onto
replicas that may lack acknowledged writes. And a replica the in-sync set still names is never
deleted (RETIRE_IN_SYNC; the driver retries): a new primary is chosen among that set's members,
and one whose data was deleted would lose every acknowledged write. The abandoned or cancelled
catch-up of a hosted replica keeps it (only a partial copy is discarded).

Record invariants (checked by the tests): ``A >= C >= 0``; ``(A, accepted_epoch)`` never
decreases; an unfinished move (IN_PROGRESS/FAILED) has revision A, names ``me`` in ``new`` and
``hosted`` is False; ``config`` changes only when a move finishes (-> new), is cancelled
(-> old) or a newer revision is accepted (-> its old).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Generic, TypeVar

from placement.core.model import PartitionScoped, Peers
from placement.core.names import validate_name, validate_partition
from placement.errors import InvalidInput


class Phase(Enum):
    """Where a move stands on this agent."""

    IN_PROGRESS = "in_progress"
    FAILED = "failed"
    DONE = "done"
    CANCELLED = "cancelled"


class RebalanceOutcome(Enum):
    """The answer to a Rebalance (mirrors ``placement.v1.RebalanceOutcome``)."""

    ACCEPTED = "accepted"
    DONE = "done"
    STALE = "stale"
    FAILED = "failed"


class CancelOutcome(Enum):
    """The answer to a CancelRebalance (mirrors ``placement.v1.CancelOutcome``)."""

    CANCELLED = "cancelled"
    NOTHING_TO_CANCEL = "nothing_to_cancel"
    ALREADY_DONE = "already_done"
    CANCEL_STALE = "cancel_stale"


class RetireOutcome(Enum):
    """The answer to a Retire (mirrors ``placement.v1.RetireOutcome``)."""

    RETIRED = "retired"
    KEPT = "kept"
    RETIRE_STALE = "retire_stale"
    #: Nothing deleted while the in-sync set names this node; the driver retries.
    RETIRE_IN_SYNC = "retire_in_sync"


@dataclass(frozen=True, slots=True)
class Move:
    """The rebalance ``old -> new`` identified by ``revision`` and where it stands here."""

    old: Peers
    new: Peers
    revision: int
    phase: Phase

    @property
    def unfinished(self) -> bool:
        """True while the move may still complete (a catch-up runs or waits for a retry)."""
        return self.phase in (Phase.IN_PROGRESS, Phase.FAILED)


@dataclass(frozen=True, slots=True)
class PartitionRecord(PartitionScoped):
    """Everything this agent persists for one partition; see the module docstring."""

    accepted_revision: int
    accepted_epoch: int
    cancelled_revision: int
    config: Peers
    move: Move | None
    hosted: bool


@dataclass(frozen=True, slots=True)
class MoveRequest(PartitionScoped):
    """A Rebalance or CancelRebalance request, already converted from protobuf."""

    old_peers: Peers
    new_peers: Peers
    revision: int
    epoch: int


@dataclass(frozen=True, slots=True)
class RetireRequest(PartitionScoped):
    """A Retire request: stable is ``stable_peers`` as of etcd revision ``revision``."""

    stable_peers: Peers
    revision: int
    epoch: int


@dataclass(frozen=True, slots=True)
class StartCatchUp:
    """Bring this node's replica up to date from ``sources`` (run in the background).

    On completion the I/O layer calls ``on_move_finished(record, revision, ...)``.
    """

    zone: str
    partition: int
    revision: int
    sources: Peers
    target: Peers


@dataclass(frozen=True, slots=True)
class StopCatchUp:
    """Stop the catch-up of ``revision`` and wait for it before the decision is persisted."""

    zone: str
    partition: int
    revision: int


@dataclass(frozen=True, slots=True)
class CreateReplica:
    """This node now holds a complete replica (committed with the record)."""

    zone: str
    partition: int


@dataclass(frozen=True, slots=True)
class DiscardReplica:
    """Delete this node's (complete or partial) replica (committed with the record)."""

    zone: str
    partition: int


Effect = StartCatchUp | StopCatchUp | CreateReplica | DiscardReplica
OutcomeT = TypeVar("OutcomeT")


@dataclass(frozen=True, slots=True)
class Decision(Generic[OutcomeT]):
    """The next record, the answer and the effects; ``record`` unchanged and no effects = no-op."""

    record: PartitionRecord
    outcome: OutcomeT
    effects: tuple[Effect, ...] = ()
    detail: str = ""


def validate_partition_key(zone: str, partition: int) -> None:
    """A partition is named by a valid zone and an id in ``0 .. MAX_PARTITIONS-1``."""
    validate_name(zone, "zone")
    validate_partition(partition)


def validate_peers(field: str, peers: Peers) -> None:
    seen: set[str] = set()
    for i, peer in enumerate(peers):
        validate_name(peer, f"{field}[{i}]")
        if peer in seen:
            raise InvalidInput(field, f"duplicate peer {peer!r}", "list each node once")
        seen.add(peer)


def validate_request(request: MoveRequest, me: str) -> None:
    """Raise ``InvalidInput`` naming the field; called before anything is decided or written."""
    validate_partition_key(request.zone, request.partition)
    if request.revision <= 0:
        raise InvalidInput(
            "revision", f"must be > 0, got {request.revision}", "send pending's mod_revision"
        )
    if request.epoch <= 0:
        raise InvalidInput("epoch", f"must be > 0, got {request.epoch}", "send the leader's epoch")
    if not request.new_peers:
        raise InvalidInput("new_peers", "must not be empty", "name at least one peer")
    validate_peers("old_peers", request.old_peers)
    validate_peers("new_peers", request.new_peers)
    if me not in request.old_peers and me not in request.new_peers:
        raise InvalidInput(
            "new_peers",
            "this node is not a member of old or new",
            f"send it to {me!r}'s peers only",
        )


def fresh_record(request: PartitionScoped, config: Peers) -> PartitionRecord:
    """The record of a partition this agent has never heard of: nothing accepted, on ``config``."""
    return PartitionRecord(
        zone=request.zone,
        partition=request.partition,
        accepted_revision=0,
        accepted_epoch=0,
        cancelled_revision=0,
        config=config,
        move=None,
        hosted=False,
    )


def _record_for(record: PartitionRecord | None, request: MoveRequest) -> PartitionRecord:
    if record is None:
        return fresh_record(request, request.old_peers)
    if record.key != request.key:
        raise ValueError(f"record {record.key} does not belong to request {request.key}")
    return record


def _abandon(record: PartitionRecord) -> tuple[PartitionRecord, tuple[Effect, ...]]:
    """Give up an unfinished move: stop its catch-up and drop the partial replica it left (a
    hosted replica that was catching up is kept)."""
    move = record.move
    if move is None or not move.unfinished:
        return record, ()
    effects: list[Effect] = []
    if move.phase is Phase.IN_PROGRESS:
        effects.append(StopCatchUp(record.zone, record.partition, move.revision))
    if not record.hosted:
        effects.append(DiscardReplica(record.zone, record.partition))
    return replace(record, move=replace(move, phase=Phase.CANCELLED)), tuple(effects)


def _start(
    record: PartitionRecord, request: MoveRequest, me: str, in_sync: bool
) -> tuple[PartitionRecord, tuple[Effect, ...]]:
    """Begin move ``request`` on a record whose (revision, epoch) was already raised."""
    if me in request.new_peers and not (record.hosted and in_sync):
        job = StartCatchUp(
            zone=request.zone,
            partition=request.partition,
            revision=request.revision,
            sources=tuple(p for p in request.old_peers if p != me),
            target=request.new_peers,
        )
        move = Move(request.old_peers, request.new_peers, request.revision, Phase.IN_PROGRESS)
        return replace(record, move=move), (job,)
    move = Move(request.old_peers, request.new_peers, request.revision, Phase.DONE)
    return replace(record, move=move, config=request.new_peers), ()


def on_rebalance(
    record: PartitionRecord | None, request: MoveRequest, me: str, in_sync: bool = True
) -> Decision[RebalanceOutcome]:
    """Decide a Rebalance; see the state machine in the module docstring (``in_sync``: whether
    the partition's in-sync set names this node, or none exists)."""
    validate_request(request, me)
    rec = _record_for(record, request)
    r, e = request.revision, request.epoch
    if r < rec.accepted_revision:
        return Decision(
            rec,
            RebalanceOutcome.STALE,
            detail=f"revision {r} < accepted revision {rec.accepted_revision}",
        )
    if r == rec.cancelled_revision:
        return Decision(rec, RebalanceOutcome.STALE, detail=f"revision {r} was cancelled")
    if r == rec.accepted_revision and e < rec.accepted_epoch:
        return Decision(
            rec, RebalanceOutcome.STALE, detail=f"epoch {e} < accepted epoch {rec.accepted_epoch}"
        )
    move = rec.move
    if r == rec.accepted_revision and move is not None and move.revision == r:
        adopted = replace(rec, accepted_epoch=e)
        if move.phase is Phase.DONE:
            return Decision(adopted, RebalanceOutcome.DONE, detail=f"revision {r} is done")
        if move.phase is Phase.IN_PROGRESS:
            return Decision(
                adopted, RebalanceOutcome.ACCEPTED, detail=f"revision {r} is in progress"
            )
        # FAILED: a resend is the driver's retry (a hosted replica back in sync is done).
        restarted, effects = _start(adopted, request, me, in_sync)
        if not effects:
            return Decision(restarted, RebalanceOutcome.DONE, detail=f"revision {r} is done")
        return Decision(
            restarted, RebalanceOutcome.ACCEPTED, effects, f"revision {r} is in progress"
        )
    abandoned, stop = _abandon(
        replace(rec, accepted_revision=r, accepted_epoch=e, config=request.old_peers)
    )
    started, effects = _start(abandoned, request, me, in_sync)
    if any(isinstance(x, StartCatchUp) for x in effects):
        # The new catch-up resumes from the partial replica instead of discarding it.
        stop = tuple(x for x in stop if not isinstance(x, DiscardReplica))
        return Decision(
            started, RebalanceOutcome.ACCEPTED, stop + effects, f"revision {r} is in progress"
        )
    return Decision(started, RebalanceOutcome.DONE, stop + effects, f"revision {r} is done")


def on_cancel(
    record: PartitionRecord | None, request: MoveRequest, me: str
) -> Decision[CancelOutcome]:
    """Decide a CancelRebalance; the three Ignite cases plus CANCEL_STALE."""
    validate_request(request, me)
    rec = _record_for(record, request)
    r, e = request.revision, request.epoch
    if (r, e) < (rec.accepted_revision, rec.accepted_epoch):
        return Decision(
            rec,
            CancelOutcome.CANCEL_STALE,
            detail=f"({r}, {e}) < accepted ({rec.accepted_revision}, {rec.accepted_epoch})",
        )
    rec = replace(rec, accepted_revision=r, accepted_epoch=e, cancelled_revision=r)
    move = rec.move
    if move is not None and move.revision == r and move.phase is not Phase.DONE:
        cancelled, effects = _abandon(rec)
        return Decision(
            replace(cancelled, config=move.old),
            CancelOutcome.CANCELLED,
            effects,
            f"revision {r} cancelled",
        )
    if move is not None and move.revision == r:
        return Decision(rec, CancelOutcome.ALREADY_DONE, detail=f"revision {r} already done")
    rec, effects = _abandon(rec)
    if rec.config == request.old_peers:
        return Decision(
            rec, CancelOutcome.NOTHING_TO_CANCEL, effects, "nothing in progress; group is on old"
        )
    if rec.config == request.new_peers:
        return Decision(
            rec, CancelOutcome.ALREADY_DONE, effects, "nothing in progress; group is on new"
        )
    return Decision(
        replace(rec, config=request.old_peers),
        CancelOutcome.NOTHING_TO_CANCEL,
        effects,
        "nothing in progress; group is on old",
    )


def on_move_finished(record: PartitionRecord, revision: int, *, succeeded: bool) -> Decision[None]:
    """A catch-up ended. A late completion of an abandoned move changes nothing."""
    move = record.move
    if move is None or move.revision != revision or move.phase is not Phase.IN_PROGRESS:
        return Decision(record, None, detail=f"revision {revision} is no longer in progress")
    if not succeeded:
        return Decision(
            replace(record, move=replace(move, phase=Phase.FAILED)), None, detail="catch-up failed"
        )
    done = replace(record, move=replace(move, phase=Phase.DONE), config=move.new, hosted=True)
    return Decision(
        done, None, (CreateReplica(record.zone, record.partition),), f"revision {revision} done"
    )


def validate_retire(request: RetireRequest) -> None:
    """Raise ``InvalidInput`` naming the field; called before anything is decided or written."""
    validate_partition_key(request.zone, request.partition)
    if request.revision <= 0:
        raise InvalidInput(
            "revision",
            f"must be > 0, got {request.revision}",
            "send the revision at which stable was switched",
        )
    if request.epoch <= 0:
        raise InvalidInput("epoch", f"must be > 0, got {request.epoch}", "send the leader's epoch")
    if request.stable_peers:  # empty: the partition was removed by re-sharding
        validate_peers("stable_peers", request.stable_peers)


def on_retire(
    record: PartitionRecord | None, request: RetireRequest, me: str, in_sync: bool = False
) -> Decision[RetireOutcome]:
    """Stable switched (at ``request.revision``): drop this node's replica once nothing names it.

    Make-before-break: a leaving member keeps serving until the switch of stable is committed,
    and the driver sends Retire only after it. Ordering: ``(revision, epoch) < (accepted,
    accepted_epoch)`` -> RETIRE_STALE (a rebalance written after that stable was accepted here;
    it decides). Otherwise the replica is kept while stable names this node, an unfinished move
    names it, or the move at or after ``revision`` (pending := planned shares the finish's
    revision) names it in ``new``; else it is discarded. Retire never raises ``accepted``: its
    revision is a stable's, not a rebalance's, and fencing rebalances with it could refuse a
    pending this node has not heard of yet. A repeat finds the same record: same answer, no effect.
    """
    validate_retire(request)
    if record is None:
        record = fresh_record(request, request.stable_peers)
    elif record.key != request.key:
        raise ValueError(f"record {record.key} does not belong to request {request.key}")
    s, e = request.revision, request.epoch
    if (s, e) < (record.accepted_revision, record.accepted_epoch):
        return Decision(
            record,
            RetireOutcome.RETIRE_STALE,
            detail=(f"({s}, {e}) < accepted ({record.accepted_revision}, {record.accepted_epoch})"),
        )
    move = record.move
    if move is not None and move.unfinished:
        return Decision(
            record,
            RetireOutcome.KEPT,
            detail=f"the unfinished move of revision {move.revision} names this node",
        )
    if me in request.stable_peers:
        return Decision(
            record, RetireOutcome.KEPT, detail=f"stable at revision {s} names this node"
        )
    if move is not None and move.revision >= s and move.phase is Phase.DONE and me in move.new:
        return Decision(
            record,
            RetireOutcome.KEPT,
            detail=f"the move of revision {move.revision} names this node",
        )
    detail = f"retired: stable at revision {s} does not name this node"
    if not record.hosted:
        return Decision(record, RetireOutcome.RETIRED, detail=detail)
    if in_sync:
        return Decision(
            record,
            RetireOutcome.RETIRE_IN_SYNC,
            detail="the in-sync set still names this node; retry once its primary removed it",
        )
    discard = DiscardReplica(record.zone, record.partition)
    return Decision(replace(record, hosted=False), RetireOutcome.RETIRED, (discard,), detail)


def resume_effects(record: PartitionRecord, me: str) -> tuple[Effect, ...]:
    """After a restart: restart the catch-up of a move that was in progress when the agent died."""
    move = record.move
    if move is None or move.phase is not Phase.IN_PROGRESS:
        return ()
    sources = tuple(p for p in move.old if p != me)
    return (StartCatchUp(record.zone, record.partition, move.revision, sources, move.new),)
