"""Stateless placement baselines for the benchmark: rendezvous hashing and a consistent-hash ring.

Both return a ``P × R`` array of node indices whose first column is the preferred primary, so the
benchmark scores them exactly like :func:`placement.algo.place.place`.

* Rendezvous (highest random weight), as Apache Ignite 3's ``RendezvousDistributionFunction``:
  every (partition, node) pair gets a 64-bit score; a partition takes the R highest-scoring nodes,
  the highest one first. Vectorised: SplitMix64 over a chunk of the P × N score matrix, then
  ``argpartition`` for the top R.
* Consistent hash ring, as OpenStack tooz's ``HashRing`` (32 points per node by default): a
  partition's key is hashed onto the ring and the ring is walked clockwise, taking the first R
  distinct nodes. Vectorised: ``searchsorted`` for the start, then a window of the following
  points with first-occurrence de-duplication (rows that need more distinct nodes than the window
  holds are retried with a wider window).

:func:`as_names` turns an index result into what :func:`placement.algo.place.place` returns, a
tuple of name tuples, so that timings compare like with like.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from placement.algo.hashing import mix64, name_key

I64 = NDArray[np.int64]

#: Score-matrix cells per chunk: bounds memory to ~3 × 8 B × 4M ≈ 100 MB.
_CHUNK_CELLS = 4_000_000


def as_names(result: I64, nodes: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """``result`` (indices into ``nodes``) as a tuple of name tuples, one per partition.

    Column by column, like ``place()``'s output: one ``tolist()`` of names per column, then
    ``zip`` builds the row tuples in C.
    """
    table = np.asarray(nodes, dtype=object)
    return tuple(zip(*(table[result[:, j]].tolist() for j in range(result.shape[1])), strict=True))


def rendezvous(partitions: int, replicas: int, nodes: Sequence[str], seed: str = "zone") -> I64:
    """Top-``replicas`` nodes by ``hash(partition, node)`` for every partition."""
    width = min(replicas, len(nodes))
    node_hash = np.asarray([name_key(seed, n) for n in nodes], dtype=np.uint64)
    part_hash = mix64(np.arange(partitions, dtype=np.uint64), name_key(seed, "partitions"))
    out = np.empty((partitions, width), dtype=np.int64)
    step = max(1, _CHUNK_CELLS // len(nodes))
    for start in range(0, partitions, step):
        stop = min(partitions, start + step)
        with np.errstate(over="ignore"):
            score = mix64(part_hash[start:stop, None] ^ node_hash[None, :])
        if width < len(nodes):
            top = np.argpartition(score, len(nodes) - width, axis=1)[:, len(nodes) - width :]
        else:
            top = np.broadcast_to(np.arange(len(nodes)), (stop - start, len(nodes)))
        top_scores = np.take_along_axis(score, top, axis=1)
        order = np.argsort(top_scores, axis=1)[:, ::-1]
        out[start:stop] = np.take_along_axis(top, order, axis=1)
    return out


def hash_ring(
    partitions: int, replicas: int, nodes: Sequence[str], points: int = 32, seed: str = "zone"
) -> I64:
    """First ``replicas`` distinct nodes clockwise from ``hash(partition)`` on a 32-point ring."""
    width = min(replicas, len(nodes))
    ring_hash = np.asarray(
        [name_key(seed, n, str(k)) for n in nodes for k in range(points)], dtype=np.uint64
    )
    ring_node = np.repeat(np.arange(len(nodes), dtype=np.int64), points)
    order = np.argsort(ring_hash, kind="stable")
    ring_hash, ring_node = ring_hash[order], ring_node[order]
    keys = mix64(np.arange(partitions, dtype=np.uint64), name_key(seed, "partitions"))
    start = np.searchsorted(ring_hash, keys) % len(ring_hash)
    out = np.full((partitions, width), -1, dtype=np.int64)
    todo = np.arange(partitions)
    window = 4 * width
    while todo.size:
        window = min(window, len(ring_hash))
        taken, done = _walk(ring_node, start[todo], width, window)
        out[todo[done]] = taken[done]
        todo = todo[~done]
        if window == len(ring_hash) and todo.size:
            raise AssertionError("hash ring: fewer distinct nodes than replicas")
        window *= 2
    return out


def _walk(ring_node: I64, start: I64, width: int, window: int) -> tuple[I64, NDArray[np.bool_]]:
    """The first ``width`` distinct nodes within ``window`` ring points of each start."""
    idx = (start[:, None] + np.arange(window)[None, :]) % len(ring_node)
    seen = ring_node[idx]
    first = np.ones(seen.shape, dtype=np.bool_)
    for k in range(1, window):
        first[:, k] = (seen[:, :k] != seen[:, k : k + 1]).all(axis=1)
    rank = np.cumsum(first, axis=1)
    done = rank[:, -1] >= width
    pick = first & (rank <= width)
    taken = np.full((len(start), width), -1, dtype=np.int64)
    rows, cols = np.nonzero(pick)
    taken[rows, rank[rows, cols] - 1] = seen[rows, cols]
    return taken, done
