"""Canonical encodings of every value the placement layer stores in etcd.

*Canonical* means: one content, one byte string. Every JSON value is written with sorted object
keys, compact separators (``,`` and ``:``), ASCII only and no floats except the node weight and the
zone delays (which ``json`` prints in the shortest round-tripping form). Peers are a JSON list **in
placement order** (the first peer is the preferred primary): order is content, so ``["a","b"]``
and ``["b","a"]`` are different assignments. Equal content therefore gives equal bytes, and a
reader in any language can decode and compare them. Every value carries a schema version ``v``
(currently 1).

Values and their fields:

* assignment (stable / pending / planned): ``{"epoch","peers","trigger","ts","v"}`` — the
  writer's leadership ``epoch``, a timestamp ``ts`` (integer milliseconds, passed in by the caller,
  never read from a clock here) and the ``trigger`` revision of the configuration change that
  produced it;
* cancel: ``{"epoch","new","old","pending_revision","ts","v"}`` — the rebalance ``old -> new`` being
  cancelled and the ``mod_revision`` of the pending key it cancels;
* change trigger: **binary** — the trigger revision as 8 bytes big-endian, then a JSON suffix
  ``{"epoch","ts","v"}``. Big-endian unsigned integers order like numbers, so etcd's byte-wise
  VALUE compare ``value(trigger) < be8(new)`` holds exactly when the stored revision is lower than
  ``new``; with an equal revision the stored value is ``be8(new)`` plus a non-empty suffix, which
  compares *greater*, so an equal (repeated) trigger is rejected too;
* zone config: the :class:`~placement.core.model.ZoneSpec` fields (``scale_up_delay`` and
  ``scale_down_delay`` in seconds; a value written before they existed decodes with 0.0;
  ``min_in_sync`` is present only when set — absent, as in every value written before it
  existed, decodes to ``None``, the default);
* node record: name, address, attributes, weight;
* data nodes of a zone (:class:`DataNodes`): the applied set, the last observed set and when the
  pending additions/removals were first seen (unix ms, ``null`` = none pending);
* primary lease (:class:`PrimaryLease`): holder node, lease epoch, expiry (unix ms);
* pause marker (:class:`ControlMark`): who paused, when;
* leader record (:class:`LeaderRecord`): ``{"api","id"}``, the election value of a driver;
* move report (:class:`MoveReport`): ``{"detail","epoch","phase","revision","ts","v"}`` — an
  agent's push that its catch-up of pending ``revision`` (sent at leader ``epoch``) ended in
  ``phase`` ``DONE`` or ``FAILED``;
* in-sync set (:class:`InSyncSet`): ``{"lease_epoch","members","primary","ts","v"}`` — members
  sorted, written by the primary under its lease epoch;
* replica size (:class:`ReplicaSize`): ``{"bytes","keys","ts","v"}``;
* zone layout (:class:`LayoutValue`): ``{"epoch","generation","partitions","reshard","ts","v"}``
  with ``reshard`` ``null`` or ``{"attempt","phase","source","target"}`` (design/resharding.md);
* reshard report (:class:`ReshardReport`): ``{"attempt","bytes","drained","keys","lag",
  "lease_epoch","purged","ts","v"}``.

Decoding never raises: bytes that are not a valid value of the expected kind decode to
:class:`Corrupt` (carrying the raw bytes and the reason), which callers treat as "unknown".

Pure code: no I/O, no clock.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from placement.core.layout import Reshard, ReshardPhase, ZoneLayout
from placement.core.model import Peers, ZoneSpec
from placement.core.names import has_name_form
from placement.core.zonespec import validate_zone_spec
from placement.errors import InvalidInput

SCHEMA_VERSION = 1
#: Largest revision/epoch/timestamp we encode: etcd revisions are int64.
MAX_INT = 2**63 - 1
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Corrupt:
    """A stored value that could not be decoded; ``raw`` is kept for inspection and compares."""

    raw: bytes
    reason: str


@dataclass(frozen=True, slots=True)
class Assignment:
    """The value of a stable, pending or planned key."""

    peers: Peers
    epoch: int
    ts: int
    trigger: int


@dataclass(frozen=True, slots=True)
class CancelIntent:
    """A cancel key's value: cancel the rebalance ``old -> new`` of pending ``pending_revision``."""

    old: Peers
    new: Peers
    pending_revision: int
    epoch: int
    ts: int


