"""The replica agent's pure protocol core: examples per transition, then hypothesis."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from placement.core.model import Peers
from placement.errors import InvalidInput
from replica.protocol import (
    CancelOutcome,
    CreateReplica,
    Decision,
    DiscardReplica,
    Effect,
    MoveRequest,
    PartitionRecord,
    Phase,
    RebalanceOutcome,
    RetireOutcome,
    RetireRequest,
    StartCatchUp,
    StopCatchUp,
    on_cancel,
    on_move_finished,
    on_rebalance,
    on_retire,
    resume_effects,
    validate_request,
)

ME = "n1"
ZONE = "z"


def req(
    revision: int,
    epoch: int = 1,
    old: Peers = ("n2", "n3"),
    new: Peers = ("n1", "n2"),
    partition: int = 0,
    zone: str = ZONE,
) -> MoveRequest:
    return MoveRequest(zone, partition, old, new, revision, epoch)


def joined(revision: int = 5, epoch: int = 1) -> PartitionRecord:
    """A record where ``ME`` joined ``revision`` and finished catching up."""
    accepted = on_rebalance(None, req(revision, epoch), ME).record
    return on_move_finished(accepted, revision, succeeded=True).record


# --- Rebalance ---------------------------------------------------------------------------------


def test_joining_member_accepts_and_starts_catch_up_from_the_other_old_peers() -> None:
    d = on_rebalance(None, req(5, old=("n2", "n1"), new=("n1", "n3")), ME)
    assert d.outcome is RebalanceOutcome.ACCEPTED
    assert d.effects == (StartCatchUp(ZONE, 0, 5, ("n2",), ("n1", "n3")),)
    assert d.record.move is not None
    assert d.record.move.phase is Phase.IN_PROGRESS
    assert (d.record.accepted_revision, d.record.accepted_epoch) == (5, 1)
    assert d.record.config == ("n2", "n1")
    assert not d.record.hosted


def test_leaving_member_is_done_at_once_and_keeps_its_replica() -> None:
    record = replace(joined(3), config=("n1", "n2"))
    d = on_rebalance(record, req(5, old=("n1", "n2"), new=("n2", "n3")), ME)
    assert d.outcome is RebalanceOutcome.DONE
    assert d.effects == ()
    assert d.record.config == ("n2", "n3")
    assert d.record.hosted


def test_catch_up_success_makes_the_replica_complete_and_the_move_done() -> None:
    accepted = on_rebalance(None, req(5), ME).record
    d = on_move_finished(accepted, 5, succeeded=True)
    assert d.effects == (CreateReplica(ZONE, 0),)
    assert d.record.hosted
    assert d.record.config == ("n1", "n2")
    assert on_rebalance(d.record, req(5), ME) == Decision(
        d.record, RebalanceOutcome.DONE, (), "revision 5 is done"
    )


def test_resend_after_a_failed_catch_up_retries_it() -> None:
    failed = on_move_finished(on_rebalance(None, req(5), ME).record, 5, succeeded=False).record
    assert failed.move is not None
    assert failed.move.phase is Phase.FAILED
    d = on_rebalance(failed, req(5), ME)
    assert d.outcome is RebalanceOutcome.ACCEPTED
    assert [type(e) for e in d.effects] == [StartCatchUp]


def test_older_revision_is_stale_and_changes_nothing() -> None:
    record = joined(5)
    d = on_rebalance(record, req(4, epoch=9), ME)
    assert (d.outcome, d.record, d.effects) == (RebalanceOutcome.STALE, record, ())


def test_same_revision_adopts_a_higher_epoch_without_a_second_effect() -> None:
    accepted = on_rebalance(None, req(5, epoch=1), ME).record
    d = on_rebalance(accepted, req(5, epoch=2), ME)
    assert d.outcome is RebalanceOutcome.ACCEPTED
    assert d.effects == ()
    assert d.record == replace(accepted, accepted_epoch=2)
    lower = on_rebalance(d.record, req(5, epoch=1), ME)
    assert (lower.outcome, lower.record, lower.effects) == (RebalanceOutcome.STALE, d.record, ())


def test_higher_revision_supersedes_and_resumes_catch_up_without_discarding() -> None:
    accepted = on_rebalance(None, req(5), ME).record
    d = on_rebalance(accepted, req(7, old=("n2",), new=("n1", "n3")), ME)
    assert d.outcome is RebalanceOutcome.ACCEPTED
    assert d.effects == (StopCatchUp(ZONE, 0, 5), StartCatchUp(ZONE, 0, 7, ("n2",), ("n1", "n3")))


def test_higher_revision_without_this_node_drops_the_partial_replica() -> None:
    accepted = on_rebalance(None, req(5), ME).record
    d = on_rebalance(accepted, req(7, old=("n1", "n2"), new=("n2", "n3")), ME)
    assert d.outcome is RebalanceOutcome.DONE
    assert d.effects == (StopCatchUp(ZONE, 0, 5), DiscardReplica(ZONE, 0))
    assert not d.record.hosted
    assert d.record.config == ("n2", "n3")


# --- CancelRebalance ---------------------------------------------------------------------------


def test_cancel_of_the_move_in_progress_returns_to_old_and_discards_the_partial_replica() -> None:
    accepted = on_rebalance(None, req(5), ME).record
    d = on_cancel(accepted, req(5), ME)
    assert d.outcome is CancelOutcome.CANCELLED
    assert d.effects == (StopCatchUp(ZONE, 0, 5), DiscardReplica(ZONE, 0))
    assert d.record.config == ("n2", "n3")
    assert d.record.cancelled_revision == 5
    again = on_cancel(d.record, req(5), ME)
    assert (again.outcome, again.record, again.effects) == (CancelOutcome.CANCELLED, d.record, ())


def test_cancel_wins_over_a_resend_of_the_same_rebalance() -> None:
    cancelled = on_cancel(on_rebalance(None, req(5), ME).record, req(5), ME).record
    d = on_rebalance(cancelled, req(5, epoch=3), ME)
    assert (d.outcome, d.record, d.effects) == (RebalanceOutcome.STALE, cancelled, ())
    assert "cancelled" in d.detail


def test_cancel_with_nothing_in_progress_on_old_is_nothing_to_cancel_and_blocks_the_resend() -> (
    None
):
    d = on_cancel(None, req(5), ME)
    assert d.outcome is CancelOutcome.NOTHING_TO_CANCEL
    assert d.effects == ()
    assert d.record.config == ("n2", "n3")
    assert d.record.cancelled_revision == 5
    assert on_rebalance(d.record, req(5), ME).outcome is RebalanceOutcome.STALE


def test_cancel_after_the_move_finished_is_already_done() -> None:
    record = joined(5)
    d = on_cancel(record, req(5), ME)
    assert d.outcome is CancelOutcome.ALREADY_DONE
    assert d.effects == ()
    assert d.record.config == ("n1", "n2")
    assert d.record.hosted


def test_cancel_of_an_older_revision_is_stale() -> None:
    record = joined(5)
    d = on_cancel(record, req(4, epoch=9), ME)
    assert (d.outcome, d.record, d.effects) == (CancelOutcome.CANCEL_STALE, record, ())
    lower_epoch = on_cancel(replace(record, accepted_epoch=3), req(5, epoch=2), ME)
    assert lower_epoch.outcome is CancelOutcome.CANCEL_STALE


def test_late_completion_of_a_cancelled_catch_up_changes_nothing() -> None:
    cancelled = on_cancel(on_rebalance(None, req(5), ME).record, req(5), ME).record
    d = on_move_finished(cancelled, 5, succeeded=True)
    assert (d.record, d.effects) == (cancelled, ())


# --- retire, resume ----------------------------------------------------------------------------


def retire(revision: int, stable: Peers = ("n2", "n3"), epoch: int = 1) -> RetireRequest:
    return RetireRequest(ZONE, 0, stable, revision, epoch)


def test_retire_keeps_the_replica_while_stable_names_this_node() -> None:
    record = joined(5)
    d = on_retire(record, retire(6, ("n1", "n2")), ME)
    assert (d.outcome, d.record, d.effects) == (RetireOutcome.KEPT, record, ())


def test_retire_discards_once_stable_no_longer_names_this_node_and_a_repeat_is_identical() -> None:
    record = joined(5)
    d = on_retire(record, retire(9), ME)
    assert d.outcome is RetireOutcome.RETIRED
    assert d.effects == (DiscardReplica(ZONE, 0),)
    assert not d.record.hosted
    # Retire orders but never raises the accepted pair.
    assert (d.record.accepted_revision, d.record.accepted_epoch) == (5, 1)
    again = on_retire(d.record, retire(9), ME)
    assert (again.outcome, again.detail, again.record, again.effects) == (
        d.outcome,
        d.detail,
        d.record,
        (),
    )


def test_retire_older_than_the_accepted_rebalance_is_stale() -> None:
    record = joined(5, epoch=2)
    for request in (retire(4, epoch=9), retire(5, epoch=1)):
        d = on_retire(record, request, ME)
        assert (d.outcome, d.record, d.effects) == (RetireOutcome.RETIRE_STALE, record, ())
    # Not stale at (5, 2), but the move of revision 5 names this node: kept.
    assert on_retire(record, retire(5, epoch=2), ME).outcome is RetireOutcome.KEPT
    assert on_retire(record, retire(6, epoch=1), ME).outcome is RetireOutcome.RETIRED


def test_retire_keeps_a_replica_an_unfinished_or_equally_recent_move_names() -> None:
    catching_up = on_rebalance(None, req(5), ME).record
    d = on_retire(catching_up, retire(6), ME)
    assert (d.outcome, d.record, d.effects) == (RetireOutcome.KEPT, catching_up, ())
    # pending := planned commits with the finish: the new move has the stable's revision.
    rejoined = joined(7)
    assert on_retire(rejoined, retire(7), ME).outcome is RetireOutcome.KEPT
    assert on_retire(rejoined, retire(8), ME).outcome is RetireOutcome.RETIRED


def test_retire_of_an_unknown_partition_records_that_nothing_is_hosted() -> None:
    d = on_retire(None, retire(3), ME)
    assert d.outcome is RetireOutcome.RETIRED
    assert d.effects == ()
    assert (d.record.hosted, d.record.move, d.record.accepted_revision) == (False, None, 0)


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (retire(0), "revision"),
        (retire(3, epoch=0), "epoch"),
        (retire(3, ("n2", "n2")), "stable_peers"),
        (retire(3, ("bad name",)), "stable_peers[0]"),
        (RetireRequest("", 0, ("n2",), 3, 1), "zone"),
        (RetireRequest(ZONE, -1, ("n2",), 3, 1), "partition"),
    ],
)
def test_invalid_retire_names_the_field(request_: RetireRequest, field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        on_retire(None, request_, ME)
    assert err.value.field == field


def test_a_retire_with_no_stable_peers_discards_a_removed_partition() -> None:
    """design/resharding.md: a partition the layout no longer keeps is retired with empty
    stable peers — every replica goes, unless a move still running names this node."""
    d = on_retire(joined(5), retire(9, ()), ME)
    assert d.outcome is RetireOutcome.RETIRED
    assert not d.record.hosted
    assert on_retire(None, retire(9, ()), ME).outcome is RetireOutcome.RETIRED


def test_restart_resumes_only_moves_in_progress() -> None:
    accepted = on_rebalance(None, req(5), ME).record
    assert resume_effects(accepted, ME) == (StartCatchUp(ZONE, 0, 5, ("n2", "n3"), ("n1", "n2")),)
    assert resume_effects(joined(5), ME) == ()


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (req(0), "revision"),
        (req(-3), "revision"),
        (req(5, epoch=0), "epoch"),
        (req(5, new=()), "new_peers"),
        (req(5, old=("n2", "n2")), "old_peers"),
        (req(5, new=("n1", "n1")), "new_peers"),
        (req(5, old=("n2",), new=("n3",)), "new_peers"),
        (req(5, partition=-1), "partition"),
        (req(5, zone=""), "zone"),
        (req(5, zone="a/b"), "zone"),
        (req(5, old=("bad name",)), "old_peers[0]"),
    ],
)
def test_invalid_requests_name_the_field_and_decide_nothing(
    request_: MoveRequest, field: str
) -> None:
    with pytest.raises(InvalidInput) as err:
        validate_request(request_, ME)
    assert err.value.field == field
    with pytest.raises(InvalidInput):
        on_rebalance(None, request_, ME)
    with pytest.raises(InvalidInput):
        on_cancel(None, request_, ME)


def test_not_a_member_says_so() -> None:
    with pytest.raises(InvalidInput, match="this node is not a member of old or new"):
        validate_request(req(5, old=("n2",), new=("n3",)), ME)


# --- properties --------------------------------------------------------------------------------

_CONFIGS: list[Peers] = [
    (),
    ("n1",),
    ("n2",),
    ("n1", "n2"),
    ("n2", "n1"),
    ("n2", "n3"),
    ("n1", "n3"),
]
_PAIRS = [(o, n) for o in _CONFIGS for n in _CONFIGS if n and (ME in o or ME in n)]
REVISIONS = 6
#: A revision identifies one rebalance (one pending value in etcd): draw its peers once per run.
rebalances = st.lists(st.sampled_from(_PAIRS), min_size=REVISIONS, max_size=REVISIONS)
calls = st.tuples(
    st.sampled_from(["rebalance", "cancel"]), st.integers(1, REVISIONS), st.integers(1, 3)
)


def _apply(
    record: PartitionRecord | None, kind: str, request: MoveRequest, in_sync: bool = True
) -> Decision[object]:
    if kind == "rebalance":
        return on_rebalance(record, request, ME, in_sync)  # type: ignore[return-value]
    return on_cancel(record, request, ME)  # type: ignore[return-value]


def _request(pairs: list[tuple[Peers, Peers]], revision: int, epoch: int) -> MoveRequest:
    old, new = pairs[revision - 1]
    return req(revision, epoch, old=old, new=new)


@given(rebalances, st.lists(calls, min_size=1, max_size=12))
def test_a_driver_resending_its_whole_history_changes_nothing(
    pairs: list[tuple[Peers, Peers]], history: list[tuple[str, int, int]]
) -> None:
    record: PartitionRecord | None = None
    for kind, revision, epoch in history:
        record = _apply(record, kind, _request(pairs, revision, epoch)).record
    for kind, revision, epoch in history:
        d = _apply(record, kind, _request(pairs, revision, epoch))
        assert d.record == record
        assert d.effects == ()


class ProtocolMachine(RuleBasedStateMachine):
    """Random Rebalance/Cancel/completion/retire sequences against the core, with a model of
    what the I/O layer holds: the running catch-up task and the replica record."""

    def __init__(self) -> None:
        super().__init__()
        self.record: PartitionRecord | None = None
        self.task: int | None = None  # revision of the running catch-up
        self.replica: str | None = None  # None | "partial" | "complete"
        self.cancelled: set[int] = set()
        self.pairs: list[tuple[Peers, Peers]] = []

    @initialize(pairs=rebalances)
    def draw_rebalances(self, pairs: list[tuple[Peers, Peers]]) -> None:
        self.pairs = pairs

    def _execute(self, effects: tuple[Effect, ...]) -> None:
        """In the service's order: stop catch-ups, commit replica effects, start catch-ups."""
        for e in effects:
            if isinstance(e, StopCatchUp):
                assert self.task == e.revision, "stopping a catch-up that is not running"
                self.task = None
        for e in effects:
            if isinstance(e, CreateReplica):
                self.replica = "complete"
            elif isinstance(e, DiscardReplica):
                self.replica = None
        for e in effects:
            if isinstance(e, StartCatchUp):
                assert self.task is None, "two catch-ups for one partition"
                self.task = e.revision

    def _request(self, kind: str, request: MoveRequest, in_sync: bool = True) -> Decision[object]:
        before = self.record
        d = _apply(before, kind, request, in_sync)
        stale = d.outcome in (RebalanceOutcome.STALE, CancelOutcome.CANCEL_STALE)
        if stale:
            assert before is not None
            assert d.record == before
            assert d.effects == ()
        if before is not None:
            old = (before.accepted_revision, before.accepted_epoch)
            assert (d.record.accepted_revision, d.record.accepted_epoch) >= old
        self._execute(d.effects)
        self.record = d.record
        twice = _apply(d.record, kind, request, in_sync)
        assert (twice.outcome, twice.detail) == (d.outcome, d.detail)
        assert (twice.record, twice.effects) == (d.record, ())
        return d

    @rule(revision=st.integers(1, REVISIONS), epoch=st.integers(1, 3), in_sync=st.booleans())
    def rebalance(self, revision: int, epoch: int, in_sync: bool) -> None:
        request = _request(self.pairs, revision, epoch)
        before = self.record
        d = self._request("rebalance", request, in_sync)
        if request.revision in self.cancelled:
            assert d.outcome is RebalanceOutcome.STALE
        resend = (
            before is not None
            and before.move is not None
            and (before.move.revision, before.move.phase) == (revision, Phase.DONE)
        )
        if d.outcome is RebalanceOutcome.DONE and ME in request.new_peers and not resend:
            # a first DONE: this node holds a replica, and a current one
            assert d.record.hosted, "DONE without a replica"
            assert in_sync, "a replica out of the in-sync set answered DONE without catching up"

    @rule(revision=st.integers(1, REVISIONS), epoch=st.integers(1, 3))
    def cancel(self, revision: int, epoch: int) -> None:
        request = _request(self.pairs, revision, epoch)
        before = self.record
        d = self._request("cancel", request)
        if d.outcome is CancelOutcome.CANCEL_STALE:
            return
        self.cancelled.add(request.revision)
        if d.outcome is CancelOutcome.CANCELLED:
            assert d.record.config == request.old_peers
            in_progress = before is not None and before.move is not None and before.move.unfinished
            assert before is not None
            if in_progress and not before.hosted:
                assert DiscardReplica(ZONE, 0) in d.effects, "a partial copy was kept"
            if before.hosted:
                assert DiscardReplica(ZONE, 0) not in d.effects, "a cancel deleted a replica"
        elif d.outcome is CancelOutcome.NOTHING_TO_CANCEL:
            assert d.record.config == request.old_peers
        else:
            assert d.record.config == request.new_peers

    @precondition(lambda self: self.task is not None)
    @rule()
    def catch_up_writes(self) -> None:
        if self.replica is None:
            self.replica = "partial"

    @precondition(lambda self: self.task is not None)
    @rule(succeeded=st.booleans())
    def catch_up_ends(self, succeeded: bool) -> None:
        assert self.record is not None
        assert self.task is not None
        if succeeded and self.replica is None:
            self.replica = "partial"
        revision, self.task = self.task, None
        d = on_move_finished(self.record, revision, succeeded=succeeded)
        self._execute(d.effects)
        self.record = d.record

    @precondition(lambda self: self.record is not None)
    @rule(revision=st.integers(1, REVISIONS), succeeded=st.booleans())
    def late_completion(self, revision: int, succeeded: bool) -> None:
        assert self.record is not None
        if revision == self.task:
            return
        d = on_move_finished(self.record, revision, succeeded=succeeded)
        assert (d.record, d.effects) == (self.record, ())

    @precondition(lambda self: self.record is not None)
    @rule(
        stable=st.sampled_from([c for c in _CONFIGS if c]),
        revision=st.integers(1, REVISIONS + 1),
        epoch=st.integers(1, 3),
        in_sync=st.booleans(),
    )
    def retire(self, stable: Peers, revision: int, epoch: int, in_sync: bool) -> None:
        assert self.record is not None
        before = self.record
        d = on_retire(before, RetireRequest(ZONE, 0, stable, revision, epoch), ME, in_sync)
        if in_sync:
            assert not d.effects, "a replica the in-sync set names was deleted"
        assert (d.record.accepted_revision, d.record.accepted_epoch) == (
            before.accepted_revision,
            before.accepted_epoch,
        )
        if ME in stable or d.outcome is not RetireOutcome.RETIRED:
            assert (d.record, d.effects) == (before, ())
        else:
            assert not d.record.hosted
            assert self.replica != "partial", "retired while a move was unfinished"
        self._execute(d.effects)
        self.record = d.record
        twice = on_retire(d.record, RetireRequest(ZONE, 0, stable, revision, epoch), ME, in_sync)
        assert (twice.outcome, twice.detail, twice.record, twice.effects) == (
            d.outcome,
            d.detail,
            d.record,
            (),
        )

    @invariant()
    def record_matches_the_world(self) -> None:
        rec = self.record
        if rec is None:
            return
        assert rec.accepted_revision >= rec.cancelled_revision >= 0
        assert rec.hosted == (self.replica == "complete")
        move = rec.move
        running = move is not None and move.phase is Phase.IN_PROGRESS
        assert (self.task is not None) == running
        if move is not None and move.unfinished:
            assert self.task in (None, move.revision)
            assert move.revision == rec.accepted_revision
            assert ME in move.new
        if move is not None and move.phase is Phase.IN_PROGRESS and rec.hosted:
            assert self.replica == "complete", "a hosted replica catching up lost its data"
        if self.replica == "partial":
            assert move is not None, "a partial replica outlived its move"
            assert move.unfinished, "a partial replica outlived its move"


