"""The fleet plan's pure core, shared by the local and the Spark engine.

Per zone, :func:`plan_zone_input` runs :func:`placement.pipeline.fleet.plan_zone` (hence
:func:`placement.algo.place.place`, the driver's function) and adds what the plan costs: bytes to
move, the load before, and — when the what-if changes the zone's partition count — the keys and
bytes the reshard would move (:func:`reshard_estimate`). :func:`zone_fragment` renders one zone's
JSON text, and
:meth:`FleetTotals.summary` the fleet totals from summed counters, so both engines write
byte-identical files however the work was split (design/formats.md, "Plan").
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any

from placement.algo.fleet import FleetTally, zone_loads
from placement.algo.place import new_pairs
from placement.core.model import Node, Peers, ZoneSpec
from placement.pipeline.fleet import ZonePlan, plan_zone, spread, zone_plan_json
from placement.pipeline.snapshot import ZoneSnapshot

#: Kinds of per-node / per-domain counters a zone contributes to the fleet summary.
LOAD, LOAD_BEFORE, DOMAIN, DOMAIN_BEFORE = "load", "load_before", "domain", "domain_before"
COUNTER_KINDS = (LOAD, LOAD_BEFORE, DOMAIN, DOMAIN_BEFORE)


@dataclass(frozen=True, slots=True)
class PartitionSize:
    """A partition's size as its replicas report it (design/pipeline.md)."""

    bytes: int
    keys: int


def partition_size(reports: Iterable[tuple[int | None, int | None]]) -> PartitionSize:
    """A partition's size from its replicas' ``(bytes, keys)`` reports: the largest bytes and
    the largest key count any replica reports (each 0 when none does; a null counts 0)."""
    largest_bytes = largest_keys = 0
    for size, keys in reports:
        largest_bytes, largest_keys = max(largest_bytes, size or 0), max(largest_keys, keys or 0)
    return PartitionSize(largest_bytes, largest_keys)


@dataclass(frozen=True, slots=True)
class ZoneInput:
    """One zone as the planner needs it: its (what-if) spec, the current stable assignment, the
    partitions' sizes (absent = unknown: 0 bytes to move) and the zone's partition count now
    (``None``: the spec's, i.e. the what-if does not re-shard it)."""

    spec: ZoneSpec
    stable: Mapping[int, Peers]
    sizes: Mapping[int, PartitionSize] = field(default_factory=dict)
    partitions_now: int | None = None


@dataclass(frozen=True, slots=True)
class ReshardEstimate:
    """What re-sharding a zone from ``source`` to ``target`` partitions would move between its
    partitions; ``keys`` / ``bytes`` are None when unknown (no source partition has a size)."""

    source: int
    target: int
    keys: int | None
    bytes: int | None

    def json(self) -> dict[str, Any]:
        """The zone summary's ``reshard`` value (design/formats.md)."""
        return {"from": self.source, "to": self.target, "keys": self.keys, "bytes": self.bytes}


def reshard_estimate(
    source: int, target: int, sizes: Mapping[int, PartitionSize]
) -> ReshardEstimate | None:
    """The keys and bytes a reshard ``source -> target`` would move, from the partitions' sizes
    under ``source`` (:meth:`placement.core.layout.Moves.moved`: a grow moves the share
    ``(P'-P)/P'`` of every source partition — the expected value —, a shrink exactly the
    removed partitions' keys and bytes); None when the count does not change."""
    if source == target:
        return None
    from placement.core.layout import Moves  # only a what-if re-shards (its import is not free)

    moves = Moves(source, target)
    if not any(p in sizes for p in moves.sources):
        return ReshardEstimate(source, target, None, None)
    return ReshardEstimate(
        source,
        target,
        keys=moves.moved({p: s.keys for p, s in sizes.items()}),
        bytes=moves.moved({p: s.bytes for p, s in sizes.items()}),
    )


