"""placement.metastore.store against a real etcd: every transition's branches and outcomes, fencing,
batches within etcd's limits, zone configs, node records, corrupt values."""

from __future__ import annotations

import asyncio
import math

import pytest

from placement.core.model import ZoneSpec
from placement.errors import Conflict, InvalidInput, NotLeader, StoreUnavailable
from placement.metastore.codec import (
    Assignment,
    CancelIntent,
    Corrupt,
    InSyncSet,
    LeaseTerm,
    MoveReport,
    NodeRecord,
    PrimaryLease,
    ReplicaSize,
    TriggerMark,
    decode_term,
    encode_primary,
    encode_report,
    encode_size,
    encode_term,
)
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import AssignField, KeySpace
from placement.metastore.store import IsrWrite, Metastore
from placement.metastore.transitions import (
    Ending,
    Fence,
    Outcome,
    PartitionState,
    TermWrite,
    TriggerAction,
)
from placement.metastore.txn import MAX_TXN_OPS
from replica.data.isr_writes import IsrWrites

pytestmark = pytest.mark.integration

ABC = ("a", "b", "c")
BCD = ("b", "c", "d")
ACD = ("a", "c", "d")
CBA = ("c", "b", "a")


@pytest.fixture
async def store(client: EtcdClient, keys: KeySpace) -> Metastore:
    return Metastore(client, keys)


@pytest.fixture
async def fence(client: EtcdClient, keys: KeySpace) -> Fence:
    key = keys.leader("test")
    revision = await client.put(key, b"test")
    return Fence(key, revision)


async def _depose(client: EtcdClient, fence: Fence) -> Fence:
    """Delete and re-create the leader key: a new term; the old fence no longer holds."""
    await client.delete(fence.leader_key)
    return Fence(fence.leader_key, await client.put(fence.leader_key, b"next"))


async def _peers(store: Metastore, zone: str, p: int) -> dict[str, object]:
    s = await store.read_partition(zone, p)
    return {
        f.value: s.peers(f) if f in (AssignField.STABLE, AssignField.PENDING, AssignField.PLANNED)
        else s.entry(f) is not None
        for f in AssignField
    }  # fmt: skip


async def test_trigger_branches(store: Metastore, fence: Fence) -> None:
    await store.create_partitions("z", {0: ABC}, 10, fence, ts=1)
    # target == stable, no pending: only the trigger is recorded
    r = await store.trigger("z", 0, ABC, 11, fence, ts=2)
    assert (r.outcome, r.action) == (Outcome.APPLIED, TriggerAction.RECORD_ONLY)
    # target != stable: pending
    r = await store.trigger("z", 0, BCD, 12, fence, ts=3)
    assert (r.outcome, r.action) == (Outcome.APPLIED, TriggerAction.WRITE_PENDING)
    assert r.state.pending is not None
    assert r.state.pending.value == Assignment(BCD, fence.epoch, 3, 12)
    # pending in progress, another target: planned
    r = await store.trigger("z", 0, ACD, 13, fence, ts=4)
    assert (r.outcome, r.action) == (Outcome.APPLIED, TriggerAction.WRITE_PLANNED)
    # target == pending: planned removed
    r = await store.trigger("z", 0, BCD, 14, fence, ts=5)
    assert (r.outcome, r.action) == (Outcome.APPLIED, TriggerAction.DELETE_PLANNED)
    assert await _peers(store, "z", 0) == {
        "stable": ABC, "pending": BCD, "planned": None, "cancel": False, "trigger": True,
    }  # fmt: skip
    # a new primary order is a new target
    r = await store.trigger("z", 0, CBA, 15, fence, ts=6)
    assert r.action is TriggerAction.WRITE_PLANNED
    # the state returned is exactly what etcd holds
    assert r.state == await store.read_partition("z", 0)


@pytest.mark.parametrize("revision", [15, 14, 1])
async def test_equal_and_older_triggers_write_nothing(
    store: Metastore, fence: Fence, revision: int
) -> None:
    await store.create_partitions("z", {0: ABC}, 10, fence, ts=1)
    await store.trigger("z", 0, BCD, 15, fence, ts=2)
    before = await store.read_partition("z", 0)
    r = await store.trigger("z", 0, ACD, revision, fence, ts=3)
    assert r.outcome is Outcome.STALE_TRIGGER
    after = await store.read_partition("z", 0)
    assert _without_revision(after) == _without_revision(before)  # incl. every mod_revision