@dataclass(frozen=True, slots=True)
class TriggerMark:
    """The value of a change-trigger key: the last trigger ``revision`` applied to the partition.

    ``held``: a cancelled rebalance left the partition where it was, and it stays there until
    a newer trigger (design/metastore.md, "Pending recovery"); no other partition off its
    target at this revision is left alone."""

    revision: int
    epoch: int
    ts: int
    held: bool = False


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What an agent registers about its node: where to reach it and its selector attributes."""

    name: str
    address: str
    attributes: Mapping[str, str] = field(default_factory=dict, hash=False)
    weight: float = 1.0
    #: The agent is shutting down (SIGTERM): its primary leases are handed over before it goes.
    stopping: bool = False


# -- helpers -----------------------------------------------------------------------------------


def _dumps(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def _check_int(name: str, value: int, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_INT:
        raise InvalidInput(name, f"{value!r} is not an integer in {low}..2**63-1", "pass an int")
    return value


def _ints(value: object, *names: str) -> dict[str, int]:
    """The int fields ``names`` of ``value``, each checked by :func:`_check_int`."""
    return {name: _check_int(name, getattr(value, name)) for name in names}


def validate_peers(peers: Peers, name: str = "peers", *, allow_empty: bool = False) -> Peers:
    """Return ``peers`` as a tuple if they are distinct valid node names, else raise."""
    if isinstance(peers, str | bytes) or not isinstance(peers, tuple | list):
        raise InvalidInput(name, f"{peers!r} is not a sequence of node names", "pass a tuple")
    result = tuple(peers)
    if not result and not allow_empty:
        raise InvalidInput(name, "is empty", "name at least one node")
    for i, peer in enumerate(result):
        if not has_name_form(peer):
            raise InvalidInput(
                f"{name}[{i}]", f"{peer!r} is not a valid node name", "use 1..64 of [A-Za-z0-9_.-]"
            )
    if len(set(result)) != len(result):
        raise InvalidInput(name, f"{list(result)} names a node twice", "list each node once")
    return result


class _Bad(Exception):
    """Internal: a decoding problem, turned into :class:`Corrupt` at the public boundary."""


def _decoder(decode: Callable[[bytes], T]) -> Callable[[bytes], T | Corrupt]:
    """The public decoder of ``decode``: a problem it raises (:class:`_Bad`, or a value failing
    validation) is returned as :class:`Corrupt` with ``raw`` and the reason."""

    @functools.wraps(decode)
    def decoded(raw: bytes) -> T | Corrupt:
        try:
            return decode(raw)
        except (_Bad, InvalidInput) as e:
            return Corrupt(raw, str(e))

    return decoded


def _load_object(raw: bytes, keys: frozenset[str]) -> dict[str, Any]:
    try:
        obj = json.loads(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _Bad(f"not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise _Bad("not a JSON object")
    version = obj.get("v")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise _Bad(f"unknown schema version {version!r}")
    if set(obj) != keys:
        raise _Bad(f"fields {sorted(obj)} != {sorted(keys)}")
    return obj


def _int(obj: Mapping[str, Any], key: str) -> int:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
        raise _Bad(f"{key} is not a non-negative int64")
    return value


def _peers(obj: Mapping[str, Any], key: str, *, allow_empty: bool = False) -> Peers:
    value = obj[key]
    if not isinstance(value, list):
        raise _Bad(f"{key} is not a list")
    try:
        return validate_peers(tuple(value), key, allow_empty=allow_empty)
    except InvalidInput as e:
        raise _Bad(str(e)) from None


def _float(obj: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Bad(f"{key} is not a finite number")
    return float(value)


def _opt_int(obj: Mapping[str, Any], key: str) -> int | None:
    return None if obj[key] is None else _int(obj, key)


def _str_map(obj: Mapping[str, Any], key: str) -> dict[str, str]:
    value = obj[key]
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise _Bad(f"{key} is not an object of strings")
    return dict(value)


# -- assignment --------------------------------------------------------------------------------

_ASSIGNMENT_KEYS = frozenset({"v", "peers", "epoch", "ts", "trigger"})


def encode_assignment(value: Assignment) -> bytes:
    """Canonical bytes of a stable/pending/planned value; :class:`InvalidInput` if invalid."""
    return _dumps(
        {
            "v": SCHEMA_VERSION,
            "peers": list(validate_peers(value.peers)),
            **_ints(value, "epoch", "ts", "trigger"),
        }
    )


@_decoder
def decode_assignment(raw: bytes) -> Assignment:
    obj = _load_object(raw, _ASSIGNMENT_KEYS)
    return Assignment(
        peers=_peers(obj, "peers"),
        epoch=_int(obj, "epoch"),
        ts=_int(obj, "ts"),
        trigger=_int(obj, "trigger"),
    )


# -- cancel ------------------------------------------------------------------------------------

_CANCEL_KEYS = frozenset({"v", "old", "new", "pending_revision", "epoch", "ts"})


def encode_cancel(value: CancelIntent) -> bytes:
    """Canonical bytes of a cancel value. ``old``/``new`` may be empty when they were unreadable."""
    return _dumps(
        {
            "v": SCHEMA_VERSION,
            "old": list(validate_peers(value.old, "old", allow_empty=True)),
            "new": list(validate_peers(value.new, "new", allow_empty=True)),
            "pending_revision": _check_int("pending_revision", value.pending_revision, 1),
            **_ints(value, "epoch", "ts"),
        }
    )


@_decoder
def decode_cancel(raw: bytes) -> CancelIntent:
    obj = _load_object(raw, _CANCEL_KEYS)
    pending_revision = _int(obj, "pending_revision")
    if pending_revision < 1:
        raise _Bad("pending_revision must be >= 1")
    return CancelIntent(
        old=_peers(obj, "old", allow_empty=True),
        new=_peers(obj, "new", allow_empty=True),
        pending_revision=pending_revision,
        epoch=_int(obj, "epoch"),
        ts=_int(obj, "ts"),
    )


# -- change trigger ----------------------------------------------------------------------------

_TRIGGER_SUFFIX_KEYS = frozenset({"v", "epoch", "ts"})
_TRIGGER_HELD_KEYS = _TRIGGER_SUFFIX_KEYS | {"held"}


def be8(revision: int) -> bytes:
    """``revision`` as 8 bytes big-endian: byte order equals numeric order for 0..2**63-1.

    This is the right-hand side of the trigger compare ``value(trigger) < be8(new)``.
    """
    return _check_int("revision", revision).to_bytes(8, "big")


def encode_trigger(value: TriggerMark) -> bytes:
    """``be8(revision)`` followed by a non-empty canonical JSON suffix ``{"epoch","ts","v"}``
    (and ``"held":true`` when held)."""
    suffix = _dumps(
        {
            "v": SCHEMA_VERSION,
            **_ints(value, "epoch", "ts"),
            **({"held": True} if value.held else {}),
        }
    )
    return be8(value.revision) + suffix


@_decoder
def decode_trigger(raw: bytes) -> TriggerMark:
    if len(raw) < 9:
        raise _Bad("shorter than 8-byte revision plus suffix")
    revision = int.from_bytes(raw[:8], "big")
    if revision > MAX_INT:
        raise _Bad("revision out of int64 range")
    suffix = raw[8:]
    obj = _load_object(suffix, _TRIGGER_HELD_KEYS if b'"held"' in suffix else _TRIGGER_SUFFIX_KEYS)
    if obj.get("held", True) is not True:
        raise _Bad("held is not true (it is written only when true)")
    return TriggerMark(revision, _int(obj, "epoch"), _int(obj, "ts"), "held" in obj)


def trigger_is_older(stored_raw: bytes, new_revision: int) -> bool:
    """Exactly etcd's ``value(trigger) < be8(new_revision)`` on the stored bytes, corrupt or not."""
    return stored_raw < be8(new_revision)


