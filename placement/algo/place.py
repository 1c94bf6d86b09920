"""The placement function: zone spec + eligible nodes + current assignment → ordered replica sets.

Pure: no I/O, no clock, no randomness (ties are broken by deterministic hashes of the zone,
node names and partition ids). The CLI, the driver and the Spark pipeline all call :func:`place`.

Guarantees (design/placement.md states them exactly; tests/unit/test_placement*.py checks them):

* every partition gets ``R' = min(R, N)`` distinct eligible nodes;
* node loads are within 1 of their water-filled weighted share (±1 when unweighted);
* with a failure-domain attribute, partitions span ``min(R', D)`` domains, domain totals are
  water-filled, node loads are within 1 of their share inside their domain;
* node ``i`` leads ``⌊ℓ_i/R'⌋`` or ``⌈ℓ_i/R'⌉`` partitions (its replica load ``ℓ_i``);
* without failure domains, the number of new (partition, node) pairs is the minimum over all
  assignments with those loads (a min-cost flow, see :mod:`placement.algo.solver`);
* the same input in any order gives the same output.
"""

from __future__ import annotations

import functools
import math
from array import array
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain, compress, pairwise, repeat
from operator import attrgetter, is_not
from types import MappingProxyType

import numpy as np
from numpy.typing import NDArray

from placement.algo import domain_keep, joint
from placement.algo.cordon import solve_cordoned
from placement.algo.fleet import FleetLoad, per_weight, rank
from placement.algo.hashing import mix64, name_key, name_keys
from placement.algo.preferred import choose_primaries
from placement.algo.solver import (
    CoreProblem,
    Pairs,
    members_matrix,
    solve,
    solve_rows,
    stable_argsort,
)
from placement.algo.targets import Targets, demand_targets, weighted_targets
from placement.core.model import Node, Peers, ZoneSpec
from placement.errors import InvalidInput

I64 = NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Placement:
    """The target of one zone.

    ``assignments[p]`` lists partition ``p``'s nodes: the preferred primary first, then the other
    members in name order. ``loads`` and ``primary_loads`` count replicas and preferred primaries
    per eligible node (zero included), in name order.
    """

    assignments: tuple[Peers, ...]
    loads: Mapping[str, int] = field(default_factory=dict, compare=False, hash=False)
    primary_loads: Mapping[str, int] = field(default_factory=dict, compare=False, hash=False)


def place(
    zone: ZoneSpec,
    nodes: Sequence[Node],
    current: Mapping[int, Sequence[str]] | None = None,
    cordoned: Collection[str] = frozenset(),
    fleet: FleetLoad | None = None,
) -> Placement:
    """Balanced replica sets for ``zone`` that keep as much of ``current`` as balance allows.

    ``nodes`` are filtered by ``zone.node_selector``; current members that are not eligible have
    left and their replicas are re-placed; current entries for partitions ``≥ P`` are ignored.
    Eligible nodes named in ``cordoned`` keep current replicas (up to their share) and take no
    new one unless a partition could not otherwise have ``R'`` members or span its failure
    domains (:mod:`placement.algo.cordon`). ``fleet`` (the other zones' loads) decides the
    choices that move nothing, least loaded first (:mod:`placement.algo.fleet`).
    Raises :class:`InvalidInput` for P < 1, R < 1, weights ≤ 0, duplicate names, no eligible node.
    """
    _check_zone(zone)
    _check_nodes(nodes)
    selected = (n for n in nodes if n.matches(zone.node_selector)) if zone.node_selector else nodes
    eligible = sorted(selected, key=attrgetter("name"))
    if not eligible:
        raise InvalidInput(
            "nodes",
            f"no eligible node for zone {zone.name}",
            f"register nodes matching the selector {dict(zone.node_selector)} "
            "or relax the zone's node_selector",
        )
    ctx = _Context.build(zone, eligible, current or {}, cordoned, fleet)
    if zone.failure_domain is None:
        members = _solve_flat(ctx)
    else:
        pairs = _solve_domains(ctx, zone.failure_domain)
        members = members_matrix(pairs, ctx.partitions, ctx.width, len(eligible))
    load = np.bincount(members.ravel(), minlength=len(eligible))
    primary = choose_primaries(members, load, ctx.cur_primary, ctx.row_key, ctx.primary_rank)
    if ctx.cordoned is None:
        members, load, primary = _members_for_primaries(
            ctx, members, load, primary, zone.failure_domain
        )
    return _assemble(ctx.names, members, primary, load, ctx.given)


def count_moves(current: Mapping[int, Sequence[str]], new: Sequence[Peers]) -> int:
    """Number of (partition, node) pairs of ``new`` that ``current`` does not have."""
    if not current:  # a fresh zone: every pair is new
        return sum(map(len, map(set, new)))
    # A row place() kept is the very tuple it was given: the others are found by C-level maps
    # and only they are compared, in Python.
    nows = list(map(current.get, range(len(new)), repeat(())))
    others = compress(zip(nows, new, strict=True), map(is_not, nows, new))
    return sum([new_pairs(now, peers) for now, peers in others])


def new_pairs(now: Sequence[str], peers: Sequence[str]) -> int:
    """How many of ``peers`` (distinct names) ``now`` does not hold."""
    if peers == now:  # unchanged (often the very tuple given): nothing new
        return 0
    return len(set(peers).difference(now))


# --- validation ----------------------------------------------------------------------------------


def _check_zone(zone: ZoneSpec) -> None:
    if zone.partitions < 1:
        raise InvalidInput(
            "zone.partitions",
            f"zone {zone.name} has {zone.partitions} partitions",
            "use at least 1 partition",
        )
    if zone.replicas < 1:
        raise InvalidInput(
            "zone.replicas",
            f"zone {zone.name} asks for {zone.replicas} replicas",
            "use at least 1 replica",
        )