@dataclass(frozen=True, slots=True)
class ZoneResult:
    """A zone's plan, what it costs, and the balance before it."""

    plan: ZonePlan
    bytes_to_move: int
    load_before: Mapping[str, int]
    domain_load_before: Mapping[str, int]
    failure_domain: str | None
    #: Set when the what-if changes the zone's partition count.
    reshard: ReshardEstimate | None = None

    def counters(self) -> dict[str, dict[str, int]]:
        """This zone's contribution to the fleet counters; domain keys are ``attribute=value``."""
        prefix = f"{self.failure_domain}=" if self.failure_domain else ""
        return {
            LOAD: dict(self.plan.load),
            LOAD_BEFORE: dict(self.load_before),
            DOMAIN: {prefix + k: v for k, v in self.plan.domain_load.items()},
            DOMAIN_BEFORE: {prefix + k: v for k, v in self.domain_load_before.items()},
        }


def bytes_to_move(
    stable: Mapping[int, Peers], target: Sequence[Peers], sizes: Mapping[int, int]
) -> int:
    """Sum over new (partition, node) pairs of the partition's size (only partitions with a
    known size can cost anything: none at all for a snapshot without sizes)."""
    total = 0
    for partition, size in sizes.items():
        if size and 0 <= partition < len(target):
            total += size * new_pairs(stable.get(partition, ()), target[partition])
    return total


def load_before(
    stable: Mapping[int, Peers], nodes: Sequence[Node], spec: ZoneSpec
) -> dict[str, int]:
    """Replicas per node in ``stable``: every node it names plus every eligible node (at 0)."""
    selector = spec.node_selector
    load = dict.fromkeys((n.name for n in nodes if not selector or n.matches(selector)), 0)
    load.update(Counter(chain.from_iterable(stable.values())))
    return dict(sorted(load.items()))


def domain_load(
    load: Mapping[str, int], nodes: Sequence[Node], attribute: str | None
) -> dict[str, int]:
    """Replicas per failure-domain value; a node lacking the attribute (or gone) is its own."""
    if not attribute:
        return {}
    by_name = {n.name: n for n in nodes}
    out: Counter[str] = Counter()
    for name, count in load.items():
        node = by_name.get(name)
        out[node.attributes.get(attribute, name) if node else name] += count
    return dict(sorted(out.items()))


def plan_zone_input(
    zone: ZoneInput,
    nodes: Sequence[Node],
    tally: FleetTally | None = None,
    own: tuple[Mapping[str, int], Mapping[str, int]] | None = None,
) -> ZoneResult:
    """Plans one zone with the driver's placement function and prices the plan. With the
    fleet's ``tally`` (:class:`~placement.algo.fleet.FleetTally`, zones placed in name order)
    the other zones' loads break the zone's ties, and the tally then counts the new plan
    (``own``: the zone's current loads, when the caller counted them already)."""
    if tally is not None and own is None:
        own = zone_loads(zone.stable.values())
    fleet = tally.others(*own) if tally is not None and own is not None else None
    plan = plan_zone(ZoneSnapshot(zone.spec, zone.stable), nodes, fleet)
    if tally is not None and own is not None:
        tally.placed(own, (plan.load, plan.primaries))
    before = load_before(zone.stable, nodes, zone.spec)
    sizes = {p: s.bytes for p, s in zone.sizes.items()}
    now = zone.spec.partitions if zone.partitions_now is None else zone.partitions_now
    return ZoneResult(
        plan=plan,
        bytes_to_move=bytes_to_move(zone.stable, plan.assignments, sizes),
        load_before=before,
        domain_load_before=domain_load(before, nodes, zone.spec.failure_domain),
        failure_domain=zone.spec.failure_domain,
        reshard=reshard_estimate(now, zone.spec.partitions, zone.sizes),
    )


def zone_json(result: ZoneResult, assignments: Any = None) -> dict[str, Any]:
    """``placement.pipeline.fleet.zone_plan_json`` plus the summary fields this pipeline adds."""
    out = zone_plan_json(result.plan, assignments)
    out["summary"].update(
        {
            "bytes_to_move": result.bytes_to_move,
            "load_before": dict(result.load_before),
            "spread_before": spread(result.load_before),
            "domain_load_before": dict(result.domain_load_before),
        }
    )
    if result.reshard is not None:
        out["summary"]["reshard"] = result.reshard.json()
    return out