def _without_revision(s: PartitionState) -> tuple[object, ...]:
    return (s.stable, s.pending, s.planned, s.cancel, s.trigger)


async def test_finish_promotes_planned_and_rejects_late_done(
    store: Metastore, fence: Fence
) -> None:
    await store.create_partitions("z", {0: ABC}, 10, fence, ts=1)
    first = (await store.trigger("z", 0, BCD, 11, fence, ts=2)).state.mod(AssignField.PENDING)
    await store.trigger("z", 0, ACD, 12, fence, ts=3)
    r = await store.finish("z", 0, first, fence, ts=4)
    assert r.outcome is Outcome.APPLIED
    assert r.state.peers(AssignField.STABLE) == BCD
    assert r.state.peers(AssignField.PENDING) == ACD  # planned became the next pending
    assert r.state.planned is None
    second = r.state.mod(AssignField.PENDING)
    assert second > first
    # A late "done" for the first rebalance changes nothing.
    before = await store.read_partition("z", 0)
    late = await store.finish("z", 0, first, fence, ts=5)
    assert late.outcome is Outcome.STALE
    assert await store.read_partition("z", 0) == before
    done = await store.finish("z", 0, second, fence, ts=6)
    assert done.outcome is Outcome.APPLIED
    assert await _peers(store, "z", 0) == {
        "stable": ACD, "pending": None, "planned": None, "cancel": False, "trigger": True,
    }  # fmt: skip


async def test_cancel_wins_over_finish(store: Metastore, fence: Fence) -> None:
    await store.create_partitions("z", {0: ABC}, 10, fence, ts=1)
    pending = (await store.trigger("z", 0, BCD, 11, fence, ts=2)).state.mod(AssignField.PENDING)
    assert (await store.cancel("z", 0, pending - 1, fence, ts=3)).outcome is Outcome.STALE
    c = await store.cancel("z", 0, pending, fence, ts=3)
    assert c.outcome is Outcome.APPLIED
    assert c.state.cancel is not None
    assert c.state.cancel.value == CancelIntent(ABC, BCD, pending, fence.epoch, 3)
    again = await store.cancel("z", 0, pending, fence, ts=4)  # idempotent: nothing rewritten
    assert again.outcome is Outcome.APPLIED
    assert again.state == c.state
    # A resend of the same rebalance finishing now loses to the cancel.
    assert (await store.finish("z", 0, pending, fence, ts=5)).outcome is Outcome.CANCELLED
    r = await store.finish_cancel("z", 0, pending, fence, ts=6)
    assert r.outcome is Outcome.APPLIED
    assert await _peers(store, "z", 0) == {
        "stable": ABC, "pending": None, "planned": None, "cancel": False, "trigger": True,
    }  # fmt: skip
    assert (await store.finish_cancel("z", 0, pending, fence, ts=7)).outcome is Outcome.STALE


async def test_finish_cancel_already_done_and_with_planned(store: Metastore, fence: Fence) -> None:
    await store.create_partitions("z", {0: ABC}, 10, fence, ts=1)
    pending = (await store.trigger("z", 0, BCD, 11, fence, ts=2)).state.mod(AssignField.PENDING)
    await store.trigger("z", 0, ACD, 12, fence, ts=3)
    await store.cancel("z", 0, pending, fence, ts=4)
    # The agents answered "already done": stable := pending, planned moves up, cancel gone.
    r = await store.finish_cancel("z", 0, pending, fence, ts=5, already_done=True)
    assert r.outcome is Outcome.APPLIED
    assert await _peers(store, "z", 0) == {
        "stable": BCD, "pending": ACD, "planned": None, "cancel": False, "trigger": True,
    }  # fmt: skip


