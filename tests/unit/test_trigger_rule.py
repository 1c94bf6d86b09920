"""The trigger rule, ``decide_trigger`` (design/metastore.md §3): what a target does to the keys."""

from __future__ import annotations

from placement.metastore.codec import (
    Assignment,
    CancelIntent,
    TriggerMark,
    decode_trigger,
    encode_trigger,
)
from placement.metastore.transitions import PartitionState, TriggerAction, Versioned, decide_trigger

A, B = ("n1", "n2"), ("n1", "n2", "n3")


def state(
    *, pending: tuple[str, ...] | None, cancel: bool, planned: bool = False, held: bool = False
) -> PartitionState:
    def v(peers: tuple[str, ...], rev: int) -> Versioned[Assignment]:
        return Versioned(Assignment(peers, 1, 0, 5), b"", rev, rev)

    trigger = TriggerMark(5, 1, 0, held)
    return PartitionState(
        "z",
        0,
        6,
        stable=v(A, 2),
        pending=v(pending, 3) if pending is not None else None,
        planned=v(A, 4) if planned else None,
        cancel=Versioned(CancelIntent(A, B, 3, 1, 0), b"", 5, 5) if cancel else None,
        trigger=Versioned(trigger, encode_trigger(trigger), 2, 2),
    )


def test_a_target_equal_to_a_pending_being_cancelled_is_kept_as_planned() -> None:
    # The cancel may revert to stable A: the target B must survive as planned, not be dropped.
    assert decide_trigger(state(pending=B, cancel=True), B, 9) is TriggerAction.WRITE_PLANNED
    assert decide_trigger(state(pending=B, cancel=True), A, 9) is TriggerAction.WRITE_PLANNED


def test_without_a_cancel_the_rule_is_unchanged() -> None:
    assert decide_trigger(state(pending=B, cancel=False), B, 9) is TriggerAction.RECORD_ONLY
    assert (
        decide_trigger(state(pending=B, cancel=False, planned=True), B, 9)
        is TriggerAction.DELETE_PLANNED
    )
    assert decide_trigger(state(pending=B, cancel=False), A, 9) is TriggerAction.WRITE_PLANNED
    assert decide_trigger(state(pending=None, cancel=False), B, 9) is TriggerAction.WRITE_PENDING
    assert decide_trigger(state(pending=None, cancel=False), A, 9) is TriggerAction.RECORD_ONLY
    assert decide_trigger(state(pending=B, cancel=True), B, 5) is TriggerAction.STALE


def test_a_pending_lost_out_of_band_is_recovered_at_the_same_revision() -> None:
    """Nothing in progress, stable is not the target of the very trigger stored: the pending
    that trigger wrote is gone (deleted out of band) — written again."""
    lost = state(pending=None, cancel=False)
    assert decide_trigger(lost, B, 5) is TriggerAction.RECOVER_PENDING
    assert decide_trigger(lost, A, 5) is TriggerAction.STALE  # on its target: nothing to do
    assert decide_trigger(lost, B, 4) is TriggerAction.STALE  # an older trigger: never
    assert decide_trigger(state(pending=B, cancel=False), A, 5) is TriggerAction.STALE


def test_a_cancel_holds_the_partition_until_a_newer_trigger() -> None:
    held = state(pending=None, cancel=False, held=True)
    assert decide_trigger(held, B, 5) is TriggerAction.STALE
    assert decide_trigger(held, B, 6) is TriggerAction.WRITE_PENDING


def test_the_held_mark_round_trips_and_is_absent_when_false() -> None:
    plain, held = TriggerMark(5, 1, 0), TriggerMark(5, 1, 0, held=True)
    assert b"held" not in encode_trigger(plain)
    assert decode_trigger(encode_trigger(plain)) == plain
    assert decode_trigger(encode_trigger(held)) == held
    # Bytes after the revision do not change the ordering of triggers.
    assert encode_trigger(held)[:8] == encode_trigger(plain)[:8]
