"""``placectl pipeline export`` and ``report`` against a real etcd: a known history written with
the real metastore layer, exported to Parquet, read back, and reported with the right numbers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from placement.core.model import ZoneSpec
from placement.metastore.codec import NodeRecord, ReplicaSize, encode_size
from placement.metastore.etcd import EtcdClient, read_history
from placement.metastore.keys import KeySpace, prefix_range_end
from placement.metastore.store import Metastore
from placement.metastore.transitions import Fence, Outcome
from placement.pipeline.export import export
from placement.pipeline.report import PLOTS, build_report

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


async def _fence(client: EtcdClient, keys: KeySpace) -> Fence:
    key = keys.leader("test")
    return Fence(key, await client.put(key, b"test"))


async def _rebalance(
    store: Metastore,
    fence: Fence,
    zone: str,
    p: int,
    target: tuple[str, ...],
    start: int,
    end: int | None,
) -> None:
    """pending := target at ts ``start``; stable := pending at ts ``end`` (None: left pending)."""
    trigger = await store.client.current_revision()
    result = await store.trigger(zone, p, target, trigger, fence, ts=start)
    assert result.outcome is Outcome.APPLIED
    if end is not None:
        assert result.state.pending is not None
        done = await store.finish(zone, p, result.state.pending.mod_revision, fence, ts=end)
        assert done.outcome is Outcome.APPLIED


async def write_known_history(client: EtcdClient, keys: KeySpace) -> None:
    """orders: p0 rebalanced in 3 s (1 move), p1 still rebalancing (1 move); carts: two
    rebalances of 0.5 s and 1 s (1 move each). Sizes reported for orders only."""
    store = Metastore(client, keys)
    fence = await _fence(client, keys)
    lease = await client.grant_lease(30)
    for name, rack in (("n1", "a"), ("n2", "b"), ("n3", "c")):
        await store.register_node(NodeRecord(name, f"127.0.0.1:1{name[1]}", {"rack": rack}), lease)
    for spec in (ZoneSpec("orders", 2, 2, failure_domain="rack"), ZoneSpec("carts", 1, 1)):
        assert (await store.create_zone(spec, fence)).applied
    await store.create_partitions("orders", {0: ("n1", "n2"), 1: ("n2", "n3")}, 1, fence, ts=1000)
    await store.create_partitions("carts", {0: ("n1",)}, 1, fence, ts=1000)
    await _rebalance(store, fence, "orders", 0, ("n1", "n3"), 2000, 5000)
    await _rebalance(store, fence, "orders", 1, ("n2", "n1"), 3000, None)
    await _rebalance(store, fence, "carts", 0, ("n2",), 10_000, 10_500)
    await _rebalance(store, fence, "carts", 0, ("n3",), 20_000, 21_000)
    for p, node, size in ((0, "n1", 100), (0, "n3", 150), (1, "n2", 70)):
        await client.put(keys.size("orders", p, node), encode_size(ReplicaSize(size, 1, 1)))


async def test_export_writes_the_snapshot_and_history(
    client: EtcdClient, keys: KeySpace, prefix: str, etcd: object, tmp_path: Path
) -> None:
    await write_known_history(client, keys)
    out = tmp_path / "export"
    summary = await export(client.endpoints[0], prefix, out)
    assert (summary.rows["zones"], summary.rows["nodes"]) == (2, 3)
    nodes = pq.read_table(out / "nodes.parquet").to_pylist()
    assert [(n["name"], dict(n["attributes"])) for n in nodes] == [
        ("n1", {"rack": "a"}), ("n2", {"rack": "b"}), ("n3", {"rack": "c"}),
    ]  # fmt: skip
    zones = {z["name"]: z for z in pq.read_table(out / "zones.parquet").to_pylist()}
    assert (zones["orders"]["partitions"], zones["orders"]["failure_domain"]) == (2, "rack")
    rows = {
        (a["zone"], a["partition"], a["field"]): a["peers"]
        for a in pq.read_table(out / "assignments.parquet").to_pylist()
    }
    assert rows == {
        ("carts", 0, "stable"): ["n3"],
        ("orders", 0, "stable"): ["n1", "n3"],
        ("orders", 1, "stable"): ["n2", "n3"],
        ("orders", 1, "pending"): ["n2", "n1"],
    }
    sizes = pq.read_table(out / "sizes.parquet").to_pylist()
    assert sorted((s["partition"], s["node"], s["bytes"]) for s in sizes) == [
        (0, "n1", 100), (0, "n3", 150), (1, "n2", 70),
    ]  # fmt: skip
    history = pq.read_table(out / "history.parquet").to_pylist()
    carts_stable = [h["peers"] for h in history if h["zone"] == "carts" and h["field"] == "stable"]
    assert carts_stable == [["n1"], ["n2"], ["n3"]]
    assert all(h["revision"] <= summary.history_to for h in history)
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["prefix"], meta["history_from"]) == (prefix, 1)


async def test_report_numbers_for_a_known_history(
    client: EtcdClient, keys: KeySpace, prefix: str, tmp_path: Path
) -> None:
    await write_known_history(client, keys)
    await export(client.endpoints[0], prefix, tmp_path / "export")
    out = tmp_path / "report"
    build_report(tmp_path / "export", out)
    numbers = json.loads((out / "report.json").read_text())
    orders, carts = numbers["zones"]["orders"], numbers["zones"]["carts"]
    assert orders["outcomes"] == {"done": 1, "in_progress": 1}
    assert (orders["moves_done"], orders["bytes_moved"]) == (1, 150)
    assert (orders["moves_in_progress"], orders["bytes_to_move"]) == (1, 70)
    assert orders["duration_s"]["max"] == 3.0
    assert carts["outcomes"] == {"done": 2}
    assert carts["moves"] == 2
    assert (carts["duration_s"]["count"], carts["duration_s"]["mean"]) == (2, 0.75)
    assert numbers["totals"]["rebalances"] == 4
    assert numbers["load_before"] == {}  # the whole history is retained: it starts empty
    assert numbers["load_after"] == {"n1": 1, "n2": 1, "n3": 3}
    assert numbers["skew"][-1]["spread"] == 2
    page = (out / "report.html").read_text()
    for name in PLOTS.values():
        assert (out / "plots" / name).stat().st_size > 1000
        assert name in page
    assert page.count("data:image/png;base64,") == len(PLOTS)


async def test_history_starts_after_compaction(etcd_factory: object, tmp_path: Path) -> None:
    server = etcd_factory()  # type: ignore[operator]
    keys = KeySpace("/c/placement")
    async with EtcdClient([server.endpoint]) as client:
        await write_known_history(client, keys)
        compact_at = await client.current_revision() - 5  # before carts' second rebalance
        await client.compact(compact_at)
        assign = keys.assign_prefix()
        history = await read_history(client, assign, prefix_range_end(assign))
        assert history.from_revision == compact_at + 1
        assert history.events
        assert history.events[0].kv.mod_revision > compact_at
        await export(server.endpoint, "/c/placement", tmp_path / "export")
    build_report(tmp_path / "export", tmp_path / "report")
    numbers = json.loads((tmp_path / "report" / "report.json").read_text())
    assert numbers["history"]["history_from"] == compact_at + 1
    assert numbers["load_after"] == {"n1": 1, "n2": 1, "n3": 3}


def test_export_command_end_to_end(etcd: object, prefix: str, tmp_path: Path) -> None:
    """The CLI against an empty prefix: every table exists (with zero rows), exit 0; an
    unreachable etcd is exit 2 and leaves no directory."""
    out = tmp_path / "export"
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    ok = subprocess.run(
        [sys.executable, "-m", "placement", "pipeline", "export", "--etcd", endpoint,
         "--prefix", prefix, "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["assignments.parquet", "history.parquet", "meta.json", "nodes.parquet",
         "primaries.parquet", "sizes.parquet", "zones.parquet"]
    )  # fmt: skip
    bad = subprocess.run(
        [sys.executable, "-m", "placement", "pipeline", "export", "--etcd", "127.0.0.1:1",
         "--out", str(tmp_path / "never")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert not (tmp_path / "never").exists()


async def _placectl(*argv: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, cwd=ROOT, timeout=240
    )


async def test_export_to_a_uri_writes_the_same_tables(
    etcd: object, client: EtcdClient, keys: KeySpace, prefix: str, tmp_path: Path
) -> None:
    """``--out file:///...`` (any Hadoop/Spark URI): written locally, then copied through the
    Hadoop file system of a local Spark; the same tables as a local ``--out``, no temporaries
    beside it; ``--spark-conf`` with a local ``--out`` is one line, exit 2."""
    await write_known_history(client, keys)
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    base = [sys.executable, "-m", "placement", "pipeline", "export", "--etcd", endpoint,
            "--prefix", prefix]  # fmt: skip
    local, remote = tmp_path / "local", tmp_path / "remote" / "export"
    remote.parent.mkdir()
    for out in (str(local), remote.as_uri()):
        done = await _placectl(*base, "--out", out)
        assert done.returncode == 0, done.stderr
        assert done.stdout.rstrip().endswith(f"-> {out}"), done.stdout
    names = sorted(p.name for p in local.iterdir())
    assert sorted(p.name for p in remote.iterdir()) == names
    for name in names:
        if name.endswith(".parquet"):
            assert pq.read_table(remote / name).equals(pq.read_table(local / name)), name
    assert json.loads((remote / "meta.json").read_text()) == json.loads(
        (local / "meta.json").read_text()
    )
    assert pq.read_table(remote / "history.parquet").num_rows > 0
    assert [p.name for p in remote.parent.iterdir()] == ["export"]
    refused = await _placectl(*base, "--out", str(tmp_path / "x"), "--spark-conf", "a=b")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "placectl: error: --spark-conf: only applies to a URI --out (drop it, or name a URI)"
    )
    assert not (tmp_path / "x").exists()
