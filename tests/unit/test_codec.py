"""Value encodings: canonical round trips, trigger byte order = numeric order, corrupt input."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from placement.core.layout import Reshard, ReshardPhase, ZoneLayout
from placement.core.limits import MAX_PARTITIONS, MAX_REPLICAS
from placement.core.model import ZoneSpec, effective_min_in_sync
from placement.errors import InvalidInput
from placement.metastore.codec import (
    MAX_INT,
    Assignment,
    CancelIntent,
    Corrupt,
    LayoutValue,
    MoveReport,
    NodeRecord,
    ReshardReport,
    TriggerMark,
    be8,
    decode_assignment,
    decode_cancel,
    decode_layout,
    decode_node,
    decode_report,
    decode_reshard_report,
    decode_trigger,
    decode_zone_spec,
    encode_assignment,
    encode_cancel,
    encode_layout,
    encode_node,
    encode_report,
    encode_reshard_report,
    encode_trigger,
    encode_zone_spec,
    trigger_is_older,
)

node_names = st.from_regex(r"[A-Za-z0-9_.-]{1,12}", fullmatch=True)
peers = st.lists(node_names, min_size=1, max_size=6, unique=True).map(tuple)
maybe_empty_peers = st.lists(node_names, max_size=6, unique=True).map(tuple)
ints = st.integers(0, MAX_INT)
revisions = st.integers(1, MAX_INT)
assignments = st.builds(Assignment, peers=peers, epoch=ints, ts=ints, trigger=ints)
cancels = st.builds(
    CancelIntent, old=maybe_empty_peers, new=maybe_empty_peers, pending_revision=revisions,
    epoch=ints, ts=ints,
)  # fmt: skip
triggers = st.builds(TriggerMark, revision=ints, epoch=ints, ts=ints)
text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8)
zone_specs = st.builds(
    ZoneSpec,
    name=node_names,
    partitions=st.integers(1, MAX_PARTITIONS),
    replicas=st.integers(1, MAX_REPLICAS),
    node_selector=st.dictionaries(text, text, max_size=3),
    failure_domain=st.none() | text,
)
nodes = st.builds(
    NodeRecord,
    name=node_names,
    address=st.just("127.0.0.1:7000"),
    attributes=st.dictionaries(text, text, max_size=3),
    weight=st.floats(min_value=0.01, max_value=1e6, allow_nan=False),
)


@given(assignments)
def test_assignment_round_trip_is_canonical(value: Assignment) -> None:
    raw = encode_assignment(value)
    assert decode_assignment(raw) == value
    assert encode_assignment(value) == raw  # deterministic
    # canonical: sorted keys, compact separators, peers in placement order
    obj = json.loads(raw)
    assert raw == json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    assert tuple(obj["peers"]) == value.peers


@given(assignments)
def test_peer_order_is_content(value: Assignment) -> None:
    assume(len(value.peers) > 1)
    swapped = Assignment(value.peers[::-1], value.epoch, value.ts, value.trigger)
    assert encode_assignment(swapped) != encode_assignment(value)


@given(cancels)
def test_cancel_round_trip(value: CancelIntent) -> None:
    raw = encode_cancel(value)
    assert decode_cancel(raw) == value
    assert encode_cancel(value) == raw


@given(triggers)
def test_trigger_round_trip(value: TriggerMark) -> None:
    raw = encode_trigger(value)
    assert decode_trigger(raw) == value
    assert raw[:8] == be8(value.revision)


@given(ints, ints)
def test_be8_byte_order_is_numeric_order(a: int, b: int) -> None:
    assert (be8(a) < be8(b)) == (a < b)
    assert (be8(a) == be8(b)) == (a == b)


@given(triggers, revisions)
def test_trigger_compare_is_exactly_stored_less_than_new(stored: TriggerMark, new: int) -> None:
    """``value(trigger) < be8(new)`` (etcd's byte compare) <=> stored revision < new.

    In particular an equal revision compares greater (the suffix), so a repeat is rejected.
    """
    raw = encode_trigger(stored)
    assert trigger_is_older(raw, new) == (stored.revision < new)
    assert (raw < be8(new)) == (stored.revision < new)


def test_equal_trigger_is_not_older() -> None:
    raw = encode_trigger(TriggerMark(42, 1, 2))
    assert not trigger_is_older(raw, 42)
    assert trigger_is_older(raw, 43)
    assert not trigger_is_older(raw, 41)


@given(zone_specs)
def test_zone_spec_round_trip(spec: ZoneSpec) -> None:
    raw = encode_zone_spec(spec)
    decoded = decode_zone_spec(raw)
    assert isinstance(decoded, ZoneSpec)
    assert (decoded.name, decoded.partitions, decoded.replicas, decoded.failure_domain) == (
        spec.name,
        spec.partitions,
        spec.replicas,
        spec.failure_domain,
    )
    assert dict(decoded.node_selector) == dict(spec.node_selector)
    assert encode_zone_spec(decoded) == raw


@given(nodes)
def test_node_round_trip(record: NodeRecord) -> None:
    raw = encode_node(record)
    decoded = decode_node(raw)
    assert isinstance(decoded, NodeRecord)
    assert decoded.name == record.name
    assert decoded.weight == record.weight
    assert dict(decoded.attributes) == dict(record.attributes)
    assert encode_node(decoded) == raw


DECODERS = [
    decode_assignment,
    decode_cancel,
    decode_trigger,
    decode_zone_spec,
    decode_node,
    decode_layout,
    decode_reshard_report,
]


@pytest.mark.parametrize("decode", DECODERS)
@given(raw=st.binary(max_size=64))
def test_arbitrary_bytes_never_crash(decode, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    result = decode(raw)
    if isinstance(result, Corrupt):
        assert result.raw == raw
        assert result.reason


@pytest.mark.parametrize(
    ("decode", "raw"),
    [
        (decode_assignment, b""),
        (decode_assignment, b"not json"),
        (decode_assignment, b"[]"),
        (decode_assignment, b'{"v":2,"peers":["a"],"epoch":1,"ts":1,"trigger":1}'),
        (decode_assignment, b'{"v":true,"peers":["a"],"epoch":1,"ts":1,"trigger":1}'),
        (decode_assignment, b'{"v":1,"peers":["a","a"],"epoch":1,"ts":1,"trigger":1}'),
        (decode_assignment, b'{"v":1,"peers":[],"epoch":1,"ts":1,"trigger":1}'),
        (decode_assignment, b'{"v":1,"peers":["a"],"epoch":-1,"ts":1,"trigger":1}'),
        (decode_assignment, b'{"v":1,"peers":["a"],"epoch":1.5,"ts":1,"trigger":1}'),
        (decode_assignment, b'{"v":1,"peers":["a"],"epoch":1,"ts":1}'),
        (decode_assignment, b'{"v":1,"peers":["a"],"epoch":1,"ts":1,"trigger":1,"x":0}'),
        (decode_assignment, b'{"v":1,"peers":"ab","epoch":1,"ts":1,"trigger":1}'),
        (decode_assignment, b"\xff\xfe\x00"),
        (decode_cancel, b'{"v":1,"old":[],"new":[],"pending_revision":0,"epoch":1,"ts":1}'),
        (decode_trigger, b"\x00" * 8),
        (decode_trigger, b"\x00" * 7),
        (decode_trigger, b"\x80" + b"\x00" * 7 + b'{"epoch":1,"ts":1,"v":1}'),
        (decode_trigger, be8(5) + b"{}"),
        (decode_zone_spec, b'{"v":1,"name":"z","partitions":0,"replicas":1,'
                           b'"node_selector":{},"failure_domain":null}'),
        (decode_node, b'{"v":1,"name":"n","address":"","attributes":{},"weight":1.0}'),
        (decode_node, b'{"v":1,"name":"n","address":"a:1","attributes":{},"weight":NaN}'),
    ],
)  # fmt: skip
def test_corrupt_values_decode_to_corrupt(decode, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    result = decode(raw)
    assert isinstance(result, Corrupt)
    assert result.raw == raw


@pytest.mark.parametrize(
    "value",
    [
        Assignment((), 1, 1, 1),
        Assignment(("a", "a"), 1, 1, 1),
        Assignment(("a b",), 1, 1, 1),
        Assignment(("a",), -1, 1, 1),
        Assignment(("a",), 1, 1, 2**63),
    ],
)
def test_invalid_assignments_are_refused(value: Assignment) -> None:
    with pytest.raises(InvalidInput):
        encode_assignment(value)


def test_invalid_zone_spec_names_field() -> None:
    with pytest.raises(InvalidInput) as e:
        encode_zone_spec(ZoneSpec("z", partitions=0, replicas=1))
    assert e.value.field == "partitions"
    with pytest.raises(InvalidInput) as e:
        encode_zone_spec(ZoneSpec("z", partitions=1, replicas=MAX_REPLICAS + 1))
    assert e.value.field == "replicas"


@given(
    revision=st.integers(0, 2**63 - 1),
    epoch=st.integers(0, 2**63 - 1),
    phase=st.sampled_from(["DONE", "FAILED"]),
    detail=st.text(max_size=40),
    ts=st.integers(0, 2**63 - 1),
)
def test_move_report_round_trip_is_canonical(
    revision: int, epoch: int, phase: str, detail: str, ts: int
) -> None:
    report = MoveReport(revision, epoch, phase, detail, ts)
    raw = encode_report(report)
    assert decode_report(raw) == report
    assert encode_report(decode_report(raw)) == raw  # type: ignore[arg-type]
    assert raw == json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")).encode()


@given(raw=st.binary(max_size=64))
def test_arbitrary_bytes_never_crash_the_report_decoder(raw: bytes) -> None:
    result = decode_report(raw)
    if isinstance(result, Corrupt):
        assert result.raw == raw
        assert result.reason


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xff\x00",
        b"[]",
        b'{"v":1,"revision":5,"epoch":1,"phase":"ACCEPTED","detail":"","ts":1}',
        b'{"v":1,"revision":5,"epoch":1,"phase":"DONE","detail":3,"ts":1}',
        b'{"v":1,"revision":-5,"epoch":1,"phase":"DONE","detail":"","ts":1}',
        b'{"v":1,"revision":5,"epoch":1,"phase":"DONE","detail":""}',
        b'{"v":2,"revision":5,"epoch":1,"phase":"DONE","detail":"","ts":1}',
        b'{"v":1,"revision":5,"epoch":1,"phase":"DONE","detail":"","ts":1,"x":0}',
    ],
)
def test_corrupt_move_reports_decode_to_corrupt(raw: bytes) -> None:
    result = decode_report(raw)
    assert isinstance(result, Corrupt)
    assert result.raw == raw


@pytest.mark.parametrize(
    "report",
    [MoveReport(1, 1, "ACCEPTED", "", 1), MoveReport(-1, 1, "DONE", "", 1)],
)
def test_invalid_move_reports_are_refused(report: MoveReport) -> None:
    with pytest.raises(InvalidInput):
        encode_report(report)


_node_names = st.from_regex(r"\A[a-z][a-z0-9-]{0,8}\Z")


@given(st.sets(_node_names, min_size=1, max_size=5), st.integers(1, 2**40), st.integers(0, 2**40))
def test_isr_round_trip_sorts_members(members: set[str], lease_epoch: int, ts: int) -> None:
    from placement.metastore.codec import InSyncSet, decode_isr, encode_isr

    primary = min(members)
    value = InSyncSet(tuple(sorted(members, reverse=True)), primary, lease_epoch, ts)
    raw = encode_isr(value)
    assert decode_isr(raw) == InSyncSet(tuple(sorted(members)), primary, lease_epoch, ts)
    assert encode_isr(decode_isr(raw)) == raw  # type: ignore[arg-type]


def test_isr_without_its_primary_round_trips_and_a_bad_primary_decodes_corrupt() -> None:
    """A primary that found its replica lacks committed entries writes the ISR without itself
    (design/data-plane.md): it encodes and decodes like any other; a primary that is not a
    node name is refused (encode) or corrupt (decode)."""
    from placement.metastore.codec import Corrupt, InSyncSet, decode_isr, encode_isr

    stepped_down = InSyncSet(("a", "b"), "c", 1, 0)
    assert decode_isr(encode_isr(stepped_down)) == stepped_down
    with pytest.raises(InvalidInput, match="primary"):
        encode_isr(InSyncSet(("a", "b"), "", 1, 0))
    for primary in (b'""', b"7", b"null", b'"a/b"'):
        raw = b'{"lease_epoch":1,"members":["a"],"primary":' + primary + b',"ts":0,"v":1}'
        assert isinstance(decode_isr(raw), Corrupt), primary


@given(st.integers(0, 2**50), st.integers(0, 2**40), st.integers(0, 2**40))
def test_size_round_trip(nbytes: int, keys: int, ts: int) -> None:
    from placement.metastore.codec import ReplicaSize, decode_size, encode_size

    raw = encode_size(ReplicaSize(nbytes, keys, ts))
    assert decode_size(raw) == ReplicaSize(nbytes, keys, ts)
    assert json.loads(raw) == {"bytes": nbytes, "keys": keys, "ts": ts, "v": 1}


@given(zone_specs, st.none() | st.integers(1, MAX_REPLICAS))
def test_zone_spec_min_in_sync_round_trips_canonically(spec: ZoneSpec, wanted: int | None) -> None:
    spec = ZoneSpec(
        spec.name,
        spec.partitions,
        spec.replicas,
        spec.node_selector,
        spec.failure_domain,
        min_in_sync=wanted,
    )
    raw = encode_zone_spec(spec)
    decoded = decode_zone_spec(raw)
    assert isinstance(decoded, ZoneSpec)
    assert decoded.min_in_sync == wanted
    assert encode_zone_spec(decoded) == raw
    # unset is not written at all: a zone without it encodes as before the field existed
    assert ("min_in_sync" in json.loads(raw)) == (wanted is not None)
    assert effective_min_in_sync(decoded) == min(2 if wanted is None else wanted, spec.replicas)


def test_zone_values_written_before_min_in_sync_decode_with_the_default() -> None:
    v1 = b'{"failure_domain":null,"name":"z","node_selector":{},"partitions":4,"replicas":3,"v":1}'
    delays = (
        b'{"failure_domain":"rack","name":"z","node_selector":{},"partitions":4,"replicas":1,'
        b'"scale_down_delay":5.0,"scale_up_delay":0.0,"v":1}'
    )
    old = decode_zone_spec(v1)
    assert isinstance(old, ZoneSpec)
    assert old.min_in_sync is None
    assert effective_min_in_sync(old) == 2
    with_delays = decode_zone_spec(delays)
    assert isinstance(with_delays, ZoneSpec)
    assert (with_delays.min_in_sync, with_delays.scale_down_delay) == (None, 5.0)
    assert effective_min_in_sync(with_delays) == 1  # capped at replicas
    assert encode_zone_spec(with_delays) == delays


@pytest.mark.parametrize("bad", [0, MAX_REPLICAS + 1, -1, True, 2.5, None, "2"])
def test_an_invalid_stored_min_in_sync_decodes_corrupt(bad: object) -> None:
    raw = json.dumps(
        {
            "v": 1,
            "name": "z",
            "partitions": 4,
            "replicas": 3,
            "node_selector": {},
            "failure_domain": None,
            "scale_up_delay": 0.0,
            "scale_down_delay": 0.0,
            "min_in_sync": bad,
        }
    ).encode()
    assert isinstance(decode_zone_spec(raw), Corrupt)


def test_encoding_an_invalid_min_in_sync_names_the_field() -> None:
    for bad in (0, MAX_REPLICAS + 1):
        with pytest.raises(InvalidInput) as e:
            encode_zone_spec(ZoneSpec("z", 1, 1, min_in_sync=bad))
        assert e.value.field == "min_in_sync"


# -- zone layouts and reshard reports (design/resharding.md) -------------------------------------

_phases = st.sampled_from(list(ReshardPhase))


@st.composite
def _layouts(draw: st.DrawFn) -> ZoneLayout:
    generation = draw(st.integers(1, 2**40))
    if draw(st.booleans()):
        return ZoneLayout(generation, draw(st.integers(1, MAX_PARTITIONS)))
    source = draw(st.integers(1, MAX_PARTITIONS))
    target = draw(st.integers(1, MAX_PARTITIONS).filter(lambda t: t != source))
    phase = draw(_phases)
    reshard = Reshard(draw(st.integers(1, 2**40)), source, target, phase)
    return ZoneLayout(generation, target if phase is ReshardPhase.CLEANUP else source, reshard)


@given(_layouts(), st.integers(0, 2**40), st.integers(0, 2**40))
def test_layout_round_trip_is_canonical(layout: ZoneLayout, epoch: int, ts: int) -> None:
    raw = encode_layout(LayoutValue(layout, epoch, ts))
    assert decode_layout(raw) == LayoutValue(layout, epoch, ts)
    assert encode_layout(decode_layout(raw)) == raw  # type: ignore[arg-type]
    assert json.loads(raw)["generation"] == layout.generation


@pytest.mark.parametrize(
    "raw",
    [
        b'{"v":1,"generation":0,"partitions":8,"reshard":null,"epoch":1,"ts":1}',
        b'{"v":1,"generation":1,"partitions":0,"reshard":null,"epoch":1,"ts":1}',
        b'{"v":1,"generation":1,"partitions":8,"epoch":1,"ts":1}',
        b'{"v":1,"generation":1,"partitions":8,"reshard":[],"epoch":1,"ts":1}',
        b'{"v":1,"generation":1,"partitions":8,"reshard":{"attempt":3,"source":8,"target":8,'
        b'"phase":"copy"},"epoch":1,"ts":1}',
        b'{"v":1,"generation":1,"partitions":8,"reshard":{"attempt":3,"source":8,"target":16,'
        b'"phase":"copying"},"epoch":1,"ts":1}',
        # before the flip the source count is in force, not the target
        b'{"v":1,"generation":1,"partitions":16,"reshard":{"attempt":3,"source":8,"target":16,'
        b'"phase":"seal"},"epoch":1,"ts":1}',
        b'{"v":1,"generation":1,"partitions":8,"reshard":{"attempt":0,"source":8,"target":16,'
        b'"phase":"copy"},"epoch":1,"ts":1}',
    ],
)
def test_corrupt_layouts_decode_to_corrupt(raw: bytes) -> None:
    result = decode_layout(raw)
    assert isinstance(result, Corrupt)
    assert result.raw == raw


@given(
    st.builds(
        ReshardReport,
        st.integers(1, 2**40),
        st.integers(0, 2**40),
        st.integers(0, 2**40),
        st.integers(0, 2**50),
        st.integers(0, 2**40),
        st.booleans(),
        st.booleans(),
        st.integers(0, 2**40),
    )
)
def test_reshard_report_round_trip(report: ReshardReport) -> None:
    raw = encode_reshard_report(report)
    assert decode_reshard_report(raw) == report
    assert decode_reshard_report(raw.replace(b'"drained":', b'"drained":1,"x":')) != report


def test_invalid_reshard_reports_are_refused_naming_the_field() -> None:
    with pytest.raises(InvalidInput, match="attempt"):
        encode_reshard_report(ReshardReport(0, 1))
    with pytest.raises(InvalidInput, match="drained"):
        encode_reshard_report(ReshardReport(1, 1, drained=1))  # type: ignore[arg-type]