# -- zone config -------------------------------------------------------------------------------

_ZONE_KEYS_V1 = frozenset(
    {"v", "name", "partitions", "replicas", "node_selector", "failure_domain"}
)
_ZONE_KEYS_DELAYS = _ZONE_KEYS_V1 | {"scale_up_delay", "scale_down_delay"}
_ZONE_KEYS = _ZONE_KEYS_DELAYS | {"min_in_sync"}
#: Field sets a stored zone config may have: current (``min_in_sync`` present only when set),
#: then the older layouts (no ``min_in_sync``; no delays either).
_ZONE_LAYOUTS = (_ZONE_KEYS, _ZONE_KEYS_DELAYS, _ZONE_KEYS_V1)


def encode_zone_spec(spec: ZoneSpec) -> bytes:
    validate_zone_spec(spec)
    return _dumps(
        {
            "v": SCHEMA_VERSION,
            "name": spec.name,
            "partitions": spec.partitions,
            "replicas": spec.replicas,
            "node_selector": dict(spec.node_selector),
            "failure_domain": spec.failure_domain,
            "scale_up_delay": float(spec.scale_up_delay),
            "scale_down_delay": float(spec.scale_down_delay),
            **({} if spec.min_in_sync is None else {"min_in_sync": spec.min_in_sync}),
        }
    )


