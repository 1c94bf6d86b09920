"""Who may append (replica.data.follower.unproven, design/data-plane.md): only the node the
follower's view shows holding the partition's lease at the append's epoch."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from placement.metastore.codec import PrimaryLease
from replica.data.follower import unproven
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
