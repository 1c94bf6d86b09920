"""The cluster snapshot file: parsing and validation into domain types.

Format (documented in design/formats.md)::

    {"nodes": [{"name": str, "attributes": {str: str}, "weight": float?}],
     "zones": [{"name": str, "partitions": int, "replicas": int,
                "node_selector": {str: str}?, "failure_domain": str?, "min_in_sync": int?,
                "stable": {"<partition>": [node, ...]}?}]}

Every problem is reported as :class:`InvalidInput` naming the field as a path
(``zones[1].replicas``) and the fix; nothing is half-accepted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import eq, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeGuard

import orjson

from placement.core.limits import MAX_PARTITIONS, MAX_REPLICAS, NAME_PATTERN
from placement.core.model import Node, Peers, ZoneSpec
from placement.core.names import NAME_HINT, is_name
from placement.errors import InvalidInput

if TYPE_CHECKING:
    from pydantic import ValidationError as PydanticValidationError


@dataclass(frozen=True, slots=True)
class ZoneSnapshot:
    """A zone's spec and its current stable assignment (partition -> ordered peers)."""

    spec: ZoneSpec
    stable: Mapping[int, Peers]


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """A validated cluster snapshot: registered nodes and zones, both in file order."""

    nodes: tuple[Node, ...]
    zones: tuple[ZoneSnapshot, ...]


_FIXES = {
    "missing": "add the field",
    "extra_forbidden": "remove the field or check its spelling",
    "greater_than_equal": "use a larger whole number",
    "less_than_equal": "use a smaller number",
    "greater_than": "use a number above zero",
    "string_pattern_mismatch": "use 1-64 letters, digits, '_', '.' or '-'",
    "int_type": "use a whole number",
    "string_type": "use a string",
    "dict_type": "use an object",
    "list_type": "use a list",
    "model_type": "use a JSON object",
    "bool_type": "use true or false",
}


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("int", "float", "str") or "[" in part:
            continue  # union-member labels pydantic adds; not part of the user's path
        else:
            out += f".{part}" if out else part
    return out or "(top level)"


def _from_pydantic(error: PydanticValidationError) -> InvalidInput:
    first = error.errors()[0]
    fix = _FIXES.get(first["type"], "")
    return InvalidInput(_path(tuple(first["loc"])), first["msg"], fix)


def parse_snapshot(data: Any) -> ClusterSnapshot:
    """Validates decoded JSON into a :class:`ClusterSnapshot` or raises :class:`InvalidInput`."""
    fields = _plain(data)
    if fields is None:
        fields = _by_schema(data)
    node_fields, zone_fields = fields
    _unique("nodes", [n[0] for n in node_fields])
    _unique("zones", [z.name for z in zone_fields])
    nodes = tuple(
        Node(name, dict(attributes), float(weight)) for name, attributes, weight in node_fields
    )
    zones = tuple(_zone(i, z) for i, z in enumerate(zone_fields))
    return ClusterSnapshot(nodes, zones)


class _ZoneFields(NamedTuple):
    """A zone as the schema accepts it (``snapshot_schema.ZoneIn``), and its stable
    assignment's distinct names."""

    name: str
    partitions: int
    replicas: int
    node_selector: Mapping[str, str]
    failure_domain: str | None
    min_in_sync: int | None
    stable: Mapping[str, list[str]]
    names: set[str]


#: A node as the schema accepts it: name, attributes, weight.
_NodeFields = tuple[str, Mapping[str, str], float | int]
_Fields = tuple[list[_NodeFields], list[_ZoneFields]]


def _by_schema(data: Any) -> _Fields:
    """``data`` validated by the schema's pydantic models (:mod:`.snapshot_schema`); their first
    error is raised as InvalidInput."""
    from pydantic import ValidationError

    from placement.pipeline.snapshot_schema import SnapshotIn

    try:
        raw = SnapshotIn.model_validate(data)
    except ValidationError as e:
        raise _from_pydantic(e) from e
    nodes: list[_NodeFields] = [(n.name, n.attributes, n.weight) for n in raw.nodes]
    zones = [
        _ZoneFields(
            z.name,
            z.partitions,
            z.replicas,
            z.node_selector,
            z.failure_domain,
            z.min_in_sync,
            z.stable,
            set(chain.from_iterable(z.stable.values())),
        )
        for z in raw.zones
    ]
    return nodes, zones


