"""The key layout: building, parsing back, ordering and validation (pure, no etcd)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.core.limits import MAX_PARTITIONS
from placement.core.names import validate_name
from placement.errors import InvalidInput
from placement.metastore.keys import AssignField, KeyKind, KeySpace, ParsedKey, prefix_range_end

names = st.from_regex(r"[A-Za-z0-9_.-]{1,64}", fullmatch=True).filter(
    lambda s: s not in {".", ".."}
)
partitions = st.integers(0, MAX_PARTITIONS - 1)
fields = st.sampled_from(list(AssignField))
prefixes = st.lists(st.from_regex(r"[a-z0-9_.-]{1,8}", fullmatch=True), min_size=1, max_size=3).map(
    lambda parts: "/" + "/".join(parts)
)


def test_default_layout() -> None:
    ks = KeySpace()
    assert ks.zone("orders") == b"/placement/zones/orders"
    assert ks.node("n-1") == b"/placement/nodes/n-1"
    assert ks.leader("driver-a") == b"/placement/leader/driver-a"
    assert ks.assign("orders", 7, AssignField.PENDING) == b"/placement/assign/orders/00007/pending"
    assert ks.partition_prefix("orders", 7) == b"/placement/assign/orders/00007/"
    assert ks.zone_assign_prefix("orders") == b"/placement/assign/orders/"


@given(prefixes, names, partitions, fields)
def test_assign_key_round_trips(prefix: str, zone: str, partition: int, f: AssignField) -> None:
    ks = KeySpace(prefix)
    key = ks.assign(zone, partition, f)
    assert ks.parse(key) == ParsedKey(KeyKind.ASSIGN, zone, partition, f)
    assert key.startswith(ks.partition_prefix(zone, partition))
    assert key.startswith(ks.zone_assign_prefix(zone))


@given(names)
def test_other_keys_round_trip(name: str) -> None:
    ks = KeySpace("/x")
    assert ks.parse(ks.zone(name)) == ParsedKey(KeyKind.ZONE, name)
    assert ks.parse(ks.node(name)) == ParsedKey(KeyKind.NODE, name)
    assert ks.parse(ks.leader(name)) == ParsedKey(KeyKind.LEADER, name)


@given(prefixes, names, partitions, names)
def test_progress_key_round_trips(prefix: str, zone: str, partition: int, node: str) -> None:
    ks = KeySpace(prefix)
    key = ks.progress(zone, partition, node)
    assert ks.parse(key) == ParsedKey(KeyKind.PROGRESS, zone, partition, node=node)
    assert key.startswith(ks.partition_progress_prefix(zone, partition))
    assert key.startswith(ks.progress_prefix())


def test_progress_layout_and_strays() -> None:
    ks = KeySpace()
    assert ks.progress("orders", 7, "n-1") == b"/placement/progress/orders/00007/n-1"
    assert ks.parse(b"/placement/progress/orders/00007") is None
    assert ks.parse(b"/placement/progress/orders/7/n-1") is None
    assert ks.parse(b"/placement/progress/orders/00007/n-1/x") is None


@given(names, partitions, partitions, fields, fields)
def test_byte_order_is_partition_order(
    zone: str, p: int, q: int, f: AssignField, g: AssignField
) -> None:
    """A range scan of a zone returns partitions in numeric order (fixed-width digits)."""
    ks = KeySpace()
    if p != q:
        assert (ks.assign(zone, p, f) < ks.assign(zone, q, g)) == (p < q)


@given(names, names)
def test_zone_prefixes_do_not_overlap(a: str, b: str) -> None:
    """Zone ``a`` never sees keys of zone ``a.b`` or ``ab`` in its prefix scan."""
    ks = KeySpace()
    if a != b:
        assert not ks.assign(b, 0, AssignField.STABLE).startswith(ks.zone_assign_prefix(a))


@pytest.mark.parametrize(
    "key",
    [
        b"/other/zones/a",
        b"/placement/zones/",
        b"/placement/zones/a/b",
        b"/placement/unknown/a",
        b"/placement/assign/z/7/stable",
        b"/placement/assign/z/00007/bogus",
        b"/placement/assign/z/99999/stable",
        b"/placement/assign/z/00007",
        b"/placement/assign/bad name/00007/stable",
        b"/placement/zones/\xff\xfe",
        b"/placementzones/a",
    ],
)
def test_foreign_or_malformed_keys_parse_to_none(key: bytes) -> None:
    assert KeySpace().parse(key) is None


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a b", "x" * 65, "é"])
def test_bad_names_rejected(name: str) -> None:
    with pytest.raises(InvalidInput) as e:
        KeySpace().zone(name)
    assert e.value.field == "zone"
    with pytest.raises(InvalidInput):
        validate_name(name, "node")


@pytest.mark.parametrize("partition", [-1, MAX_PARTITIONS, True, 1.0])
def test_bad_partitions_rejected(partition: object) -> None:
    with pytest.raises(InvalidInput) as e:
        KeySpace().assign("z", partition, AssignField.STABLE)  # type: ignore[arg-type]
    assert e.value.field == "partition"


@pytest.mark.parametrize("prefix", ["", "placement", "/placement/", "//x", "/a b", "/a//b"])
def test_bad_prefixes_rejected(prefix: str) -> None:
    with pytest.raises(InvalidInput) as e:
        KeySpace(prefix)
    assert e.value.field == "prefix"


@given(st.binary(min_size=1, max_size=16), st.binary(max_size=8))
def test_prefix_range_end_bounds_exactly_the_prefix(prefix: bytes, tail: bytes) -> None:
    end = prefix_range_end(prefix)
    key = prefix + tail
    assert key >= prefix
    if end != b"\x00":
        assert key < end
    # A key that does not start with the prefix and sorts after it is outside the range.
    outside = end
    if end != b"\x00":
        assert not outside.startswith(prefix)


def test_prefix_range_end_examples() -> None:
    assert prefix_range_end(b"/a/") == b"/a0"
    assert prefix_range_end(b"a\xff") == b"b"
    assert prefix_range_end(b"\xff\xff") == b"\x00"


def test_isr_and_size_keys_round_trip() -> None:
    ks = KeySpace()
    assert ks.isr("orders", 7) == b"/placement/isr/orders/00007"
    assert ks.parse(ks.isr("orders", 7)) == ParsedKey(KeyKind.ISR, "orders", 7)
    assert ks.size("orders", 7, "n-1") == b"/placement/sizes/orders/00007/n-1"
    assert ks.parse(ks.size("orders", 7, "n-1")) == ParsedKey(
        KeyKind.SIZES, "orders", 7, node="n-1"
    )
    assert ks.isr("orders", 7).startswith(ks.zone_isr_prefix("orders"))
    assert ks.parse(b"/placement/isr/orders/7") is None
    assert ks.parse(b"/placement/sizes/orders/00007") is None


def test_layout_and_reshard_report_keys_round_trip() -> None:
    ks = KeySpace()
    assert ks.layout("orders") == b"/placement/layout/orders"
    assert ks.parse(ks.layout("orders")) == ParsedKey(KeyKind.LAYOUT, "orders")
    assert ks.reshard_report("orders", 7) == b"/placement/reshard/orders/00007"
    assert ks.parse(ks.reshard_report("orders", 7)) == ParsedKey(KeyKind.RESHARD, "orders", 7)
    assert ks.reshard_report("orders", 7).startswith(ks.zone_reshard_prefix("orders"))
    assert not ks.reshard_report("orders.b", 7).startswith(ks.zone_reshard_prefix("orders"))
    assert ks.parse(b"/placement/layout/orders/00007") is None
    assert ks.parse(b"/placement/reshard/orders") is None