def _check_nodes(nodes: Sequence[Node]) -> None:
    names = [node.name for node in nodes]
    weights = [node.weight for node in nodes]
    if len(set(names)) == len(names) and all(0 < w < math.inf for w in weights):
        return  # the usual case; otherwise the loop below names the first offending node
    seen: set[str] = set()
    for k, node in enumerate(nodes):
        if node.name in seen:
            raise InvalidInput(
                f"nodes[{k}].name",
                f"duplicate node name {node.name!r}",
                "give every node a unique name",
            )
        seen.add(node.name)
        if not (math.isfinite(node.weight) and node.weight > 0):
            raise InvalidInput(
                f"nodes[{k}].weight",
                f"node {node.name} has weight {node.weight}",
                "use a finite weight above 0 (1.0 = an ordinary node)",
            )


# --- the problem in index space ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Given:
    """The current assignment as given, when partition ``p`` is ``values[p]`` for ``p < n``.

    ``matrix[p]`` are the node indices of ``values[p]`` in the given order (-1: not eligible).
    An output row equal to its input row can reuse it (no name lookups, and no copy at all for
    a tuple, e.g. a previous :class:`Placement` fed back).

    ``slots``/``row_count``, when every partition ``0..P-1`` is given: the position
    ``p · width + column`` of every valid current pair in the matrix of the sorted given rows,
    and the number of valid pairs per partition (hints for the core, see
    :class:`~placement.algo.solver.CoreProblem`).
    """

    matrix: I64
    values: list[Sequence[str]]
    slots: I64 | None = None
    row_count: I64 | None = None
    ordered: I64 | None = None  #: the first ``P`` rows of ``matrix``, each sorted


@dataclass(frozen=True, slots=True)
class _Context:
    """A zone's problem with nodes as indices 0..N-1 in name order.

    ``cur_*`` are the valid current pairs (deduplicated, eligible nodes, partitions < P), sorted.
    """

    zone: str
    names: list[str]
    weights: list[float]
    attributes: list[Mapping[str, str]]
    partitions: int
    width: int
    row_key: NDArray[np.uint64]
    node_key: NDArray[np.uint64]
    cur_row: I64
    cur_node: I64
    cur_first: NDArray[np.bool_]
    cur_primary: I64
    given: _Given | None
    #: Which eligible nodes are cordoned; None when none is.
    cordoned: NDArray[np.bool_] | None = None
    #: With a :class:`FleetLoad`: each node's replicas in the other zones, and the fleet ranks
    #: of the nodes for a ``+1`` replica and for a ``+1`` primary (lowest load per weight first).
    fleet_replicas: NDArray[np.float64] | None = None
    fleet_rank: I64 | None = None
    primary_rank: I64 | None = None

    @staticmethod
    def build(
        zone: ZoneSpec,
        eligible: list[Node],
        current: Mapping[int, Sequence[str]],
        cordoned: Collection[str] = frozenset(),
        fleet: FleetLoad | None = None,
    ) -> _Context:
        names = [n.name for n in eligible]
        weights = [n.weight for n in eligible]
        node_key = name_keys((zone.name,), names)
        fleet_replicas, fleet_rank, primary_rank = _fleet_fields(fleet, names, weights, node_key)
        mask = np.asarray([n in cordoned for n in names], dtype=np.bool_) if cordoned else None
        rows, nodes, firsts, primary, given = _parse_current(
            current, zone.partitions, _Index((name, i) for i, name in enumerate(names))
        )
        return _Context(
            zone=zone.name,
            names=names,
            weights=weights,
            attributes=[n.attributes for n in eligible],
            partitions=zone.partitions,
            width=min(zone.replicas, len(eligible)),
            row_key=mix64(np.arange(zone.partitions, dtype=np.uint64), name_key(zone.name)),
            node_key=node_key,
            cur_row=rows,
            cur_node=nodes,
            cur_first=firsts,
            cur_primary=primary,
            given=given,
            cordoned=mask if mask is not None and mask.any() else None,
            fleet_replicas=fleet_replicas,
            fleet_rank=fleet_rank,
            primary_rank=primary_rank,
        )

    @property
    def total(self) -> int:
        return self.partitions * self.width


def _fleet_fields(
    fleet: FleetLoad | None, names: list[str], weights: list[float], node_key: NDArray[np.uint64]
) -> tuple[NDArray[np.float64] | None, I64 | None, I64 | None]:
    """:class:`_Context`'s ``fleet_replicas``, ``fleet_rank`` and ``primary_rank``. A fleet
    that loads every node alike (per weight) decides nothing: its rank is left out, and the
    zone is placed as without a fleet."""
    if fleet is None:
        return None, None, None
    replicas = per_weight(fleet.replicas, names, weights)
    primaries = per_weight(fleet.primaries, names, weights)
    fleet_replicas = fleet_rank = primary_rank = None
    if len(replicas) and ((replicas != replicas[0]).any() or (primaries != primaries[0]).any()):
        # equal replica loads: the node leading fewer takes the replica (it may lead it)
        fleet_replicas = per_weight(fleet.replicas, names, [1.0] * len(names))
        fleet_rank = rank(replicas, node_key, primaries)
    if len(primaries) and (primaries != primaries[0]).any():
        primary_rank = rank(primaries, node_key)
    return fleet_replicas, fleet_rank, primary_rank