# --- the plain snapshot: what the schema accepts, recognised without pydantic -------------------
#
# Only values of exactly the types JSON decodes to (``dict``, ``list``, ``str``, ``int``,
# ``float``, ``None``) are plain, and only within the schema's bounds: anything else (a bad
# snapshot, or one the schema would accept after all, e.g. a ``str`` subclass) goes through the
# schema, so every error is the schema's, and every snapshot it accepts is accepted.

#: NAME_PATTERN as pydantic applies it: its ``$`` only at the very end (``re``'s ``$`` also
#: matches before a final newline; ``fullmatch`` does not).
_name_form = re.compile(NAME_PATTERN).fullmatch
_NODE_KEYS = frozenset({"name", "attributes", "weight"})
_ZONE_KEYS = frozenset(
    {"name", "partitions", "replicas", "node_selector", "failure_domain", "min_in_sync", "stable"}
)
_STR = {str}


def _plain(data: Any) -> _Fields | None:
    """The snapshot's fields when it is plain, else None (then the schema decides)."""
    if type(data) is not dict or data.keys() != {"nodes", "zones"}:
        return None
    nodes_in, zones_in = data["nodes"], data["zones"]
    if type(nodes_in) is not list or type(zones_in) is not list:
        return None
    nodes: list[_NodeFields] = []
    for node in nodes_in:
        if type(node) is not dict or not node.keys() <= _NODE_KEYS:
            return None
        name, attributes = node.get("name"), node.get("attributes", {})
        weight = node.get("weight", 1.0)
        if not (_plain_name(name) and _plain_strings(attributes)):
            return None
        if type(weight) not in (float, int) or not weight > 0:  # nan is not > 0
            return None
        nodes.append((name, attributes, weight))
    zones = []
    for zone in zones_in:
        fields = _plain_zone(zone)
        if fields is None:
            return None
        zones.append(fields)
    return nodes, zones


def _plain_zone(zone: Any) -> _ZoneFields | None:
    if type(zone) is not dict or not zone.keys() <= _ZONE_KEYS:
        return None
    name, partitions, replicas = zone.get("name"), zone.get("partitions"), zone.get("replicas")
    selector, domain = zone.get("node_selector", {}), zone.get("failure_domain")
    min_in_sync, stable = zone.get("min_in_sync"), zone.get("stable", {})
    if not (
        _plain_name(name)
        and type(partitions) is int
        and 1 <= partitions <= MAX_PARTITIONS
        and type(replicas) is int
        and 1 <= replicas <= MAX_REPLICAS
        and _plain_strings(selector)
        and (domain is None or type(domain) is str)
        and (min_in_sync is None or (type(min_in_sync) is int and 1 <= min_in_sync <= MAX_REPLICAS))
        and type(stable) is dict
        and set(map(type, stable)) <= _STR
    ):
        return None
    lists = stable.values()
    if not set(map(type, lists)) <= {list}:
        return None
    try:
        names = set(chain.from_iterable(lists))
    except TypeError:  # an unhashable member
        return None
    # A member that is not a str is one of the distinct names unless it equals one of them (a
    # str subclass, which the schema would take as that str).
    if not set(map(type, names)) <= _STR:
        return None
    return _ZoneFields(name, partitions, replicas, selector, domain, min_in_sync, stable, names)


def _plain_name(name: Any) -> TypeGuard[str]:
    return type(name) is str and _name_form(name) is not None and name not in (".", "..")


def _plain_strings(value: Any) -> bool:
    """A dict of ``str`` to ``str``."""
    return (
        type(value) is dict
        and set(map(type, value)) <= _STR
        and set(map(type, value.values())) <= _STR
    )


def load_snapshot(path: Path) -> ClusterSnapshot:
    """Reads and validates a snapshot file; unreadable or non-JSON files raise InvalidInput."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidInput("--input", f"cannot read {path}: {e}", "pass a readable file") from e
    return decode_snapshot(text, str(path))


def decode_snapshot(text: str | bytes, where: str) -> ClusterSnapshot:
    """Decodes and validates a snapshot's JSON text (``where`` names it in errors)."""
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as e:  # a json.JSONDecodeError: msg, lineno
        raise InvalidInput(
            "--input", f"{where} is not JSON: {e.msg} at line {e.lineno}", "fix the JSON syntax"
        ) from e
    return parse_snapshot(data)


