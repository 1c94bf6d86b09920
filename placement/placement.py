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
  assignments with those loads (a min-cost flow, see :mod:`placement.placement_core`);
* the same input in any order gives the same output.
"""

from __future__ import annotations

import functools
import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, pairwise
from operator import attrgetter
from types import MappingProxyType

import numpy as np
from numpy.typing import NDArray

from placement.errors import InvalidInput
from placement.model import Node, Peers, ZoneSpec
from placement.placement_core import CoreProblem, Pairs, solve, stable_argsort
from placement.placement_hash import mix64, name_key
from placement.placement_primary import choose_primaries
from placement.placement_targets import Targets, weighted_targets

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
    zone: ZoneSpec, nodes: Sequence[Node], current: Mapping[int, Sequence[str]] | None = None
) -> Placement:
    """Balanced replica sets for ``zone`` that keep as much of ``current`` as balance allows.

    ``nodes`` are filtered by ``zone.node_selector``; current members that are not eligible have
    left and their replicas are re-placed; current entries for partitions ``≥ P`` are ignored.
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
    ctx = _Context.build(zone, eligible, current or {})
    if zone.failure_domain is None:
        pairs = _solve_flat(ctx)
    else:
        pairs = _solve_domains(ctx, zone.failure_domain)
    members = _members_matrix(pairs, ctx.partitions, ctx.width, len(eligible))
    load = np.bincount(members.ravel(), minlength=len(eligible))
    primary = choose_primaries(members, load, ctx.cur_primary, ctx.row_key)
    return _assemble(ctx.names, members, primary, load, ctx.given)