def _load_zone_object(raw: bytes) -> dict[str, Any]:
    error: _Bad | None = None
    for layout in _ZONE_LAYOUTS:
        try:
            return _load_object(raw, layout)
        except _Bad as e:
            error = error or e
    assert error is not None
    raise error


@_decoder
def decode_zone_spec(raw: bytes) -> ZoneSpec:
    obj = _load_zone_object(raw)
    name, domain = obj["name"], obj["failure_domain"]
    if not isinstance(name, str) or not (domain is None or isinstance(domain, str)):
        raise _Bad("name/failure_domain have the wrong type")
    spec = ZoneSpec(
        name=name,
        partitions=_int(obj, "partitions"),
        replicas=_int(obj, "replicas"),
        node_selector=_str_map(obj, "node_selector"),
        failure_domain=domain,
        scale_up_delay=_float(obj, "scale_up_delay"),
        scale_down_delay=_float(obj, "scale_down_delay"),
        min_in_sync=_int(obj, "min_in_sync") if "min_in_sync" in obj else None,
    )
    validate_zone_spec(spec)
    return spec


# -- node record -------------------------------------------------------------------------------

_NODE_KEYS = frozenset({"v", "name", "address", "attributes", "weight"})
#: A stopping agent's record also says so (its leases are handed over before it leaves).
_STOPPING_NODE_KEYS = _NODE_KEYS | {"stopping"}


def encode_node(record: NodeRecord) -> bytes:
    if not has_name_form(record.name):
        raise InvalidInput(
            "name", f"{record.name!r} is not a valid node name", "use [A-Za-z0-9_.-]{1,64}"
        )
    if not isinstance(record.address, str) or not record.address:
        raise InvalidInput("address", "is empty", "pass host:port")
    weight = float(record.weight)
    if not math.isfinite(weight) or weight <= 0:
        raise InvalidInput("weight", f"{record.weight!r} is not a positive number", "use e.g. 1.0")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in record.attributes.items()):
        raise InvalidInput("attributes", "keys and values must be strings", "use str: str")
    return _dumps(
        {
            "v": SCHEMA_VERSION,
            "name": record.name,
            "address": record.address,
            "attributes": dict(record.attributes),
            "weight": weight,
            **({"stopping": True} if record.stopping else {}),
        }
    )