_quote = json.encoder.encode_basestring_ascii  # what json.dumps prints for a str (C)


def indented_json(value: Any, pad: str = "") -> str:
    """``json.dumps(value, indent=1)`` with ``pad`` after every line break: the text of
    ``value`` where it sits in a document at the indentation ``pad``.

    The standard library indents with its pure-Python encoder (its C encoder does not indent);
    this builds the same text with joins, a list of strings or a dict of ``int`` values in one
    ``map`` each. Dicts with ``str`` keys, lists, tuples, ``str`` and ``int`` are rendered here,
    anything else (``None``, floats, bools, other keys or types) by ``json.dumps`` itself.
    """
    kind = type(value)
    if kind is str:
        return _quote(value)
    if kind is int:
        return int.__repr__(value)
    if isinstance(value, Rows):
        return value.json(pad)
    inner = pad + " "
    sep = ",\n" + inner
    if kind is dict:
        if not value:
            return "{}"
        try:
            keys = list(map(_quote, value))  # TypeError: a key that is not a str
        except TypeError:
            return json.dumps(value, indent=1).replace("\n", "\n" + pad)
        values = list(value.values())
        body = None
        if bool not in set(map(type, values)):  # int.__repr__ takes bools (json: true/false)
            with contextlib.suppress(TypeError):  # a value that is not an int
                body = sep.join(map("{}: {}".format, keys, map(int.__repr__, values)))
        if body is None:
            items = zip(keys, values, strict=True)
            body = sep.join([key + ": " + indented_json(item, inner) for key, item in items])
        return "{\n" + inner + body + "\n" + pad + "}"
    if kind is list or kind is tuple:
        if not value:
            return "[]"
        try:
            body = sep.join(map(_quote, value))
        except TypeError:  # not only strings
            body = sep.join([indented_json(item, inner) for item in value])
        return "[\n" + inner + body + "\n" + pad + "]"
    return json.dumps(value, indent=1).replace("\n", "\n" + pad)


@dataclass(frozen=True, slots=True)
class Rows:
    """A zone's assignments as the plan file holds them — ``{"0": [names], ...}`` — rendered
    straight from the placement's rows (:meth:`json`), without building that dict first."""

    rows: Sequence[Peers]

    def json(self, pad: str) -> str:
        """``indented_json({str(p): list(peers) ...}, pad)``: rows of one width are one
        ``str.join`` of pieces made once — each row's opening (``_row_heads``) and each name as
        it is printed in a column — taken by C-level maps, not one call per row."""
        rows = self.rows
        if not rows:
            return "{}"
        inner, leaf = pad + " ", pad + "  "
        names = set(chain.from_iterable(rows))
        widths = set(map(len, rows))
        if len(widths) == 1 and (width := widths.pop()) > 0:
            lead = "\n" + leaf
            printed = {name: lead + _quote(name) + "," for name in names}  # not the last column
            last = {name: lead + _quote(name) for name in names}
            columns = [
                map((printed if k < width - 1 else last).__getitem__, map(itemgetter(k), rows))
                for k in range(width)
            ]
            pieces = chain.from_iterable(zip(_row_heads(len(rows), inner), *columns, strict=True))
            body = "".join(pieces) + "\n" + inner + "]"
        else:
            body = (",\n" + inner).join(
                f'"{p}": ' + indented_json(list(peers), inner) for p, peers in enumerate(rows)
            )
        return "{\n" + inner + body + "\n" + pad + "}"


@functools.lru_cache(maxsize=4)
def _row_heads(count: int, inner: str) -> tuple[str, ...]:
    """What opens each of ``count`` rows: ``"p": [``, after the previous row's end (kept: the
    zones of a fleet often have as many partitions)."""
    follow = "\n" + inner + "],\n" + inner + '"{}": ['
    return ('"0": [', *map(follow.format, range(1, count)))


