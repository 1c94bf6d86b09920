"""The replication transport's conversions: plain messages survive protobuf both ways."""

from __future__ import annotations

from placement.v1 import data_pb2
from replica.data.model import (
    AppendCall,
    AppendOutcome,
    AppendReply,
    FetchCall,
    FetchOutcome,
    FetchReply,
)
from replica.data.peers import (
    append_call_from_pb,
    append_call_to_pb,
    append_reply_from_pb,
    append_reply_to_pb,
    fetch_call_from_pb,
    fetch_call_to_pb,
    fetch_reply_from_pb,
    fetch_reply_to_pb,
)
from replica.data.storage import Entry

ENTRIES = (Entry(5, 2, b"k", b"v"), Entry(6, 2, b"gone", b"", True))


def test_append_round_trips() -> None:
    for tail in (False, True):
        call = AppendCall("orders", 3, 7, "n1", 4, 2, ENTRIES, 4, tail)
        assert append_call_from_pb(append_call_to_pb(call)) == call
    for outcome in AppendOutcome:
        reply = AppendReply(outcome, 6, 2, 7)
        assert append_reply_from_pb(append_reply_to_pb(reply)) == reply


def test_fetch_round_trips() -> None:
    for call in (
        FetchCall("orders", 1, "n2", snapshot=True, snapshot_after=b"m", max_bytes=10),
        FetchCall("orders", 1, "n2", snapshot=False, after_index=9, max_bytes=10),
    ):
        assert fetch_call_from_pb(fetch_call_to_pb(call)) == call
    page = FetchReply(FetchOutcome.OK, ((b"a", b"1"),), (), True, 9, 2, 9, 3)
    entries = FetchReply(FetchOutcome.OK, entries=ENTRIES, commit_index=6, lease_epoch=3)
    for reply in (page, entries, FetchReply(FetchOutcome.SNAPSHOT_NEEDED)):
        assert fetch_reply_from_pb(fetch_reply_to_pb(reply)) == reply
    assert page.size == 2
    assert entries.size == 6


def test_unknown_outcomes_read_as_before() -> None:
    """An unset outcome: the primary resends (mismatch); the learner applies the reply (ok)."""
    assert append_reply_from_pb(data_pb2.AppendResponse()).outcome is AppendOutcome.MISMATCH
    assert fetch_reply_from_pb(data_pb2.FetchResponse()).outcome is FetchOutcome.OK