@_decoder
def decode_node(raw: bytes) -> NodeRecord:
    try:
        obj = _load_object(raw, _NODE_KEYS)
    except _Bad:
        obj = _load_object(raw, _STOPPING_NODE_KEYS)
    name, address, weight = obj["name"], obj["address"], obj["weight"]
    if obj.get("stopping", True) is not True:
        raise _Bad("stopping is not true")
    if not has_name_form(name):
        raise _Bad("name is not a valid node name")
    if not isinstance(address, str) or not address:
        raise _Bad("address is not a non-empty string")
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise _Bad("weight is not a number")
    if not math.isfinite(weight) or weight <= 0:
        raise _Bad("weight is not positive")
    return NodeRecord(name, address, _str_map(obj, "attributes"), float(weight), "stopping" in obj)


# -- data nodes of a zone ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DataNodes:
    """The value of ``{p}/datanodes/{zone}`` (see :mod:`placement.driver.datanodes`).

    ``applied``: the data-node set placement uses (sorted names). ``observed``: the matching
    registered set when last looked at. ``up_since`` / ``down_since``: unix ms when the additions
    (observed - applied) / removals (applied - observed) now pending were first seen; ``None`` when
    there are none.
    """

    applied: tuple[str, ...]
    observed: tuple[str, ...]
    up_since: int | None
    down_since: int | None
    epoch: int = 0
    ts: int = 0

    def same_content(self, other: DataNodes) -> bool:
        """Equal apart from the writer's stamp (epoch, ts)."""
        return (self.applied, self.observed, self.up_since, self.down_since) == (
            other.applied,
            other.observed,
            other.up_since,
            other.down_since,
        )


_DATANODES_KEYS = frozenset({"v", "applied", "observed", "up_since", "down_since", "epoch", "ts"})


def encode_datanodes(value: DataNodes) -> bytes:
    return _dumps(
        {
            "v": SCHEMA_VERSION,
            "applied": sorted(validate_peers(value.applied, "applied", allow_empty=True)),
            "observed": sorted(validate_peers(value.observed, "observed", allow_empty=True)),
            "up_since": None if value.up_since is None else _check_int("up_since", value.up_since),
            "down_since": (
                None if value.down_since is None else _check_int("down_since", value.down_since)
            ),
            **_ints(value, "epoch", "ts"),
        }
    )


@_decoder
def decode_datanodes(raw: bytes) -> DataNodes:
    obj = _load_object(raw, _DATANODES_KEYS)
    return DataNodes(
        applied=tuple(sorted(_peers(obj, "applied", allow_empty=True))),
        observed=tuple(sorted(_peers(obj, "observed", allow_empty=True))),
        up_since=_opt_int(obj, "up_since"),
        down_since=_opt_int(obj, "down_since"),
        epoch=_int(obj, "epoch"),
        ts=_int(obj, "ts"),
    )


# -- primary lease -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PrimaryLease:
    """The value of ``{p}/primary/{zone}/{partition:05d}``.

    ``node`` holds the lease while its :class:`LeaseTerm` lasts (``{p}/primary/@term/{node}``,
    renewed once per node, not per lease) and, when ``expiry`` is set (unix ms; 0 = not set), no
    later than ``expiry``: the leader caps a lease it means to take from a holder whose term goes
    on (:meth:`until`). ``lease_epoch`` increases by one on every move of the lease to another
    node (replicas fence stale primaries with it); ``epoch``/``ts`` stamp the writing driver
    leader.
    """

    node: str
    lease_epoch: int
    expiry: int
    epoch: int = 0
    ts: int = 0

    def until(self, term: int) -> int:
        """When the lease ends (unix ms), given ``term``: the ``until`` of the holder's
        :class:`LeaseTerm` (0 = the holder has none). The earlier of the two that are set; 0
        when neither is (a lease with neither is over)."""
        if not self.expiry:
            return term
        return min(self.expiry, term) if term else self.expiry


