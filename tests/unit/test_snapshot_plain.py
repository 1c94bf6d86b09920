"""The snapshot's plain path (``snapshot._plain``: the usual file recognised without pydantic)
accepts exactly what the schema (``snapshot_schema``) accepts, with the same result, and leaves
every error to the schema: the same first error, word for word."""

from __future__ import annotations

import math
from copy import deepcopy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.core.limits import MAX_PARTITIONS, MAX_REPLICAS
from placement.errors import InvalidInput
from placement.pipeline import snapshot
from placement.pipeline.snapshot import ClusterSnapshot, parse_snapshot

NODE_NAMES = ["n1", "n2", "n3", "n4"]


class Sub(str):
    """A str subclass: not plain, but the schema takes it as a str."""


#: What a value may be replaced with, by the field it is (wrong types, bounds, names, a str
#: subclass), and what any other may.
COUNTS = [0, -1, MAX_REPLICAS, MAX_REPLICAS + 1, MAX_PARTITIONS, MAX_PARTITIONS + 1, True, 4.0, "4"]
NAMES = [".", "..", "a\n", "", "x" * 64, "x" * 65, "bad name", "\u00e9", Sub("n1"), 1]
ODD: dict[str, list[Any]] = {
    "partitions": COUNTS,
    "replicas": COUNTS,
    "min_in_sync": COUNTS,
    "weight": [0, -0.0, -1, math.nan, math.inf, 2**70, True, "1"],
    "name": NAMES,
    "member": [*NAMES, "n1"],
    "any": [None, 1, "1", 1.5, True, [], {}, ["n1"], {"a": "b"}, {"a": 1}, {1: "a"}, Sub("x")],
}
GENERIC = [None, "1", 1.5, []]
#: Keys a dict may gain: unknown fields, fields again, partitions of the stable assignment.
KEYS = ["extra", "weight", "stable", "9", "x", "007", "\u00b2", "-1", "4", "3", 1, Sub("5")]

