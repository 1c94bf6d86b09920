"""What-if changes to a cluster snapshot (pure): add or remove nodes, change zones' R or P.

A :class:`WhatIf` is parsed from the ``placectl plan`` options and applied to the nodes and zone
specs before planning. It never touches the current assignment: "before" stays what the cluster
holds now, "after" is what the placement function makes of the changed cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from placement.core.limits import MAX_PARTITIONS, MAX_REPLICAS
from placement.core.model import Node, ZoneSpec
from placement.core.names import validate_name
from placement.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class WhatIf:
    """The changes to apply; empty means "plan the cluster as it is"."""

    add_nodes: tuple[Node, ...] = ()
    remove_nodes: tuple[str, ...] = ()
    set_replicas: Mapping[str, int] | None = None
    set_partitions: Mapping[str, int] | None = None

    @property
    def zone_names(self) -> frozenset[str]:
        return frozenset(self.set_replicas or {}) | frozenset(self.set_partitions or {})


def parse_add_node(text: str) -> Node:
    """``NAME[,attr=value...]`` -> a :class:`Node` of weight 1."""
    name, *pairs = text.split(",")
    try:
        validate_name(name.strip(), "node")
    except InvalidInput as e:
        raise InvalidInput("--add-node", e.problem, "use NAME[,attr=value...]") from e
    attributes: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(
                "--add-node", f"{pair!r} in {text!r} is not attr=value", "use NAME[,attr=value...]"
            )
        attributes[key.strip()] = value.strip()
    return Node(name.strip(), attributes)


def split_setting(option: str, text: str, example: str) -> tuple[str, str]:
    """``KEY=VALUE`` -> ``(KEY, VALUE)`` stripped, or InvalidInput naming ``option``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise InvalidInput(option, f"{text!r} is not KEY=VALUE", f"e.g. {option} {example}")
    return key.strip(), value.strip()


def _parse_setting(option: str, text: str, limit: int) -> tuple[str, int]:
    zone, number = split_setting(option, text, "orders=5")
    what = option.removeprefix("--set-")
    if not number.isdigit():
        raise InvalidInput(option, f"{text!r} is not ZONE=N", f"e.g. {option} orders=5")
    value = int(number)
    if not 1 <= value <= limit:
        raise InvalidInput(
            option, f"{what} {value} for zone {zone!r} is out of range", f"use 1..{limit}"
        )
    return zone, value


def parse_whatif(
    add_nodes: Iterable[str] = (),
    remove_nodes: Iterable[str] = (),
    set_replicas: Iterable[str] = (),
    set_partitions: Iterable[str] = (),
) -> WhatIf:
    """The options as given on the command line -> a :class:`WhatIf` (syntax only: names are
    checked against a snapshot by :func:`apply_to_nodes` / :func:`apply_to_spec`)."""
    replicas = dict(_parse_setting("--set-replicas", t, MAX_REPLICAS) for t in set_replicas)
    partitions = dict(_parse_setting("--set-partitions", t, MAX_PARTITIONS) for t in set_partitions)
    return WhatIf(
        add_nodes=tuple(parse_add_node(t) for t in add_nodes),
        remove_nodes=tuple(n.strip() for n in remove_nodes),
        set_replicas=replicas or None,
        set_partitions=partitions or None,
    )


def apply_to_nodes(nodes: Sequence[Node], whatif: WhatIf) -> tuple[Node, ...]:
    """The node list after removals and additions (removed first, additions appended)."""
    names = {n.name for n in nodes}
    for name in whatif.remove_nodes:
        if name not in names:
            raise InvalidInput(
                "--remove-node",
                f"node {name!r} is not in the snapshot",
                f"name one of its {len(names)} nodes (e.g. {_examples(names)})",
            )
    removed = set(whatif.remove_nodes)
    kept = [n for n in nodes if n.name not in removed]
    kept_names = {n.name for n in kept}
    for node in whatif.add_nodes:
        if node.name in kept_names:
            raise InvalidInput(
                "--add-node", f"node {node.name!r} is already in the snapshot", "pick a new name"
            )
        kept_names.add(node.name)
        kept.append(node)
    return tuple(kept)


def check_zones(zone_names: Iterable[str], whatif: WhatIf) -> None:
    """Raises :class:`InvalidInput` naming the option when it names a zone not in the snapshot."""
    known = set(zone_names)
    for option, settings in (
        ("--set-replicas", whatif.set_replicas),
        ("--set-partitions", whatif.set_partitions),
    ):
        for zone in settings or {}:
            if zone not in known:
                raise InvalidInput(
                    option,
                    f"zone {zone!r} is not in the snapshot",
                    f"name one of its {len(known)} zones (e.g. {_examples(known)})",
                )


def apply_to_spec(spec: ZoneSpec, whatif: WhatIf) -> ZoneSpec:
    """``spec`` with this what-if's replica / partition count for its zone, if any."""
    replicas = (whatif.set_replicas or {}).get(spec.name, spec.replicas)
    partitions = (whatif.set_partitions or {}).get(spec.name, spec.partitions)
    if (replicas, partitions) == (spec.replicas, spec.partitions):
        return spec
    return replace(spec, replicas=replicas, partitions=partitions)


def _examples(names: Iterable[str]) -> str:
    shown = sorted(names)[:3]
    return ", ".join(shown) if shown else "none"