def _parse_current(
    current: Mapping[int, Sequence[str]], partitions: int, index: _Index
) -> tuple[I64, I64, NDArray[np.bool_], I64, _Given | None]:
    """Valid current pairs sorted by (row, node), whether each is its row's primary, and every
    row's current primary.

    The primary is the first listed member, only when that node is still eligible. Vectorised:
    the names are flattened once and looked up with one C-level ``map``. The usual input —
    partitions ``0..n-1`` in order, all with the same number of members — is a matrix whose
    rows are sorted and deduplicated in place; anything else goes through a stable sort of
    the pair codes (the first occurrence of a duplicate wins, so a primary is never lost).
    """
    values = list(current.values())
    try:
        sizes = set(map(len, values))
    except TypeError:
        return (*_parse_current_slow(current, partitions, index), None)
    # The usual keys 0..n-1 in order, all with the same number of members, are checked by one
    # list comparison; any others are read into an array (integers only).
    common = sizes.pop() if len(sizes) == 1 else 0
    keys = None
    if common > 0 and list(current) == _range_list(len(values)):
        lengths = [common]
        total = common * len(values)
    else:
        try:
            keys = np.frombuffer(array("q", current), dtype=np.int64)
        except (TypeError, OverflowError):
            return (*_parse_current_slow(current, partitions, index), None)
        lengths = list(map(len, values))
        total = sum(lengths)
    node = _lookup(index, chain.from_iterable(values), total)
    if node is None:  # fewer or more members than their ``len()`` said
        return (*_parse_current_slow(current, partitions, index), None)
    if keys is None:
        matrix = node.reshape(len(values), lengths[0])
        rows, nodes, first, primary, slots, count, ordered = _parse_dense(matrix, partitions)
        if len(matrix) < partitions:
            return rows, nodes, first, primary, _Given(matrix, values, ordered=ordered)
        return rows, nodes, first, primary, _Given(matrix, values, slots, count, ordered)
    row = np.repeat(keys, lengths)
    size = np.asarray(lengths, dtype=np.int64)
    first = np.zeros(total, dtype=np.bool_)
    first[(np.cumsum(size) - size)[size > 0]] = True
    valid = (node >= 0) & (row >= 0) & (row < partitions)
    width = len(index)
    code = row[valid] * width + node[valid]
    first = first[valid]
    order = stable_argsort(code, partitions * width)
    code = code[order]
    distinct = np.ones(len(code), dtype=np.bool_)
    distinct[1:] = code[1:] != code[:-1]
    code, first = code[distinct], first[order[distinct]]
    rows, nodes = code // width, code % width
    primary = np.full(partitions, -1, dtype=np.int64)
    primary[rows[first]] = nodes[first]
    return rows, nodes, first, primary, None


_END = object()


@functools.lru_cache(maxsize=4)
def _range_list(n: int) -> list[int]:
    """``list(range(n))``, cached (compared with the keys of ``current``; never modified)."""
    return list(range(n))


class _Index(dict[str, int]):
    """Node index by name; -1 for a name that is not eligible (one-argument lookups are the
    fastest ``map`` can call)."""

    __slots__ = ()

    def __missing__(self, name: str) -> int:
        return -1


class _ByteIndex(dict[str, int]):
    """:class:`_Index` for fewer than 255 nodes, with 255 for a name that is not eligible."""

    __slots__ = ()

    def __missing__(self, name: str) -> int:
        return 255


def _byte_nodes() -> I64:
    table = np.arange(256, dtype=np.int64)
    table[255] = -1
    table.flags.writeable = False
    return table


#: Node index of a byte code of :class:`_ByteIndex` (255: not eligible, -1).
_BYTE_NODES = _byte_nodes()


def _lookup(index: _Index, names: Iterator[str], total: int) -> I64 | None:
    """The node index of each name (-1: not eligible); None unless there are ``total`` names.

    With fewer than 255 nodes the indices are collected as bytes (``bytearray`` of the
    lookups): the per-name cost of the loop is the floor here, and filling a byte buffer
    costs less per name than ``np.fromiter`` (Python ints to a C array).
    """
    if len(index) < 255:
        codes = bytearray(map(_ByteIndex(index).__getitem__, names))
        if len(codes) != total:
            return None
        nodes: I64 = _BYTE_NODES[np.frombuffer(codes, dtype=np.uint8)]
        return nodes
    try:
        nodes = np.fromiter(map(index.__getitem__, names), dtype=np.int64, count=total)
    except ValueError:  # fewer names
        return None
    if next(names, _END) is not _END:  # more names
        return None
    return nodes


def _parse_dense(
    matrix: I64, partitions: int
) -> tuple[I64, I64, NDArray[np.bool_], I64, I64, I64, I64]:
    """:func:`_parse_current` when row ``p`` of ``matrix`` lists partition ``p`` (-1: not
    eligible), then the position of every pair in the rows' sorted matrix, the number of
    pairs per row and that sorted matrix (see :class:`_Given`).

    Works column by column and fills the pairs in place: few large temporaries, since each
    fresh array of the size of the input costs page faults.
    """
    matrix = matrix[:partitions]
    n_rows, width = matrix.shape
    lead = matrix[:, 0].copy()
    columns = _sorted_columns(matrix)
    valid = columns[0] >= 0
    every = bool(valid.all())
    masks = [valid]
    for a, b in pairwise(columns):
        ok = b != a
        if every:
            every = bool(ok.all())  # b > a >= 0 once sorted: no -1 left
        masks.append(ok & (b >= 0))
    nodes = np.empty((n_rows, width), dtype=np.int64)
    for j, column in enumerate(columns):
        nodes[:, j] = column
    first = nodes == lead[:, None]
    rows = _row_ids(n_rows, width)
    primary = np.full(partitions, -1, dtype=np.int64)
    primary[:n_rows] = lead
    if every:
        count = np.full(n_rows, width, dtype=np.int64)
        return (
            rows,
            nodes.reshape(-1),
            first.reshape(-1),
            primary,
            _row_ids(n_rows * width, 1),
            count,
            nodes,
        )
    keep = np.empty((n_rows, width), dtype=np.bool_)
    count = masks[0].astype(np.int64)
    for j, mask in enumerate(masks):
        keep[:, j] = mask
        if j:
            count += mask
    slots = np.flatnonzero(keep)
    flat = nodes.reshape(-1)
    return rows[slots], flat[slots], first.reshape(-1)[slots], primary, slots, count, nodes


@functools.lru_cache(maxsize=4)
def _row_ids(n_rows: int, width: int) -> I64:
    """``np.repeat(np.arange(n_rows), width)``, cached and read-only."""
    rows = np.repeat(np.arange(n_rows, dtype=np.int64), width)
    rows.flags.writeable = False
    return rows