def count_moves(current: Mapping[int, Sequence[str]], new: Sequence[Peers]) -> int:
    """Number of (partition, node) pairs of ``new`` that ``current`` does not have."""
    moves = 0
    for partition, peers in enumerate(new):
        before = set(current.get(partition, ()))
        moves += sum(1 for name in set(peers) if name not in before)
    return moves


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
    """

    matrix: I64
    values: list[Sequence[str]]


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

    @staticmethod
    def build(
        zone: ZoneSpec, eligible: list[Node], current: Mapping[int, Sequence[str]]
    ) -> _Context:
        names = [n.name for n in eligible]
        rows, nodes, firsts, primary, given = _parse_current(
            current, zone.partitions, _Index((name, i) for i, name in enumerate(names))
        )
        return _Context(
            zone=zone.name,
            names=names,
            weights=[n.weight for n in eligible],
            attributes=[n.attributes for n in eligible],
            partitions=zone.partitions,
            width=min(zone.replicas, len(eligible)),
            row_key=mix64(np.arange(zone.partitions, dtype=np.uint64), name_key(zone.name)),
            node_key=np.asarray([name_key(zone.name, n) for n in names], dtype=np.uint64),
            cur_row=rows,
            cur_node=nodes,
            cur_first=firsts,
            cur_primary=primary,
            given=given,
        )

    @property
    def total(self) -> int:
        return self.partitions * self.width


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
        lengths = list(map(len, values))
    except TypeError:
        return (*_parse_current_slow(current, partitions, index), None)
    # The usual keys 0..n-1 in order are checked by one list comparison; any others are read
    # into an array (integers only).
    dense = bool(lengths) and lengths[0] > 0 and lengths.count(lengths[0]) == len(lengths)
    keys = None
    if not (dense and list(current) == _range_list(len(values))):
        try:
            keys = np.frombuffer(array("q", current), dtype=np.int64)
        except (TypeError, OverflowError):
            return (*_parse_current_slow(current, partitions, index), None)
    total = sum(lengths)
    names = chain.from_iterable(values)
    try:
        node = np.fromiter(map(index.__getitem__, names), dtype=np.int64, count=total)
    except ValueError:  # fewer members than their ``len()`` said
        return (*_parse_current_slow(current, partitions, index), None)
    if next(names, _END) is not _END:  # more members than their ``len()`` said
        return (*_parse_current_slow(current, partitions, index), None)
    if keys is None:
        matrix = node.reshape(len(values), lengths[0])
        return (*_parse_dense(matrix, partitions), _Given(matrix, values))
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


def _parse_dense(matrix: I64, partitions: int) -> tuple[I64, I64, NDArray[np.bool_], I64]:
    """:func:`_parse_current` when row ``p`` of ``matrix`` lists partition ``p`` (-1: not
    eligible)."""
    matrix = matrix[:partitions]
    lead = matrix[:, 0].copy()
    columns = _sorted_columns(matrix)
    valid = [columns[0] >= 0]
    valid += [(b >= 0) & (b != a) for a, b in pairwise(columns)]
    rows = np.repeat(np.arange(len(matrix), dtype=np.int64), matrix.shape[1])
    nodes: I64 = np.stack(columns, axis=1).ravel()
    if not all(v.all() for v in valid):
        keep = np.stack(valid, axis=1).ravel()
        rows, nodes = rows[keep], nodes[keep]
    primary = np.full(partitions, -1, dtype=np.int64)
    primary[: len(lead)] = lead
    return rows, nodes, nodes == lead[rows], primary


def sort_rows(matrix: I64) -> I64:
    """``np.sort(matrix, axis=1)``, faster for short rows (see :func:`_sorted_columns`)."""
    if matrix.shape[1] == 0:
        return matrix.copy()
    out: I64 = np.stack(_sorted_columns(matrix), axis=1)
    return out


def _sorted_columns(matrix: I64) -> list[I64]:
    """The columns of ``np.sort(matrix, axis=1)``; a compare-exchange network (odd-even
    transposition) when rows are short: numpy's per-row sort has a high fixed cost for 2-4
    elements."""
    width = matrix.shape[1]
    if width > 4:
        ordered = np.sort(matrix, axis=1)
        return [ordered[:, j] for j in range(width)]
    columns = [matrix[:, j] for j in range(width)]
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


def _solve_flat(ctx: _Context) -> Pairs:
    """No failure domain: one core problem over all eligible nodes, each capped at P."""
    _, targets = weighted_targets(ctx.weights, ctx.total, hi=[ctx.partitions] * len(ctx.names))
    return solve(
        CoreProblem(
            demand=np.full(ctx.partitions, ctx.width, dtype=np.int64),
            targets=targets,
            cur_row=ctx.cur_row,
            cur_node=ctx.cur_node,
            cur_first=ctx.cur_first,
            row_key=ctx.row_key,
            node_key=ctx.node_key,
        )
    )


# --- failure domains -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Domains:
    """Eligible nodes grouped by failure-domain value (a node without it is its own domain)."""

    labels: list[str]
    of_node: I64
    nodes: list[I64]
    weights: list[float]

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
        weights = [sum(ctx.weights[i] for i in members.tolist()) for members in nodes]
        return _Domains(labels, of_node, nodes, weights)


def _solve_domains(ctx: _Context, attribute: str) -> Pairs:
    """Hierarchical: domains per partition first (sticky), then nodes inside each domain (sticky).

    With ``D ≥ R'`` domains a partition takes ``R'`` distinct domains (a domain holds at most one
    replica of it). With ``D < R'`` every partition takes every domain and the remaining replicas
    go to domains with more nodes, at most ``min(size, R' − D + 1)`` per domain.
    """
    dom = _Domains.build(ctx, attribute)
    if len(dom.labels) >= ctx.width:
        rows, doms = _domains_distinct(ctx, dom)
    else:
        rows, doms = _domains_all(ctx, dom)
    out_rows: list[I64] = []
    out_nodes: list[I64] = []
    for d in range(len(dom.labels)):
        mine = doms == d
        r, n = _inside_domain(ctx, dom, d, rows[mine])
        out_rows.append(r)
        out_nodes.append(n)
    return np.concatenate(out_rows), np.concatenate(out_nodes)


def _domain_keys(ctx: _Context, labels: list[str]) -> NDArray[np.uint64]:
    return np.asarray([name_key(ctx.zone, "domain", label) for label in labels], dtype=np.uint64)


def _domain_pairs(ctx: _Context, dom: _Domains) -> tuple[I64, I64, NDArray[np.bool_], I64]:
    """Current (row, domain) pairs with their multiplicity, and which hold the row's primary."""
    code = ctx.cur_row * len(dom.labels) + dom.of_node[ctx.cur_node]
    codes, counts = np.unique(code, return_counts=True)
    first = np.isin(codes, code[ctx.cur_first])
    return codes // len(dom.labels), codes % len(dom.labels), first, counts


def _domains_distinct(ctx: _Context, dom: _Domains) -> Pairs:
    """Level 1 with ``D ≥ R'``: the core with domains as nodes, each capped at P."""
    n_dom = len(dom.labels)
    _, targets = weighted_targets(dom.weights, ctx.total, hi=[ctx.partitions] * n_dom)
    rows, doms, first, _ = _domain_pairs(ctx, dom)
    return solve(
        CoreProblem(
            demand=np.full(ctx.partitions, ctx.width, dtype=np.int64),
            targets=targets,
            cur_row=rows,
            cur_node=doms,
            cur_first=first,
            row_key=ctx.row_key,
            node_key=_domain_keys(ctx, dom.labels),
        )
    )


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
    order = np.lexsort((_domain_keys(ctx, dom.labels)[cand], t.floor[cand] - held[cand]))
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


def _inside_domain(ctx: _Context, dom: _Domains, d: int, rows: I64) -> Pairs:
    """Level 2: the domain's replicas of ``rows`` (a repeated row = more replicas) on its nodes."""
    nodes = dom.nodes[d]
    part_rows, demand = np.unique(rows, return_counts=True)
    if part_rows.size == 0:
        return part_rows, part_rows
    weights = [ctx.weights[i] for i in nodes.tolist()]
    cap = len(part_rows)
    _, targets = weighted_targets(weights, int(demand.sum()), hi=[cap] * len(weights))
    local_node = np.full(len(ctx.names), -1, dtype=np.int64)
    local_node[nodes] = np.arange(len(nodes))
    mine = (dom.of_node[ctx.cur_node] == d) & np.isin(ctx.cur_row, part_rows)
    out_rows, out_nodes = solve(
        CoreProblem(
            demand=demand.astype(np.int64),
            targets=targets,
            cur_row=np.searchsorted(part_rows, ctx.cur_row[mine]).astype(np.int64),
            cur_node=local_node[ctx.cur_node[mine]],
            cur_first=ctx.cur_first[mine],
            row_key=mix64(ctx.row_key[part_rows], name_key(ctx.zone, dom.labels[d])),
            node_key=ctx.node_key[nodes],
        )
    )
    return part_rows[out_rows], nodes[out_nodes]


# --- output --------------------------------------------------------------------------------------


def _members_matrix(pairs: Pairs, partitions: int, width: int, n_nodes: int) -> I64:
    """Rows × width node indices, each row sorted (= name order)."""
    rows, nodes = pairs
    if len(rows) != partitions * width:
        raise AssertionError("placement: wrong number of replicas")
    if (np.bincount(rows, minlength=partitions) != width).any():
        raise AssertionError("placement: a partition with the wrong number of replicas")
    code = rows * n_nodes + nodes
    # Mostly sorted (kept pairs come sorted, then the few new ones): timsort merges the runs
    # in linear time; a fresh zone's random order is faster with the default sort.
    presorted = np.count_nonzero(code[1:] < code[:-1]) * 64 < len(code)
    code.sort(kind="stable" if presorted else None)
    if width > 1 and (code[1:] == code[:-1]).any():
        raise AssertionError("placement: a node twice in one partition")
    matrix: I64 = (code % n_nodes).reshape(partitions, width)
    return matrix


def _assemble(
    names: list[str], members: I64, primary: I64, load: I64, given: _Given | None
) -> Placement:
    """Primary first, the others in name order; names instead of indices.

    Rows equal to their given current row are rebuilt from it with ``tuple()`` (the same
    object when it is already a tuple); only the others are looked up by index.
    """
    rows, width = members.shape
    # Column by column (contiguous arrays): member j of the others is members[:, j] before the
    # primary's position in the (sorted) row, members[:, j + 1] after it.
    position = np.zeros(rows, dtype=np.int64)
    for j in range(width):
        position += members[:, j] < primary
    columns = [primary]
    columns += [np.where(position > j, members[:, j], members[:, j + 1]) for j in range(width - 1)]
    table = np.asarray(names, dtype=object)
    assignments: tuple[Peers, ...]
    if given is not None and given.matrix.shape[1] == width:
        size = min(len(given.matrix), rows)
        same = given.matrix[:size, 0] == primary[:size]
        for j in range(1, width):
            same &= given.matrix[:size, j] == columns[j][:size]
        changed = np.flatnonzero(~same).tolist() + list(range(size, rows))
        out: list[Peers] = list(map(tuple, given.values[:size]))
        out.extend(() for _ in range(size, rows))
        fresh = zip(*(table[column[changed]].tolist() for column in columns), strict=True)
        for p, peers in zip(changed, fresh, strict=True):
            out[p] = peers
        assignments = tuple(out)
    else:
        assignments = tuple(zip(*(table[column].tolist() for column in columns), strict=True))
    primaries = np.bincount(primary, minlength=len(names))
    return Placement(
        assignments=assignments,
        loads=MappingProxyType(dict(zip(names, load.tolist(), strict=True))),
        primary_loads=MappingProxyType(dict(zip(names, primaries.tolist(), strict=True))),
    )