async def test_every_write_is_fenced(store: Metastore, client: EtcdClient, fence: Fence) -> None:
    await store.create_partitions("z", {0: ABC}, 10, fence, ts=1)
    pending = (await store.trigger("z", 0, BCD, 11, fence, ts=2)).state.mod(AssignField.PENDING)
    observed = await store.read_partition("z", 0)
    new_fence = await _depose(client, fence)
    assert new_fence.epoch > fence.epoch
    before = await store.read_partition("z", 0)
    calls = [
        lambda o: store.trigger("z", 0, ACD, 20, fence, ts=3, observed=o),
        lambda o: store.finish("z", 0, pending, fence, ts=3, observed=o),
        lambda o: store.cancel("z", 0, pending, fence, ts=3, observed=o),
        lambda o: store.finish_cancel("z", 0, pending, fence, ts=3, observed=o),
    ]
    for call in calls:
        for o in (None, observed):  # via the fenced read, and via the txn's compare alone
            with pytest.raises(NotLeader):
                await call(o)
    with pytest.raises(NotLeader):
        await store.create_partitions("z", {1: ABC}, 10, fence, ts=3)
    with pytest.raises(NotLeader):
        await store.apply_triggers("z", {0: ACD}, 21, fence, ts=3)
    with pytest.raises(NotLeader):
        await store.create_zone(ZoneSpec("z", 1, 1), fence)
    assert await store.read_partition("z", 0) == before
    assert (await store.trigger("z", 0, ACD, 20, new_fence, ts=3)).outcome is Outcome.APPLIED


async def test_a_stale_observation_never_writes_wrong(store: Metastore, fence: Fence) -> None:
    """A decision made on an old snapshot is caught by the compares and re-made on fresh state."""
    await store.create_partitions("z", {0: ABC}, 10, fence, ts=1)
    old = await store.read_partition("z", 0)
    pending = (await store.trigger("z", 0, BCD, 11, fence, ts=2)).state.mod(AssignField.PENDING)
    # On `old` (no pending) this trigger would write pending; really it must write planned.
    r = await store.trigger("z", 0, ACD, 12, fence, ts=3, observed=old)
    assert (r.outcome, r.action, r.attempts) == (Outcome.APPLIED, TriggerAction.WRITE_PLANNED, 2)
    assert r.state.peers(AssignField.PENDING) == BCD
    # A no-op decided on an old snapshot is confirmed by a fresh read first.
    mid = await store.read_partition("z", 0)
    finished = await store.finish("z", 0, pending, fence, ts=4)
    r = await store.finish("z", 0, pending, fence, ts=5, observed=mid)
    assert r.outcome is Outcome.STALE
    assert r.state == await store.read_partition("z", 0) == finished.state


async def test_create_500_partitions_in_batches(
    store: Metastore, client: EtcdClient, fence: Fence
) -> None:
    stables = {p: (f"n{p % 7}", f"n{(p + 1) % 7}", f"n{(p + 2) % 7}") for p in range(500)}
    before = await client.current_revision()
    result = await store.create_partitions("big", stables, 10, fence, ts=1)
    assert result.created == tuple(range(500))
    assert result.existing == ()
    assert all(t.ops <= MAX_TXN_OPS and t.succeeded for t in result.txns)
    assert len(result.txns) == 8  # 64 partitions x (1 compare, 2 puts) per txn
    assert await client.current_revision() - before == len(result.txns)  # one revision per txn
    zone = await store.read_zone("big", page_size=97)
    assert list(zone.partitions) == list(range(500))
    assert {p: s.peers(AssignField.STABLE) for p, s in zone.partitions.items()} == stables
    assert all(
        isinstance(s.trigger.value, TriggerMark) and s.trigger.value.revision == 10  # type: ignore[union-attr]
        for s in zone.partitions.values()
    )
    # Creating again is create-only: all reported existing, nothing written.
    rev = await client.current_revision()
    again = await store.create_partitions("big", {**stables, 500: ABC}, 11, fence, ts=2)
    assert again.created == (500,)
    assert again.existing == tuple(range(500))
    assert await client.current_revision() == rev + 1


async def test_apply_triggers_batches_and_falls_back(store: Metastore, fence: Fence) -> None:
    n = 200
    await store.create_partitions("z", {p: ABC for p in range(n)}, 10, fence, ts=1)
    observed = await store.read_zone("z")
    # one partition moves on behind the batch's back
    await store.trigger("z", 7, ACD, 12, fence, ts=2)
    targets = {p: BCD if p % 2 else ABC for p in range(n)}
    result = await store.apply_triggers("z", targets, 11, fence, ts=3, observed=observed)
    assert all(t.ops <= MAX_TXN_OPS for t in result.txns)
    assert len(result.results) == n
    assert result.results[7].outcome is Outcome.STALE_TRIGGER  # 12 > 11: re-decided, not written
    for p in range(n):
        if p == 7:
            continue
        expect = TriggerAction.WRITE_PENDING if p % 2 else TriggerAction.RECORD_ONLY
        assert (result.results[p].outcome, result.results[p].action) == (Outcome.APPLIED, expect)
    zone = await store.read_zone("z")
    for p in range(n):
        assert _without_revision(zone.partition(p)) == _without_revision(result.results[p].state)
        want = BCD if p % 2 and p != 7 else (ACD if p == 7 else None)
        assert zone.partition(p).peers(AssignField.PENDING) == want


