"""The etcd key layout of the placement state, under one configurable prefix.

Layout (``{p}`` is the prefix, ``/placement`` by default)::

    {p}/zones/{zone}                              zone config (codec.encode_zone_spec)
    {p}/nodes/{node}                              registered node, under the agent's lease
    {p}/leader/{member}                           election keys, under each candidate's lease
    {p}/assign/{zone}/{partition:05d}/{field}     field in stable|pending|planned|cancel|trigger
    {p}/datanodes/{zone}                          applied + observed data nodes (holddown)
    {p}/primary/{zone}/{partition:05d}            primary lease of a partition
    {p}/primary/@term/{node}                      the lease term of a node: how long the
                                                  primary leases it holds last (codec.LeaseTerm);
                                                  beside the leases, so one watch of
                                                  {p}/primary/ sees both in etcd's order ('@' is
                                                  in no zone name)
    {p}/control/{name}                            driver controls: ``paused``
    {p}/progress/{zone}/{partition:05d}/{node}    a node's move report (codec.encode_report),
                                                  under that agent's registration lease
    {p}/isr/{zone}/{partition:05d}                in-sync set of a partition (codec.encode_isr),
                                                  written by the primary, fenced by its lease
    {p}/sizes/{zone}/{partition:05d}/{node}       a replica's data size (codec.encode_size),
                                                  under that agent's registration lease
    {p}/layout/{zone}                             the zone's layout in force and its reshard
                                                  (codec.encode_layout; design/resharding.md)
    {p}/reshard/{zone}/{partition:05d}            a partition's reshard report, by its primary's
                                                  agent under its registration lease

Partitions are written with five fixed-width digits so that a prefix range scan of a zone comes out
in partition order (``00002`` < ``00010``), and every key of one partition shares the prefix
``{p}/assign/{zone}/{partition:05d}/`` so a single range (or a single ``version == 0`` compare over
that range) covers the whole partition. Every prefix handed out ends in ``/``: zone ``a`` never
matches keys of zone ``a.b``.

Pure code: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from placement.core.limits import MAX_PARTITIONS
from placement.core.names import is_name, validate_name, validate_partition
from placement.errors import InvalidInput

DEFAULT_PREFIX = "/placement"

_PARTITION_WIDTH = 5
_PARTITION_RE = re.compile(r"^[0-9]{5}$")
_PREFIX_SEGMENT_RE = re.compile(r"^[A-Za-z0-9_.-]+$")

assert 10**_PARTITION_WIDTH >= MAX_PARTITIONS, "partition width too small for MAX_PARTITIONS"


class KeyKind(StrEnum):
    """What a key under the prefix holds."""

    ZONE = "zones"
    NODE = "nodes"
    LEADER = "leader"
    ASSIGN = "assign"
    DATANODES = "datanodes"
    PRIMARY = "primary"
    CONTROL = "control"
    PROGRESS = "progress"
    ISR = "isr"
    SIZES = "sizes"
    LAYOUT = "layout"
    RESHARD = "reshard"
    DRAIN = "drain"
    CORDON = "cordon"
    TERM = "term"


#: The directory of the nodes' lease terms under ``{p}/primary/`` ('@' is in no zone name).
TERM_DIR = b"@term"

#: Names of the control keys under ``{p}/control/``.
PAUSED = "paused"
CONTROL_NAMES = frozenset({PAUSED})


class AssignField(StrEnum):
    """The per-partition keys of the assignment protocol (design/metastore.md §3)."""

    STABLE = "stable"
    PENDING = "pending"
    PLANNED = "planned"
    CANCEL = "cancel"
    TRIGGER = "trigger"


@dataclass(frozen=True, slots=True)
class ParsedKey:
    """A key of the layout taken apart.

    ``name`` is the zone (ZONE, ASSIGN, DATANODES, PRIMARY, PROGRESS, ISR, SIZES, LAYOUT,
    RESHARD), node (NODE, DRAIN, CORDON, TERM), member id (LEADER) or control name (CONTROL);
    ``partition`` is set for ASSIGN, PRIMARY, PROGRESS, ISR, SIZES and RESHARD keys, ``field``
    for ASSIGN keys only, ``node`` for PROGRESS and SIZES keys only.
    """

    kind: KeyKind
    name: str
    partition: int | None = None
    field: AssignField | None = None
    node: str | None = None


def prefix_range_end(prefix: bytes) -> bytes:
    """The etcd ``range_end`` making ``[prefix, range_end)`` exactly the keys starting with it."""
    end = bytearray(prefix)
    for i in reversed(range(len(end))):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\x00"  # every byte was 0xff: the range runs to the end of the keyspace


def _zone_dir(family: bytes, zone: str) -> bytes:
    """``{family}{zone}/``: the keys of one zone in a per-partition family."""
    return family + validate_name(zone).encode() + b"/"


def _partition_id(partition: int) -> bytes:
    """A partition id as it stands in keys: zero-padded, so keys sort in partition order."""
    return f"{validate_partition(partition):0{_PARTITION_WIDTH}d}".encode()


class KeySpace:
    """Builds and parses the keys of one placement deployment (one prefix)."""

    __slots__ = ("_base", "prefix")

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        segments = prefix.split("/")
        if (
            not prefix.startswith("/")
            or prefix.endswith("/")
            or not all(_PREFIX_SEGMENT_RE.match(s) for s in segments[1:])
        ):
            raise InvalidInput(
                "prefix",
                f"{prefix!r} is not a valid key prefix",
                "use '/name' or '/a/b' with segments of letters, digits, '_', '.', '-'",
            )
        self.prefix = prefix
        self._base = prefix.encode()

    def __repr__(self) -> str:
        return f"KeySpace({self.prefix!r})"

    # -- zones, nodes, leader ------------------------------------------------------------------

    def zones_prefix(self) -> bytes:
        return self._base + b"/zones/"

    def zone(self, zone: str) -> bytes:
        return self.zones_prefix() + validate_name(zone).encode()

    def nodes_prefix(self) -> bytes:
        return self._base + b"/nodes/"

    def node(self, node: str) -> bytes:
        return self.nodes_prefix() + validate_name(node, "node").encode()

    def leader_prefix(self) -> bytes:
        return self._base + b"/leader/"

    def leader(self, member_id: str) -> bytes:
        return self.leader_prefix() + validate_name(member_id, "member").encode()

    # -- assignments ---------------------------------------------------------------------------

    def assign_prefix(self) -> bytes:
        return self._base + b"/assign/"

    def zone_assign_prefix(self, zone: str) -> bytes:
        """All assignment keys of ``zone``, in partition order under a range scan."""
        return _zone_dir(self.assign_prefix(), zone)

    def partition_prefix(self, zone: str, partition: int) -> bytes:
        """All keys of one partition (stable, pending, planned, cancel, trigger)."""
        p = _partition_id(partition)
        return self.zone_assign_prefix(zone) + p + b"/"

    def assign(self, zone: str, partition: int, field: AssignField) -> bytes:
        return self.partition_prefix(zone, partition) + AssignField(field).value.encode()

    # -- data nodes, primaries, controls ------------------------------------------------------

    def datanodes_prefix(self) -> bytes:
        return self._base + b"/datanodes/"

    def datanodes(self, zone: str) -> bytes:
        return self.datanodes_prefix() + validate_name(zone).encode()

    def primary_prefix(self) -> bytes:
        return self._base + b"/primary/"

    def zone_primary_prefix(self, zone: str) -> bytes:
        return _zone_dir(self.primary_prefix(), zone)

    def primary(self, zone: str, partition: int) -> bytes:
        p = _partition_id(partition)
        return self.zone_primary_prefix(zone) + p

    def control_prefix(self) -> bytes:
        return self._base + b"/control/"

    def control(self, name: str) -> bytes:
        if name not in CONTROL_NAMES:
            raise InvalidInput(
                "control", f"{name!r} is not a control key", f"use {sorted(CONTROL_NAMES)}"
            )
        return self.control_prefix() + name.encode()

    def paused(self) -> bytes:
        return self.control(PAUSED)

    def drain_prefix(self) -> bytes:
        return self._base + b"/drain/"

    def drain(self, node: str) -> bytes:
        """``{p}/drain/{node}``: an operator drains the node (its leases, then its replicas move
        away; design/control-plane.md, "Drain")."""
        return self.drain_prefix() + validate_name(node, "node").encode()

    def cordon_prefix(self) -> bytes:
        return self._base + b"/cordon/"

    def cordon(self, node: str) -> bytes:
        """``{p}/cordon/{node}``: an operator cordons the node (it keeps its replicas and takes
        no new ones; design/control-plane.md, "Cordon")."""
        return self.cordon_prefix() + validate_name(node, "node").encode()

    def terms_prefix(self) -> bytes:
        """The nodes' lease terms: under the primary leases' prefix (one watch of that prefix
        delivers a lease and its holder's term in etcd's order), in a directory no zone can
        name."""
        return self.primary_prefix() + TERM_DIR + b"/"

    def term(self, node: str) -> bytes:
        """``{p}/primary/@term/{node}``: how long the primary leases ``node`` holds last,
        renewed by the leader once per node instead of once per lease
        (design/control-plane.md, "Primary leases")."""
        return self.terms_prefix() + validate_name(node, "node").encode()

    # -- move reports (agents push completion) ------------------------------------------------

    def progress_prefix(self) -> bytes:
        return self._base + b"/progress/"

    def partition_progress_prefix(self, zone: str, partition: int) -> bytes:
        """All nodes' move reports of one partition."""
        p = _partition_id(partition)
        return _zone_dir(self.progress_prefix(), zone) + p + b"/"

    def progress(self, zone: str, partition: int, node: str) -> bytes:
        """The move report ``node`` writes for ``zone``/``partition``."""
        node_part = validate_name(node, "node").encode()
        return self.partition_progress_prefix(zone, partition) + node_part

    # -- in-sync sets and replica sizes (data plane) -------------------------------------------

    def isr_prefix(self) -> bytes:
        return self._base + b"/isr/"

    def zone_isr_prefix(self, zone: str) -> bytes:
        return _zone_dir(self.isr_prefix(), zone)

    def isr(self, zone: str, partition: int) -> bytes:
        """The in-sync set of ``zone``/``partition``."""
        p = _partition_id(partition)
        return self.zone_isr_prefix(zone) + p

    def sizes_prefix(self) -> bytes:
        return self._base + b"/sizes/"

    def size(self, zone: str, partition: int, node: str) -> bytes:
        """The data size ``node`` reports for its replica of ``zone``/``partition``."""
        p = _partition_id(partition)
        return (
            _zone_dir(self.sizes_prefix(), zone) + p + b"/" + validate_name(node, "node").encode()
        )

    # -- layouts and reshard reports (design/resharding.md) ------------------------------------

    def layout_prefix(self) -> bytes:
        return self._base + b"/layout/"

    def layout(self, zone: str) -> bytes:
        """The layout in force of ``zone`` and its reshard, if one runs."""
        return self.layout_prefix() + validate_name(zone).encode()

    def reshard_prefix(self) -> bytes:
        return self._base + b"/reshard/"

    def zone_reshard_prefix(self, zone: str) -> bytes:
        return _zone_dir(self.reshard_prefix(), zone)

    def reshard_report(self, zone: str, partition: int) -> bytes:
        """The reshard report of ``zone``/``partition`` (written by its primary's agent)."""
        return self.zone_reshard_prefix(zone) + _partition_id(partition)

    # -- parsing -------------------------------------------------------------------------------

    def parse(self, key: bytes) -> ParsedKey | None:
        """Take a key of this layout apart; ``None`` for a key outside the prefix or not of it.

        Never raises: a stray key under the prefix (written by hand, by a newer version) is
        simply not ours to interpret.
        """
        head = self._base + b"/"
        if not key.startswith(head):
            return None
        try:
            parts = key[len(head) :].decode("ascii").split("/")
        except UnicodeDecodeError:
            return None
        kind_text, rest = parts[0], parts[1:]
        if kind_text in (KeyKind.ZONE, KeyKind.NODE, KeyKind.LEADER):
            if len(rest) != 1 or not is_name(rest[0]):
                return None
            return ParsedKey(KeyKind(kind_text), rest[0])
        if kind_text == KeyKind.PRIMARY and rest and rest[0] == TERM_DIR.decode():
            if len(rest) != 2 or not is_name(rest[1]):
                return None
            return ParsedKey(KeyKind.TERM, rest[1])
        if kind_text in (KeyKind.DATANODES, KeyKind.LAYOUT, KeyKind.DRAIN, KeyKind.CORDON):
            if len(rest) != 1 or not is_name(rest[0]):
                return None
            return ParsedKey(KeyKind(kind_text), rest[0])
        if kind_text == KeyKind.CONTROL:
            if len(rest) != 1 or rest[0] not in CONTROL_NAMES:
                return None
            return ParsedKey(KeyKind.CONTROL, rest[0])
        if kind_text in (KeyKind.PRIMARY, KeyKind.ISR, KeyKind.RESHARD):
            if len(rest) != 2 or not is_name(rest[0]) or not _PARTITION_RE.match(rest[1]):
                return None
            if int(rest[1]) >= MAX_PARTITIONS:
                return None
            return ParsedKey(KeyKind(kind_text), rest[0], int(rest[1]))
        if kind_text in (KeyKind.PROGRESS, KeyKind.SIZES):
            if (
                len(rest) != 3
                or not is_name(rest[0])
                or not _PARTITION_RE.match(rest[1])
                or not is_name(rest[2])
                or int(rest[1]) >= MAX_PARTITIONS
            ):
                return None
            return ParsedKey(KeyKind(kind_text), rest[0], int(rest[1]), node=rest[2])
        if kind_text == KeyKind.ASSIGN:
            if len(rest) != 3 or not is_name(rest[0]) or not _PARTITION_RE.match(rest[1]):
                return None
            partition = int(rest[1])
            if partition >= MAX_PARTITIONS:
                return None
            try:
                field = AssignField(rest[2])
            except ValueError:
                return None
            return ParsedKey(KeyKind.ASSIGN, rest[0], partition, field)
        return None
