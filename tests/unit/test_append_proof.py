"""Who may append (replica.data.follower.unproven, design/data-plane.md): only the node the
follower's view shows holding the partition's lease at the append's epoch."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from placement.metastore.codec import PrimaryLease
from replica.data.follower import unproven, view_lags
from replica.data.model import AppendCall, AppendOutcome

NODES = st.sampled_from(["n1", "n2", "n3"])


def _call(primary: str, epoch: int) -> AppendCall:
    return AppendCall("z", 0, epoch, primary, 0, 0, (), 0)


@given(
    sender=NODES,
    primary=NODES,
    epoch=st.integers(0, 5),
    lease=st.none() | st.tuples(NODES, st.integers(0, 5)),
)
def test_an_append_is_applied_only_from_the_lease_holder_at_its_epoch(
    sender: str, primary: str, epoch: int, lease: tuple[str, int] | None
) -> None:
    held = PrimaryLease(lease[0], lease[1], 0) if lease is not None else None
    reply = unproven(_call(primary, epoch), sender, held)
    proven = held is not None and sender == primary == held.node and epoch == held.lease_epoch
    assert (reply is None) is proven
    if reply is not None and held is not None and sender == primary and epoch < held.lease_epoch:
        # etcd holds a newer lease: the sender is deposed, and learns the epoch that fenced it
        assert reply.outcome is AppendOutcome.STALE_EPOCH
        assert reply.lease_epoch == held.lease_epoch
    elif reply is not None:
        assert reply.outcome is AppendOutcome.UNPROVEN


def test_a_follower_waits_for_its_view_only_when_every_append_lags_and_never_on_a_heartbeat() -> (
    None
):
    """``view_lags``: an empty Replicate (the pair's heartbeat) never waits — it did, 1 s each,
    once the wait was taken only when all appends lag (all([]) is true); one proven append of
    another partition answers at once; only appends whose lease the view lacks or has older wait.
    """
    leases = {0: PrimaryLease("n1", 3, 0), 1: None}

    def lease_of(call: AppendCall) -> PrimaryLease | None:
        return leases[call.partition]

    def call(partition: int, epoch: int, primary: str = "n1") -> AppendCall:
        return AppendCall("z", partition, epoch, primary, 0, 0, (), 0)

    assert not view_lags([], "n1", lease_of)
    assert view_lags([call(0, 4)], "n1", lease_of)  # a newer epoch than the view's
    assert view_lags([call(1, 1)], "n1", lease_of)  # no lease in the view yet
    assert not view_lags([call(0, 3)], "n1", lease_of)  # proven
    assert not view_lags([call(0, 4), call(0, 3)], "n1", lease_of)  # one proven: no wait
    assert not view_lags([call(1, 1, "n2")], "n1", lease_of)  # forged sender: refused at once
