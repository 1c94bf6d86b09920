"""``placectl plan`` as a user runs it: a real subprocess, real files, exit codes and messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "snapshot.json"


def placectl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "placement", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_plans_the_example_snapshot(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = placectl("plan", "--input", str(EXAMPLE), "--output", str(out))
    assert result.returncode == 0, result.stderr
    plan = json.loads(out.read_text())
    snapshot = json.loads(EXAMPLE.read_text())
    nodes = {n["name"]: n for n in snapshot["nodes"]}
    assert [z["name"] for z in plan["zones"]] == [z["name"] for z in snapshot["zones"]]
    for zone_in, zone_out in zip(snapshot["zones"], plan["zones"], strict=True):
        selector = zone_in.get("node_selector", {})
        eligible = {
            name
            for name, n in nodes.items()
            if all(n["attributes"].get(k) == v for k, v in selector.items())
        }
        assignments = zone_out["assignments"]
        assert sorted(assignments, key=int) == [str(p) for p in range(zone_in["partitions"])]
        for peers in assignments.values():
            assert len(peers) == len(set(peers)) == min(zone_in["replicas"], len(eligible))
            assert set(peers) <= eligible
        load = zone_out["summary"]["load"]
        assert sum(load.values()) == zone_in["partitions"] * min(zone_in["replicas"], len(eligible))
    orders = plan["zones"][0]
    # node-c9 left the cluster: nothing may stay on it; every partition spans three racks.
    for peers in orders["assignments"].values():
        assert "node-c9" not in peers
        assert len({nodes[p]["attributes"]["rack"] for p in peers}) == 3
    # sessions: fresh zone on the ssd nodes; node-c1 has weight 2, so each node's load is within
    # one replica of its weighted share S·w/W.
    sessions = plan["zones"][1]["summary"]
    assert sessions["moves"] == 16 * 2
    ssd = {
        name: n.get("weight", 1) for name, n in nodes.items() if n["attributes"]["tier"] == "ssd"
    }
    total_weight = sum(ssd.values())
    for name, load in sessions["load"].items():
        assert abs(load - 16 * 2 * ssd[name] / total_weight) < 1, (name, load)


def test_same_input_same_plan(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert placectl("plan", "--input", str(EXAMPLE), "--output", str(a)).returncode == 0
    assert placectl("plan", "--input", str(EXAMPLE), "--output", str(b)).returncode == 0
    assert a.read_text() == b.read_text()


def _snapshot(**zone: Any) -> dict[str, Any]:
    base = {"name": "z", "partitions": 4, "replicas": 2}
    base.update(zone)
    return {"nodes": [{"name": "n1"}, {"name": "n2"}], "zones": [base]}


BAD_SNAPSHOTS = [
    (_snapshot(replicas=0), "zones[0].replicas"),
    (_snapshot(partitions=0), "zones[0].partitions"),
    (_snapshot(partitions="4"), "zones[0].partitions"),
    (_snapshot(partitions=70_000), "zones[0].partitions"),
    (_snapshot(stable={"9": ["n1"]}), "zones[0].stable.9"),
    (_snapshot(stable={"1": ["n1", "n1"]}), "zones[0].stable.1"),
    (_snapshot(stable={"0": ["n1"], "x": ["n2"]}), "zones[0].stable.x"),
    (_snapshot(stable={"\u00b2": ["n1"]}), "zones[0].stable.\u00b2"),
    (_snapshot(stable={"0": ["n1"], "1": ["n2", "bad name"]}), "zones[0].stable.1[1]"),
    (_snapshot(stable={"1": ["n1", ".."]}), "zones[0].stable.1[1]"),
    (_snapshot(stable={"1": ["n1", 7]}), "zones[0].stable.1[1]"),
    ({"nodes": [{"name": "n1"}, {"name": "n1"}], "zones": []}, "nodes[1].name"),
    ({"nodes": [{"name": "n1", "weight": 0}], "zones": []}, "nodes[0].weight"),
    ({"nodes": [{"attributes": {}}], "zones": []}, "nodes[0].name"),
    ({"nodes": [{"name": "n1"}]}, "zones"),
    (
        {"nodes": [{"name": "n1"}], "zones": [{"name": "z", "partitions": 1, "replicas": 1}] * 2},
        "zones[1].name",
    ),
    ({"nodes": [], "zones": [{"name": "z", "partitions": 1, "replicas": 1}]}, "nodes"),
    ([1, 2], "(top level)"),
]


@pytest.mark.parametrize(("snapshot", "field"), BAD_SNAPSHOTS)
def test_bad_snapshot_names_the_field_and_writes_nothing(
    tmp_path: Path, snapshot: Any, field: str
) -> None:
    src, out = tmp_path / "snap.json", tmp_path / "plan.json"
    src.write_text(json.dumps(snapshot))
    result = placectl("plan", "--input", str(src), "--output", str(out))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("placectl: error: ")
    assert field in lines[0]
    assert "Traceback" not in result.stderr
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [src]


@pytest.mark.parametrize("content", ["", "{not json", "\xff\xfe", '{"nodes": [\n 1,\n', "[NaN]"])
def test_unreadable_snapshot(tmp_path: Path, content: str) -> None:
    src, out = tmp_path / "snap.json", tmp_path / "plan.json"
    src.write_bytes(content.encode("latin-1"))
    result = placectl("plan", "--input", str(src), "--output", str(out))
    assert result.returncode == 2
    assert "--input" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_missing_snapshot_file(tmp_path: Path) -> None:
    result = placectl(
        "plan", "--input", str(tmp_path / "nope.json"), "--output", str(tmp_path / "p")
    )
    assert result.returncode == 2
    assert "--input" in result.stderr
    assert "cannot read" in result.stderr


def test_failed_plan_keeps_an_existing_output(tmp_path: Path) -> None:
    src, out = tmp_path / "snap.json", tmp_path / "plan.json"
    out.write_text("previous plan")
    src.write_text(json.dumps(_snapshot(replicas=-1)))
    assert placectl("plan", "--input", str(src), "--output", str(out)).returncode == 2
    assert out.read_text() == "previous plan"


def test_unknown_engine_is_a_usage_error(tmp_path: Path) -> None:
    result = placectl(
        "plan", "--input", str(EXAMPLE), "--output", str(tmp_path / "p"), "--engine", "x"
    )
    assert result.returncode == 2
    assert "--engine" in result.stderr


@pytest.mark.parametrize("name", [".", ".."])
def test_snapshot_names_follow_the_one_name_rule(tmp_path: Path, name: str) -> None:
    """``.`` and ``..`` match the name pattern but are no valid name anywhere in the product."""
    snapshot = json.loads(EXAMPLE.read_text())
    snapshot["nodes"][0]["name"] = name
    bad = tmp_path / "snapshot.json"
    bad.write_text(json.dumps(snapshot))
    out = tmp_path / "plan.json"
    result = placectl("plan", "--input", str(bad), "--output", str(out))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("placectl: error: nodes[0].name:")
    assert "not a valid name" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()