def _sorted_columns(matrix: I64) -> list[I64]:
    """The columns of ``np.sort(matrix, axis=1)``; a compare-exchange network (odd-even
    transposition) when rows are short: numpy's per-row sort has a high fixed cost for 2-4
    elements."""
    width = matrix.shape[1]
    if width > 4:
        ordered = np.sort(matrix, axis=1)
        return [ordered[:, j] for j in range(width)]
    return _sort_network([matrix[:, j] for j in range(width)])


def _sort_network(columns: list[I64]) -> list[I64]:
    """Element-wise sorted ``columns`` (at most 4): ``out[0] <= out[1] <= …`` in every row."""
    columns = list(columns)
    width = len(columns)
    for round_ in range(width):
        for j in range(round_ % 2, width - 1, 2):
            low = np.minimum(columns[j], columns[j + 1])
            columns[j + 1] = np.maximum(columns[j], columns[j + 1])
            columns[j] = low
    return columns


def _parse_current_slow(
    current: Mapping[int, Sequence[str]], partitions: int, index: Mapping[str, int]
) -> tuple[I64, I64, NDArray[np.bool_], I64]:
    """:func:`_parse_current` for unusual inputs (keys that are not ``int``, members without a
    consistent ``len``)."""
    rows: list[int] = []
    nodes: list[int] = []
    firsts: list[bool] = []
    primary = np.full(partitions, -1, dtype=np.int64)
    for row, peers in current.items():
        if not 0 <= row < partitions:
            continue
        seen: set[int] = set()
        for position, name in enumerate(peers):
            i = index.get(name)
            if i is None or i in seen:
                continue
            seen.add(i)
            rows.append(row)
            nodes.append(i)
            firsts.append(position == 0)
            if position == 0:
                primary[row] = i
    r = np.asarray(rows, dtype=np.int64)
    n = np.asarray(nodes, dtype=np.int64)
    order = np.lexsort((n, r))
    return r[order], n[order], np.asarray(firsts, dtype=np.bool_)[order], primary


def _solve_flat(ctx: _Context) -> I64:
    """No failure domain: one core problem over all eligible nodes, each capped at P; the
    members matrix."""
    _, targets = weighted_targets(ctx.weights, ctx.total, hi=[ctx.partitions] * len(ctx.names))
    given = ctx.given
    dense = given is not None and given.matrix.shape[1] == ctx.width
    pb = CoreProblem(
        demand=np.full(ctx.partitions, ctx.width, dtype=np.int64),
        targets=targets,
        cur_row=ctx.cur_row,
        cur_node=ctx.cur_node,
        cur_first=ctx.cur_first,
        row_key=ctx.row_key,
        node_key=ctx.node_key,
        row_count=given.row_count if given is not None else None,
        slots=given.slots if dense and given is not None else None,
        node_rank=ctx.fleet_rank,
    )
    if ctx.cordoned is not None:
        pairs = solve_cordoned(pb, ctx.weights, ctx.cordoned)
        return members_matrix(pairs, ctx.partitions, ctx.width, len(ctx.names))
    return solve_rows(pb, ctx.width)


def _members_for_primaries(
    ctx: _Context, members: I64, load: I64, primary: I64, attribute: str | None
) -> tuple[I64, I64, I64]:
    """``members``, or other members keeping as many current pairs whose primaries change
    fewer current primaries (:mod:`placement.algo.joint`); with their loads and primaries.
    With failure domains only for ``D ≥ R'``."""

    changed = (ctx.cur_primary >= 0) & (primary != ctx.cur_primary)
    if ctx.partitions * len(ctx.names) > joint.JOINT_EDGES or not changed.any():
        return members, load, primary

    def choose(trial: I64, loads: I64) -> I64:
        return choose_primaries(trial, loads, ctx.cur_primary, ctx.row_key, ctx.primary_rank)

    if attribute is None:
        _, targets = weighted_targets(ctx.weights, ctx.total, hi=[ctx.partitions] * len(ctx.names))
        bands = _Bands(targets.floor, targets.floor + targets.eligible)
        domain = None
    else:
        dom = _Domains.build(ctx, attribute)
        if len(dom.labels) < ctx.width:
            return members, load, primary
        bands = _DomainBands(ctx, dom)
        domain = dom.of_node
    lo, hi = bands.at(load)
    other = joint.members_for_primaries(
        members, primary, ctx.cur_primary, ctx.cur_row, ctx.cur_node, lo, hi, domain
    )
    if other is not None:
        other_load = np.bincount(other.ravel(), minlength=len(ctx.names))
        chosen = choose(other, other_load)
        if _primary_changes(ctx, chosen) < _primary_changes(ctx, primary):
            members, load, primary = other, other_load, chosen
    bound = joint.primaries_bound(members, ctx.cur_primary, *bands.widest())
    exchanged = joint.exchanges(
        members,
        primary,
        load,
        ctx.cur_primary,
        ctx.cur_row,
        ctx.cur_node,
        bound,
        choose,
        bands.fits,
        domain,
    )
    if exchanged is not None:
        members, primary = exchanged
        load = np.bincount(members.ravel(), minlength=len(ctx.names))
    return members, load, primary


class _Bands:
    """Every node's load band ``[lo, hi]`` (no failure domain: the same for every load)."""

    def __init__(self, lo: I64, hi: I64) -> None:
        self.lo, self.hi = lo, hi

    def at(self, load: I64) -> tuple[I64, I64]:
        """The bands that hold with the domain totals of ``load``."""
        return self.lo, self.hi

    def widest(self) -> tuple[I64, I64]:
        """Bands that every load meeting the targets is within."""
        return self.lo, self.hi

    def fits(self, load: I64, y: int, z: int) -> bool:
        """Whether ``load`` with one replica moved from node ``y`` to node ``z`` meets the
        targets (``load`` does)."""
        return bool(load[y] > self.lo[y] and load[z] < self.hi[z])