async def _moving(store: Metastore, fence: Fence, n: int) -> dict[int, int]:
    """``n`` partitions of zone z, each moving ABC -> BCD (every third with a planned ACD behind
    it), each with a DONE report of b; their pending revisions."""
    await store.create_partitions("z", {p: ABC for p in range(n)}, 10, fence, ts=1)
    await store.apply_triggers("z", {p: BCD for p in range(n)}, 11, fence, ts=2)
    await store.apply_triggers("z", {p: ACD for p in range(0, n, 3)}, 12, fence, ts=3)
    zone = await store.read_zone("z")
    pending = {p: zone.partition(p).mod(AssignField.PENDING) for p in range(n)}
    for p, revision in pending.items():
        report = MoveReport(revision, fence.epoch, "DONE", "done", 4)
        await store.client.put(store.keys.progress("z", p, "b"), encode_report(report))
    return pending


async def test_end_moves_switches_many_partitions_in_few_transactions_with_their_reports(
    store: Metastore, client: EtcdClient, fence: Fence
) -> None:
    n = 100
    pending = await _moving(store, fence, n)
    endings = [Ending("z", p, pending[p]) for p in range(n)]
    before = (await client.get(b"/")).revision
    results = await store.end_moves(endings, fence, ts=5)
    after = (await client.get(b"/")).revision
    # 3 compares and 3-4 ops per partition (the report range delete among them), 128 per txn
    assert math.ceil(n * 3 / (MAX_TXN_OPS - 1)) <= after - before <= math.ceil(n / 30)
    assert [r.outcome for r in results] == [Outcome.APPLIED] * n
    zone = await store.read_zone("z")
    for p, r in enumerate(results):
        # the state returned is what etcd holds (computed, not read back: every mod revision)
        assert _without_revision(r.state) == _without_revision(zone.partition(p))
        assert zone.partition(p).peers(AssignField.STABLE) == BCD
        assert zone.partition(p).peers(AssignField.PENDING) == (ACD if p % 3 == 0 else None)
        assert zone.partition(p).planned is None
    reports = await client.list_prefix(store.keys.progress_prefix())
    assert reports.kvs == ()
    # a late repeat changes nothing: STALE, as finish says
    again = await store.end_moves(endings[:5], fence, ts=6)
    assert [r.outcome for r in again] == [Outcome.STALE] * 5
    assert (await client.get(b"/")).revision == after


async def test_end_moves_redoes_a_batch_one_partition_raced_partition_by_partition(
    store: Metastore, client: EtcdClient, fence: Fence
) -> None:
    n = 20
    pending = await _moving(store, fence, n)
    real_txn = client.txn
    raced = False

    async def txn_with_a_race(*args: object, **kwargs: object) -> object:
        nonlocal raced
        if not raced and args[0]:  # the first write: another writer gets in first
            raced = True
            await store.trigger("z", 1, ACD, 13, fence, ts=5)  # planned appears under p1
        return await real_txn(*args, **kwargs)  # type: ignore[arg-type]

    client.txn = txn_with_a_race  # type: ignore[method-assign]
    try:
        results = await store.end_moves([Ending("z", p, pending[p]) for p in range(n)], fence, ts=6)
    finally:
        client.txn = real_txn  # type: ignore[method-assign]
    assert raced
    assert [r.outcome for r in results] == [Outcome.APPLIED] * n
    zone = await store.read_zone("z")
    assert zone.partition(1).peers(AssignField.PENDING) == ACD  # its planned, promoted
    for p in range(n):
        assert zone.partition(p).peers(AssignField.STABLE) == BCD
        assert _without_revision(results[p].state) == _without_revision(zone.partition(p))
    assert (await client.list_prefix(store.keys.progress_prefix())).kvs == ()