_PRIMARY_KEYS = frozenset({"v", "node", "lease_epoch", "expiry", "epoch", "ts"})


def encode_primary(value: PrimaryLease) -> bytes:
    (node,) = validate_peers((value.node,), "node")
    return _dumps(
        {
            "v": SCHEMA_VERSION,
            "node": node,
            "lease_epoch": _check_int("lease_epoch", value.lease_epoch, 1),
            **_ints(value, "expiry", "epoch", "ts"),
        }
    )


@_decoder
def decode_primary(raw: bytes) -> PrimaryLease:
    obj = _load_object(raw, _PRIMARY_KEYS)
    (node,) = _peers({"node": [obj["node"]]}, "node")
    lease_epoch = _int(obj, "lease_epoch")
    if lease_epoch < 1:
        raise _Bad("lease_epoch must be >= 1")
    return PrimaryLease(node, lease_epoch, _int(obj, "expiry"), _int(obj, "epoch"), _int(obj, "ts"))


# -- lease terms -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaseTerm:
    """The value of ``{p}/primary/@term/{node}``: every primary lease naming the node lasts until
    ``until`` (unix ms; :meth:`PrimaryLease.until`). The leader renews it once per node while the
    node is registered and answers, so the leases themselves are written only when they move;
    ``epoch``/``ts`` stamp the writing driver leader."""

    until: int
    epoch: int = 0
    ts: int = 0


_TERM_KEYS = frozenset({"v", "until", "epoch", "ts"})


def encode_term(value: LeaseTerm) -> bytes:
    return _dumps({"v": SCHEMA_VERSION, **_ints(value, "until", "epoch", "ts")})


@_decoder
def decode_term(raw: bytes) -> LeaseTerm:
    obj = _load_object(raw, _TERM_KEYS)
    return LeaseTerm(_int(obj, "until"), _int(obj, "epoch"), _int(obj, "ts"))


def term_until(raw: bytes | None) -> int | None:
    """``until`` of a readable lease term value; None: no value, or a corrupt one (a lease
    whose holder has no readable term ends at its cap, if any: ``PrimaryLease.until``)."""
    term = decode_term(raw) if raw is not None else None
    return term.until if isinstance(term, LeaseTerm) else None


# -- leader record (the election value) ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaderRecord:
    """The value of a driver's election key ``{p}/leader/{member}``: ``{"api","id"}`` — the
    member id and the address of its API (no schema version: the first format, kept as is)."""

    member_id: str
    api: str


def encode_leader(value: LeaderRecord) -> bytes:
    return _dumps({"id": value.member_id, "api": value.api})


def decode_leader(raw: bytes) -> LeaderRecord | Corrupt:
    """A field that is missing or not a string decodes as ``""`` (unknown)."""
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return Corrupt(raw, f"not JSON: {e}")
    if not isinstance(obj, dict):
        return Corrupt(raw, "not a JSON object")
    member_id, api = obj.get("id"), obj.get("api")
    return LeaderRecord(
        member_id if isinstance(member_id, str) else "", api if isinstance(api, str) else ""
    )


# -- control marks (pause) ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ControlMark:
    """The value of a control key such as ``{p}/control/paused``: its writer's epoch and ts."""

    epoch: int
    ts: int


_CONTROL_KEYS = frozenset({"v", "epoch", "ts"})


def encode_control(value: ControlMark) -> bytes:
    return _dumps({"v": SCHEMA_VERSION, **_ints(value, "epoch", "ts")})


@_decoder
def decode_control(raw: bytes) -> ControlMark:
    obj = _load_object(raw, _CONTROL_KEYS)
    return ControlMark(_int(obj, "epoch"), _int(obj, "ts"))


# -- move reports (agent -> driver push) -------------------------------------------------------

REPORT_PHASES = frozenset({"DONE", "FAILED"})


