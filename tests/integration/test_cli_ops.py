"""``placectl`` operator commands as subprocesses against real drivers, agents and etcd.

One cluster per module (2 drivers and 3 agents as subprocesses via ``placement.local.cluster``,
on the session etcd under a private prefix, mutual TLS as ``placectl up`` runs it); every command
runs as ``python -m placement`` with the admin operator's certificate.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import pty
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from placement.local.certs import create_pki
from placement.local.cluster import Cluster, UpOptions, start_cluster, wait_ready
from placement.metastore.election import current_leader
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace
from placement.security.pki import Role

EVENTUALLY = 30.0 * float(os.environ.get("CI_TIME_MULTIPLIER", "1"))


@pytest.fixture(scope="module")
def ops_cluster(etcd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    prefix = f"/t{uuid.uuid4().hex[:12]}/placement"
    opts = UpOptions(nodes=3, drivers=2, etcd=etcd.endpoint, api_port=0, prefix=prefix)
    base = tmp_path_factory.mktemp("ops-cluster")
    cluster = start_cluster(opts, base, Console(quiet=True))
    try:
        asyncio.run(wait_ready(cluster, opts, demo_zone=False))
        yield cluster
    finally:
        cluster.stop()
    for child in cluster.children:
        assert child.proc is not None
        assert child.proc.returncode is not None


def placectl(
    cluster: Cluster | None, *args: str, endpoint: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``placectl`` as the cluster's admin operator (its certificate through ``PLACECTL_*``)."""
    target = endpoint or (",".join(cluster.driver_apis) if cluster else "127.0.0.1:1")
    return subprocess.run(
        [sys.executable, "-m", "placement", "--endpoint", target, *args],
        env={**os.environ, **(cluster.env() if cluster else {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ok_json(cluster: Cluster, *args: str) -> Any:
    result = placectl(cluster, *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def one_line_error(result: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("placectl: error: ")
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0]


def with_terminal_stderr(
    argv: list[str], env: dict[str, str], timeout: float = 120
) -> tuple[int, str, str]:
    """Runs ``argv`` with stdout a pipe and stderr a terminal (a pty): ``(code, stdout,
    stderr)``."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=secondary,
        env={**env, "TERM": "xterm-256color", "COLUMNS": "200"},
    )
    os.close(secondary)
    drawn = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the child closed its end
                return
            if not chunk:
                return
            drawn.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=timeout)
    reader.join(timeout=10)
    os.close(primary)
    return proc.returncode, out.decode(), drawn.decode(errors="replace")


def same_answer_as_json_and_yaml(cluster: Cluster, *args: str) -> Any:
    """``args`` with ``-o json``, ``-o yaml``, ``--json`` and ``-o json`` again, until the first
    and last JSON answers are equal (the cluster did not change between them; its lease renewals
    change revisions and expiries): then the YAML answer must be that same data."""
    deadline = time.monotonic() + EVENTUALLY
    while True:
        before = ok_json(cluster, *args, "-o", "json")
        as_yaml = placectl(cluster, *args, "-o", "yaml")
        assert as_yaml.returncode == 0, as_yaml.stderr
        alias = ok_json(cluster, *args, "--json")
        after = ok_json(cluster, *args, "-o", "json")
        if before == after:
            assert yaml.safe_load(as_yaml.stdout) == before, args
            assert alias == before, args
            return before
        assert time.monotonic() < deadline, f"{args}: the answer kept changing"


def wait_status(cluster: Cluster, zone: str, check: Any) -> dict[str, Any]:
    deadline = time.monotonic() + EVENTUALLY
    while True:
        status: dict[str, Any] = ok_json(cluster, "zone", "status", zone, "--json")
        if check(status) or time.monotonic() > deadline:
            return status
        time.sleep(0.3)


def test_zone_lifecycle_and_assignments(ops_cluster: Cluster) -> None:
    c = ops_cluster
    created = placectl(
        c, "zone", "create", "orders", "--partitions", "6", "--replicas", "2",
        "--failure-domain", "rack", "--scale-down-delay", "60", "--min-in-sync", "2",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert "zone orders created" in created.stdout
    assert "min-in-sync=2" in created.stdout
    got = ok_json(c, "zone", "get", "orders", "--json")
    assert got["partitions"] == 6
    assert got["replicas"] == 2
    assert got["failure_domain"] == "rack"
    assert got["scale_down_delay"] == 60.0
    assert (got["min_in_sync"], got["effective_min_in_sync"]) == (2, 2)
    shown = placectl(c, "zone", "get", "orders")
    assert shown.returncode == 0, shown.stderr
    assert "min ISR" in shown.stdout
    listed = ok_json(c, "zone", "list", "--json")
    assert "orders" in [z["name"] for z in listed["zones"]]

    status = wait_status(c, "orders", lambda s: s["state"] == "READY" and s["partitions_done"] == 6)
    assert status["state"] == "READY"
    assert status["partitions_done"] == 6
    table = ok_json(c, "assignments", "orders", "--json")
    assert [p["partition"] for p in table["partitions"]] == list(range(6))
    for p in table["partitions"]:
        assert len(p["stable"]) == 2
        assert p["pending"] is None
    one = ok_json(c, "assignments", "orders", "--partition", "3", "--json")
    assert [p["partition"] for p in one["partitions"]] == [3]

    altered = placectl(c, "zone", "alter", "orders", "--replicas", "3")
    assert altered.returncode == 0, altered.stderr
    assert ok_json(c, "zone", "get", "orders", "--json")["min_in_sync"] == 2  # kept
    watched = placectl(c, "zone", "status", "orders", "--watch", "--json", "--interval", "0.2")
    assert watched.returncode == 0, watched.stderr
    states = [json.loads(line)["state"] for line in watched.stdout.splitlines()]
    assert states[-1] == "READY"
    assert set(states) <= {"READY", "REBALANCING", "HOLDDOWN"}
    final = ok_json(c, "assignments", "orders", "--json")
    assert all(len(p["stable"]) == 3 for p in final["partitions"])

    human = placectl(c, "assignments", "orders")
    assert human.returncode == 0
    assert "partition" in human.stdout

    dropped = placectl(c, "zone", "drop", "orders")
    assert dropped.returncode == 0, dropped.stderr
    one_line_error(placectl(c, "zone", "get", "orders"), 2, "orders", "does not exist")


def test_nodes_pause_resume_inspect(ops_cluster: Cluster) -> None:
    c = ops_cluster
    found = ok_json(c, "nodes", "--json")
    assert sorted(n["name"] for n in found["nodes"]) == ["node-1", "node-2", "node-3"]
    assert {n["attributes"]["rack"] for n in found["nodes"]} == {"r1", "r2", "r3"}

    prefix = c.prefix
    paused = placectl(c, "rebalance", "pause")
    assert paused.returncode == 0, paused.stderr
    keys = ok_json(c, "inspect", "--etcd", c.etcd_endpoint, "--prefix", prefix, "--json")
    control = [k for k in keys["keys"] if k["key"] == f"{prefix}/control/paused"]
    assert len(control) == 1
    assert control[0]["value"]["epoch"] > 0
    resumed = placectl(c, "rebalance", "resume")
    assert resumed.returncode == 0, resumed.stderr
    keys = ok_json(c, "inspect", "--etcd", c.etcd_endpoint, "--prefix", prefix, "--json")
    assert not [k for k in keys["keys"] if k["kind"] == "control"]
    kinds = {k["kind"] for k in keys["keys"]}
    assert {"nodes", "leader"} <= kinds


def test_output_formats_on_a_live_cluster(
    ops_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every read's ``-o json`` and ``-o yaml`` are the same data (``--json`` too), ``-o wide``
    adds its columns, writes answer as data, and progress bars stay off stdout."""
    c = ops_cluster
    monkeypatch.setenv("COLUMNS", "250")  # wide tables are not wrapped
    created = ok_json(c, *shlex.split("zone create fmt --partitions 3 --replicas 2 -o json"))
    assert (created["name"], created["partitions"], created["replicas"]) == ("fmt", 3, 2)
    altered = placectl(c, *shlex.split("zone alter fmt --scale-up-delay 0 -o yaml"))
    assert altered.returncode == 0, altered.stderr
    assert yaml.safe_load(altered.stdout)["scale_up_delay"] == 0
    wait_status(c, "fmt", lambda s: s["state"] == "READY" and s["partitions_done"] == 3)

    reads = [
        ("zone", "get", "fmt"),
        ("zone", "list"),
        ("zone", "status", "fmt"),
        ("assignments", "fmt"),
        ("assignments", "fmt", "--partition", "1"),
        ("nodes",),
        ("node", "status", "node-1"),
        ("inspect", "--etcd", c.etcd_endpoint, "--prefix", c.prefix),
    ]
    found = {args: same_answer_as_json_and_yaml(c, *args) for args in reads}
    assert found[("zone", "get", "fmt")]["name"] == "fmt"
    assert [p["partition"] for p in found[("assignments", "fmt", "--partition", "1")][
        "partitions"
    ]] == [1]  # fmt: skip
    assert found[("node", "status", "node-1")]["registered"] is True

    wide = {
        ("zone", "get", "fmt"): ["revision", "reshard attempt"],
        ("zone", "status", "fmt"): ["eligible nodes 3"],
        ("assignments", "fmt"): ["lease expires", " in "],
        ("nodes",): ["state", "replicas", "primaries", "active"],
        ("node", "status", "node-1"): ["(revision "],
    }
    for args, words in wide.items():
        shown = placectl(c, *args, "-o", "wide")
        assert shown.returncode == 0, shown.stderr
        table = placectl(c, *args)
        for word in words:
            assert word in shown.stdout, (args, word, shown.stdout)
            assert word not in table.stdout, (args, word, table.stdout)

    inspect = ("inspect", "--etcd", c.etcd_endpoint, "--prefix", c.prefix)
    assert _header(placectl(c, *inspect).stdout) == ["key", "mod rev", "value"]
    assert _header(placectl(c, *inspect, "-o", "wide").stdout) == [
        "key", "kind", "mod rev", "lease", "value",
    ]  # fmt: skip

    bad = placectl(c, "zone", "get", "fmt", "-o", "xml")
    assert bad.returncode == 2
    assert "'-o' / '--output'" in bad.stderr
    assert bad.stdout == ""

    # a piped watch prints each status, no bar; -o yaml: a document each
    piped = placectl(c, "zone", "status", "fmt", "--watch", "--interval", "0.2")
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.startswith("zone fmt: READY")
    assert piped.stderr == ""
    documents = list(
        yaml.safe_load_all(placectl(c, "zone", "status", "fmt", "--watch", "-o", "yaml").stdout)
    )
    assert [d["state"] for d in documents] == ["READY"]

    assert ok_json(c, "rebalance", "pause", "-o", "json") == {"paused": True}
    assert ok_json(c, "rebalance", "resume", "--json") == {"paused": False}
    undrained = ok_json(c, "node", "undrain", "node-1", "-o", "json")
    assert (undrained["node"], undrained["draining"]) == ("node-1", False)
    cordoned = ok_json(c, "node", "cordon", "node-1", "-o", "json")
    assert (cordoned["node"], cordoned["cordoned"]) == ("node-1", True)
    assert ok_json(c, "node", "uncordon", "node-1", "--json")["cordoned"] is False

    # pipeline export: the summary as data; its bar only on a terminal's stderr
    export = [
        "pipeline", "export", "--etcd", c.etcd_endpoint, "--prefix", c.prefix,
        "--out", str(tmp_path / "export"),
    ]  # fmt: skip
    summary = ok_json(c, *export, "-o", "json")
    assert summary["rows"]["zones"] >= 1
    assert summary["out"] == str(tmp_path / "export")
    piped_export = placectl(c, *export)
    assert piped_export.returncode == 0, piped_export.stderr
    assert piped_export.stderr == ""
    code, out, drawn = with_terminal_stderr(
        [sys.executable, "-m", "placement", *export], {**os.environ, **c.env()}
    )
    assert code == 0, drawn
    assert out.startswith("exported revision ")
    assert len(out.splitlines()) == 1  # the bar never reaches stdout
    assert "exporting" in drawn
    assert "12/12" in drawn  # every step: the 5 snapshot ranges, the history, 6 tables
    assert "wrote history.parquet" in drawn
    report = ["pipeline", "report", "--input", str(tmp_path / "export")]
    as_json = ok_json(c, *report, "--out", str(tmp_path / "r1"), "-o", "json")
    as_yaml = placectl(c, *report, "--out", str(tmp_path / "r2"), "-o", "yaml")
    assert as_yaml.returncode == 0, as_yaml.stderr
    assert yaml.safe_load(as_yaml.stdout) == {**as_json, "report": str(tmp_path / "r2/report.html")}
    assert as_json["report"] == str(tmp_path / "r1/report.html")

    dropped = placectl(c, "zone", "drop", "fmt", "-o", "yaml")
    assert dropped.returncode == 0, dropped.stderr
    assert yaml.safe_load(dropped.stdout) == {"name": "fmt", "dropped": True}


def _header(table: str) -> list[str]:
    """The column names of a rich table's header row."""
    row = next(line for line in table.splitlines() if line.startswith("┃"))
    return [cell.strip() for cell in row.strip("┃").split("┃")]


def test_bad_input_one_line_exit_2_nothing_written(ops_cluster: Cluster) -> None:
    c = ops_cluster
    prefix = c.prefix
    before = ok_json(c, "inspect", "--etcd", c.etcd_endpoint, "--prefix", prefix, "--json")
    zone_keys = [k for k in before["keys"] if k["kind"] == "zones"]
    cases = [
        (("zone", "create", "z", "--partitions", "4", "--replicas", "0"), "replicas"),
        (("zone", "create", "z", "--partitions", "70000", "--replicas", "1"), "partitions"),
        (("zone", "create", "z", "--partitions", "4", "--replicas", "65"), "replicas"),
        (
            ("zone", "create", "z", "--partitions", "4", "--replicas", "1", "--node-selector", "x"),
            "--node-selector",
        ),
        (
            tuple(shlex.split("zone create z --partitions 4 --replicas 1 --scale-up-delay -3")),
            "scale_up_delay",
        ),
        (
            ("zone", "create", "z", "--partitions", "4", "--replicas", "3", "--min-in-sync", "0"),
            "--min-in-sync",
        ),
        (
            ("zone", "create", "z", "--partitions", "4", "--replicas", "3", "--min-in-sync", "65"),
            "--min-in-sync",
        ),
        (("zone", "alter", "nope", "--replicas", "2"), "nope"),
        (("zone", "alter", "nope"), "no setting"),
        (("rebalance", "cancel", "nope", "0"), "nope"),
        (("rebalance", "cancel", "nope"), "nope"),
    ]
    for args, word in cases:
        one_line_error(placectl(c, *args), 2, word)
    after = ok_json(c, "inspect", "--etcd", c.etcd_endpoint, "--prefix", prefix, "--json")
    assert [k for k in after["keys"] if k["kind"] == "zones"] == zone_keys

    assert (
        placectl(c, "zone", "create", "dup", "--partitions", "2", "--replicas", "1").returncode == 0
    )
    one_line_error(
        placectl(c, "zone", "create", "dup", "--partitions", "2", "--replicas", "1"),
        2,
        "already exists",
    )
    nothing = placectl(c, "rebalance", "cancel", "dup", "1")
    assert nothing.returncode == 1
    assert "no rebalance" in nothing.stdout
    not_resharding = placectl(c, "rebalance", "cancel", "dup")
    assert not_resharding.returncode == 1
    assert "not re-sharding" in not_resharding.stdout
    assert placectl(c, "zone", "drop", "dup").returncode == 0


def test_unavailable_exit_1_and_failover(ops_cluster: Cluster, tmp_path: Path) -> None:
    one_line_error(placectl(None, "zone", "list"), 1, "no placement driver answered")
    # a dead address first in the list: the client fails over to a live driver
    endpoint = "127.0.0.1:1," + ops_cluster.driver_apis[1]
    listed = placectl(ops_cluster, "zone", "list", "--json", endpoint=endpoint)
    assert listed.returncode == 0, listed.stderr
    one_line_error(placectl(None, "zone", "list", endpoint="nohost"), 2, "--endpoint")


def test_agent_run_registers_and_revokes_on_sigterm(ops_cluster: Cluster, tmp_path: Path) -> None:
    c = ops_cluster
    prefix = c.prefix
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "placement",
            "agent",
            "run",
            "--etcd",
            c.etcd_endpoint,
            "--prefix",
            prefix,
            "--node",
            "extra",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(tmp_path / "extra"),
            "--attribute",
            "rack=r9",
            "--lease-ttl",
            "30",
            *_certificate(c, "extra"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("agent extra listening on 127.0.0.1:")
        nodes = {n["name"]: n for n in ok_json(c, "nodes", "--json")["nodes"]}
        assert nodes["extra"]["attributes"] == {"rack": "r9"}
        assert nodes["extra"]["address"] == line.split()[-1]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    # revoked on shutdown: gone now, not after the 30 s TTL
    names = [n["name"] for n in ok_json(c, "nodes", "--json")["nodes"]]
    assert "extra" not in names

    bad = placectl(
        c, "agent", "run", "--etcd", c.etcd_endpoint, "--node", "x", "--listen", "127.0.0.1:0",
        "--data-dir", str(tmp_path / "x"), "--attribute", "rack",
    )  # fmt: skip
    one_line_error(bad, 2, "--attribute")


def _certificate(cluster: Cluster, node: str) -> list[str]:
    """``--cacert --cert --key`` of a new agent ``node``, issued by the cluster's CA."""
    assert cluster.pki is not None
    create_pki(cluster.pki.directory, {node: Role.AGENT}, dt.datetime.now(dt.UTC))
    return cluster.pki.flags(node)


def _leader_id(cluster: Cluster) -> str:
    async def read() -> str:
        async with EtcdClient([cluster.etcd_endpoint]) as client:
            kv = await current_leader(client, KeySpace(cluster.prefix))
            assert kv is not None
            return str(json.loads(kv.value)["id"])

    return asyncio.run(read())


def _child(cluster: Cluster, name: str) -> subprocess.Popen[bytes]:
    (child,) = [c for c in cluster.children if c.name == name]
    assert child.proc is not None
    return child.proc


def test_zz_holddown_forwarding_and_leader_failover(ops_cluster: Cluster) -> None:
    """Last in the module: it stops an agent and kills the leader driver."""
    c = ops_cluster
    leader = _leader_id(c)
    follower_api = c.driver_apis[1 if leader == "driver-1" else 0]
    created = placectl(
        c,
        *shlex.split("zone create hd --partitions 4 --replicas 2 --scale-down-delay 120"),
        endpoint=follower_api,  # a follower forwards the write to the leader
    )
    assert created.returncode == 0, created.stderr
    wait_status(c, "hd", lambda s: s["state"] == "READY" and s["partitions_done"] == 4)

    agent = _child(c, "node-3")
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0
    held = wait_status(c, "hd", lambda s: s["state"] == "HOLDDOWN")
    assert held["state"] == "HOLDDOWN"
    assert 0 < held["holddown_remaining_seconds"] <= 120
    human = placectl(c, "zone", "status", "hd")
    assert "HOLDDOWN" in human.stdout

    _child(c, leader).send_signal(signal.SIGKILL)
    deadline = time.monotonic() + EVENTUALLY
    while True:
        result = placectl(c, *shlex.split("zone alter hd --replicas 1"))
        if result.returncode == 0:
            break
        one_line_error(result, 1)
        assert time.monotonic() < deadline, "no new leader took the write"
    assert _leader_id(c) != leader
    assert ok_json(c, "zone", "get", "hd", "--json")["replicas"] == 1