async def test_end_moves_keeps_the_results_of_batches_that_committed_when_one_fails(
    store: Metastore, client: EtcdClient, fence: Fence
) -> None:
    """The second transaction's answer is lost (StoreUnavailable): the first's finishes are
    still reported APPLIED, only the second's endings carry the error."""
    n = 60
    pending = await _moving(store, fence, n)
    real_txn = client.txn
    writes = 0

    async def second_write_unanswered(*args: object, **kwargs: object) -> object:
        nonlocal writes
        if args[0]:  # a write (reads have no compares)
            writes += 1
            if writes == 2:
                raise StoreUnavailable("txn: no answer in time")
        return await real_txn(*args, **kwargs)  # type: ignore[arg-type]

    client.txn = second_write_unanswered  # type: ignore[method-assign]
    try:
        results = await store.end_moves([Ending("z", p, pending[p]) for p in range(n)], fence, 5)
    finally:
        client.txn = real_txn  # type: ignore[method-assign]
    applied = [p for p, r in enumerate(results) if not isinstance(r, StoreUnavailable)]
    lost = [p for p, r in enumerate(results) if isinstance(r, StoreUnavailable)]
    assert applied
    assert lost
    assert all(results[p].outcome is Outcome.APPLIED for p in applied)  # type: ignore[union-attr]
    zone = await store.read_zone("z")
    assert all(zone.partition(p).peers(AssignField.STABLE) == BCD for p in applied)
    assert all(zone.partition(p).peers(AssignField.STABLE) == ABC for p in lost)  # not sent
    again = await store.end_moves([Ending("z", p, pending[p]) for p in lost], fence, 6)
    assert [r.outcome for r in again] == [Outcome.APPLIED] * len(lost)  # type: ignore[union-attr]


async def test_end_moves_cancels_fences_and_refuses_bad_input(
    store: Metastore, client: EtcdClient, fence: Fence
) -> None:
    pending = await _moving(store, fence, 4)
    for p in (0, 1, 2):
        await store.cancel("z", p, pending[p], fence, ts=5)
    with pytest.raises(InvalidInput, match="endings"):
        await store.end_moves([Ending("z", 0, pending[0])] * 2, fence, ts=6)
    results = await store.end_moves(
        [
            Ending("z", 0, pending[0]),  # a finish, but cancel wins
            Ending("z", 1, pending[1], cancelled=True),
            Ending("z", 2, pending[2], cancelled=True, already_done=True),
            Ending("z", 3, pending[3], cancelled=True),  # no cancel to finish
        ],
        fence,
        ts=6,
    )
    assert [r.outcome for r in results] == [
        Outcome.CANCELLED, Outcome.APPLIED, Outcome.APPLIED, Outcome.STALE,
    ]  # fmt: skip
    zone = await store.read_zone("z")
    assert zone.partition(1).peers(AssignField.STABLE) == ABC  # reverted
    assert zone.partition(2).peers(AssignField.STABLE) == BCD  # already done
    assert zone.partition(1).cancel is None
    assert zone.partition(2).cancel is None
    deposed = await _depose(client, fence)
    assert deposed != fence
    with pytest.raises(NotLeader):
        await store.end_moves([Ending("z", 0, pending[0], cancelled=True)], fence, ts=7)
    assert (await store.read_partition("z", 0)).cancel is not None  # nothing written


async def test_read_keys_answers_each_key_in_order_beyond_one_transaction(
    store: Metastore, client: EtcdClient
) -> None:
    keys = [f"/rk/{i:04d}".encode() for i in range(300)]
    for key in keys[::3]:
        await client.put(key, key[::-1])
    found = await store.read_keys(keys)  # 300 > 128 gets: three read transactions
    assert len(found) == 300
    for i, (key, kv) in enumerate(zip(keys, found, strict=True)):
        if i % 3:
            assert kv is None
        else:
            assert kv is not None
            assert (kv.key, kv.value) == (key, key[::-1])


async def test_zone_configs_create_only_and_cas(store: Metastore, fence: Fence) -> None:
    spec = ZoneSpec("orders", partitions=8, replicas=3, node_selector={"tier": "ssd"})
    created = await store.create_zone(spec, fence)
    assert created.applied
    dup = await store.create_zone(spec, fence)
    assert not dup.applied
    assert dup.current is not None
    assert dup.current.spec == spec
    record = await store.get_zone("orders")
    assert record is not None
    assert record.mod_revision == created.revision
    bigger = ZoneSpec("orders", partitions=16, replicas=3, node_selector={"tier": "ssd"})
    stale = await store.update_zone(bigger, record.mod_revision - 1, fence)
    assert not stale.applied
    assert stale.current == record
    updated = await store.update_zone(bigger, record.mod_revision, fence)
    assert updated.applied
    await store.create_partitions("orders", {0: ABC}, updated.revision, fence, ts=1)
    revision, zones = await store.list_zones()
    assert [z.spec for z in zones] == [bigger]
    assert revision >= updated.revision
    deleted = await store.delete_zone("orders", updated.revision, fence)
    assert deleted.applied
    assert await store.get_zone("orders") is None
    assert (await store.read_zone("orders")).partitions == {}
    with pytest.raises(InvalidInput):
        await store.create_zone(ZoneSpec("orders", partitions=0, replicas=1), fence)


