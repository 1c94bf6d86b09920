"""Bad input to ``placectl plan`` (both engines) and ``placectl pipeline``: exit code 2, one line
naming the option or field and the fix, and no output (an existing one is left as it was)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from test_cli_plan import placectl

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "snapshot.json"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


CASES = [
    (["--input", str(EXAMPLE), "--engine", "spark", "--set-replicas", "nope=2"], "--set-replicas"),
    (["--input", str(EXAMPLE), "--set-partitions", "orders=x"], "--set-partitions"),
    (["--input", str(EXAMPLE), "--engine", "spark", "--remove-node", "ghost"], "--remove-node"),
    (["--input", str(EXAMPLE), "--add-node", "node-a1,rack=a"], "--add-node"),
    (["--input", str(EXAMPLE), "--engine", "spark", "--master", "sprak://x:1"], "--master"),
    (["--input", str(EXAMPLE), "--master", "local[2]"], "--master"),
    (["--input", str(EXAMPLE), "--engine", "spark", "--spark-conf", "novalue"], "--spark-conf"),
    (["--input", str(ROOT / "tests"), "--engine", "spark"], "--input"),
]


@pytest.mark.parametrize(("args", "option"), CASES)
def test_bad_plan_options(tmp_path: Path, args: list[str], option: str) -> None:
    out = tmp_path / "plan.json"
    out.write_text("previous plan")
    result = placectl("plan", *args, "--output", str(out))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"placectl: error: {option}"), lines[0]
    assert "(" in lines[0]  # the fix
    assert out.read_text() == "previous plan"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_unreachable_master_fails_fast_with_nothing_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before anything is packed for the executors, too (an empty cache would be filled)."""
    out, cache = tmp_path / "out" / "plan.json", tmp_path / "cache"
    out.parent.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    master = f"spark://127.0.0.1:{_closed_port()}"
    export = tmp_path / "export"  # what the report checks before Spark starts
    export.mkdir()
    for table in ("history", "assignments"):
        (export / f"{table}.parquet").write_bytes(b"")
    for command in (
        ["plan", "--input", str(EXAMPLE), "--output", str(out)],
        ["pipeline", "report", "--input", str(export), "--out", str(out.parent / "r")],
    ):
        result = placectl(*command, "--engine", "spark", "--master", master)
        assert result.returncode == 2
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"placectl: error: --master: Spark master {master} is unreachable")
        assert "omit --master" in line
        assert list(out.parent.iterdir()) == []
        assert not (cache / "placement").exists()  # (matplotlib keeps its own cache there)


def test_malformed_snapshot_with_the_spark_engine(tmp_path: Path) -> None:
    src, out = tmp_path / "snap.json", tmp_path / "plan.json"
    src.write_text(json.dumps({"nodes": [], "zones": [{"name": "z", "partitions": 1}]}))
    result = placectl("plan", "--input", str(src), "--output", str(out), "--engine", "spark")
    assert result.returncode == 2
    assert "zones[0].replicas" in result.stderr
    assert not out.exists()


def test_report_and_export_bad_arguments(tmp_path: Path) -> None:
    result = placectl(
        "pipeline", "report", "--input", str(tmp_path / "none"), "--out", str(tmp_path / "r")
    )
    assert result.returncode == 2
    assert "placectl: error: --input" in result.stderr
    result = placectl(
        "pipeline", "export", "--etcd", "nohost", "--out", str(tmp_path / "missing" / "x")
    )
    assert result.returncode == 2
    assert "placectl: error: --out: directory" in result.stderr
    assert sorted(tmp_path.iterdir()) == []