class _DomainBands(_Bands):
    """``D ≥ R'``: domain ``d`` holds ``T_d`` (the floor of its share, or the floor + 1 where
    it may), its nodes the bands of the water-fill of ``T_d`` inside it."""

    def __init__(self, ctx: _Context, dom: _Domains) -> None:
        n_dom = len(dom.labels)
        _, self.totals = weighted_targets(dom.weights, ctx.total, hi=[ctx.partitions] * n_dom)
        self.dom = dom
        self.inner: dict[tuple[int, int], tuple[I64, I64]] = {}
        lo = np.zeros(len(ctx.names), dtype=np.int64)
        hi = np.zeros(len(ctx.names), dtype=np.int64)
        for d, nodes in enumerate(dom.nodes):
            floor = int(self.totals.floor[d])
            ends = [
                self._inner(d, t) for t in range(floor, floor + 1 + int(self.totals.eligible[d]))
            ]
            lo[nodes] = np.minimum.reduce([e[0] for e in ends])
            hi[nodes] = np.maximum.reduce([e[1] for e in ends])
        super().__init__(lo, hi)

    def _inner(self, d: int, total: int) -> tuple[I64, I64]:
        key = (d, total)
        if key not in self.inner:
            if total:
                t = demand_targets(self.dom.node_weights[d], np.ones(total, dtype=np.int64))
                self.inner[key] = (t.floor, t.floor + t.eligible)
            else:
                zero = np.zeros(len(self.dom.nodes[d]), dtype=np.int64)
                self.inner[key] = (zero, zero)
        return self.inner[key]

    def at(self, load: I64) -> tuple[I64, I64]:
        lo, hi = np.zeros_like(load), np.zeros_like(load)
        for d, nodes in enumerate(self.dom.nodes):
            lo[nodes], hi[nodes] = self._inner(d, int(load[nodes].sum()))
        return lo, hi

    def fits(self, load: I64, y: int, z: int) -> bool:
        of = self.dom.of_node
        if of[y] == of[z]:  # the domain's total stays, and so do its bands
            lo, hi = self._inner(int(of[y]), int(load[self.dom.nodes[of[y]]].sum()))
            at_y, at_z = self.dom.local[y], self.dom.local[z]
            return bool(load[y] > lo[at_y] and load[z] < hi[at_z])
        for d, step in ((int(of[y]), -1), (int(of[z]), 1)):
            nodes = self.dom.nodes[d]
            loads = load[nodes].copy()
            loads[self.dom.local[y if step < 0 else z]] += step
            total = int(loads.sum())
            floor = int(self.totals.floor[d])
            if not floor <= total <= floor + int(self.totals.eligible[d]):
                return False
            lo, hi = self._inner(d, total)
            if ((loads < lo) | (loads > hi)).any():
                return False
        return True


def _primary_changes(ctx: _Context, primary: I64) -> int:
    return int(np.count_nonzero((ctx.cur_primary >= 0) & (primary != ctx.cur_primary)))


# --- failure domains -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Domains:
    """Eligible nodes grouped by failure-domain value (a node without it is its own domain)."""

    labels: list[str]
    of_node: I64
    nodes: list[I64]
    weights: list[float]
    #: Each node's index among its domain's nodes.
    local: I64
    #: The weights of each domain's nodes.
    node_weights: list[list[float]]

    @staticmethod
    def build(ctx: _Context, attribute: str) -> _Domains:
        labels_of = [
            f"={a[attribute]}" if attribute in a else f"node:{name}"
            for a, name in zip(ctx.attributes, ctx.names, strict=True)
        ]
        labels = sorted(set(labels_of))
        position = {label: d for d, label in enumerate(labels)}
        of_node = np.asarray([position[label] for label in labels_of], dtype=np.int64)
        nodes = [np.flatnonzero(of_node == d) for d in range(len(labels))]
        node_weights = [[ctx.weights[i] for i in members.tolist()] for members in nodes]
        weights = [sum(w) for w in node_weights]
        local = np.empty(len(of_node), dtype=np.int64)
        for members in nodes:
            local[members] = np.arange(len(members))
        return _Domains(labels, of_node, nodes, weights, local, node_weights)


def _solve_domains(ctx: _Context, attribute: str) -> Pairs:
    """Hierarchical: domains per partition first (sticky), then nodes inside each domain (sticky).

    With ``D ≥ R'`` domains a partition takes ``R'`` distinct domains (a domain holds at most one
    replica of it). With ``D < R'`` every partition takes every domain and the remaining replicas
    go to domains with more nodes, at most ``min(size, R' − D + 1)`` per domain.

    With a fleet, a domain's ``+1`` is not always free: which domain takes it changes what its
    nodes can keep. So unless the fleet's choice keeps every pair level 1 kept (the most any
    choice keeps), both are solved and the fleet's is taken only when it keeps at least as many
    current pairs: never more moves than without a fleet — sometimes fewer, where the plain
    level-1 choice is the one that loses a pair (level by level is not minimal, see Limits).
    """
    dom = _Domains.build(ctx, attribute)
    limits = _limits(ctx, dom)
    rows, doms = _domain_level(ctx, dom, limits=limits)
    pairs = _inside_domains(ctx, dom, rows, doms)
    if ctx.fleet_replicas is not None and _kept(ctx, pairs) != _domain_kept(ctx, dom, rows, doms):
        # some current pair level 1 kept is lost inside its domain: the plain level 1 may keep
        # more (level 1's kept count is the same for every tie order)
        plain_ctx = replace(ctx, fleet_replicas=None)
        plain_rows, plain_doms = _domain_level(plain_ctx, dom, limits=limits)
        if not (np.array_equal(plain_rows, rows) and np.array_equal(plain_doms, doms)):
            plain = _inside_domains(ctx, dom, plain_rows, plain_doms)
            if _kept(ctx, plain) > _kept(ctx, pairs):
                pairs = plain
    return pairs if limits is None else _keep_most(ctx, dom, pairs, limits)