async def test_nodes_register_under_a_lease(store: Metastore, client: EtcdClient) -> None:
    lease = await client.grant_lease(5)
    other = await client.grant_lease(5)
    try:
        await store.register_node(NodeRecord("n1", "127.0.0.1:7001", {"rack": "r1"}), lease)
        await store.register_node(NodeRecord("n1", "127.0.0.1:7001", {"rack": "r2"}), lease)
        with pytest.raises(Conflict):
            await store.register_node(NodeRecord("n1", "127.0.0.1:7009"), other)
        _, nodes = await store.list_nodes()
        assert [(n.name, n.lease) for n in nodes] == [("n1", lease.id)]
        assert isinstance(nodes[0].record, NodeRecord)
        assert nodes[0].record.attributes == {"rack": "r2"}
        await lease.revoke()  # the registration goes with the lease
        assert (await store.list_nodes())[1] == ()
        await store.register_node(NodeRecord("n1", "127.0.0.1:7009"), other)
    finally:
        await other.revoke()


async def test_owned_keys_are_put_in_as_few_transactions_as_the_limits_allow(
    store: Metastore, client: EtcdClient, keys: KeySpace
) -> None:
    lease = await client.grant_lease(5)
    try:
        items = {
            keys.size("z", p, "n1"): encode_size(ReplicaSize(p * 10, p, 1)) for p in range(300)
        }
        before = await client.current_revision()
        sent = await store.put_owned_many(items, lease)
        after = await client.current_revision()
        assert sent == after - before == math.ceil(300 / MAX_TXN_OPS)  # one revision per txn
        found = await client.list_prefix(keys.sizes_prefix())
        assert {kv.key: kv.value for kv in found.kvs} == items
        assert {kv.lease for kv in found.kvs} == {lease.id}
        assert await store.put_owned_many({}, lease) == 0
        assert await client.current_revision() == after
        await lease.revoke()  # they go with the writer's lease
        assert (await client.list_prefix(keys.sizes_prefix())).kvs == ()
    finally:
        await lease.revoke()


async def test_corrupt_values_are_unknown_not_fatal(
    store: Metastore, client: EtcdClient, keys: KeySpace, fence: Fence
) -> None:
    await client.put(keys.assign("z", 0, AssignField.STABLE), b"\x00garbage")
    await client.put(keys.assign("z", 0, AssignField.TRIGGER), b"junk")  # b"junk" > be8(any)
    state = await store.read_partition("z", 0)
    assert isinstance(state.stable.value, Corrupt)  # type: ignore[union-attr]
    # The trigger compare is on bytes, exactly as etcd does it: b"junk" is not older than 5.
    assert (await store.trigger("z", 0, ABC, 5, fence, ts=1)).outcome is Outcome.STALE_TRIGGER
    await client.put(keys.assign("z", 0, AssignField.TRIGGER), b"\x00")
    r = await store.trigger("z", 0, ABC, 5, fence, ts=1)  # a corrupt stable equals no target
    assert r.action is TriggerAction.WRITE_PENDING
    await client.put(keys.assign("z", 0, AssignField.PENDING), b"{}")
    pending = (await store.read_partition("z", 0)).mod(AssignField.PENDING)
    assert (await store.finish("z", 0, pending, fence, ts=2)).outcome is Outcome.CORRUPT
    assert (await store.cancel("z", 0, pending, fence, ts=2)).outcome is Outcome.APPLIED
    r = await store.finish_cancel("z", 0, pending, fence, ts=3)
    assert r.outcome is Outcome.APPLIED
    assert r.state.pending is None