string_maps = st.dictionaries(st.sampled_from(["r", "s", ""]), st.sampled_from(["1", "", "\u00e9"]))
nodes = st.fixed_dictionaries(
    {"name": st.sampled_from(NODE_NAMES)},
    optional={
        "attributes": string_maps,
        "weight": st.sampled_from([1, 2.5, 2**70, 1e-320, math.inf]),
    },
)
stables = st.dictionaries(
    st.sampled_from(["0", "1", "2", "3"]),
    st.lists(st.sampled_from(NODE_NAMES), unique=True, max_size=4),
    max_size=4,
)
zones = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["z", "y"]),
        "partitions": st.sampled_from([4, 5, MAX_PARTITIONS]),
        "replicas": st.sampled_from([1, 2, 3, MAX_REPLICAS]),
    },
    optional={
        "node_selector": string_maps,
        "failure_domain": st.sampled_from(["rack", "", None]),
        "min_in_sync": st.sampled_from([None, 1, MAX_REPLICAS]),
        "stable": stables,
    },
)
#: Valid snapshots (but for duplicate names and stable names of no node, which the checks
#: after the schema find).
snapshots = st.fixed_dictionaries(
    {"nodes": st.lists(nodes, max_size=4), "zones": st.lists(zones, max_size=3)}
)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in ``value`` (its own path first)."""
    inside = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    return [path, *(p for key, item in inside for p in _paths(item, (*path, key)))]


def _mutate(data: Any, draw: st.DataObject) -> Any:
    """``data`` with one value somewhere in it replaced or removed, or a key or item added."""
    paths = _paths(data)
    fields = [p for p in paths if p and p[-1] in ODD]  # half the time one of these
    path = draw.draw(st.sampled_from(fields if fields and draw.draw(st.booleans()) else paths))
    if not path:
        return draw.draw(st.sampled_from(ODD["any"]))
    copy = deepcopy(data)
    *parents, last = path
    holder = copy
    for key in parents:
        holder = holder[key]
    field = last if last in ODD else "member" if "stable" in parents else "any"
    action = draw.draw(st.sampled_from(["replace", "replace", "remove", "add"]))
    if action == "replace":
        holder[last] = draw.draw(st.sampled_from(ODD[field] + GENERIC))
    elif action == "remove":
        del holder[last]
    elif isinstance(holder, dict):
        holder[draw.draw(st.sampled_from(KEYS))] = draw.draw(st.sampled_from([["n1"], 1]))
    else:
        holder.append(draw.draw(st.sampled_from(ODD["member"])))
    return copy


def _outcome(data: Any) -> ClusterSnapshot | str:
    try:
        return parse_snapshot(data)
    except InvalidInput as e:
        return f"error: {e}"


@settings(max_examples=2000, deadline=None)
@given(snapshots, st.integers(0, 2), st.data())
def test_plain_path_gives_what_the_schema_gives(
    valid: dict[str, Any], mutations: int, draw: st.DataObject
) -> None:
    data: Any = valid
    for _ in range(mutations):
        data = _mutate(data, draw)
    fast = _outcome(data)
    original = snapshot._plain
    snapshot._plain = lambda data: None  # type: ignore[assignment]
    try:
        by_schema = _outcome(data)
    finally:
        snapshot._plain = original
    assert fast == by_schema
    if isinstance(fast, ClusterSnapshot):  # the plain path never keeps a str subclass
        assert all(type(n.name) is str for n in fast.nodes)


def test_a_usual_snapshot_is_plain_and_only_bad_or_unusual_ones_are_not() -> None:
    zone = {"name": "z", "partitions": 4, "replicas": 2, "stable": {"0": ["n1", "n2"]}}
    usual = {"nodes": [{"name": "n1"}, {"name": "n2", "weight": 2}], "zones": [zone]}
    assert snapshot._plain(usual) is not None
    for bad in (
        {**usual, "zones": [{**zone, "partitions": True}]},
        {**usual, "zones": [{**zone, "stable": {"0": ["n1", 2]}}]},
        {**usual, "zones": [{**zone, "stable": {"0": ["n1", Sub("n3")]}}]},
        {**usual, "nodes": [{"name": "n1\n"}]},
        {**usual, "nodes": [{"name": "n1", "weight": math.nan}]},
    ):
        assert snapshot._plain(bad) is None


@pytest.mark.parametrize(
    ("stable", "error"),
    [
        ({"0": ["n1", "n1"]}, "zones[0].stable.0: a node is listed twice"),
        ({"0": ["n1", "n2"], "1": ["n2", "n1", "n2"]}, "zones[0].stable.1: a node is listed twice"),
        ({"0": ["n1"], "1": ["n2", "n3", "n4", "n5", "n1", "n5"]}, "zones[0].stable.1: a node"),
        ({"0": ["n1"], "4": ["n2"]}, "zones[0].stable.4: partition '4' is not a partition"),
        ({"0": ["n1"], "1": ["n2", "n3", "n4", "n5", "n6"]}, None),
        ({"0": ["n1", "n2", "n3"], "1": ["n3", "n2", "n1"]}, None),
    ],
)
def test_stable_checks_by_column_and_by_set(
    stable: dict[str, list[str]], error: str | None
) -> None:
    data = {"nodes": [{"name": "n1"}], "zones": [{"name": "z", "partitions": 4, "replicas": 1}]}
    data["zones"][0]["stable"] = stable
    outcome = _outcome(data)
    if error is None:
        assert isinstance(outcome, ClusterSnapshot)
    else:
        assert isinstance(outcome, str)
        assert outcome.startswith(f"error: {error}")


BASE: dict[str, Any] = {
    "nodes": [{"name": "n1", "attributes": {"rack": "r1"}, "weight": 1.5}, {"name": "n2"}],
    "zones": [
        {
            "name": "z",
            "partitions": 4,
            "replicas": 2,
            "node_selector": {"rack": "r1"},
            "failure_domain": "rack",
            "min_in_sync": 1,
            "stable": {"0": ["n1", "n2"], "1": ["n2"]},
        }
    ],
}


def _same_as_schema(data: Any) -> None:
    fast = _outcome(data)
    original = snapshot._plain
    snapshot._plain = lambda data: None  # type: ignore[assignment]
    try:
        assert fast == _outcome(data), data
    finally:
        snapshot._plain = original


@pytest.mark.parametrize(
    "path",
    [
        ("nodes", 0, "name"),
        ("nodes", 0, "attributes"),
        ("nodes", 0, "attributes", "rack"),
        ("nodes", 0, "weight"),
        ("zones", 0, "name"),
        ("zones", 0, "partitions"),
        ("zones", 0, "replicas"),
        ("zones", 0, "node_selector"),
        ("zones", 0, "node_selector", "rack"),
        ("zones", 0, "failure_domain"),
        ("zones", 0, "min_in_sync"),
        ("zones", 0, "stable"),
        ("zones", 0, "stable", "0"),
        ("zones", 0, "stable", "0", 1),
    ],
)
def test_every_odd_value_of_every_field_as_the_schema_says(path: tuple[Any, ...]) -> None:
    *parents, last = path
    field = last if last in ODD else "member" if "stable" in parents else "any"
    for value in [*ODD[field], *ODD["any"]]:
        data = deepcopy(BASE)
        holder = data
        for key in parents:
            holder = holder[key]
        holder[last] = value
        _same_as_schema(data)
        if isinstance(holder, dict):
            del holder[last]
            _same_as_schema(data)
    for key in KEYS:  # keys added to the top level, a node, a zone, the stable assignment
        for holder_path in ((), ("nodes", 0), ("zones", 0), ("zones", 0, "stable")):
            data = deepcopy(BASE)
            holder = data
            for part in holder_path:
                holder = holder[part]
            holder[key] = ["n1"]
            _same_as_schema(data)
