"""The deposed-epoch audit (``placement.metastore.audit.stale_writes``) on hand-made histories:
it must flag a driver write carrying an epoch after that epoch's leader key was deleted — and
only that."""

from __future__ import annotations

import json

import pytest

from placement.metastore.audit import stale_writes
from placement.metastore.keys import AssignField, KeySpace
from placement.metastore.kv import EventKind, KeyValue, WatchEvent

KEYS = KeySpace("/audit")
LEADER = KEYS.leader_prefix() + b"d1"


def _put(key: bytes, revision: int, epoch: int | None) -> WatchEvent:
    value = json.dumps({"epoch": epoch}).encode() if epoch is not None else b"{}"
    return WatchEvent(EventKind.PUT, KeyValue(key, value, revision, revision, 1, 0), None)


def _leader_deleted(created: int, revision: int, with_prev: bool = True) -> WatchEvent:
    prev = KeyValue(LEADER, b"{}", created, created, 1, 7) if with_prev else None
    return WatchEvent(EventKind.DELETE, KeyValue(LEADER, b"", 0, revision, 0, 0), prev)


def test_a_write_by_an_ended_epoch_after_its_key_went_is_stale() -> None:
    stable = KEYS.assign("z", 0, AssignField.STABLE)
    history = [
        _put(LEADER, 5, None),
        _put(stable, 8, 5),  # in its term: fine
        _leader_deleted(5, 10),
        _put(stable, 11, 5),  # after its key went: stale
        _put(stable, 12, 13),  # another epoch: fine
        _put(KEYS.progress("z", 0, "n1"), 14, 5),  # an agent's report: exempt
    ]
    terms, late = stale_writes(KEYS, history)
    assert terms == 1
    assert [(w.key, w.revision, w.epoch, w.ended_at) for w in late] == [(stable, 11, 5, 10)]


def test_a_history_of_live_terms_has_nothing_stale() -> None:
    stable = KEYS.assign("z", 0, AssignField.STABLE)
    terms, late = stale_writes(KEYS, [_put(LEADER, 5, None), _put(stable, 9, 5)])
    assert (terms, late) == (0, [])


def test_a_deleted_leader_key_without_its_value_is_refused() -> None:
    with pytest.raises(ValueError, match="deleted leader key"):
        stale_writes(KEYS, [_leader_deleted(5, 10, with_prev=False)])
