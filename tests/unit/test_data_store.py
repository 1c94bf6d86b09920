"""The replica data store: appends apply, undo restores exactly, followers accept only what
extends their log, the fence rejects stale primaries, snapshots load and resume."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.data.partitioning import CONTROL_PREFIX, SEAL_KEY, control_key, partition_of
from replica.data.storage import AppendResult, DataStore, Entry

Z, P = "z", 0


@pytest.fixture
def store() -> Iterator[DataStore]:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    s = DataStore(conn)
    s.create_schema()
    yield s
    conn.close()


def fresh() -> DataStore:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    s = DataStore(conn)
    s.create_schema()
    return s


def contents(s: DataStore) -> dict[bytes, bytes]:
    items, more = s.scan(Z, P, b"", b"", 10_000)
    assert not more
    return dict(items)


ops = st.lists(
    st.tuples(st.sampled_from([b"a", b"b", b"c", b"d"]), st.none() | st.binary(max_size=3)),
    min_size=1,
    max_size=30,
)


def as_entries(
    raw: list[tuple[bytes, bytes | None]], start: int = 1, epoch: int = 1
) -> list[Entry]:
    return [Entry(start + i, epoch, k, v or b"", v is None) for i, (k, v) in enumerate(raw)]


def replay(entries: list[Entry]) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for e in entries:
        if e.delete:
            out.pop(e.key, None)
        else:
            out[e.key] = e.value
    return out


@settings(max_examples=60, deadline=None)
@given(ops, st.integers(0, 30), st.integers(0, 30))
def test_undo_to_any_point_equals_replaying_the_prefix(raw, commit: int, cut: int) -> None:  # type: ignore[no-untyped-def]
    s = fresh()
    entries = as_entries(raw)
    s.append(Z, P, entries, min(commit, len(entries)))
    assert contents(s) == replay(entries)
    state = s.truncate(Z, P, cut)
    kept = max(min(cut, len(entries)), min(commit, len(entries)))
    assert state.last_index == kept
    assert contents(s) == replay(entries[:kept])


def test_follower_rejects_a_stale_epoch_and_undoes_only_what_differs(store: DataStore) -> None:
    result, state = store.follow(
        Z, P, 2, 0, 0, as_entries([(b"a", b"1"), (b"b", b"2")], epoch=2), 1
    )
    assert result is AppendResult.OK
    assert state.last_index == 2
    assert state.commit_index == 1
    # A deposed primary (epoch 1) changes nothing.
    result, state = store.follow(Z, P, 1, 2, 2, as_entries([(b"c", b"x")], 3, epoch=1), 3)
    assert result is AppendResult.STALE_EPOCH
    assert contents(store) == {b"a": b"1", b"b": b"2"}
    # A new primary (epoch 3) whose entry 2 is another one: the follower's log differs at its
    # last entry, so it asks from its commit index — and undoes nothing yet.
    result, state = store.follow(Z, P, 3, 2, 3, [], 1, tail=True)
    assert result is AppendResult.MISMATCH
    assert state.last_index == 1
    assert contents(store) == {b"a": b"1", b"b": b"2"}
    fenced = store.state(Z, P)
    assert fenced is not None
    assert fenced.seen_epoch == 3
    # The entries from there replace the uncommitted one that differs, in one transaction.
    result, state = store.follow(
        Z, P, 3, 1, 2, as_entries([(b"b", b"3")], 2, epoch=3), 2, tail=True
    )
    assert result is AppendResult.OK
    assert state.last_index == 2
    assert state.seen_epoch == 3
    assert contents(store) == {b"a": b"1", b"b": b"3"}


def test_follower_skips_entries_it_has_and_refuses_gaps(store: DataStore) -> None:
    entries = as_entries([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")])
    assert store.follow(Z, P, 1, 0, 0, entries[:2], 0)[0] is AppendResult.OK
    result, state = store.follow(Z, P, 1, 0, 0, entries, 3)  # a resend overlapping the log
    assert result is AppendResult.OK
    assert state.last_index == 3
    assert state.commit_index == 3
    result, state = store.follow(Z, P, 1, 5, 1, as_entries([(b"z", b"9")], 6), 6)
    assert result is AppendResult.MISMATCH
    assert state.last_index == 3
    assert contents(store) == {b"a": b"1", b"b": b"2", b"c": b"3"}


def test_snapshot_pages_load_and_then_the_log_continues(store: DataStore) -> None:
    source = fresh()
    source.append(Z, P, as_entries([(bytes([65 + i]), b"v" * 10) for i in range(20)]), 20)
    state = store.begin_snapshot(Z, P, 20, 1)
    assert state.loading_snapshot
    after = b""
    while True:
        items, done, _ = source.snapshot_page(Z, P, after, 50)
        state = store.load_page(Z, P, items, done)
        if done:
            break
        after = items[-1][0]
        assert state.snap_after == after  # a restart resumes here
    assert not state.loading_snapshot
    assert state.last_index == 20
    assert contents(store) == contents(source)
    assert store.epoch_at(Z, P, 20, state) == 1
    more = as_entries([(b"A", b"new")], 21)
    assert store.follow(Z, P, 1, 20, 1, more, 21)[0] is AppendResult.OK
    assert store.get(Z, P, b"A") == b"new"


def test_trim_keeps_the_newest_and_moves_the_base(store: DataStore) -> None:
    store.append(Z, P, as_entries([(b"k", bytes([i])) for i in range(10)]), 10)
    state = store.trim(Z, P, 3)
    assert (state.base_index, state.last_index) == (7, 10)
    assert [e.index for e in store.entries(Z, P, 7, 10, 1 << 20)] == [8, 9, 10]
    assert store.truncate(Z, P, 0).last_index == 10  # committed: never undone


def test_scan_honours_prefix_start_after_and_limit(store: DataStore) -> None:
    store.append(Z, P, as_entries([(k, b"1") for k in (b"a1", b"a2", b"a3", b"b1")]), 4)
    assert store.scan(Z, P, b"a", b"", 2) == ([(b"a1", b"1"), (b"a2", b"1")], True)
    assert store.scan(Z, P, b"a", b"a2", 5) == ([(b"a3", b"1")], False)
    assert store.size(Z, P) == (4 * 3, 4)


def test_scan_pages_are_bounded_in_bytes_but_always_move_on(store: DataStore) -> None:
    store.append(Z, P, as_entries([(bytes([97 + i]), b"x" * 1000) for i in range(5)]), 5)
    items, more = store.scan(Z, P, b"", b"", 100, max_bytes=2500)
    assert [k for k, _ in items] == [b"a", b"b"]
    assert more
    items, more = store.scan(Z, P, b"", b"d", 100, max_bytes=10)
    assert [k for k, _ in items] == [b"e"]
    assert not more


def test_sizes_of_every_replica_in_one_query_equal_size_of_each(store: DataStore) -> None:
    assert store.sizes() == {}
    store.ensure("z", 0)  # an empty replica: reported as 0 bytes, 0 keys
    store.append("z", 1, as_entries([(b"a", b"xyz"), (b"bb", b""), (b"a", b"q")]), 0)
    store.append("y", 1, as_entries([(b"k", b"v"), (b"k", None)]), 0)  # put then delete
    store.append("z", 2, as_entries([(b"key", b"value" * 10)]), 0)
    found = store.sizes()
    assert found == {
        ("z", 0): (0, 0),
        ("z", 1): (len(b"a") + len(b"q") + len(b"bb"), 2),
        ("y", 1): (0, 0),
        ("z", 2): (3 + 50, 1),
    }
    assert found == {key: store.size(*key) for key in found}
    store.drop("z", 1)
    assert ("z", 1) not in store.sizes()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 3), ops), max_size=6))
def test_sizes_agree_with_size_per_replica(
    writes: list[tuple[str, int, list[tuple[bytes, bytes | None]]]],
) -> None:
    s = fresh()
    for zone, partition, raw in writes:
        state = s.ensure(zone, partition)
        s.append(zone, partition, as_entries(raw, start=state.last_index + 1), 0)
    found = s.sizes()
    assert set(found) == {(z, p) for z, p, _ in writes}
    assert found == {key: s.size(*key) for key in found}


@settings(max_examples=60, deadline=None)
@given(
    st.sets(st.binary(min_size=1, max_size=3), max_size=40),
    st.sets(st.sampled_from([b"seal/1", b"cursor/1/0", b"cursor/1/3"]), max_size=3),
    st.integers(1, 6),
    st.integers(0, 4),
    st.integers(1, 7),
)
def test_scan_shows_only_routed_client_keys_and_pages_through_all_of_them(
    keys: set[bytes], controls: set[bytes], routed: int, partition: int, limit: int
) -> None:
    """design/resharding.md, "Control keys": a scan never shows a control key, and with
    ``routed`` only the keys that route to the partition — however the rows fall into pages."""
    s = fresh()
    stored = sorted(keys | {control_key(*c.decode().split("/")) for c in controls})
    s.append(Z, partition, as_entries([(k, b"v" + k) for k in stored]), len(stored))
    wanted = [
        (k, b"v" + k)
        for k in sorted(keys)
        if not k.startswith(CONTROL_PREFIX) and partition_of(k, routed) == partition % routed
    ]
    if partition >= routed:  # a partition beyond the layout owns nothing
        wanted = []
    got: list[tuple[bytes, bytes]] = []
    after = b""
    for _ in range(len(stored) + 2):
        items, more = s.scan(Z, partition, b"", after, limit, routed=routed)
        assert len(items) <= limit
        got += items
        if not more:
            break
        assert items, "a page with more to come moved on"
        after = items[-1][0]
    assert got == wanted
    everything, _ = s.scan(Z, partition, b"", b"", 10_000)
    assert [k for k, _ in everything] == [k for k in stored if not k.startswith(CONTROL_PREFIX)]


@settings(max_examples=50, deadline=None)
@given(
    st.sets(st.binary(min_size=1, max_size=3), max_size=50),
    st.booleans(),
    st.integers(1, 5),
    st.integers(0, 4),
    st.integers(1, 40),
)
def test_a_selected_snapshot_pages_through_exactly_the_selected_keys(
    keys: set[bytes], sealed: bool, partitions: int, partition: int, max_bytes: int
) -> None:
    """Re-sharding's copy (design/resharding.md): pages of a selected snapshot carry exactly
    the keys routing to the destination (and the seal), resuming after the last key examined
    even when a page carries none."""
    partition %= partitions
    s = fresh()
    rows = sorted(keys | ({SEAL_KEY} if sealed else set()))
    s.append(Z, P, as_entries([(k, b"v") for k in rows]), len(rows))
    got: list[bytes] = []
    after = b""
    for _ in range(len(rows) + 2):
        items, done, scanned = s.snapshot_page(Z, P, after, max_bytes, (partitions, partition))
        got += [k for k, _ in items]
        assert scanned >= after
        if done:
            break
        assert scanned > after, "a page always moves on"
        after = scanned
    want = [k for k in rows if k == SEAL_KEY or partition_of(k, partitions) == partition]
    assert got == want


def test_key_pages_give_every_key_once_in_order_without_values(store: DataStore) -> None:
    store.append(Z, P, as_entries([(bytes([65 + i]), b"v" * 1000) for i in range(10)]), 10)
    keys: list[bytes] = []
    after = b""
    while True:
        page, done = store.key_page(Z, P, after, 3)
        keys += page
        if done:
            break
        after = page[-1]
    assert keys == [bytes([65 + i]) for i in range(10)]
    assert store.key_page(Z, P, b"J", 3) == ([], True)
