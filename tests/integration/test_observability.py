"""Metrics and structured logs on a live cluster (design/observability.md).

One cluster per module, as ``placectl up`` runs it (2 drivers and 3 agents as subprocesses, mutual
TLS, every process with ``--metrics-listen`` and ``--log-format json``), on the session etcd:

* ``/metrics`` over HTTPS with a client certificate of the cluster's CA (refused without one);
  scraped before and after a zone is created, written to, and rebalanced twice (replicas 2 → 3 →
  2): the counters move — moves done, Rebalance answers, catch-up bytes, in-sync-set expands,
  data requests, etcd transactions — and the state gauges agree with etcd;
* every metric the Grafana dashboard (``deploy/grafana/placement.json``) queries exists there;
* every line of every driver's and agent's log is one JSON object, and lines about a partition
  carry its zone, partition and epoch as fields;
* a malformed or taken ``--metrics-listen`` is one line naming the option, exit 2.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from placement.local.cluster import Cluster, UpOptions, free_ports, start_cluster, wait_ready

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "placement.json"
EVENTUALLY = 60.0 * float(os.environ.get("CI_TIME_MULTIPLIER", "1"))
ZONE = "observed"
PARTITIONS = 8
#: The only lines of a process's log that are not log records: its announcement on stdout.
ANNOUNCE = re.compile(r"^(driver \S+ serving on|agent \S+ listening on) ")


@pytest.fixture(scope="module")
def cluster(etcd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    prefix = f"/t{uuid.uuid4().hex[:12]}/placement"
    opts = UpOptions(
        nodes=3, drivers=2, etcd=etcd.endpoint, api_port=0, prefix=prefix, log_format="json"
    )
    c = start_cluster(opts, tmp_path_factory.mktemp("observed"), Console(quiet=True))
    try:
        asyncio.run(wait_ready(c, opts, demo_zone=False))
        yield c
    finally:
        c.stop()


def _context(cluster: Cluster, name: str = "reader") -> ssl.SSLContext:
    assert cluster.pki is not None
    context = ssl.create_default_context(cafile=str(cluster.pki.ca))
    context.load_cert_chain(str(cluster.pki.cert(name)), str(cluster.pki.key(name)))
    return context


def scrape(cluster: Cluster, process: str) -> dict[str, float]:
    """Every sample of ``process``'s ``/metrics``: ``name{labels}`` -> value."""
    url = f"https://{cluster.metrics[process]}/metrics"
    with urllib.request.urlopen(url, context=_context(cluster), timeout=10) as answer:
        text = answer.read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}"] = s.value
    return samples


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of ``name``'s samples whose labels include ``labels``."""
    want = [f"{k}={v}" for k, v in labels.items()]
    found = 0.0
    for key, value in samples.items():
        metric, _, rest = key.partition("{")
        if metric == name and all(w in rest.rstrip("}").split(",") for w in want):
            found += value
    return found


def agents(cluster: Cluster) -> list[str]:
    return sorted(n for n in cluster.metrics if n.startswith("node-"))


def everywhere(cluster: Cluster, name: str, **labels: str) -> float:
    return sum(total(scrape(cluster, a), name, **labels) for a in agents(cluster))


