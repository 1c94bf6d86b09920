"""An agent's decoded view of etcd for its data plane, kept up to date key by key.

The agent list-watches zones, their layouts, primary leases, in-sync sets, node records and the
assignment keys (design/data-plane.md, "Hibernation"). Each watch wake-up hands
:meth:`View.apply` the prefix's previous and new snapshot; only keys whose mod revision changed
are decoded again, and the result says which partitions and nodes changed, so the data plane
wakes exactly the primaries concerned — at rest, a lease renewal of a thousand partitions costs
a thousand integer compares, not a thousand decodes of every key the agent knows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from placement.core.layout import ZoneLayout
from placement.core.model import ZoneSpec
from placement.metastore.codec import Assignment as AssignmentValue
from placement.metastore.codec import (
    InSyncSet,
    LayoutValue,
    NodeRecord,
    PrimaryLease,
    decode_assignment,
    decode_isr,
    decode_layout,
    decode_node,
    decode_primary,
    decode_zone_spec,
    term_until,
)
from placement.metastore.keys import AssignField, KeyKind, KeySpace
from placement.metastore.kv import KeyValue

#: A partition: (zone, partition).
Key = tuple[str, int]

#: The assignment keys whose peers hold (or are about to hold) a replica.
_HOLDING = (AssignField.STABLE, AssignField.PENDING)


@dataclass
class Changes:
    """What one :meth:`View.apply` changed."""

    #: Partitions whose stable or pending assignment changed.
    assignments: set[Key] = field(default_factory=set)
    #: Partitions whose primary lease or in-sync set changed.
    partitions: set[Key] = field(default_factory=set)
    #: Nodes whose record appeared, changed or disappeared.
    nodes: set[str] = field(default_factory=set)
    zones: set[str] = field(default_factory=set)
    #: Nodes whose lease term was written or deleted.
    terms: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.assignments or self.partitions or self.nodes or self.zones or self.terms)


@dataclass
class View:
    """See the module docstring. Mutated in place by :meth:`apply` (one event loop)."""

    keys: KeySpace
    zones: dict[str, ZoneSpec] = field(default_factory=dict)
    #: Each zone's layout in force (design/resharding.md); a zone without a readable one is
    #: absent (its data requests are refused as unavailable).
    layouts: dict[str, ZoneLayout] = field(default_factory=dict)
    #: Each readable layout key's mod revision.
    layout_revisions: dict[str, int] = field(default_factory=dict)
    leases: dict[Key, tuple[PrimaryLease, int]] = field(default_factory=dict)
    #: node -> ``until`` of its lease term (``{p}/primary/@term/{node}``): every lease it holds
    #: ends then at the latest (:meth:`lease_until`). Watched with the leases, in etcd's order.
    terms: dict[str, int] = field(default_factory=dict)
    isrs: dict[Key, tuple[InSyncSet, int]] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)
    #: Per partition, the peers of each readable holding assignment key (None = unreadable).
    assignments: dict[Key, dict[AssignField, frozenset[str] | None]] = field(default_factory=dict)
    #: Per partition, the mod revision of each holding assignment key the view holds (readable
    #: or not): what a learner's join compares (``assignment_revisions``).
    assignment_mods: dict[Key, dict[AssignField, int]] = field(default_factory=dict)

    def lease_until(self, lease: PrimaryLease) -> int:
        """When ``lease`` ends (unix ms): :meth:`PrimaryLease.until` with its holder's term."""
        return lease.until(self.terms.get(lease.node, 0))

    def primary_hint(self, key: Key) -> str:
        lease = self.leases.get(key)
        if lease is None:
            return ""
        node = lease[0].node
        return f"{node}@{self.nodes.get(node, '')}"

    def holders(self, key: Key) -> frozenset[str] | None:
        """The nodes stable or pending name for ``key``; None when unknown (no stable key yet,
        or one of them is unreadable) — then nobody is judged by it."""
        fields = self.assignments.get(key)
        if not fields or AssignField.STABLE not in fields:
            return None
        out: set[str] = set()
        for peers in fields.values():
            if peers is None:
                return None
            out |= peers
        return frozenset(out)

    def assignment_revisions(self, key: Key) -> tuple[tuple[AssignField, int], ...]:
        """The mod revision (0 = absent) of ``key``'s stable and pending keys as this view has
        them: a learner's join compares them, so it lands only while the assignment it was
        judged by is still etcd's (design/data-plane.md, "A learner's join")."""
        mods = self.assignment_mods.get(key, {})
        return tuple((f, mods.get(f, 0)) for f in _HOLDING)

    def apply(self, keys: Iterable[bytes], live: Mapping[bytes, KeyValue]) -> Changes:
        """Bring the view's ``keys`` to their values in ``live`` (a watched prefix as its
        list-watch has it; a key absent there is deleted): what a :class:`Follower` took, or
        every key of a first list. Applying a key's current value again changes nothing but
        may name it in the changes."""
        changes = Changes()
        for key in keys:
            kv = live.get(key)
            if kv is None:
                self._set(key, None, 0, changes)
            else:
                self._set(key, kv.value, kv.mod_revision, changes)
        return changes

    def _set(self, raw_key: bytes, value: bytes | None, revision: int, changes: Changes) -> None:
        parsed = self.keys.parse(raw_key)
        if parsed is None:
            return
        kind, name, partition = parsed.kind, parsed.name, parsed.partition
        if kind is KeyKind.ZONE:
            spec = decode_zone_spec(value) if value is not None else None
            if isinstance(spec, ZoneSpec):
                self.zones[name] = spec
            else:
                self.zones.pop(name, None)
            changes.zones.add(name)
        elif kind is KeyKind.LAYOUT:
            layout = decode_layout(value) if value is not None else None
            if isinstance(layout, LayoutValue):
                self.layouts[name] = layout.layout
                self.layout_revisions[name] = revision
            else:
                self.layouts.pop(name, None)
                self.layout_revisions.pop(name, None)
            changes.zones.add(name)
        elif kind is KeyKind.NODE:
            record = decode_node(value) if value is not None else None
            if isinstance(record, NodeRecord):
                self.nodes[name] = record.address
            else:
                self.nodes.pop(name, None)
            changes.nodes.add(name)
        elif kind is KeyKind.TERM:
            until = term_until(value)
            if until is not None:
                self.terms[name] = until
            else:
                self.terms.pop(name, None)
            changes.terms.add(name)
        elif partition is None:
            return
        elif kind is KeyKind.PRIMARY:
            lease = decode_primary(value) if value is not None else None
            before = self.leases.get((name, partition))
            if isinstance(lease, PrimaryLease):
                self.leases[(name, partition)] = (lease, revision)
            else:
                self.leases.pop((name, partition), None)
            renewed = (
                before is not None
                and isinstance(lease, PrimaryLease)
                and (before[0].node, before[0].lease_epoch) == (lease.node, lease.lease_epoch)
            )
            if not renewed:  # same holder and epoch: only its end moved, read where it matters
                changes.partitions.add((name, partition))
        elif kind is KeyKind.ISR:
            isr = decode_isr(value) if value is not None else None
            if isinstance(isr, InSyncSet):
                self.isrs[(name, partition)] = (isr, revision)
            else:
                self.isrs.pop((name, partition), None)
            changes.partitions.add((name, partition))
        elif kind is KeyKind.ASSIGN and parsed.field in _HOLDING:
            assert parsed.field is not None
            fields = self.assignments.setdefault((name, partition), {})
            mods = self.assignment_mods.setdefault((name, partition), {})
            if value is None:
                fields.pop(parsed.field, None)
                mods.pop(parsed.field, None)
                if not fields:
                    del self.assignments[(name, partition)]
                if not mods:
                    del self.assignment_mods[(name, partition)]
            else:
                mods[parsed.field] = revision
                decoded = decode_assignment(value)
                fields[parsed.field] = (
                    frozenset(decoded.peers) if isinstance(decoded, AssignmentValue) else None
                )
            changes.assignments.add((name, partition))