def _limits(ctx: _Context, dom: _Domains) -> domain_keep.Bands | None:
    """The joint bands of :mod:`placement.algo.domain_keep` (``D ≥ R'``, some current pair,
    no cordon); None otherwise."""
    n_dom = len(dom.labels)
    if n_dom < ctx.width or ctx.cordoned is not None or not len(ctx.cur_row):
        return None
    _, targets = weighted_targets(dom.weights, ctx.total, hi=[ctx.partitions] * n_dom)
    return domain_keep.bands(targets, dom.node_weights, dom.nodes, len(ctx.names))


def _keep_most(ctx: _Context, dom: _Domains, pairs: Pairs, limits: domain_keep.Bands) -> Pairs:
    """``pairs``, or the levels' answer for the current pairs a joint max flow keeps when
    ``pairs`` keeps fewer than that flow (:mod:`placement.algo.domain_keep`; ``D ≥ R'``)."""
    n_dom = len(dom.labels)
    width = len(ctx.names)
    chosen = np.zeros(ctx.partitions * width, dtype=np.bool_)
    chosen[pairs[0] * width + pairs[1]] = True
    kept = chosen[ctx.cur_row * width + ctx.cur_node]
    if kept.all():
        return pairs
    args = (ctx.width, ctx.cur_row, ctx.cur_node, dom.of_node, limits, n_dom)
    if int(kept.sum()) >= domain_keep.cut_bound(*args):
        return pairs
    found = domain_keep.most_kept(*args, kept)
    if found is None:
        return pairs
    more, plus = found
    sub = replace(
        ctx, cur_row=ctx.cur_row[more], cur_node=ctx.cur_node[more], cur_first=ctx.cur_first[more]
    )
    # The domains whose nodes keep more than their floors allow at the lower total take the +1.
    again = _inside_domains(sub, dom, *_domain_level(sub, dom, plus, limits))
    if _kept(ctx, again) < int(more.sum()):
        # The flow's kept set could not be completed as it is (the levels had to drop one of
        # its pairs): a small zone is solved on the whole network instead.
        exact = domain_keep.exact_small(
            ctx.partitions, *args[:4], limits.domains, dom.node_weights, dom.nodes
        )
        if exact is not None and _kept(ctx, exact) > _kept(ctx, again):
            again = exact
    return again if _kept(ctx, again) > int(kept.sum()) else pairs


def _domain_level(
    ctx: _Context,
    dom: _Domains,
    first: NDArray[np.bool_] | None = None,
    limits: domain_keep.Bands | None = None,
) -> Pairs:
    """Level 1: the (partition, domain) pairs, a domain listed once per replica it holds.
    ``D ≥ R'``: ``first``, domains that take the ``+1`` of the domain totals before the
    others where the kept pairs leave a choice; ``limits``, the nodes' bands (their pairs
    above them are dropped first, :func:`_drop_tiers`)."""
    if len(dom.labels) >= ctx.width:
        return _domains_distinct(ctx, dom, first, limits)
    return _domains_all(ctx, dom)


def _kept(ctx: _Context, pairs: Pairs) -> int:
    """How many current pairs ``pairs`` keeps."""
    width = len(ctx.names)
    # Sorted pair codes, not a flag per (partition, node): at P = 65,536 on 1,000 nodes that
    # table was 65 MB to zero per call, a tenth of an adversarial weighted zone's placing.
    held = np.unique(ctx.cur_row * width + ctx.cur_node)
    if not len(held):
        return 0
    codes = pairs[0] * width + pairs[1]
    at = np.minimum(np.searchsorted(held, codes), len(held) - 1)
    return int(np.count_nonzero(held[at] == codes))


def _domain_kept(ctx: _Context, dom: _Domains, rows: I64, doms: I64) -> int:
    """How many current (partition, domain) pairs level 1's ``rows``/``doms`` keep, counted
    with their multiplicity (a domain holding two replicas of a partition counts twice)."""
    n_dom = len(dom.labels)
    new, new_count = np.unique(rows * n_dom + doms, return_counts=True)
    now, now_count = np.unique(ctx.cur_row * n_dom + dom.of_node[ctx.cur_node], return_counts=True)
    _, at_new, at_now = np.intersect1d(new, now, assume_unique=True, return_indices=True)
    return int(np.minimum(new_count[at_new], now_count[at_now]).sum())


def _inside_domains(ctx: _Context, dom: _Domains, rows: I64, doms: I64) -> Pairs:
    """Level 2 for every domain, given level 1's (partition, domain) pairs."""
    # Every domain's partitions (sorted) with its replicas of each, in one pass: the codes
    # ``domain · P + row`` sorted are the domains in order, each with its sorted rows.
    n_dom, p = len(dom.labels), ctx.partitions
    codes, demand = np.unique(doms * p + rows, return_counts=True)
    bounds = np.searchsorted(codes, np.arange(n_dom + 1, dtype=np.int64) * p).tolist()
    # The current pairs whose partition level 1 gives to their node's domain.
    assigned = np.zeros(n_dom * p, dtype=np.bool_)
    assigned[codes] = True
    cur_dom = dom.of_node[ctx.cur_node]
    placed = assigned[cur_dom * p + ctx.cur_row]
    out_rows: list[I64] = []
    out_nodes: list[I64] = []
    for d in range(n_dom):
        lo, hi = bounds[d], bounds[d + 1]
        mine = placed & (cur_dom == d)
        r, n = _inside_domain(ctx, dom, d, codes[lo:hi] - d * p, demand[lo:hi], mine)
        out_rows.append(r)
        out_nodes.append(n)
    return np.concatenate(out_rows), np.concatenate(out_nodes)


def _domain_keys(ctx: _Context, labels: list[str]) -> NDArray[np.uint64]:
    return np.asarray([name_key(ctx.zone, "domain", label) for label in labels], dtype=np.uint64)


def _domain_pairs(ctx: _Context, dom: _Domains) -> tuple[I64, I64, NDArray[np.bool_], I64]:
    """Current (row, domain) pairs with their multiplicity, and which hold the row's primary."""
    code = ctx.cur_row * len(dom.labels) + dom.of_node[ctx.cur_node]
    codes, counts = np.unique(code, return_counts=True)
    primary = np.zeros(ctx.partitions * len(dom.labels), dtype=np.bool_)
    primary[code[ctx.cur_first]] = True
    return codes // len(dom.labels), codes % len(dom.labels), primary[codes], counts