def placectl(cluster: Cluster, *args: str, role: str = "admin") -> str:
    result = subprocess.run(
        [sys.executable, "-m", "placement", "--endpoint", ",".join(cluster.driver_apis), *args],
        env={**os.environ, **cluster.env(role)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def leader_of(cluster: Cluster) -> str:
    leaders = [
        d for d in cluster.metrics if d.startswith("driver-") and scrape(cluster, d).get(
            "placement_driver_leader{}"
        ) == 1
    ]  # fmt: skip
    assert len(leaders) == 1, leaders
    return leaders[0]


def eventually(check: Any, what: str) -> Any:
    deadline = time.monotonic() + EVENTUALLY
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.3)


def ready(cluster: Cluster, replicas: int) -> bool:
    samples = scrape(cluster, leader_of(cluster))
    placed = total(samples, "placement_node_replicas")
    return (
        total(samples, "placement_zone_state", zone=ZONE, state="READY") == 1
        and placed == PARTITIONS * replicas
        and total(samples, "placement_driver_moves_in_flight", zone=ZONE) == 0
    )


def test_metrics_move_through_a_zone_s_life_and_cover_the_dashboard(cluster: Cluster) -> None:
    # mutual TLS: no client certificate, no metrics
    assert cluster.pki is not None
    anonymous = ssl.create_default_context(cafile=str(cluster.pki.ca))
    url = f"https://{cluster.metrics['node-1']}/metrics"
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        urllib.request.urlopen(url, context=anonymous, timeout=10).read()

    leader = leader_of(cluster)
    before = scrape(cluster, leader)
    assert before["placement_driver_epoch{}"] > 0
    assert before["placement_driver_terms_total{}"] >= 1
    follower = next(d for d in cluster.metrics if d.startswith("driver-") and d != leader)
    assert scrape(cluster, follower)["placement_driver_epoch{}"] == 0

    placectl(cluster, "zone", "create", ZONE, "--partitions", str(PARTITIONS), "--replicas", "2")
    eventually(lambda: ready(cluster, 2), "zone READY with 2 replicas per partition")
    samples = scrape(cluster, leader)
    assert total(samples, "placement_node_primaries") == PARTITIONS
    assert total(samples, "placement_driver_primary_lease_writes_total", kind="granted") >= 8
    assert total(samples, "placement_etcd_txn_seconds_count", outcome="applied") > total(
        before, "placement_etcd_txn_seconds_count", outcome="applied"
    )
    assert everywhere(cluster, "placement_agent_primaries", zone=ZONE) == PARTITIONS
    assert everywhere(cluster, "placement_agent_replicas", zone=ZONE) == 2 * PARTITIONS

    for i in range(20):
        placectl(cluster, "data", "put", ZONE, f"key-{i}", "v" * 1000, role="client")
    assert everywhere(cluster, "placement_data_request_seconds_count", op="put", outcome="ok") >= 20

    expands = everywhere(cluster, "placement_isr_changes_total", change="expand")
    copied = everywhere(cluster, "placement_catch_up_bytes_total")
    placectl(cluster, "zone", "alter", ZONE, "--replicas", "3")
    eventually(lambda: ready(cluster, 3), "zone READY with 3 replicas per partition")
    samples = scrape(cluster, leader)
    assert total(samples, "placement_driver_moves_total", zone=ZONE, outcome="done") >= PARTITIONS
    assert total(samples, "placement_driver_rebalance_rpcs_total", outcome="done") >= PARTITIONS
    assert total(samples, "placement_driver_pass_seconds_count") > 0
    assert everywhere(cluster, "placement_isr_changes_total", change="expand") > expands
    assert everywhere(cluster, "placement_catch_up_bytes_total") > copied
    assert everywhere(cluster, "placement_catch_up_seconds_count") >= 1
    assert eventually(
        lambda: everywhere(cluster, "placement_agent_isr_size", zone=ZONE, size="3") == PARTITIONS,
        "every led partition's in-sync set holds 3",
    )

    placectl(cluster, "zone", "alter", ZONE, "--replicas", "2")
    eventually(lambda: ready(cluster, 2), "zone READY with 2 replicas again")
    eventually(
        lambda: everywhere(cluster, "placement_isr_changes_total", change="shrink") > 0,
        "in-sync sets shrank",
    )

    # Every series the dashboard draws exists on this cluster.
    names: set[str] = set()
    for process in cluster.metrics:
        names |= {key.partition("{")[0] for key in scrape(cluster, process)}
    queried = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            queried |= set(re.findall(r"\bplacement_[a-z_]+", target["expr"]))
    assert queried, "the dashboard queries nothing"
    assert queried <= names, sorted(queried - names)


def test_every_log_line_is_json_with_its_context(cluster: Cluster) -> None:
    placectl(cluster, "zone", "create", "logged", "--partitions", "2", "--replicas", "2")
    time.sleep(1.0)
    placectl(cluster, "zone", "alter", "logged", "--replicas", "3")  # learners join: logged
    eventually(
        lambda: any(
            '"zone": "logged"' in (cluster.base / "logs" / f"{a}.log").read_text()
            for a in agents(cluster)
        ),
        "an agent logged about zone logged",
    )
    with_context = 0
    for process in cluster.metrics:
        lines = (cluster.base / "logs" / f"{process}.log").read_text().splitlines()
        assert lines, process
        for line in lines:
            if ANNOUNCE.match(line):
                continue
            record = json.loads(line)  # every other line is one JSON object
            assert {"ts", "level", "logger", "message", "component"} <= record.keys(), line
            assert record["component"] == ("driver" if process.startswith("driver") else "agent")
            if record.get("zone") == "logged" and "partition" in record and "epoch" in record:
                with_context += 1
    assert with_context, "no line carried zone, partition and epoch"


def test_a_bad_metrics_listen_is_one_line_naming_the_option(tmp_path: Path) -> None:
    (taken,) = free_ports(1)
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        for value, words in (
            ("nonsense", "is not HOST:PORT"),
            (f"127.0.0.1:{taken}", "cannot listen on"),
        ):
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "replica",
                    "--node",
                    "n1",
                    "--listen",
                    "127.0.0.1:0",
                    "--data-dir",
                    str(tmp_path / "n1"),
                    "--metrics-listen",
                    value,
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert result.returncode == 2, (result.stdout, result.stderr)
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1, result.stderr
            assert "--metrics-listen" in lines[0], lines[0]
            assert words in lines[0], lines[0]


def test_zone_status_is_never_ready_early_across_a_leader_kill_and_a_join(
    cluster: Cluster,
) -> None:
    """The failover window of design/observability.md's honest status: the leader SIGKILLed, a
    node registered right after (scale-up delay 0). Every READY answer is checked against etcd
    at the revision it reflects: the new node must hold replicas by then."""
    zone = "failover"
    placectl(
        cluster, "zone", "create", zone, "--partitions", "8", "--replicas", "2",
        "--scale-up-delay", "0",
    )  # fmt: skip
    asyncio.run(_until_ready(cluster, zone, "node-4"))
    leader = leader_of(cluster)
    child = next(c for c in cluster.children if c.name == leader)
    assert child.proc is not None
    child.proc.kill()
    child.proc.wait()
    _start_fourth_agent(cluster)
    seen = asyncio.run(_until_ready(cluster, zone, "node-4", must_hold=True))
    assert seen - {"READY"}, f"never saw the work pending: {seen}"


def _start_fourth_agent(cluster: Cluster) -> None:
    """node-4, started like the others (its own certificate, data dir, listen and metrics
    ports)."""
    import datetime as dt

    from placement.local.certs import create_pki
    from placement.local.cluster import Child
    from placement.security.pki import Role

    assert cluster.pki is not None
    create_pki(cluster.pki.directory, {"node-4": Role.AGENT}, dt.datetime.now(dt.UTC))
    model = next(c for c in cluster.children if c.name == "node-3")
    listen, metrics = free_ports(2)
    argv = [a.replace("node-3", "node-4") for a in model.argv]
    argv[argv.index("--listen") + 1] = f"127.0.0.1:{listen}"
    argv[argv.index("--metrics-listen") + 1] = f"127.0.0.1:{metrics}"
    child = Child("node-4", argv, cluster.base / "logs" / "node-4.log")
    child.start()
    cluster.children.append(child)


async def _until_ready(
    cluster: Cluster, zone: str, newcomer: str, *, must_hold: bool = False
) -> set[str]:
    """Poll the zone's status until READY; every READY is checked in etcd at its revision
    (``must_hold``: ``newcomer`` holds replicas then). Returns the states seen."""
    from placement.api.client import ApiError, PlacementClient
    from placement.metastore.etcd import EtcdClient
    from placement.metastore.keys import AssignField, KeySpace
    from placement.metastore.transitions import partition_states
    from placement.v1 import driver_pb2

    keys = KeySpace(cluster.prefix)
    seen: set[str] = set()
    registered = 0
    deadline = time.monotonic() + EVENTUALLY
    request = driver_pb2.GetZoneRequest(name=zone)
    async with (
        PlacementClient(cluster.driver_apis, tls=cluster.tls("reader")) as api,
        EtcdClient([cluster.etcd_endpoint], credentials=cluster.etcd_credentials()) as etcd,
    ):
        while True:
            assert time.monotonic() < deadline, f"never READY with {newcomer}; saw {seen}"
            if must_hold and not registered:
                node = await etcd.get(keys.node(newcomer))
                if node.first() is None:
                    await asyncio.sleep(0.05)
                    continue
                registered = node.first().mod_revision  # from here on it must count
            try:
                status = await api.call(lambda s, t: s.GetZoneStatus(request, timeout=t))
            except ApiError as e:
                if not e.unavailable:
                    raise
                await asyncio.sleep(0.05)
                continue
            state = driver_pb2.ZoneState.Name(status.state)
            seen.add(state)
            if state == "READY":
                found = await etcd.list_prefix(
                    keys.zone_assign_prefix(zone), revision=status.revision
                )
                states = partition_states(keys, zone, found.kvs, status.revision)
                holding = {n for s in states.values() for n in s.peers(AssignField.STABLE) or ()}
                if not must_hold:
                    return seen
                assert status.revision >= registered
                assert newcomer in holding, f"READY at {status.revision} with {newcomer} empty"
                return seen
            await asyncio.sleep(0.05)


def test_assignments_watch_prints_every_change_as_it_happens(cluster: Cluster) -> None:
    """``placectl assignments ZONE --watch --json``: the current assignments, then a JSON line
    per change (revision order) — here a replica-count change's pending and new stable."""
    zone = "watched"
    placectl(cluster, "zone", "create", zone, "--partitions", "4", "--replicas", "2")
    asyncio.run(_until_ready(cluster, zone, ""))
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "placement", "--endpoint", ",".join(cluster.driver_apis),
            "assignments", zone, "--watch", "--json",
        ],
        env={**os.environ, **cluster.env("reader")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = [json.loads(proc.stdout.readline()) for _ in range(4)]
        assert sorted(line["partition"] for line in first) == [0, 1, 2, 3]
        assert all(len(line["stable"]) == 2 and line["primary"] for line in first)
        placectl(cluster, "zone", "alter", zone, "--replicas", "3")
        widened: set[int] = set()
        revisions = []
        pending = False
        while widened != {0, 1, 2, 3}:
            line = json.loads(proc.stdout.readline())
            revisions.append(line["revision"])
            pending = pending or line["pending"] is not None
            if len(line["stable"]) == 3 and line["pending"] is None:
                widened.add(line["partition"])
        assert pending, "no change showed the pending assignment"
        assert revisions == sorted(revisions)
        assert revisions[0] > first[0]["revision"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
