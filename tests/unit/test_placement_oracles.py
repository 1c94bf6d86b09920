"""Independent oracles for the placement tests (shares, balance checks, optimal moves).

They are written differently from the code under test on purpose: shares by evaluating the fill
level at every breakpoint (quadratic), optimal moves by dynamic programming over partitions.
The tests at the bottom check the oracles themselves on hand-computed cases.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from fractions import Fraction

from placement.algo.place import Placement
from placement.core.model import Node, ZoneSpec


def shares(
    weights: Sequence[float], total: int, hi: Sequence[int], lo: Sequence[int] | None = None
) -> list[Fraction]:
    """``clamp(λ·w_i, lo_i, hi_i)`` summing to ``total``, by brute force over breakpoints."""
    w = [Fraction(x) for x in weights]
    low = list(lo) if lo is not None else [0] * len(w)

    def level(lam: Fraction) -> Fraction:
        return sum(
            (
                min(max(lam * wi, Fraction(a)), Fraction(b))
                for wi, a, b in zip(w, low, hi, strict=True)
            ),
            Fraction(0),
        )

    points = sorted(
        {Fraction(0)}
        | {Fraction(a) / wi for wi, a in zip(w, low, strict=True)}
        | {Fraction(b) / wi for wi, b in zip(w, hi, strict=True)}
    )
    prev = points[0]
    lam = points[-1]
    for point in points:
        if level(point) >= total:
            if level(point) == level(prev):
                lam = point
            else:
                lam = prev + (total - level(prev)) * (point - prev) / (level(point) - level(prev))
            break
        prev = point
    result = [
        min(max(lam * wi, Fraction(a)), Fraction(b)) for wi, a, b in zip(w, low, hi, strict=True)
    ]
    assert sum(result) == total
    return result


def eligible_nodes(zone: ZoneSpec, nodes: Sequence[Node]) -> list[Node]:
    return sorted((n for n in nodes if n.matches(zone.node_selector)), key=lambda n: n.name)


def realizable_shares(weights: Sequence[float], demands: Sequence[int]) -> list[Fraction]:
    """The weighted fair shares of nodes serving rows that need ``demands[p]`` distinct nodes
    each, by progressive filling over **every** subset (exponential: small domains only): all
    shares grow as ``λ·w_i``; a subset ``K`` may hold at most ``Σ_p min(d_p, |K|)`` (Gale–Ryser:
    what those rows can give ``|K|`` nodes); when one becomes tight its nodes stop growing."""
    n = len(weights)
    w = [Fraction(x) for x in weights]

    def g(k: int) -> int:
        return sum(min(d, k) for d in demands)

    x = [Fraction(0)] * n
    frozen = [False] * n
    subsets = [[i for i in range(n) if mask >> i & 1] for mask in range(1, 1 << n)]
    lam = Fraction(0)
    while not all(frozen):
        best: Fraction | None = None
        tight: list[list[int]] = []
        for k in subsets:
            free = [i for i in k if not frozen[i]]
            if not free:
                continue
            fixed = sum((x[i] for i in k if frozen[i]), Fraction(0))
            level = (g(len(k)) - fixed) / sum(w[i] for i in free)
            if best is None or level < best:
                best, tight = level, [free]
            elif level == best:
                tight.append(free)
        assert best is not None
        assert best >= lam
        lam = best
        for free in tight:
            for i in free:
                frozen[i], x[i] = True, lam * w[i]
    assert sum(x) == sum(demands)
    return x


def width(zone: ZoneSpec, nodes: Sequence[Node]) -> int:
    return min(zone.replicas, len(eligible_nodes(zone, nodes)))


def domain_of(node: Node, attribute: str) -> str:
    """Failure domain label; a node without the attribute is a domain of its own."""
    value = node.attributes.get(attribute)
    return f"={value}" if value is not None else f"node:{node.name}"


def loads(result: Placement, names: Sequence[str]) -> Counter[str]:
    counter: Counter[str] = Counter(dict.fromkeys(names, 0))
    for peers in result.assignments:
        counter.update(peers)
    return counter


def primaries(result: Placement, names: Sequence[str]) -> Counter[str]:
    counter: Counter[str] = Counter(dict.fromkeys(names, 0))
    counter.update(peers[0] for peers in result.assignments)
    return counter


def within_one(value: int, share: Fraction) -> bool:
    """``value`` is ⌊share⌋ or ⌈share⌉."""
    return share - 1 < value < share + 1


def check_shape(zone: ZoneSpec, nodes: Sequence[Node], result: Placement) -> None:
    """Property 1: P partitions, each with R' distinct eligible nodes."""
    names = {n.name for n in eligible_nodes(zone, nodes)}
    assert len(result.assignments) == zone.partitions
    for peers in result.assignments:
        assert len(peers) == width(zone, nodes)
        assert len(set(peers)) == len(peers)
        assert set(peers) <= names