def _unique(field: str, names: list[str]) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise InvalidInput(
                f"{field}[{i}].name", f"duplicate name {name!r}", "names must be unique"
            )
        seen.add(name)


def _zone(index: int, z: _ZoneFields) -> ZoneSnapshot:
    _check_stable_names(index, z.stable, z.names)
    stable = _valid_stable(z.stable, z.partitions)
    if stable is None:
        stable = _stable_or_error(index, z.stable, z.partitions)
    spec = ZoneSpec(
        z.name,
        z.partitions,
        z.replicas,
        dict(z.node_selector),
        z.failure_domain,
        min_in_sync=z.min_in_sync,
    )
    return ZoneSnapshot(spec, stable)


def _valid_stable(raw: Mapping[str, list[str]], partitions: int) -> dict[int, Peers] | None:
    """``raw`` as partition -> peers when every key is a partition below ``partitions`` and no
    list names a node twice (None otherwise: :func:`_stable_or_error` says where) — checked
    with one pass of C-level maps each, not a Python loop per partition."""
    keys, lists = list(raw), list(raw.values())
    numbers: Sequence[int]
    if len(keys) <= partitions and keys == _decimal_keys(len(keys)):
        numbers = range(len(keys))  # the usual keys: "0", "1", ... in order
    else:
        if not all(map(str.isdecimal, keys)):
            return None
        numbers = list(map(int, keys))
        if numbers and max(numbers) >= partitions:
            return None
    if _names_repeated(lists):
        return None
    return dict(zip(numbers, map(tuple, lists), strict=True))


#: "0", "1", ...: the usual keys of a stable assignment, as far as one was that long.
_DECIMAL_KEYS: list[str] = []


def _decimal_keys(count: int) -> list[str]:
    """``[str(p) for p in range(count)]``, kept for the next zone (``count`` ≤ MAX_PARTITIONS)."""
    if len(_DECIMAL_KEYS) < count:
        _DECIMAL_KEYS.extend(map(str, range(len(_DECIMAL_KEYS), count)))
    return _DECIMAL_KEYS[:count]


def _names_repeated(lists: list[list[str]]) -> bool:
    """Whether a list names a node twice. Lists of one small width are compared column against
    column (a C-level map per pair of columns, faster than a set per list); others by sets."""
    widths = set(map(len, lists))
    if len(widths) == 1 and (width := widths.pop()) <= 4:
        columns = [list(map(itemgetter(k), lists)) for k in range(width)]
        return any(
            any(map(eq, columns[a], columns[b])) for a in range(width) for b in range(a + 1, width)
        )
    return sum(map(len, map(set, lists))) != sum(map(len, lists))


def _stable_or_error(index: int, raw: Mapping[str, list[str]], partitions: int) -> dict[int, Peers]:
    """:func:`_valid_stable` one partition at a time, raising InvalidInput at the first bad one."""
    stable: dict[int, Peers] = {}
    for key, peers in raw.items():
        field = f"zones[{index}].stable.{key}"
        if not key.isdecimal() or int(key) >= partitions:
            raise InvalidInput(
                field,
                f"partition {key!r} is not a partition of this zone",
                f"use a partition number from 0 to {partitions - 1}",
            )
        if len(set(peers)) != len(peers):
            raise InvalidInput(field, "a node is listed twice", "list each node once")
        stable[int(key)] = tuple(peers)
    return stable


def _check_stable_names(index: int, stable: Mapping[str, list[str]], names: set[str]) -> None:
    """Every name in ``stable`` (whose distinct names are ``names``) is a valid name (``Name``'s
    rule), each distinct one checked once; the first bad one is reported where it is,
    ``zones[i].stable.P[j]``."""
    bad = {name for name in names if not is_name(name)}
    if not bad:
        return
    for key, peers in stable.items():
        for j, name in enumerate(peers):
            if name in bad:
                raise InvalidInput(
                    f"zones[{index}].stable.{key}[{j}]",
                    f"{name!r} is not a valid name ({NAME_HINT})",
                    _FIXES["string_pattern_mismatch"],
                )