def _domains_distinct(
    ctx: _Context,
    dom: _Domains,
    plus_first: NDArray[np.bool_] | None = None,
    limits: domain_keep.Bands | None = None,
) -> Pairs:
    """Level 1 with ``D ≥ R'``: the core with domains as nodes, each capped at P."""
    n_dom = len(dom.labels)
    _, targets = weighted_targets(dom.weights, ctx.total, hi=[ctx.partitions] * n_dom)
    rows, doms, first, _ = _domain_pairs(ctx, dom)
    node_rank = _domain_rank(ctx, dom)
    drop = None
    if limits is not None:
        held = np.bincount(doms, minlength=n_dom)
        if (held > targets.floor + targets.eligible).any():  # some domain sheds
            drop = _drop_tiers(ctx, dom, limits, rows * n_dom + doms)
    if plus_first is not None:
        tie = _domain_keys(ctx, dom.labels) if node_rank is None else node_rank
        node_rank = rank((~plus_first).astype(np.float64), tie.astype(np.uint64))
    pb = CoreProblem(
        demand=np.full(ctx.partitions, ctx.width, dtype=np.int64),
        targets=targets,
        cur_row=rows,
        cur_node=doms,
        cur_first=first,
        row_key=ctx.row_key,
        node_key=_domain_keys(ctx, dom.labels),
        node_rank=node_rank,
        cur_drop=drop,
    )
    if ctx.cordoned is not None:
        # A domain whose nodes are all cordoned is a cordoned node of this level: it keeps
        # partitions it holds and takes a new one only when the spread needs it.
        closed = np.asarray([bool(ctx.cordoned[m].all()) for m in dom.nodes], dtype=np.bool_)
        if closed.any():
            return solve_cordoned(pb, dom.weights, closed)
    return solve(pb)


def _drop_tiers(ctx: _Context, dom: _Domains, limits: domain_keep.Bands, codes: I64) -> I64 | None:
    """For level 1's current (partition, domain) pairs ``codes`` (``row · D + domain``,
    sorted): what dropping each costs inside its domain (:attr:`CoreProblem.cur_drop`). Node
    ``i`` holding ``h_i`` current pairs, with floor ``a_i`` and at most ``u_i`` at its domain's
    lower total or the one above: its first ``h_i − u_i`` pairs (in hash order) are lost
    anyway (tier 0), the next ones down to ``a_i`` may go without a move inside the domain
    (tier 1), the others are kept there (tier 2); a pair of a partition with two current
    nodes in one domain is tier 1. None when no node holds more than its floor (nothing to
    prefer)."""
    n_dom = len(dom.labels)
    held = np.bincount(ctx.cur_node, minlength=len(ctx.names))
    above = held - limits.node_floor
    if not (above > 0).any():
        return None
    # Each current pair's place among its node's pairs, in hash order.
    tie = mix64(ctx.row_key[ctx.cur_row] ^ ctx.node_key[ctx.cur_node])
    order = np.lexsort((tie, ctx.cur_node))
    starts = np.searchsorted(ctx.cur_node[order], np.arange(len(ctx.names)))
    place_of = np.empty(len(order), dtype=np.int64)
    place_of[order] = np.arange(len(order)) - starts[ctx.cur_node[order]]
    lost = held - limits.node_floor - limits.node_room
    tier = np.where(
        place_of < lost[ctx.cur_node], 0, np.where(place_of < above[ctx.cur_node], 1, 2)
    )
    code = ctx.cur_row * n_dom + dom.of_node[ctx.cur_node]
    at = np.searchsorted(codes, code)
    out = np.full(len(codes), 2, dtype=np.int64)
    np.minimum.at(out, at, tier)
    shared = np.bincount(at, minlength=len(codes)) > 1
    out[shared] = np.minimum(out[shared], 1)
    return out


def _domain_rank(ctx: _Context, dom: _Domains) -> I64 | None:
    """The fleet rank of the domains: their nodes' replicas in the other zones per unit of
    the domain's weight (None without a fleet)."""
    if ctx.fleet_replicas is None:
        return None
    held = np.bincount(dom.of_node, weights=ctx.fleet_replicas, minlength=len(dom.labels))
    return rank(held / np.asarray(dom.weights), _domain_keys(ctx, dom.labels))


def _domains_all(ctx: _Context, dom: _Domains) -> Pairs:
    """Level 1 with ``D < R'``: domain ``d`` becomes ``m_d`` virtual nodes ``d#0..``.

    ``d#0`` has target P (every partition spans every domain); the others split the rest of the
    domain's water-filled total, following the current multiplicities where possible. The
    result lists a domain once per replica it holds.
    """
    n_dom, extra = len(dom.labels), ctx.width - len(dom.labels)
    cap = [min(len(members), extra + 1) for members in dom.nodes]
    rows, doms, first, counts = _domain_pairs(ctx, dom)
    counts = np.minimum(counts, np.asarray(cap)[doms])
    totals = _domain_totals(ctx, dom, cap, np.bincount(np.repeat(doms, counts), minlength=n_dom))
    virtual_of: list[list[int]] = []
    targets: list[int] = []
    labels: list[str] = []
    for d in range(n_dom):
        held = [int(np.count_nonzero((doms == d) & (counts > k))) for k in range(1, cap[d])]
        split = _split_sticky(totals[d] - ctx.partitions, held, ctx.partitions)
        virtual_of.append(list(range(len(targets), len(targets) + cap[d])))
        targets.extend([ctx.partitions, *split])
        labels.extend(f"{dom.labels[d]}#{k}" for k in range(cap[d]))
    v_rows = np.repeat(rows, counts)
    offsets = np.concatenate([np.arange(c) for c in counts.tolist()]) if len(counts) else rows
    base = np.asarray([v[0] for v in virtual_of], dtype=np.int64)
    v_nodes = base[np.repeat(doms, counts)] + offsets
    v_first = np.repeat(first, counts) & (offsets == 0)
    order = np.lexsort((v_nodes, v_rows))
    out_rows, out_virtual = solve(
        CoreProblem(
            demand=np.full(ctx.partitions, ctx.width, dtype=np.int64),
            targets=Targets.exact(targets),
            cur_row=v_rows[order],
            cur_node=v_nodes[order],
            cur_first=v_first[order],
            row_key=ctx.row_key,
            node_key=_domain_keys(ctx, labels),
        )
    )
    domain_of_virtual = np.repeat(np.arange(n_dom), cap)
    return out_rows, domain_of_virtual[out_virtual]