def check_balance(zone: ZoneSpec, nodes: Sequence[Node], result: Placement) -> None:
    """Property 2 without failure domains: loads within 1 of the water-filled weighted share."""
    eligible = eligible_nodes(zone, nodes)
    names = [n.name for n in eligible]
    total = zone.partitions * width(zone, nodes)
    target = shares([n.weight for n in eligible], total, [zone.partitions] * len(eligible))
    got = loads(result, names)
    for name, share in zip(names, target, strict=True):
        assert within_one(got[name], share), (name, got[name], share)
    if len({n.weight for n in eligible}) == 1:
        assert max(got.values()) - min(got.values()) <= 1


def check_domains(zone: ZoneSpec, nodes: Sequence[Node], result: Placement) -> None:
    """Property 2 with failure domains: spread, domain totals, ±1 inside each domain."""
    assert zone.failure_domain is not None
    attribute = zone.failure_domain
    eligible = eligible_nodes(zone, nodes)
    by_name = {n.name: n for n in eligible}
    labels = sorted({domain_of(n, attribute) for n in eligible})
    members = {d: [n for n in eligible if domain_of(n, attribute) == d] for d in labels}
    w, p, count = width(zone, nodes), zone.partitions, len(labels)
    for peers in result.assignments:
        assert len({domain_of(by_name[x], attribute) for x in peers}) == min(w, count)
    got = loads(result, list(by_name))
    totals = {d: sum(got[n.name] for n in members[d]) for d in labels}
    if count >= w:
        lo, hi = [0] * count, [p] * count
    else:
        lo, hi = [p] * count, [min(len(members[d]), w - count + 1) * p for d in labels]
    weights = [sum(n.weight for n in members[d]) for d in labels]
    for d, share in zip(labels, shares(weights, p * w, hi, lo), strict=True):
        assert within_one(totals[d], share), (d, totals[d], share)
    for d in labels:
        names = {n.name for n in members[d]}
        demands = [len(names & set(peers)) for peers in result.assignments]
        if len(members[d]) <= 10:
            inside = realizable_shares([n.weight for n in members[d]], demands)
        else:  # too many subsets: the plain water-fill (right whenever it is realisable)
            inside = shares([n.weight for n in members[d]], totals[d], [p] * len(members[d]))
        for node, share in zip(members[d], inside, strict=True):
            assert within_one(got[node.name], share), (node.name, got[node.name], share)
    sizes = {len(m) for m in members.values()}
    if len(sizes) == 1 and len({n.weight for n in eligible}) == 1:
        assert max(got.values()) - min(got.values()) <= 1


def check_primaries(zone: ZoneSpec, nodes: Sequence[Node], result: Placement) -> None:
    """Property 3: node i leads ⌊ℓ_i/R'⌋ or ⌈ℓ_i/R'⌉ partitions (its load ℓ_i)."""
    names = [n.name for n in eligible_nodes(zone, nodes)]
    got, lead = loads(result, names), primaries(result, names)
    for name in names:
        assert within_one(lead[name], Fraction(got[name], width(zone, nodes))), name
    unweighted = len({n.weight for n in eligible_nodes(zone, nodes)}) == 1
    if zone.failure_domain is None and unweighted:
        assert max(lead.values()) - min(lead.values()) <= 1
    assert dict(result.loads) == dict(got)
    assert dict(result.primary_loads) == dict(lead)


def check_all(zone: ZoneSpec, nodes: Sequence[Node], result: Placement) -> None:
    check_shape(zone, nodes, result)
    if zone.failure_domain is None:
        check_balance(zone, nodes, result)
    else:
        check_domains(zone, nodes, result)
    check_primaries(zone, nodes, result)


def valid_current(
    zone: ZoneSpec, nodes: Sequence[Node], current: Mapping[int, Sequence[str]]
) -> dict[int, set[str]]:
    names = {n.name for n in eligible_nodes(zone, nodes)}
    return {p: set(peers) & names for p, peers in current.items() if 0 <= p < zone.partitions}