@dataclass(frozen=True, slots=True)
class MoveReport:
    """The value of ``{p}/progress/{zone}/{partition}/{node}``: the agent's catch-up of pending
    ``revision`` (accepted at leader ``epoch``) ended in ``phase`` (DONE or FAILED) at ``ts``."""

    revision: int
    epoch: int
    phase: str
    detail: str
    ts: int


_REPORT_KEYS = frozenset({"v", "revision", "epoch", "phase", "detail", "ts"})


def encode_report(value: MoveReport) -> bytes:
    if value.phase not in REPORT_PHASES:
        raise InvalidInput("phase", f"{value.phase!r} is not DONE or FAILED", "pass DONE/FAILED")
    if not isinstance(value.detail, str):
        raise InvalidInput("detail", f"{value.detail!r} is not a string", "pass a str")
    return _dumps(
        {
            "v": SCHEMA_VERSION,
            **_ints(value, "revision", "epoch"),
            "phase": value.phase,
            "detail": value.detail,
            "ts": _check_int("ts", value.ts),
        }
    )


@_decoder
def decode_report(raw: bytes) -> MoveReport:
    obj = _load_object(raw, _REPORT_KEYS)
    phase, detail = obj["phase"], obj["detail"]
    if phase not in REPORT_PHASES:
        raise _Bad(f"phase {phase!r} is not DONE or FAILED")
    if not isinstance(detail, str):
        raise _Bad("detail is not a string")
    return MoveReport(_int(obj, "revision"), _int(obj, "epoch"), phase, detail, _int(obj, "ts"))


# -- in-sync sets and replica sizes (data plane) -----------------------------------------------


@dataclass(frozen=True, slots=True)
class InSyncSet:
    """The value of ``{p}/isr/{zone}/{partition:05d}``: the replicas that hold every acknowledged
    write of the partition. ``primary`` wrote it while holding the primary lease of
    ``lease_epoch``; ``members`` are sorted (a set) and include ``primary`` — but when a primary
    that found its replica lacks committed entries stepped down (design/data-plane.md)."""

    members: Peers
    primary: str
    lease_epoch: int
    ts: int


_ISR_KEYS = frozenset({"v", "members", "primary", "lease_epoch", "ts"})


def encode_isr(value: InSyncSet) -> bytes:
    members = validate_peers(value.members, "members")
    (primary,) = validate_peers((value.primary,), "primary")
    return _dumps(
        {
            "v": SCHEMA_VERSION,
            "members": sorted(members),
            "primary": primary,
            "lease_epoch": _check_int("lease_epoch", value.lease_epoch, 1),
            "ts": _check_int("ts", value.ts),
        }
    )


@_decoder
def decode_isr(raw: bytes) -> InSyncSet:
    obj = _load_object(raw, _ISR_KEYS)
    members = _peers(obj, "members")
    (primary,) = _peers({"primary": [obj["primary"]]}, "primary")
    return InSyncSet(tuple(sorted(members)), primary, _int(obj, "lease_epoch"), _int(obj, "ts"))


@dataclass(frozen=True, slots=True)
class ReplicaSize:
    """The value of ``{p}/sizes/{zone}/{partition:05d}/{node}``: how much data ``node``'s replica
    holds (``bytes`` of keys plus values, ``keys`` live keys) at ``ts``."""

    bytes: int
    keys: int
    ts: int


_SIZE_KEYS = frozenset({"v", "bytes", "keys", "ts"})


def encode_size(value: ReplicaSize) -> bytes:
    return _dumps({"v": SCHEMA_VERSION, **_ints(value, "bytes", "keys", "ts")})


@_decoder
def decode_size(raw: bytes) -> ReplicaSize:
    obj = _load_object(raw, _SIZE_KEYS)
    return ReplicaSize(_int(obj, "bytes"), _int(obj, "keys"), _int(obj, "ts"))


# -- zone layout and reshard reports (design/resharding.md) -------------------------------------


