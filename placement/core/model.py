"""Immutable domain types shared by the placement function, the metastore layer and the CLI.

No I/O and no protobuf here: servicers and the CLI convert at the edges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from placement.core.limits import MAX_PAIRS
from placement.errors import InvalidInput

#: Ordered replica list of one partition; the first member is the preferred primary.
Peers = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PartitionScoped:
    """About one partition: ``zone``, ``partition`` (the first fields) and their ``key``."""

    zone: str
    partition: int

    @property
    def key(self) -> tuple[str, int]:
        return (self.zone, self.partition)


@dataclass(frozen=True, slots=True)
class Node:
    """A node that may hold replicas: unique ``name``, selector/failure-domain ``attributes``.

    ``weight`` scales the node's share of replicas (1.0 = an ordinary node); it must be > 0.
    """

    name: str
    attributes: Mapping[str, str] = field(default_factory=dict, hash=False)
    weight: float = 1.0

    def matches(self, selector: Mapping[str, str]) -> bool:
        """True when every ``key=value`` of ``selector`` is one of this node's attributes."""
        return all(self.attributes.get(k) == v for k, v in selector.items())


@dataclass(frozen=True, slots=True)
class ZoneSpec:
    """What a zone asks for: ``partitions`` × ``replicas`` on the nodes its selector matches.

    ``failure_domain`` names a node attribute (e.g. ``rack``); replicas of one partition go to
    distinct values of it whenever possible.

    ``scale_up_delay`` / ``scale_down_delay`` (seconds, >= 0) hold down data-node changes: a node
    that joins (leaves) the zone's matching set counts only after it has been there (gone) that
    long, so membership that flaps back within the delay moves nothing (``driver.datanodes``).

    ``min_in_sync`` (1..MAX_REPLICAS, ``None`` = the default) is the fewest members a
    partition's in-sync set may shrink to before its primary refuses writes; see
    :func:`effective_min_in_sync` for the value the data plane applies.
    """

    name: str
    partitions: int
    replicas: int
    node_selector: Mapping[str, str] = field(default_factory=dict, hash=False)
    failure_domain: str | None = None
    scale_up_delay: float = 0.0
    scale_down_delay: float = 0.0
    min_in_sync: int | None = None


#: ``min_in_sync`` of a zone that does not set it.
DEFAULT_MIN_IN_SYNC = 2


def effective_min_in_sync(spec: ZoneSpec) -> int:
    """The in-sync set size below which a primary refuses writes: the zone's ``min_in_sync``
    (default :data:`DEFAULT_MIN_IN_SYNC`), capped at ``replicas`` — a zone of R replicas can
    never need more than R members in sync, so R=1 zones stay writable with the default."""
    wanted = spec.min_in_sync if spec.min_in_sync is not None else DEFAULT_MIN_IN_SYNC
    return min(wanted, spec.replicas)


def parse_pairs(items: Sequence[str], option: str) -> dict[str, str]:
    """``["k=v", ...]`` -> dict; raises InvalidInput naming ``option`` on bad syntax, duplicates
    or more than :data:`MAX_PAIRS` pairs."""
    if len(items) > MAX_PAIRS:
        raise InvalidInput(option, f"{len(items)} pairs given", f"give at most {MAX_PAIRS}")
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise InvalidInput(option, f"{item!r} is not KEY=VALUE", "e.g. rack=r1")
        if key in result:
            raise InvalidInput(option, f"key {key!r} given twice", "give each key once")
        result[key] = value
    return result