def min_moves(zone: ZoneSpec, nodes: Sequence[Node], current: Mapping[int, Sequence[str]]) -> int:
    """The fewest new pairs of any assignment with loads within 1 of the shares (no domains).

    Dynamic programming over partitions; the state is the load vector so far.
    """
    eligible = eligible_nodes(zone, nodes)
    n, w, p = len(eligible), width(zone, nodes), zone.partitions
    target = shares([x.weight for x in eligible], p * w, [p] * n)
    floor = [t.numerator // t.denominator for t in target]
    ceil = [-(-t.numerator // t.denominator) for t in target]
    keep = valid_current(zone, nodes, current)
    index = {x.name: i for i, x in enumerate(eligible)}
    combos = list(itertools.combinations(range(n), w))
    best: dict[tuple[int, ...], int] = {(0,) * n: 0}
    for row in range(p):
        held = {index[x] for x in keep.get(row, set())}
        left = p - row - 1
        nxt: dict[tuple[int, ...], int] = {}
        for state, kept in best.items():
            for combo in combos:
                new = list(state)
                for i in combo:
                    new[i] += 1
                if any(new[i] > ceil[i] or floor[i] - new[i] > left for i in range(n)):
                    continue
                key = tuple(new)
                value = kept + len(held.intersection(combo))
                if nxt.get(key, -1) < value:
                    nxt[key] = value
        best = nxt
    return p * w - max(best.values())


def refill_possible(
    zone: ZoneSpec, nodes: Sequence[Node], current: Mapping[int, Sequence[str]]
) -> bool:
    """Can every hole be filled while keeping every valid current pair (no displacement)?

    Then the minimum number of new pairs is exactly the number of holes. A max-flow: source →
    row (its holes) → node not in the row → sink (room up to the floor), plus one ``+1`` each
    through a hub for the ``extra`` slots not already used by nodes holding ``floor + 1``.
    """
    eligible = eligible_nodes(zone, nodes)
    n, w, p = len(eligible), width(zone, nodes), zone.partitions
    target = shares([x.weight for x in eligible], p * w, [p] * n)
    floor = [t.numerator // t.denominator for t in target]
    extra = p * w - sum(floor)
    index = {x.name: i for i, x in enumerate(eligible)}
    keep = valid_current(zone, nodes, current)
    held = Counter(index[x] for names in keep.values() for x in names)
    for i in range(n):
        over = held[i] - floor[i]
        if over > 1 or (over == 1 and target[i].denominator == 1):
            return False
    extra -= sum(1 for i in range(n) if held[i] == floor[i] + 1)
    if extra < 0 or any(len(names) > w for names in keep.values()):
        return False
    source, sink, hub = "s", "t", "h"
    capacity: dict[tuple[object, object], int] = {}
    for row in range(p):
        members = {index[x] for x in keep.get(row, set())}
        capacity[source, ("r", row)] = w - len(members)
        for i in range(n):
            if i not in members:
                capacity[("r", row), ("n", i)] = 1
    for i in range(n):
        capacity[("n", i), sink] = max(0, floor[i] - held[i])
        if target[i].denominator != 1 and held[i] <= floor[i]:
            capacity[("n", i), hub] = 1
    capacity[hub, sink] = extra
    return _max_flow(capacity, source, sink) == sum(capacity[source, ("r", r)] for r in range(p))


def _max_flow(capacity: dict[tuple[object, object], int], source: object, sink: object) -> int:
    """Edmonds-Karp on a dict of edge capacities."""
    residual: dict[object, dict[object, int]] = {}
    for (u, v), c in capacity.items():
        residual.setdefault(u, {})[v] = residual.get(u, {}).get(v, 0) + c
        residual.setdefault(v, {}).setdefault(u, 0)
    flow = 0
    while True:
        parent: dict[object, object] = {source: source}
        queue = [source]
        for u in queue:
            for v, c in residual[u].items():
                if c > 0 and v not in parent:
                    parent[v] = u
                    queue.append(v)
        if sink not in parent:
            return flow
        v = sink
        while v != source:
            u = parent[v]
            residual[u][v] -= 1
            residual[v][u] += 1
            v = u
        flow += 1


# --- the oracles checked on hand-computed cases ---------------------------------------------------


def test_shares_caps_heavy_nodes_at_p() -> None:
    # 2 partitions × 2 replicas; weights 10:1:1 → the heavy node is capped at 2, the rest share 2.
    assert shares([10, 1, 1], 4, [2, 2, 2]) == [2, 1, 1]
    assert shares([1, 1, 2], 8, [4, 4, 4]) == [2, 2, 4]
    assert shares([1, 1, 1], 6, [3, 3, 3], [3, 0, 0]) == [3, Fraction(3, 2), Fraction(3, 2)]


def test_min_moves_sees_unavoidable_extra_move() -> None:
    # P=3, R=2, N=3 with p0=p1={a,b}: loads must be 2,2,2 and p2 needs two nodes; c can go to p2
    # only once, so one kept pair has to go: 3 new pairs, not S - kept = 2.
    nodes = [Node("a"), Node("b"), Node("c")]
    zone = ZoneSpec("z", 3, 2)
    assert min_moves(zone, nodes, {0: ["a", "b"], 1: ["a", "b"]}) == 3
    assert min_moves(zone, nodes, {}) == 6


def test_refill_possible_sees_a_node_that_shares_every_orphaned_partition() -> None:
    # n1 must gain one replica but already sits in both partitions that lost n0.
    nodes = [Node(f"n{i}") for i in range(1, 6)]
    zone = ZoneSpec("z", 4, 4)
    before = {
        0: ["n0", "n1", "n4", "n5"],
        1: ["n2", "n3", "n4", "n5"],
        2: ["n3", "n2", "n4", "n5"],
        3: ["n1", "n0", "n2", "n3"],
    }
    assert not refill_possible(zone, nodes, before)
    assert refill_possible(zone, nodes, {0: ["n1", "n2"], 1: ["n3", "n4", "n5"]})