@dataclass(frozen=True, slots=True)
class LayoutValue:
    """The value of ``{p}/layout/{zone}``: the layout in force and its reshard, stamped with the
    writing leader's ``epoch`` and ``ts``."""

    layout: ZoneLayout
    epoch: int = 0
    ts: int = 0


_LAYOUT_KEYS = frozenset({"v", "generation", "partitions", "reshard", "epoch", "ts"})
_RESHARD_KEYS = frozenset({"attempt", "source", "target", "phase"})


def encode_layout(value: LayoutValue) -> bytes:
    layout = ZoneLayout(value.layout.generation, value.layout.partitions, value.layout.reshard)
    r = layout.reshard
    return _dumps(
        {
            "v": SCHEMA_VERSION,
            "generation": layout.generation,
            "partitions": layout.partitions,
            "reshard": None
            if r is None
            else {
                "attempt": r.attempt,
                "source": r.source,
                "target": r.target,
                "phase": ReshardPhase(r.phase).value,
            },
            **_ints(value, "epoch", "ts"),
        }
    )


@_decoder
def decode_layout(raw: bytes) -> LayoutValue:
    obj = _load_object(raw, _LAYOUT_KEYS)
    found = obj["reshard"]
    reshard = None
    if found is not None:
        if not isinstance(found, dict) or set(found) != _RESHARD_KEYS:
            raise _Bad(f"reshard is not an object with fields {sorted(_RESHARD_KEYS)}")
        try:
            phase = ReshardPhase(found["phase"])
        except ValueError:
            raise _Bad(f"reshard.phase {found['phase']!r} is not a phase") from None
        reshard = Reshard(
            _int(found, "attempt"), _int(found, "source"), _int(found, "target"), phase
        )
    layout = ZoneLayout(_int(obj, "generation"), _int(obj, "partitions"), reshard)
    return LayoutValue(layout, _int(obj, "epoch"), _int(obj, "ts"))


@dataclass(frozen=True, slots=True)
class ReshardReport:
    """The value of ``{p}/reshard/{zone}/{partition:05d}``: what the partition's primary (at
    ``lease_epoch``) has done for reshard ``attempt``. ``drained`` (a destination copied every
    source up to its seal) and ``purged`` (its clean-up or abort deletions are committed) are
    monotonic facts about committed data; ``keys``/``bytes`` copied so far and ``lag`` (the most
    source entries not copied yet) are progress."""

    attempt: int
    lease_epoch: int
    keys: int = 0
    bytes: int = 0
    lag: int = 0
    drained: bool = False
    purged: bool = False
    ts: int = 0


_RESHARD_REPORT_KEYS = frozenset(
    {"v", "attempt", "lease_epoch", "keys", "bytes", "lag", "drained", "purged", "ts"}
)


def encode_reshard_report(value: ReshardReport) -> bytes:
    for name in ("drained", "purged"):
        if not isinstance(getattr(value, name), bool):
            raise InvalidInput(name, f"{getattr(value, name)!r} is not a bool", "pass a bool")
    return _dumps(
        {
            "v": SCHEMA_VERSION,
            "attempt": _check_int("attempt", value.attempt, 1),
            **_ints(value, "lease_epoch", "keys", "bytes", "lag", "ts"),
            "drained": value.drained,
            "purged": value.purged,
        }
    )


@_decoder
def decode_reshard_report(raw: bytes) -> ReshardReport:
    obj = _load_object(raw, _RESHARD_REPORT_KEYS)
    for name in ("drained", "purged"):
        if not isinstance(obj[name], bool):
            raise _Bad(f"{name} is not a bool")
    if _int(obj, "attempt") < 1:
        raise _Bad("attempt is below 1")
    return ReshardReport(
        _int(obj, "attempt"),
        _int(obj, "lease_epoch"),
        _int(obj, "keys"),
        _int(obj, "bytes"),
        _int(obj, "lag"),
        obj["drained"],
        obj["purged"],
        _int(obj, "ts"),
    )
