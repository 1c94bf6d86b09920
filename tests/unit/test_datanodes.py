"""Holddown of a zone's data nodes (pure): scale-up / scale-down delays on an injected clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from placement.core.model import ZoneSpec
from placement.driver.datanodes import advance, holddown_remaining, matching_nodes
from placement.metastore.codec import DataNodes, NodeRecord, decode_datanodes, encode_datanodes

SPEC = ZoneSpec("z", 8, 2, scale_up_delay=10.0, scale_down_delay=30.0)
ABC = ("a", "b", "c")


def steady(names: tuple[str, ...] = ABC) -> DataNodes:
    return DataNodes(applied=names, observed=names, up_since=None, down_since=None)


def test_a_new_zone_applies_the_observed_set_at_once() -> None:
    record = advance(SPEC, None, ["c", "a", "b"], now_ms=5)
    assert record == steady()


def test_a_node_that_leaves_and_returns_within_the_scale_down_delay_changes_nothing() -> None:
    left = advance(SPEC, steady(), ["a", "b"], now_ms=1_000)
    assert left.applied == ABC
    assert left.down_since == 1_000
    assert holddown_remaining(SPEC, left, 1_000) == 30.0
    still = advance(SPEC, left, ["a", "b"], now_ms=20_000)
    assert still.applied == ABC
    assert still.down_since == 1_000
    back = advance(SPEC, still, ABC, now_ms=29_000)
    assert back == steady()
    assert holddown_remaining(SPEC, back, 29_000) is None
    later = advance(SPEC, back, ABC, now_ms=100_000)
    assert later.same_content(back)


def test_a_removal_is_applied_when_the_scale_down_delay_expires() -> None:
    left = advance(SPEC, steady(), ["a", "b"], now_ms=1_000)
    due = advance(SPEC, left, ["a", "b"], now_ms=31_000)
    assert due == steady(("a", "b"))


def test_additions_and_removals_have_independent_timers() -> None:
    both = advance(SPEC, steady(), ["a", "b", "d"], now_ms=0)
    assert (both.up_since, both.down_since) == (0, 0)
    up_due = advance(SPEC, both, ["a", "b", "d"], now_ms=10_000)
    assert up_due.applied == ("a", "b", "c", "d")
    assert (up_due.up_since, up_due.down_since) == (None, 0)
    assert holddown_remaining(SPEC, up_due, 10_000) == 20.0
    down_due = advance(SPEC, up_due, ["a", "b", "d"], now_ms=30_000)
    assert down_due == steady(("a", "b", "d"))


def test_zero_delays_apply_at_once() -> None:
    spec = ZoneSpec("z", 1, 1)
    assert advance(spec, steady(), ["a", "d"], now_ms=7) == steady(("a", "d"))


def test_selector_matching() -> None:
    nodes = [
        NodeRecord("x", "h:1", {"tier": "ssd"}),
        NodeRecord("y", "h:2", {"tier": "hdd"}),
        NodeRecord("w", "h:3", {"tier": "ssd", "rack": "1"}),
    ]
    assert matching_nodes(ZoneSpec("z", 1, 1, node_selector={"tier": "ssd"}), nodes) == ("w", "x")
    assert matching_nodes(ZoneSpec("z", 1, 1), nodes) == ("w", "x", "y")


names = st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), unique=True)


@given(
    steps=st.lists(st.tuples(names, st.integers(0, 5_000)), max_size=12),
    up=st.integers(0, 8),
    down=st.integers(0, 8),
)
def test_applied_changes_only_after_a_change_was_held_for_its_delay(
    steps: list[tuple[list[str], int]], up: int, down: int
) -> None:
    spec = ZoneSpec("z", 1, 1, scale_up_delay=float(up), scale_down_delay=float(down))
    record = steady()
    now = 0
    for observed, dt in steps:
        now += dt
        before = record
        record = advance(spec, record, observed, now)
        added = set(record.applied) - set(before.applied)
        removed = set(before.applied) - set(record.applied)
        if added:
            assert before.up_since is not None or up == 0 or dt >= 0
            assert now - (before.up_since if before.up_since is not None else now) >= up * 1000
            assert added <= set(observed)
        if removed:
            assert now - (before.down_since if before.down_since is not None else now) >= (
                down * 1000
            )
            assert not removed & set(observed)
        assert decode_datanodes(encode_datanodes(record)) == record


def test_a_drained_node_leaves_at_once_and_other_removals_keep_their_delay() -> None:
    """An operator's drain is not a failure: no scale-down delay for it."""
    drained = advance(SPEC, steady(), ["a", "b"], now_ms=1_000, drained={"c"})
    assert drained == steady(("a", "b"))
    both = advance(SPEC, steady(("a", "b", "c", "d")), ["a", "b"], now_ms=1_000, drained={"c"})
    assert both.applied == ("a", "b", "d")  # c at once, d after its delay
    assert both.down_since == 1_000