def zone_fragment(result: ZoneResult) -> str:
    """The zone's text exactly as ``json.dump(plan, indent=1)`` prints it inside ``"zones"``."""
    return "  " + indented_json(zone_json(result, Rows(result.plan.assignments)), "  ")


@dataclass(slots=True)
class FleetTotals:
    """Running fleet totals; the local engine adds zones, the Spark engine sums in Spark."""

    zones: int = 0
    moves: int = 0
    bytes_to_move: int = 0
    counters: dict[str, Counter[str]] = field(
        default_factory=lambda: {kind: Counter() for kind in COUNTER_KINDS}
    )
    #: Zones the what-if re-shards; those without sizes; the others' keys and bytes to move.
    reshard_zones: int = 0
    reshard_unsized: int = 0
    reshard_keys: int = 0
    reshard_bytes: int = 0

    def add(self, result: ZoneResult) -> None:
        self.zones += 1
        self.moves += result.plan.moves
        self.bytes_to_move += result.bytes_to_move
        for kind, values in result.counters().items():
            self.counters[kind].update(values)
        r = result.reshard
        if r is not None:
            self.reshard_zones += 1
            if r.keys is None or r.bytes is None:
                self.reshard_unsized += 1
            else:
                self.reshard_keys += r.keys
                self.reshard_bytes += r.bytes

    def summary(self) -> dict[str, Any]:
        """The plan file's fleet ``summary``: totals, per-node and per-domain load before/after."""
        load = dict(sorted(self.counters[LOAD].items()))
        before = dict(sorted(self.counters[LOAD_BEFORE].items()))
        return {
            "zones": self.zones,
            "moves": self.moves,
            "load": load,
            "spread": spread(load),
            "bytes_to_move": self.bytes_to_move,
            "load_before": before,
            "spread_before": spread(before),
            "domain_load": dict(sorted(self.counters[DOMAIN].items())),
            "domain_load_before": dict(sorted(self.counters[DOMAIN_BEFORE].items())),
            **self._reshard(),
        }

    def _reshard(self) -> dict[str, Any]:
        """``{"reshard": ...}`` when a zone is re-sharded; keys and bytes are the sized zones'
        sums, null when no zone has sizes (unknown is not 0)."""
        if not self.reshard_zones:
            return {}
        sized = self.reshard_zones > self.reshard_unsized
        return {
            "reshard": {
                "zones": self.reshard_zones,
                "keys": self.reshard_keys if sized else None,
                "bytes": self.reshard_bytes if sized else None,
                "unsized_zones": self.reshard_unsized,
            }
        }


def reshard_line(summary: Mapping[str, Any]) -> str | None:
    """The CLI's line about the fleet summary's ``reshard`` (None without one)."""
    r = summary.get("reshard")
    if not r:
        return None
    head = f"reshard of {r['zones']} zone(s): "
    if r["keys"] is None:
        return (
            head + "keys and bytes to move unknown: no partition sizes reported "
            "(plan an export of a cluster whose agents report sizes)"
        )
    unsized = r["unsized_zones"]
    return (
        head + f"{r['keys']} key(s), {r['bytes']} byte(s) to move between partitions "
        "(estimated from the reported sizes"
        + (f"; {unsized} zone(s) without sizes are not counted)" if unsized else ")")
    )


def plan_text_parts(
    fragments: Iterable[str], summary: Callable[[], Mapping[str, Any]]
) -> Iterator[str]:
    """The plan file as text pieces: equal to ``json.dump({"zones": [...], "summary": ...},
    indent=1)`` plus a newline, without holding every zone at once; ``summary`` is called after
    the last fragment (the totals are complete only then)."""
    yield '{\n "zones": ['
    first = True
    for fragment in fragments:
        yield ("\n" if first else ",\n") + fragment
        first = False
    yield "]" if first else "\n ]"
    yield ',\n "summary": ' + indented_json(dict(summary()), " ")
    yield "\n}\n"
