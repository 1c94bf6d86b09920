"""The replication protocol of design/data-plane.md ("Writes", "A new primary") run on three real
data stores, with appends delivered, lost or delayed (and then delivered out of order, possibly
after the lease moved on) as hypothesis chooses: an acknowledged entry is in the log of every
replica after every step — a new epoch, a reconcile, a stale or overtaken append never undoes
one — and once every append gets through, every replica holds exactly the primary's log."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from replica.data.storage import AppendResult, DataStore, Entry

Z, P = "z", 0
NODES = 3
#: What happens to one append: it arrives now, is lost, or arrives later (out of order).
DELIVERY = st.sampled_from(["deliver", "deliver", "deliver", "drop", "delay"])

Append = tuple[str, int, int, int, int, list[Entry], int, bool]


def store() -> DataStore:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    s = DataStore(conn)
    s.create_schema()
    return s


def log_of(s: DataStore) -> list[Entry]:
    state = s.state(Z, P)
    if state is None:
        return []
    return s.entries(Z, P, 0, state.last_index, 1 << 30)


@dataclass
class Cluster:
    """The primary's side of ``replica.data.primary.Primary`` (its ``_sync`` rounds, the
    reconcile, the commit index in memory) over real ``DataStore`` replicas; every replica is
    in the in-sync set, so a write is acknowledged only once all of them hold it."""

    draw: st.DataObject
    stores: list[DataStore] = field(default_factory=lambda: [store() for _ in range(NODES)])
    primary: int = 0
    epoch: int = 0
    commit: int = 0
    match: dict[int, int] = field(default_factory=dict)
    delayed: list[tuple[int, Append]] = field(default_factory=list)
    acked: list[Entry] = field(default_factory=list)

    @property
    def own(self) -> DataStore:
        return self.stores[self.primary]

    def last(self) -> int:
        state = self.own.state(Z, P)
        return 0 if state is None else state.last_index

    def sync(self, member: int, upto: int, reliable: bool) -> bool:
        for _ in range(8):
            after = self.match[member]
            state = self.own.state(Z, P)
            assert state is not None
            prev_epoch = self.own.epoch_at(Z, P, after, state) or 0
            entries = self.own.entries(Z, P, after, upto, 1 << 20)
            tail = after + len(entries) == state.last_index
            call: Append = (Z, P, self.epoch, after, prev_epoch, entries, self.commit, tail)
            how = "deliver" if reliable else self.draw.draw(DELIVERY)
            if how == "delay":
                self.delayed.append((member, call))
            if how != "deliver":
                return False
            result, answer = self.stores[member].follow(*call)
            assert result is not AppendResult.STALE_EPOCH  # nobody saw a later epoch
            assert result is not AppendResult.AHEAD, "a primary holding every commit refused"
            self.match[member] = min(answer.last_index, state.last_index)
            if result is AppendResult.OK and answer.last_index >= upto:
                return True
        return False

    def replicate(self, reliable: bool = False) -> bool:
        upto = self.last()
        members = [m for m in range(NODES) if m != self.primary]
        done = [self.sync(m, upto, reliable) for m in members]
        if all(done):
            self.commit = max(self.commit, upto)
        return all(done)

    def write(self, key: bytes, value: bytes) -> None:
        entry = Entry(self.last() + 1, self.epoch, key, value, False)
        self.own.append_writes(Z, P, [entry], self.commit)
        if self.replicate():
            self.acked.append(entry)

    def take_over(self, node: int, reliable: bool = False) -> None:
        """A new lease epoch on ``node`` (any replica: each is in the in-sync set): fence, then
        bring every member to this log; once all hold it, the whole log is committed."""
        self.primary, self.epoch = node, self.epoch + 1
        state = self.own.raise_fence(Z, P, self.epoch)
        self.commit = state.commit_index
        self.match = {m: state.last_index for m in range(NODES) if m != node}
        self.replicate(reliable)

    def commit_notice(self, reliable: bool = False) -> None:
        """After a burst: an empty append carrying the commit index; the primary's own commit
        index written."""
        self.replicate(reliable)
        self.own.set_commit(Z, P, self.commit)

    def learn(self, node: int) -> None:
        """``node`` runs a learner although it may be an in-sync member (its view of etcd lags
        the in-sync set): one fetch by the product's rules — the primary answers once its whole
        log is committed (``Primary.committed``) with the entries after the learner's commit
        index, and the learner applies them with ``DataStore.learn``."""
        if node == self.primary or not self.replicate():
            return
        learner = self.stores[node]
        mine = learner.state(Z, P)
        assert mine is not None
        upto = self.last()
        entries = self.own.entries(Z, P, mine.commit_index, upto, 1 << 20)
        learner.learn(Z, P, self.epoch, mine.commit_index, entries, upto)

    def deliver_late(self, i: int) -> None:
        member, call = self.delayed.pop(i)
        result, _ = self.stores[member].follow(*call)  # nobody is waiting for the answer ...
        assert result is not AppendResult.AHEAD  # ... but a late one is never taken for a loss

    def check_acked_everywhere(self) -> None:
        for node, s in enumerate(self.stores):
            held = {(e.index, e.epoch, e.key, e.value) for e in log_of(s)}
            lost = [e for e in self.acked if (e.index, e.epoch, e.key, e.value) not in held]
            assert not lost, f"replica {node} lost acknowledged entries {lost}"


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_no_acknowledged_entry_is_ever_undone_and_replicas_converge(data: st.DataObject) -> None:
    cluster = Cluster(data)
    cluster.take_over(0, reliable=True)
    kinds = st.sampled_from(["write", "write", "fail-over", "notice", "late", "learn"])
    steps = data.draw(st.lists(kinds, max_size=40))
    for n, step in enumerate(steps):
        if step == "write":
            cluster.write(f"k{n % 4}".encode(), f"v{n}".encode())
        elif step == "fail-over":
            cluster.take_over(data.draw(st.integers(0, NODES - 1)))
        elif step == "notice":
            cluster.commit_notice()
        elif step == "learn":
            cluster.learn(data.draw(st.integers(0, NODES - 1)))
        elif cluster.delayed:
            cluster.deliver_late(data.draw(st.integers(0, len(cluster.delayed) - 1)))
        cluster.check_acked_everywhere()
    # Whatever is still in flight arrives; then a primary whose appends all get through.
    while cluster.delayed:
        cluster.deliver_late(0)
        cluster.check_acked_everywhere()
    cluster.take_over(data.draw(st.integers(0, NODES - 1)), reliable=True)
    cluster.commit_notice(reliable=True)
    cluster.check_acked_everywhere()
    want = log_of(cluster.own)
    for node, s in enumerate(cluster.stores):
        assert log_of(s) == want, f"replica {node}'s log differs from the primary's"
        items, _ = s.scan(Z, P, b"", b"", 10_000)
        mine, _ = cluster.own.scan(Z, P, b"", b"", 10_000)
        assert items == mine, f"replica {node}'s data differs from the primary's"
        state = s.state(Z, P)
        assert state is not None
        assert state.commit_index == len(want)


def test_a_new_epoch_alone_undoes_nothing() -> None:
    """The case the eager undo got wrong: entry 2 was acknowledged, but the follower's commit
    index (written lazily) still says 1; the new primary holds entry 2, so nothing is undone."""
    follower = store()
    entries = [Entry(1, 1, b"a", b"1", False), Entry(2, 1, b"b", b"2", False)]
    assert follower.follow(Z, P, 1, 0, 0, entries, 1)[0] is AppendResult.OK
    result, state = follower.follow(Z, P, 2, 2, 1, [], 1, tail=True)
    assert result is AppendResult.OK
    assert (state.last_index, state.seen_epoch) == (2, 2)
    assert follower.get(Z, P, b"b") == b"2"


def test_a_suffix_past_the_new_primarys_log_is_undone_only_by_a_tail_append() -> None:
    follower = store()
    entries = [Entry(1, 1, b"a", b"1", False), Entry(2, 1, b"b", b"2", False)]
    assert follower.follow(Z, P, 1, 0, 0, entries, 1)[0] is AppendResult.OK
    # Not the primary's tail (a bounded catch-up append): entry 2 may be in its log.
    result, state = follower.follow(Z, P, 2, 1, 1, [], 1)
    assert (result, state.last_index) == (AppendResult.OK, 2)
    # The primary's log ends at 1: entry 2 (an older epoch) was never acknowledged.
    result, state = follower.follow(Z, P, 2, 1, 1, [], 1, tail=True)
    assert (result, state.last_index) == (AppendResult.OK, 1)
    assert follower.get(Z, P, b"b") is None
    # An overtaken tail append of the same epoch keeps that primary's later entries.
    assert follower.follow(Z, P, 2, 1, 1, [Entry(2, 2, b"c", b"3", False)], 1, tail=True)[0] is (
        AppendResult.OK
    )
    result, state = follower.follow(Z, P, 2, 1, 1, [], 1, tail=True)
    assert (result, state.last_index) == (AppendResult.OK, 2)
    assert follower.get(Z, P, b"c") == b"3"


def test_the_commit_index_never_covers_a_suffix_the_append_did_not_match() -> None:
    follower = store()
    entries = [Entry(i, 1, b"k", bytes([i]), False) for i in range(1, 5)]
    assert follower.follow(Z, P, 1, 0, 0, entries, 0)[0] is AppendResult.OK
    # Epoch 2's primary matched entry 2 only, and says 4 is committed (its own entries 3, 4).
    result, state = follower.follow(Z, P, 2, 2, 1, [], 4)
    assert result is AppendResult.OK
    assert state.commit_index == 2


def test_a_primary_whose_log_lacks_committed_entries_is_refused_and_undoes_nothing() -> None:
    """A replica lost and re-created empty while the in-sync set still named its node, then
    made primary: its reconcile's tail append says its log ends at 0. A member whose commit
    index is above that answers AHEAD (its commit index) and keeps every entry — before, the
    append was answered OK and the empty primary served reads of acknowledged keys as not
    found. So does a primary whose entry at a committed index has another epoch; a late
    append of the member's own primary (its later entries of the same epoch) is not one."""
    member = store()
    entries = [Entry(i, 1, b"k%d" % i, b"v", False) for i in range(1, 6)]
    assert member.follow(Z, P, 1, 0, 0, entries, 3)[0] is AppendResult.OK
    result, state = member.follow(Z, P, 2, 0, 0, [], 0, tail=True)
    assert (result, state.last_index) == (AppendResult.AHEAD, 3)
    assert member.state(Z, P).last_index == 5  # type: ignore[union-attr]
    assert [e.index for e in log_of(member)] == [1, 2, 3, 4, 5]
    # entries 4, 5 are above the commit index: a primary holding 1..3 undoes them (never acked)
    result, state = member.follow(Z, P, 2, 3, 1, [], 3, tail=True)
    assert (result, state.last_index) == (AppendResult.OK, 3)
    # its entry at a committed index differs: refused, as prev or as one it sends
    assert member.follow(Z, P, 3, 2, 2, [], 3)[0] is AppendResult.AHEAD
    assert member.follow(Z, P, 3, 1, 1, [Entry(2, 3, b"x", b"y", False)], 3)[0] is (
        AppendResult.AHEAD
    )
    assert [e.epoch for e in log_of(member)] == [1, 1, 1]
    # an overtaken tail append of the current primary: its own entries stay, no refusal
    assert member.follow(Z, P, 3, 3, 1, [Entry(4, 3, b"n", b"1", False)], 4, tail=True)[0] is (
        AppendResult.OK
    )
    result, state = member.follow(Z, P, 3, 3, 1, [], 3, tail=True)
    assert (result, state.last_index) == (AppendResult.OK, 4)


def test_a_trimmed_log_judges_a_late_tail_append_by_its_base_epoch() -> None:
    """A tail append ending below the member's base (its log trimmed since): the entry after its
    end is gone, but epochs only grow along the log, so an older base epoch proves that entry
    older than the primary's epoch (AHEAD), while a base of the primary's own epoch proves
    nothing — a late append of that primary, not a refusal (the review's false positive)."""
    own, older = store(), store()
    for member, epoch in ((own, 2), (older, 1)):
        entries = [Entry(i, epoch, b"k", bytes([i]), False) for i in range(1, 11)]
        assert member.follow(Z, P, epoch, 0, 0, entries, 10)[0] is AppendResult.OK
        assert member.trim(Z, P, 2).base_index == 8
    assert own.follow(Z, P, 2, 3, 2, [], 3, tail=True)[0] is AppendResult.MISMATCH
    assert older.follow(Z, P, 2, 3, 1, [], 3, tail=True)[0] is AppendResult.AHEAD
    assert [e.index for e in log_of(older)] == [9, 10]  # nothing undone