TestProtocolMachine = ProtocolMachine.TestCase
TestProtocolMachine.settings = settings(max_examples=200, stateful_step_count=25, deadline=None)


# -- in sync: a hosted replica is not necessarily a current one (design/data-plane.md) ---------


def test_a_hosted_member_out_of_the_in_sync_set_catches_up_before_done() -> None:
    """A move that keeps ``ME`` (hosted, but dropped from the in-sync set: it missed writes)
    does not answer DONE at once: its replica catches up first, and the end keeps the data."""
    hosted = joined(5)
    stay = req(9, old=("n1", "n2", "n3"), new=("n1",))
    current = on_rebalance(hosted, stay, ME, in_sync=True)
    assert current.outcome is RebalanceOutcome.DONE
    assert current.effects == ()
    stale = on_rebalance(hosted, stay, ME, in_sync=False)
    assert stale.outcome is RebalanceOutcome.ACCEPTED
    assert [type(e) for e in stale.effects] == [StartCatchUp]
    assert stale.record.hosted
    done = on_move_finished(stale.record, 9, succeeded=True)
    assert done.record.hosted
    assert done.record.move is not None
    assert done.record.move.phase is Phase.DONE
    assert not any(isinstance(e, DiscardReplica) for e in done.effects)


def test_a_cancelled_catch_up_of_a_hosted_replica_keeps_it() -> None:
    catching_up = on_rebalance(
        joined(5), req(9, old=("n1", "n2"), new=("n1", "n3")), ME, in_sync=False
    ).record
    cancelled = on_cancel(catching_up, req(9, old=("n1", "n2"), new=("n1", "n3")), ME)
    assert cancelled.outcome is CancelOutcome.CANCELLED
    assert [type(e) for e in cancelled.effects] == [StopCatchUp]
    assert cancelled.record.hosted
    superseded = on_rebalance(catching_up, req(10, old=("n1", "n2"), new=("n2", "n3")), ME)
    assert not any(isinstance(e, DiscardReplica) for e in superseded.effects)
    assert superseded.record.hosted


def test_a_replica_the_in_sync_set_names_is_never_deleted() -> None:
    hosted = joined(5)
    retire = RetireRequest(ZONE, 0, ("n2", "n3"), 7, 1)
    kept = on_retire(hosted, retire, ME, in_sync=True)
    assert kept.outcome is RetireOutcome.RETIRE_IN_SYNC
    assert kept.effects == ()
    assert kept.record == hosted
    gone = on_retire(hosted, retire, ME, in_sync=False)
    assert gone.outcome is RetireOutcome.RETIRED
    assert [type(e) for e in gone.effects] == [DiscardReplica]
