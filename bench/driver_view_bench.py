"""How long the driver's per-pass view build takes, with and without the decode cache.

    .venv/bin/python bench/driver_view_bench.py [--partitions 1000]

Builds the prefix as the driver sees it for one zone (stable + trigger + primary lease per
partition, 5 nodes), then times ``build_view`` decoding everything (every pass before the cache)
against a cached pass after one key changed (every pass with it). Median of 21 runs each.
"""

from __future__ import annotations

import argparse
import statistics
import time

from placement.algo.place import place
from placement.core.model import Node, ZoneSpec
from placement.driver.core import DecodeCache, build_view
from placement.metastore.codec import (
    Assignment,
    DataNodes,
    NodeRecord,
    PrimaryLease,
    TriggerMark,
    encode_assignment,
    encode_datanodes,
    encode_node,
    encode_primary,
    encode_trigger,
    encode_zone_spec,
)
from placement.metastore.keys import AssignField, KeySpace
from placement.metastore.kv import KeyValue


def prefix(partitions: int) -> tuple[KeySpace, dict[bytes, KeyValue]]:
    keys = KeySpace("/bench")
    nodes = [f"n{i}" for i in range(5)]
    spec = ZoneSpec("z", partitions, 3)
    kvs: dict[bytes, KeyValue] = {}
    rev = 0

    def put(key: bytes, value: bytes) -> None:
        nonlocal rev
        rev += 1
        kvs[key] = KeyValue(key, value, rev, rev, 1, 0)

    for n in nodes:
        put(keys.node(n), encode_node(NodeRecord(n, "127.0.0.1:1")))
    put(keys.zone("z"), encode_zone_spec(spec))
    put(keys.datanodes("z"), encode_datanodes(DataNodes(tuple(nodes), tuple(nodes), None, None)))
    for p, peers in enumerate(place(spec, [Node(n) for n in nodes]).assignments):
        put(keys.assign("z", p, AssignField.STABLE), encode_assignment(Assignment(peers, 1, 0, 2)))
        put(keys.assign("z", p, AssignField.TRIGGER), encode_trigger(TriggerMark(2, 1, 0)))
        put(keys.primary("z", p), encode_primary(PrimaryLease(peers[0], 1, 10_000)))
    return keys, kvs


def median_ms(runs: list[float]) -> float:
    return statistics.median(runs) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--partitions", type=int, default=1000)
    args = parser.parse_args()
    keys, kvs = prefix(args.partitions)
    revision = max(kv.mod_revision for kv in kvs.values())
    full, cached = [], []
    cache = DecodeCache()
    build_view(keys, kvs, revision, cache)
    changed = keys.assign("z", 0, AssignField.STABLE)
    for i in range(21):
        t = time.perf_counter()
        build_view(keys, kvs, revision)
        full.append(time.perf_counter() - t)
        revision += 1
        old = kvs[changed]
        kvs[changed] = KeyValue(changed, old.value, old.create_revision, revision, i + 2, 0)
        t = time.perf_counter()
        build_view(keys, kvs, revision, cache)
        cached.append(time.perf_counter() - t)
    print(f"keys: {len(kvs)}")
    print(f"build_view, decode everything: {median_ms(full):.1f} ms (median of 21)")
    print(f"build_view, decode cache, 1 key changed: {median_ms(cached):.1f} ms (median of 21)")


if __name__ == "__main__":
    main()
