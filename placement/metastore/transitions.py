"""The pure half of the assignment transitions: states, decisions and transaction packing.

What :class:`~placement.metastore.store.Metastore` writes is decided here, without I/O: the
partition state read from etcd (:class:`PartitionState`), the writer's :class:`Fence`, the rule of
each transition (:func:`decide_trigger`, :func:`plan_trigger`, :func:`plan_finish`,
:func:`plan_cancel`, :func:`plan_finish_cancel`) as the compares and writes of one transaction,
and the grouping of many partitions' transactions within etcd's limits (:func:`pack`). The rules
and the table of compares per transition are in ``design/metastore.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Generic, TypeVar

from placement.core.model import Peers, ZoneSpec
from placement.errors import InvalidInput
from placement.metastore.codec import (
    Assignment,
    CancelIntent,
    Corrupt,
    LayoutValue,
    LeaseTerm,
    NodeRecord,
    PrimaryLease,
    TriggerMark,
    be8,
    decode_assignment,
    decode_cancel,
    decode_trigger,
    encode_assignment,
    encode_cancel,
    encode_primary,
    encode_term,
    encode_trigger,
    trigger_is_older,
)
from placement.metastore.keys import AssignField, KeyKind, KeySpace
from placement.metastore.kv import KeyValue, TxnResult
from placement.metastore.txn import (
    MAX_TXN_OPS,
    REQUEST_BYTES_BUDGET,
    Compare,
    Delete,
    Get,
    Op,
    Put,
    Txn,
    txn_ops,
    txn_request_bytes,
)

T = TypeVar("T")


class Outcome(StrEnum):
    """How a transition ended (when it did not raise)."""

    #: The transition's writes committed (for cancel: or the same cancel was already there).
    APPLIED = "applied"
    #: The trigger is not newer than the stored one: nothing written.
    STALE_TRIGGER = "stale_trigger"
    #: The pending key is not the one named (finished, cancelled or replaced; or no cancel to
    #: finish): nothing written.
    STALE = "stale"
    #: finish refused: a cancel of this pending exists, and cancel always wins. Nothing written.
    CANCELLED = "cancelled"
    #: A value the transition must carry over is undecodable: nothing written (cancel it).
    CORRUPT = "corrupt"


@dataclass(frozen=True, slots=True)
class Fence:
    """The writer's leadership: every write compares ``create_revision(leader_key) == epoch``.

    The epoch is the leader key's create revision, so a key deleted and created again (a later term
    of the same member) has a different epoch — a value compare could not tell the two apart.
    """

    leader_key: bytes
    epoch: int

    def compare(self) -> Compare:
        return Compare.create(self.leader_key, "==", self.epoch)

    def holds(self, leader: KeyValue | None) -> bool:
        return leader is not None and leader.create_revision == self.epoch


@dataclass(frozen=True, slots=True)
class Versioned(Generic[T]):
    """A decoded value with its etcd metadata; ``raw`` is what etcd holds (used in compares)."""

    value: T | Corrupt
    raw: bytes
    mod_revision: int
    create_revision: int


@dataclass(frozen=True, slots=True)
class PartitionState:
    """The assignment keys of one partition at one ``revision``; ``None`` = key absent."""

    zone: str
    partition: int
    revision: int
    stable: Versioned[Assignment] | None = None
    pending: Versioned[Assignment] | None = None
    planned: Versioned[Assignment] | None = None
    cancel: Versioned[CancelIntent] | None = None
    trigger: Versioned[TriggerMark] | None = None

    def entry(self, f: AssignField) -> Versioned[object] | None:
        # ``f`` is a str (StrEnum): the attribute's name itself, with no enum ``.value`` lookup
        # (a pass asks this for every partition of the fleet several times).
        entry: Versioned[object] | None = getattr(self, f)
        return entry

    def mod(self, f: AssignField) -> int:
        """``mod_revision`` of the key, 0 when absent (etcd's value for a missing key)."""
        entry = self.entry(f)
        return 0 if entry is None else entry.mod_revision

    def peers(self, f: AssignField) -> Peers | None:
        """Peers of stable/pending/planned; ``None`` when absent or corrupt."""
        entry: Versioned[object] | None = getattr(self, f)
        if entry is None:
            return None
        value = entry.value
        return value.peers if isinstance(value, Assignment) else None

    def holders(self) -> frozenset[str]:
        """The nodes that hold a replica (stable) or are taking one (pending)."""
        return frozenset(self.peers(AssignField.STABLE) or ()) | frozenset(
            self.peers(AssignField.PENDING) or ()
        )


@dataclass(frozen=True, slots=True)
class ZoneState:
    """Every partition of a zone with assignment keys, read at one ``revision``."""

    zone: str
    revision: int
    partitions: Mapping[int, PartitionState]

    def partition(self, partition: int) -> PartitionState:
        found = self.partitions.get(partition)
        return found if found is not None else PartitionState(self.zone, partition, self.revision)


class TriggerAction(StrEnum):
    """Which branch of rule 2 a trigger takes (:func:`decide_trigger`)."""

    #: No rebalance in progress and target != stable: pending := target.
    WRITE_PENDING = "write_pending"
    #: A rebalance in progress and target != pending: planned := target.
    WRITE_PLANNED = "write_planned"
    #: A rebalance in progress towards target already: planned removed.
    DELETE_PLANNED = "delete_planned"
    #: Nothing to move (target == stable, or == pending with no planned): only the trigger recorded.
    RECORD_ONLY = "record_only"
    #: The stored trigger is this revision, no rebalance is in progress, target != stable and no
    #: cancel held the partition there: pending := target, the trigger unchanged (a pending
    #: lost out of band is written again; design/metastore.md, "Pending recovery").
    RECOVER_PENDING = "recover_pending"
    #: The stored trigger is not older: nothing written.
    STALE = "stale"


@dataclass(frozen=True, slots=True)
class TransitionResult:
    """What a transition did; ``state`` is the partition after it (or as found, if not applied)."""

    outcome: Outcome
    state: PartitionState
    action: TriggerAction | None = None
    attempts: int = 1

    @property
    def revision(self) -> int:
        return self.state.revision


@dataclass(frozen=True, slots=True)
class TxnStats:
    """One batch transaction as sent: its op count (as etcd counts it), bytes and result."""

    partitions: int
    ops: int
    bytes: int
    succeeded: bool
    revision: int


@dataclass(frozen=True, slots=True)
class CreateResult:
    created: tuple[int, ...]
    existing: tuple[int, ...]
    txns: tuple[TxnStats, ...]


@dataclass(frozen=True, slots=True)
class BatchTriggerResult:
    results: Mapping[int, TransitionResult]
    txns: tuple[TxnStats, ...]


@dataclass(frozen=True, slots=True)
class ZoneRecord:
    """A zone's config (and, when read with it, its layout: design/resharding.md)."""

    name: str
    spec: ZoneSpec | Corrupt
    mod_revision: int
    create_revision: int
    #: The layout key's value (None = absent, or not read) and ``mod_revision`` (0 = absent).
    layout: LayoutValue | Corrupt | None = None
    layout_revision: int = 0


@dataclass(frozen=True, slots=True)
class ZoneWrite:
    """A zone config write: ``applied``, or not with the ``current`` record (None = absent)."""

    applied: bool
    revision: int
    current: ZoneRecord | None


@dataclass(frozen=True, slots=True)
class NodeEntry:
    name: str
    record: NodeRecord | Corrupt
    lease: int
    mod_revision: int


# -- pure decisions ----------------------------------------------------------------------------


def decide_trigger(state: PartitionState, target: Peers, trigger_revision: int) -> TriggerAction:
    """Rule 2 (design/metastore.md §3) as a pure function of the partition state.

    * stored trigger not older than ``trigger_revision`` (byte compare, as etcd does) -> STALE;
    * no pending: target != stable -> WRITE_PENDING, else RECORD_ONLY;
    * pending being cancelled (a cancel key exists): WRITE_PLANNED — the cancel may end on old or
      on new, so the target must survive it as planned (finish_cancel makes it pending; equal to
      stable it is a move without copies), never be dropped as "already pending";
    * pending: target == pending -> DELETE_PLANNED (RECORD_ONLY if there is none), else
      WRITE_PLANNED.

    Peers compare as ordered tuples: a new preferred primary is a new target. A corrupt stable or
    pending equals no target.

    A stored trigger of exactly ``trigger_revision`` (not older) is STALE — unless nothing is in
    progress (no pending, planned or cancel), stable is readable and not the target, and the
    trigger is not ``held`` by a cancel: RECOVER_PENDING (a pending deleted out of band).
    """
    if state.trigger is not None and not trigger_is_older(state.trigger.raw, trigger_revision):
        return (
            TriggerAction.RECOVER_PENDING
            if _recoverable(state, target, trigger_revision)
            else TriggerAction.STALE
        )
    if state.pending is None:
        if state.peers(AssignField.STABLE) != target:
            return TriggerAction.WRITE_PENDING
        return TriggerAction.RECORD_ONLY
    if state.cancel is not None:
        return TriggerAction.WRITE_PLANNED
    if state.peers(AssignField.PENDING) == target:
        return (
            TriggerAction.DELETE_PLANNED if state.planned is not None else TriggerAction.RECORD_ONLY
        )
    return TriggerAction.WRITE_PLANNED


def _recoverable(state: PartitionState, target: Peers, trigger_revision: int) -> bool:
    """A partition left off ``target`` at the trigger revision that asked for it, with nothing
    in progress and no cancel holding it there (see :func:`decide_trigger`)."""
    mark = state.trigger.value if state.trigger is not None else None
    if not isinstance(mark, TriggerMark) or mark.revision != trigger_revision or mark.held:
        return False
    if state.pending is not None or state.planned is not None or state.cancel is not None:
        return False
    stable = state.peers(AssignField.STABLE)
    return stable is not None and stable != target


@dataclass(frozen=True, slots=True)
class Write:
    """The partition-local part of a transition's transaction (the fence is added on sending)."""

    compares: tuple[Compare, ...]
    puts: Mapping[AssignField, bytes]
    deletes: tuple[AssignField, ...]


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    write: Write | None
    action: TriggerAction | None = None


def _restamp(entry: Versioned[Assignment], epoch: int, ts: int) -> bytes:
    """Carry an assignment to another key under the writer's epoch and ts (raw if corrupt)."""
    if isinstance(entry.value, Corrupt):
        return entry.raw
    return encode_assignment(replace(entry.value, epoch=epoch, ts=ts))


def _mod_is(keys: KeySpace, state: PartitionState, f: AssignField) -> Compare:
    return Compare.mod(keys.assign(state.zone, state.partition, f), "==", state.mod(f))


def plan_trigger(
    keys: KeySpace,
    state: PartitionState,
    target: Peers,
    trigger_revision: int,
    epoch: int,
    ts: int,
) -> Decision:
    """Compares and writes of a trigger on ``state`` (pure).

    Compares: trigger newer — ``value(trigger) < be8(new)`` when a trigger was read, else
    ``version(trigger) == 0`` (etcd's VALUE compare is false on a missing key, so the absent case
    is its own branch, chosen by what was read: a mismatch fails the txn and the re-read picks the
    other branch); ``mod_revision`` of stable, pending, planned and cancel equal to what was read
    (the decision depends on whether a cancel exists).
    """
    action = decide_trigger(state, target, trigger_revision)
    if action is TriggerAction.STALE:
        return Decision(Outcome.STALE_TRIGGER, None, action)
    z, p = state.zone, state.partition
    trigger_key = keys.assign(z, p, AssignField.TRIGGER)
    if action is TriggerAction.RECOVER_PENDING:
        trigger_cmp = _mod_is(keys, state, AssignField.TRIGGER)  # the very mark read
    elif state.trigger is not None:
        trigger_cmp = Compare.value(trigger_key, "<", be8(trigger_revision))
    else:
        trigger_cmp = Compare.version(trigger_key, "==", 0)
    compares = (
        trigger_cmp,
        _mod_is(keys, state, AssignField.STABLE),
        _mod_is(keys, state, AssignField.PENDING),
        _mod_is(keys, state, AssignField.PLANNED),
        _mod_is(keys, state, AssignField.CANCEL),
    )
    assignment = encode_assignment(Assignment(target, epoch, ts, trigger_revision))
    if action is TriggerAction.RECOVER_PENDING:
        return Decision(
            Outcome.APPLIED, Write(compares, {AssignField.PENDING: assignment}, ()), action
        )
    puts = {AssignField.TRIGGER: encode_trigger(TriggerMark(trigger_revision, epoch, ts))}
    deletes: tuple[AssignField, ...] = ()
    if action is TriggerAction.WRITE_PENDING:
        puts[AssignField.PENDING] = assignment
    elif action is TriggerAction.WRITE_PLANNED:
        puts[AssignField.PLANNED] = assignment
    if action is not TriggerAction.WRITE_PLANNED and state.planned is not None:
        deletes = (AssignField.PLANNED,)  # DELETE_PLANNED, or a stray planned without pending
    return Decision(Outcome.APPLIED, Write(compares, puts, deletes), action)


def plan_finish(
    keys: KeySpace, state: PartitionState, pending_revision: int, epoch: int, ts: int
) -> Decision:
    """``stable := pending; pending := planned (or delete); delete planned`` (pure).

    Compares: ``mod_revision(pending) == pending_revision``, ``version(cancel) == 0`` (cancel wins),
    ``mod_revision(planned)`` as read.
    """
    pending = state.pending
    if pending is None or pending.mod_revision != pending_revision:
        return Decision(Outcome.STALE, None)
    if state.cancel is not None:
        return Decision(Outcome.CANCELLED, None)
    if isinstance(pending.value, Corrupt):
        return Decision(Outcome.CORRUPT, None)
    z, p = state.zone, state.partition
    compares = (
        Compare.mod(keys.assign(z, p, AssignField.PENDING), "==", pending_revision),
        Compare.version(keys.assign(z, p, AssignField.CANCEL), "==", 0),
        _mod_is(keys, state, AssignField.PLANNED),
    )
    puts, deletes = _promote_planned(state, epoch, ts)
    puts[AssignField.STABLE] = _restamp(pending, epoch, ts)
    return Decision(Outcome.APPLIED, Write(compares, puts, deletes))


def _promote_planned(
    state: PartitionState, epoch: int, ts: int
) -> tuple[dict[AssignField, bytes], tuple[AssignField, ...]]:
    """``pending := planned (or delete); delete planned``."""
    if state.planned is not None:
        return {AssignField.PENDING: _restamp(state.planned, epoch, ts)}, (AssignField.PLANNED,)
    return {}, (AssignField.PENDING,)


def plan_cancel(
    keys: KeySpace, state: PartitionState, pending_revision: int, epoch: int, ts: int
) -> Decision:
    """Write ``cancel = (stable, pending, pending_revision)`` (pure).

    Compares: ``mod_revision(pending) == pending_revision``, ``mod_revision(cancel)`` as read (0:
    absent). An existing cancel of the same pending is APPLIED without writing.
    """
    pending = state.pending
    if pending is None or pending.mod_revision != pending_revision:
        return Decision(Outcome.STALE, None)
    existing = state.cancel
    if (
        existing is not None
        and isinstance(existing.value, CancelIntent)
        and existing.value.pending_revision == pending_revision
    ):
        return Decision(Outcome.APPLIED, None)
    z, p = state.zone, state.partition
    compares = (
        Compare.mod(keys.assign(z, p, AssignField.PENDING), "==", pending_revision),
        _mod_is(keys, state, AssignField.CANCEL),
    )
    intent = CancelIntent(
        old=state.peers(AssignField.STABLE) or (),
        new=state.peers(AssignField.PENDING) or (),
        pending_revision=pending_revision,
        epoch=epoch,
        ts=ts,
    )
    return Decision(
        Outcome.APPLIED, Write(compares, {AssignField.CANCEL: encode_cancel(intent)}, ())
    )


def plan_finish_cancel(
    keys: KeySpace,
    state: PartitionState,
    pending_revision: int,
    epoch: int,
    ts: int,
    *,
    already_done: bool,
) -> Decision:
    """End a cancelled rebalance (pure): ``pending := planned (or delete); delete planned, cancel``;
    stable unchanged — or, when the agents answered "already done", ``stable := pending``.
    Reverted, the trigger is re-stamped ``held``: the partition stays where the cancel left it
    until a newer trigger (never recovered at this one).

    Compares: ``mod_revision(pending) == pending_revision``, ``mod_revision(cancel)`` as read (and
    non-zero: a cancel must exist), ``mod_revision(planned)`` as read; when it re-stamps the
    trigger, ``mod_revision(trigger)`` as read.
    """
    pending = state.pending
    if pending is None or pending.mod_revision != pending_revision or state.cancel is None:
        return Decision(Outcome.STALE, None)
    if already_done and isinstance(pending.value, Corrupt):
        return Decision(Outcome.CORRUPT, None)
    z, p = state.zone, state.partition
    compares: tuple[Compare, ...] = (
        Compare.mod(keys.assign(z, p, AssignField.PENDING), "==", pending_revision),
        _mod_is(keys, state, AssignField.CANCEL),
        _mod_is(keys, state, AssignField.PLANNED),
    )
    puts, deletes = _promote_planned(state, epoch, ts)
    if already_done:
        puts[AssignField.STABLE] = _restamp(pending, epoch, ts)
    else:
        mark = state.trigger.value if state.trigger is not None else None
        if isinstance(mark, TriggerMark):
            compares = (*compares, _mod_is(keys, state, AssignField.TRIGGER))
            puts[AssignField.TRIGGER] = encode_trigger(replace(mark, epoch=epoch, ts=ts, held=True))
    return Decision(Outcome.APPLIED, Write(compares, puts, (*deletes, AssignField.CANCEL)))


@dataclass(frozen=True, slots=True)
class Ending:
    """One rebalance to end (the driver's verdict on the agents' answers): ``finish`` it, or
    — ``cancelled`` — ``finish_cancel`` it (``already_done``: the agents had completed it)."""

    zone: str
    partition: int
    pending_revision: int
    cancelled: bool = False
    already_done: bool = False


def plan_ending(
    keys: KeySpace, state: PartitionState, ending: Ending, epoch: int, ts: int
) -> Decision:
    """:func:`plan_finish` or :func:`plan_finish_cancel`, as ``ending`` says."""
    if ending.cancelled:
        return plan_finish_cancel(
            keys, state, ending.pending_revision, epoch, ts, already_done=ending.already_done
        )
    return plan_finish(keys, state, ending.pending_revision, epoch, ts)


def apply_write(state: PartitionState, write: Write, revision: int) -> PartitionState:
    """The partition after ``write`` committed at ``revision`` (pure: what a read at that
    revision returns, without the read — every key written gets ``mod_revision = revision``)."""
    fields: dict[AssignField, Versioned[object] | None] = {f: None for f in write.deletes}
    for f, raw in write.puts.items():
        before = state.entry(f)
        created = before.create_revision if before is not None else revision
        fields[f] = Versioned(_DECODERS[f](raw), raw, revision, created)
    return _with_fields(replace(state, revision=revision), fields)


# -- decoding ----------------------------------------------------------------------------------

_DECODERS: Mapping[AssignField, Callable[[bytes], object]] = {
    AssignField.STABLE: decode_assignment,
    AssignField.PENDING: decode_assignment,
    AssignField.PLANNED: decode_assignment,
    AssignField.CANCEL: decode_cancel,
    AssignField.TRIGGER: decode_trigger,
}


def assign_versioned(field: AssignField, kv: KeyValue) -> Versioned[object]:
    """An assignment key's value decoded as its ``field`` says, with its raw bytes and revisions."""
    return Versioned(_DECODERS[field](kv.value), kv.value, kv.mod_revision, kv.create_revision)


def _with_fields(
    state: PartitionState, fields: Mapping[AssignField, Versioned[object] | None]
) -> PartitionState:
    return replace(state, **{f.value: v for f, v in fields.items()})  # type: ignore[arg-type]


def partition_states(
    keys: KeySpace, zone: str, kvs: Iterable[KeyValue], revision: int
) -> dict[int, PartitionState]:
    """The partitions of ``zone`` found among ``kvs`` (any keys), decoded, as of ``revision``."""
    fields: dict[int, dict[AssignField, Versioned[object] | None]] = {}
    for kv in kvs:
        parsed = keys.parse(kv.key)
        if parsed is None or parsed.kind is not KeyKind.ASSIGN or parsed.name != zone:
            continue
        assert parsed.partition is not None
        assert parsed.field is not None
        fields.setdefault(parsed.partition, {})[parsed.field] = assign_versioned(parsed.field, kv)
    return {
        p: _with_fields(PartitionState(zone, p, revision), found)
        for p, found in sorted(fields.items())
    }


# -- batching ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Unit:
    """One partition's part of a batch transaction; its keys occur in no other unit."""

    partition: int
    compares: tuple[Compare, ...]
    ops: tuple[Op, ...]


def pack(
    units: Sequence[Unit], *, reserved_compares: int, reserved_ops: int = 0
) -> list[list[Unit]]:
    """Group units greedily, in order, so every transaction stays within etcd's limits:
    at most :data:`MAX_TXN_OPS` compares (incl. ``reserved_compares``) and success ops (incl.
    ``reserved_ops``), and at most :data:`REQUEST_BYTES_BUDGET` bytes. A single unit that does not
    fit alone is an error."""
    batches: list[list[Unit]] = []
    current: list[Unit] = []
    compares = reserved_compares
    ops = reserved_ops
    size = 0
    for unit in units:
        unit_size = txn_request_bytes(Txn(unit.compares, unit.ops))
        if (
            reserved_compares + len(unit.compares) > MAX_TXN_OPS
            or reserved_ops + len(unit.ops) > MAX_TXN_OPS
            or unit_size > REQUEST_BYTES_BUDGET
        ):
            raise InvalidInput(
                f"partition {unit.partition}",
                "does not fit in one transaction",
                "use smaller values",
            )
        if current and (
            compares + len(unit.compares) > MAX_TXN_OPS
            or ops + len(unit.ops) > MAX_TXN_OPS
            or size + unit_size > REQUEST_BYTES_BUDGET
        ):
            batches.append(current)
            current, compares, ops, size = [], reserved_compares, reserved_ops, 0
        current.append(unit)
        compares += len(unit.compares)
        ops += len(unit.ops)
        size += unit_size
    if current:
        batches.append(current)
    return batches


def batch_txn(
    fence: Fence, batch: Sequence[Unit], failure: tuple[Op, ...], read_back: Get | None = None
) -> Txn:
    """The fence and every unit's compares; every unit's ops (then ``read_back``: it sees them)."""
    ops = tuple(op for u in batch for op in u.ops)
    return Txn(
        (fence.compare(), *(c for u in batch for c in u.compares)),
        ops if read_back is None else (*ops, read_back),
        failure,
    )


def txn_stats(txn: Txn, partitions: int, result: TxnResult) -> TxnStats:
    return TxnStats(
        partitions, txn_ops(txn), txn_request_bytes(txn), result.succeeded, result.revision
    )


# -- primary leases --------------------------------------------------------------------------------

#: Primary-lease keys written per transaction (plus the fence compare: within etcd's 128).
PRIMARY_BATCH = 120
#: Compares per primary-lease transaction besides the fence (etcd: at most 128 per list): a
#: renewal needs one (the lease key), a move two (the lease key and the ISR key).
PRIMARY_COMPARES = 120


@dataclass(frozen=True, slots=True)
class LeaseWrite:
    """One lease to write: CAS the primary key from ``expected_mod`` (0 = absent) to ``lease``.

    ``isr_mod``: for a write that changes the holder, the ISR key's mod_revision the choice was
    made on (0 = no ISR key), compared in the same transaction; ``None`` for a write of the
    same holder (no ISR compare). ``term_mod``: for a cap, the mod_revision of the holder's
    lease term the cap was computed from (0 = no term), compared too — a cap never lands after
    a renewal of that term it did not see, so an agent never sees its term renewed before the
    cap of a lease it must give up."""

    lease: PrimaryLease
    expected_mod: int
    isr_mod: int | None = None
    term_mod: int | None = None

    @property
    def moves(self) -> bool:
        return self.isr_mod is not None


def _lease_ops(
    keys: KeySpace, zone: str, partition: int, write: LeaseWrite, epoch: int, ts: int
) -> tuple[list[Compare], Put]:
    key = keys.primary(zone, partition)
    compares = [Compare.mod(key, "==", write.expected_mod)]
    if write.isr_mod is not None:
        isr = keys.isr(zone, partition)
        compares.append(
            Compare.mod(isr, "==", write.isr_mod)
            if write.isr_mod
            else Compare.version(isr, "==", 0)
        )
    if write.term_mod is not None:
        compares.append(Compare.mod(keys.term(write.lease.node), "==", write.term_mod))
    return compares, Put(key, encode_primary(replace(write.lease, epoch=epoch, ts=ts)))


def plan_primary_txns(
    keys: KeySpace, zone: str, leases: Mapping[int, LeaseWrite], epoch: int, ts: int
) -> list[tuple[tuple[Compare, ...], tuple[Put, ...]]]:
    """The compares and puts of the transactions writing ``leases`` (the fence is added on
    sending): renewals and moves in separate transactions (an ISR change fails only the moves
    batched with it, never a renewal), each at most :data:`PRIMARY_BATCH` keys and
    :data:`PRIMARY_COMPARES` compares."""
    items = sorted(leases.items())
    txns: list[tuple[tuple[Compare, ...], tuple[Put, ...]]] = []
    for group in ([(p, w) for p, w in items if not w.moves], [(p, w) for p, w in items if w.moves]):
        compares: list[Compare] = []
        puts: list[Put] = []
        for p, lease_write in group:
            need, put = _lease_ops(keys, zone, p, lease_write, epoch, ts)
            if len(puts) == PRIMARY_BATCH or len(compares) + len(need) > PRIMARY_COMPARES:
                txns.append((tuple(compares), tuple(puts)))
                compares, puts = [], []
            compares.extend(need)
            puts.append(put)
        if puts:
            txns.append((tuple(compares), tuple(puts)))
    return txns


@dataclass(frozen=True, slots=True)
class TermWrite:
    """One lease term to write: CAS ``{p}/primary/@term/{node}`` from ``expected_mod``
    (0 = absent) to ``term``."""

    term: LeaseTerm
    expected_mod: int


def plan_term_txns(
    keys: KeySpace,
    writes: Mapping[str, TermWrite],
    drops: Mapping[str, int],
    epoch: int,
    ts: int,
) -> list[tuple[tuple[Compare, ...], tuple[Op, ...]]]:
    """The compares and ops of the transactions writing ``writes`` and deleting ``drops``
    (node -> mod_revision) — each key compared on its mod_revision — at most
    :data:`PRIMARY_BATCH` keys each (the fence is added on sending)."""
    items: list[tuple[Compare, Op]] = []
    for node, write in sorted(writes.items()):
        key = keys.term(node)
        term = replace(write.term, epoch=epoch, ts=ts)
        items.append((Compare.mod(key, "==", write.expected_mod), Put(key, encode_term(term))))
    for node, mod in sorted(drops.items()):
        key = keys.term(node)
        items.append((Compare.mod(key, "==", mod), Delete(key)))
    return [
        (tuple(c for c, _ in chunk), tuple(op for _, op in chunk))
        for start in range(0, len(items), PRIMARY_BATCH)
        for chunk in (items[start : start + PRIMARY_BATCH],)
    ]


# -- keys an agent owns ------------------------------------------------------------------------


def plan_owned_txns(items: Mapping[bytes, bytes], lease: int) -> list[tuple[Put, ...]]:
    """The puts of the transactions writing keys their writer owns (an agent's replica sizes)
    under its ``lease``, unconditionally: in key order, each transaction at most
    :data:`MAX_TXN_OPS` puts and :data:`REQUEST_BYTES_BUDGET` bytes. A single put that does not
    fit alone is an error."""
    txns: list[tuple[Put, ...]] = []
    current: list[Put] = []
    size = 0
    for key, value in sorted(items.items()):
        put = Put(key, value, lease=lease)
        put_size = txn_request_bytes(Txn((), (put,)))
        if put_size > REQUEST_BYTES_BUDGET:
            raise InvalidInput(repr(key), "does not fit in one transaction", "use a smaller value")
        if current and (len(current) == MAX_TXN_OPS or size + put_size > REQUEST_BYTES_BUDGET):
            txns.append(tuple(current))
            current, size = [], 0
        current.append(put)
        size += put_size
    if current:
        txns.append(tuple(current))
    return txns