async def test_bad_input_is_refused_before_any_write(
    store: Metastore, client: EtcdClient, fence: Fence
) -> None:
    rev = await client.current_revision()
    for call in (
        store.trigger("z", 0, (), 5, fence, ts=1),
        store.trigger("z", 0, ("a", "a"), 5, fence, ts=1),
        store.trigger("z", 0, ABC, 0, fence, ts=1),
        store.trigger("bad zone", 0, ABC, 5, fence, ts=1),
        store.finish("z", -1, 5, fence, ts=1),
        store.create_partitions("z", {0: ()}, 5, fence, ts=1),
    ):
        with pytest.raises(InvalidInput):
            await call
    assert await client.current_revision() == rev


async def test_isr_writes_of_many_partitions_share_transactions(
    store: Metastore, client: EtcdClient, keys: KeySpace
) -> None:
    """``IsrWrites``: concurrent in-sync-set writes go out together, each still fenced by its own
    lease and ISR revisions; a batch with one stale write writes nothing (its callers check
    alone)."""
    lease_revs = {}
    for p in range(100):
        lease = PrimaryLease("n1", 1, 2**40)
        lease_revs[p] = await client.put(keys.primary("z", p), encode_primary(lease))
    writes = IsrWrites(store)
    isr = InSyncSet(("n1", "n2"), "n1", 1, 0)
    revisions = await asyncio.gather(
        *(writes.write(IsrWrite("z", p, isr, lease_revs[p], 0)) for p in range(100))
    )
    assert all(r is not None for r in revisions)
    assert writes.written == 100
    assert writes.transactions < 10, writes.transactions  # not one per partition
    for p in range(100):
        kv = (await client.get(keys.isr("z", p))).first()
        assert kv is not None
        assert kv.mod_revision in revisions
    # One write compares a lease revision that moved on: its whole batch is left unwritten.
    moved = IsrWrite("z", 0, InSyncSet(("n1",), "n1", 1, 0), lease_revs[0] - 1, 0)
    fine = IsrWrite("z", 1, InSyncSet(("n1",), "n1", 1, 0), lease_revs[1], revisions[1] or 0)
    assert await asyncio.gather(writes.write(moved), writes.write(fine)) == [None, None]
    kv = (await client.get(keys.isr("z", 1))).first()
    assert kv is not None
    assert kv.mod_revision == revisions[1]
    await writes.close()


async def test_lease_terms_are_written_in_concurrent_fenced_batches_each_on_its_own_compares(
    store: Metastore, fence: Fence, client: EtcdClient, keys: KeySpace
) -> None:
    """A round of 300 terms goes out as three transactions at once; one whose compare is stale
    (a term written meanwhile) writes none of its batch, the others all of theirs; a stale
    fence writes nothing and raises NotLeader; stale terms are deleted on their mod revision."""
    nodes = [f"n{i:03d}" for i in range(300)]
    first = await store.write_terms(
        {n: TermWrite(LeaseTerm(10_000), 0) for n in nodes}, {}, fence, 1
    )
    assert first.raced == 0
    found = {kv.key: kv for kv in (await client.list_prefix(keys.terms_prefix())).kvs}
    assert len(found) == 300
    assert max(kv.mod_revision for kv in found.values()) == first.revision
    term = decode_term(found[keys.term("n000")].value)
    assert term == LeaseTerm(10_000, fence.epoch, 1)  # stamped with the writer's epoch and ts
    mods = {n: found[keys.term(n)].mod_revision for n in nodes}
    # n150 (the second batch of 120) is renewed by someone else meanwhile: that batch loses
    await client.put(keys.term("n150"), encode_term(LeaseTerm(1)))
    second = await store.write_terms(
        {n: TermWrite(LeaseTerm(20_000), mods[n]) for n in nodes}, {}, fence, 2
    )
    assert second.raced == 1
    after = {kv.key: kv for kv in (await client.list_prefix(keys.terms_prefix())).kvs}
    untils = {n: decode_term(after[keys.term(n)].value) for n in nodes}
    lost = {n for n, t in untils.items() if not (isinstance(t, LeaseTerm) and t.until == 20_000)}
    assert lost == set(nodes[120:240]), sorted(lost)[:3]
    # deletes compare the mod revision too
    gone = await store.write_terms({}, {"n000": after[keys.term("n000")].mod_revision}, fence, 3)
    assert gone.raced == 0
    assert (await client.get(keys.term("n000"))).first() is None
    # a deposed writer writes nothing
    successor = await _depose(client, fence)
    assert successor.epoch != fence.epoch
    with pytest.raises(NotLeader):
        await store.write_terms({"n001": TermWrite(LeaseTerm(1), 0)}, {}, fence, 4)