def _domain_totals(ctx: _Context, dom: _Domains, cap: list[int], held: I64) -> list[int]:
    """Water-filled domain totals in ``[P, m_d·P]``; ``+1`` to domains holding most above floor."""
    p = ctx.partitions
    _, t = weighted_targets(dom.weights, ctx.total, hi=[c * p for c in cap], lo=[p] * len(cap))
    cand = np.flatnonzero(t.eligible)
    fleet = _domain_rank(ctx, dom)
    tie = _domain_keys(ctx, dom.labels) if fleet is None else fleet
    order = np.lexsort((tie[cand], t.floor[cand] - held[cand]))
    totals = t.floor.copy()
    totals[cand[order[: t.extra]]] += 1
    return [int(x) for x in totals.tolist()]


def _split_sticky(total: int, held: list[int], cap: int) -> list[int]:
    """Split ``total`` over slots capped at ``cap``, as close as possible to ``held``."""
    split = [min(h, cap) for h in held]
    missing = total - sum(split)
    k = 0
    while missing > 0:
        step = min(cap - split[k], missing)
        split[k] += step
        missing -= step
        k += 1
    k = len(split) - 1
    while missing < 0:
        step = min(split[k], -missing)
        split[k] -= step
        missing += step
        k -= 1
    return split


def _inside_domain(
    ctx: _Context, dom: _Domains, d: int, part_rows: I64, demand: I64, mine: NDArray[np.bool_]
) -> Pairs:
    """Level 2: the domain's replicas of ``part_rows`` (sorted; ``demand`` replicas each) on
    its nodes; ``mine`` marks the current pairs on its nodes whose row is in ``part_rows``."""
    nodes = dom.nodes[d]
    if part_rows.size == 0:
        return part_rows, part_rows
    targets = demand_targets(dom.node_weights[d], demand.astype(np.int64))
    pb = CoreProblem(
        demand=demand.astype(np.int64),
        targets=targets,
        cur_row=np.searchsorted(part_rows, ctx.cur_row[mine]).astype(np.int64),
        cur_node=dom.local[ctx.cur_node[mine]],
        cur_first=ctx.cur_first[mine],
        row_key=mix64(ctx.row_key[part_rows], name_key(ctx.zone, dom.labels[d])),
        node_key=ctx.node_key[nodes],
        node_rank=None if ctx.fleet_rank is None else ctx.fleet_rank[nodes],
    )
    closed = ctx.cordoned[nodes] if ctx.cordoned is not None else None
    if closed is not None and closed.any():
        out_rows, out_nodes = solve_cordoned(pb, dom.node_weights[d], closed)
    else:
        out_rows, out_nodes = solve(pb)
    return part_rows[out_rows], nodes[out_nodes]


# --- output --------------------------------------------------------------------------------------


def _output_columns(members: I64, primary: I64) -> list[I64]:
    """The output rows as columns: the primary, then the other members in index order."""
    width = members.shape[1]
    # Column by column (contiguous arrays): member j of the others is by_column[j] before the
    # primary's position in the (sorted) row, by_column[j + 1] after it.
    by_column = members.T.copy()
    position = by_column[0] < primary
    if width > 2:
        position = position.astype(np.int64)
        for j in range(1, width):
            position += by_column[j] < primary
    columns = [primary]
    columns += [np.where(position > j, by_column[j], by_column[j + 1]) for j in range(width - 1)]
    return columns


def _assemble(
    names: list[str], members: I64, primary: I64, load: I64, given: _Given | None
) -> Placement:
    """Primary first, the others in name order; names instead of indices.

    Rows equal to their given current row are rebuilt from it with ``tuple()`` (the same
    object when it is already a tuple); only the others are looked up by index.
    """
    rows, width = members.shape
    table = np.asarray(names, dtype=object)
    assignments: tuple[Peers, ...]
    if given is not None and given.matrix.shape[1] == width:
        size = min(len(given.matrix), rows)
        same = given.matrix[:size, 0] == primary[:size]
        if given.ordered is not None and len(given.ordered) >= size:
            # The given row is the output row when it has the same members (sorted rows
            # equal), leads with the primary and lists the others in increasing order.
            for j in range(width):
                same &= given.ordered[:size, j] == members[:size, j]
            for j in range(1, width - 1):
                same &= given.matrix[:size, j] < given.matrix[:size, j + 1]
        else:
            columns = _output_columns(members[:size], primary[:size])
            for j in range(1, width):
                same &= given.matrix[:size, j] == columns[j]
        changed = np.flatnonzero(~same).tolist() + list(range(size, rows))
        out: list[Peers] = list(map(tuple, given.values[:size]))
        out.extend(() for _ in range(size, rows))
        columns = _output_columns(members[changed], primary[changed])
        fresh = zip(*(table[column].tolist() for column in columns), strict=True)
        for p, peers in zip(changed, fresh, strict=True):
            out[p] = peers
        assignments = tuple(out)
    else:
        columns = _output_columns(members, primary)
        assignments = tuple(zip(*(table[column].tolist() for column in columns), strict=True))
    primaries = np.bincount(primary, minlength=len(names))
    return Placement(
        assignments=assignments,
        loads=MappingProxyType(dict(zip(names, load.tolist(), strict=True))),
        primary_loads=MappingProxyType(dict(zip(names, primaries.tolist(), strict=True))),
    )
