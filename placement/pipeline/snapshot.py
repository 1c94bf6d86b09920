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

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr
from pydantic import ValidationError as PydanticValidationError

from placement.core.limits import MAX_PARTITIONS, MAX_REPLICAS, NAME_PATTERN
from placement.core.model import Node, Peers, ZoneSpec
from placement.core.names import NAME_HINT, is_name
from placement.errors import InvalidInput


def _name(text: str) -> str:
    """The one name rule (:mod:`placement.core.names`) beyond the pattern: not ``.`` or ``..``."""
    if not is_name(text):
        raise ValueError(f"{text!r} is not a valid name ({NAME_HINT})")
    return text


Name = Annotated[StrictStr, Field(pattern=NAME_PATTERN), AfterValidator(_name)]


class _NodeIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Name
    attributes: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    weight: Annotated[StrictFloat | StrictInt, Field(gt=0)] = 1.0


class _ZoneIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: Name
    partitions: Annotated[StrictInt, Field(ge=1, le=MAX_PARTITIONS)]
    replicas: Annotated[StrictInt, Field(ge=1, le=MAX_REPLICAS)]
    node_selector: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    failure_domain: StrictStr | None = None
    min_in_sync: Annotated[StrictInt, Field(ge=1, le=MAX_REPLICAS)] | None = None
    #: Its names are checked by :func:`_zone`, once per distinct name: the same rule as
    #: ``Name``, whose per-item Python validator cost 0.5 s for 300,000 replicas.
    stable: dict[StrictStr, list[StrictStr]] = Field(default_factory=dict)


class _SnapshotIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    nodes: list[_NodeIn]
    zones: list[_ZoneIn]


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
    try:
        raw = _SnapshotIn.model_validate(data)
    except PydanticValidationError as e:
        raise _from_pydantic(e) from e
    _unique("nodes", [n.name for n in raw.nodes])
    _unique("zones", [z.name for z in raw.zones])
    nodes = tuple(Node(n.name, dict(n.attributes), float(n.weight)) for n in raw.nodes)
    zones = tuple(_zone(i, z) for i, z in enumerate(raw.zones))
    return ClusterSnapshot(nodes, zones)


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


def _zone(index: int, z: _ZoneIn) -> ZoneSnapshot:
    _check_stable_names(index, z.stable)
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
    if not all(map(str.isdecimal, keys)):
        return None
    numbers = list(map(int, keys))
    if numbers and max(numbers) >= partitions:
        return None
    if sum(map(len, map(set, lists))) != sum(map(len, lists)):
        return None
    return dict(zip(numbers, map(tuple, lists), strict=True))


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


def _check_stable_names(index: int, stable: Mapping[str, list[str]]) -> None:
    """Every name in ``stable`` is a valid name (``Name``'s rule), each distinct one checked
    once; the first bad one is reported where it is, ``zones[i].stable.P[j]``."""
    names: set[str] = set()
    for peers in stable.values():
        names.update(peers)
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
