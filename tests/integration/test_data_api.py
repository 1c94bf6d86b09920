"""The data API end to end: ``placectl data`` and ``placectl workload`` as subprocesses, and the
routing client in-process, against real etcd, 2 drivers and 3 agents (subprocesses started by
``placement.local.cluster``, on the session etcd under a private prefix).

Deadlines scale with ``CI_TIME_MULTIPLIER`` (default 1).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from rich.console import Console
from test_cli_ops import with_terminal_stderr
from test_pair_stream import eventually_true

from placement.data.checker import check_workload
from placement.data.client import (
    LAYOUT_HEADER,
    PRIMARY_HEADER,
    DataClient,
    DriverRoutes,
    ZoneRoutes,
    header_value,
    parse_primary_hint,
)
from placement.data.partitioning import partition_of
from placement.data.workload import run_writers
from placement.local.cluster import Cluster, UpOptions, start_cluster, wait_ready
from placement.rpc import DATA_PROFILE, channel
from placement.security.tls import TlsMaterial
from placement.v1 import common_pb2, data_pb2, data_pb2_grpc


def channel_to(address: str, tls: TlsMaterial | None) -> grpc.aio.Channel:
    """A channel to an agent with ``tls`` (a role's or a node's certificate)."""
    return channel(address, DATA_PROFILE, tls)


EVENTUALLY = 60.0 * float(os.environ.get("CI_TIME_MULTIPLIER", "1"))
ZONE = "kv"
PARTITIONS = 4


def placectl(
    cluster: Cluster, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``placectl``: data and workload commands as the client operator, the rest as admin."""
    role = "client" if args[0] in ("data", "workload") else "admin"
    return subprocess.run(
        [sys.executable, "-m", "placement", "--endpoint", ",".join(cluster.driver_apis), *args],
        env={**os.environ, **cluster.env(role)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]


async def _wait_serving(cluster: Cluster) -> None:
    """Every partition of the zone accepts a write (primaries elected, data service up)."""
    deadline = time.monotonic() + EVENTUALLY
    probes = {}
    i = 0
    while len(probes) < PARTITIONS:
        key = f"probe-{i}".encode()
        probes.setdefault(partition_of(key, PARTITIONS), key)
        i += 1
    async with DataClient(cluster.driver_apis, tls=cluster.tls("client"), deadline=5.0) as client:
        pending = dict(probes)
        last: Exception | None = None
        while pending:
            for p, key in list(pending.items()):
                try:
                    await client.put(ZONE, key, b"ready")
                    await client.delete(ZONE, key)
                    del pending[p]
                except Exception as e:  # any failure: not serving yet
                    last = e
            if pending and time.monotonic() > deadline:
                pytest.fail(f"partitions {sorted(pending)} never accepted a write: {last}")
            if pending:
                await asyncio.sleep(0.3)


@pytest.fixture(scope="module")
def data_cluster(etcd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    prefix = f"/t{uuid.uuid4().hex[:12]}/placement"
    opts = UpOptions(nodes=3, drivers=2, etcd=etcd.endpoint, api_port=0, prefix=prefix)
    base = tmp_path_factory.mktemp("data-cluster")
    cluster = start_cluster(opts, base, Console(quiet=True))
    try:
        asyncio.run(wait_ready(cluster, opts, demo_zone=False))
        ok(
            placectl(
                cluster,
                "zone",
                "create",
                ZONE,
                "--partitions",
                str(PARTITIONS),
                "--replicas",
                "3",
                "--failure-domain",
                "rack",
            )
        )
        ok(placectl(cluster, "zone", "status", ZONE, "--watch", "--json", "--interval", "0.2"))
        asyncio.run(_wait_serving(cluster))
        yield cluster
        # checked before the stop: agents stopping one by one may log their peers' absence
        for log in (base / "logs").glob("*.log"):
            text = log.read_text(errors="replace")
            assert "Traceback" not in text, f"unexpected traceback in {log}:\n{text[-4000:]}"
    finally:
        cluster.stop()


def test_put_get_delete_scan_through_the_cli(data_cluster: Cluster) -> None:
    c = data_cluster
    keys = [f"cli-{i:02d}" for i in range(12)]
    for k in keys:
        out = ok(placectl(c, "data", "put", ZONE, k, f"value of {k}"))
        assert out.startswith(f"put {k}: index ")
    assert ok(placectl(c, "data", "get", ZONE, "cli-03")) == "value of cli-03\n"
    got = json.loads(ok(placectl(c, "data", "get", ZONE, "cli-04", "--json")))
    assert got == {"key": "cli-04", "value": "value of cli-04"}

    scanned = json.loads(ok(placectl(c, "data", "scan", ZONE, "--prefix", "cli-", "--json")))
    assert [i["key"] for i in scanned["items"]] == keys  # every partition, merged in key order
    assert scanned["count"] == len(keys)
    lines = ok(placectl(c, "data", "scan", ZONE, "--prefix", "cli-1")).splitlines()
    assert lines == [f"{k}\tvalue of {k}" for k in keys if k.startswith("cli-1")]

    assert ok(placectl(c, "data", "delete", ZONE, "cli-03")) == "deleted cli-03\n"
    assert ok(placectl(c, "data", "delete", ZONE, "cli-03")) == "cli-03 did not exist\n"
    missing = placectl(c, "data", "get", ZONE, "cli-03")
    assert missing.returncode == 1
    assert missing.stdout == ""
    assert "not found" in missing.stderr

    # binary keys and values with --hex
    ok(placectl(c, "data", "put", ZONE, "00ff10", "deadbeef00", "--hex"))
    assert ok(placectl(c, "data", "get", ZONE, "00ff10", "--hex")) == "deadbeef00\n"
    hexed = json.loads(ok(placectl(c, "data", "scan", ZONE, "--prefix", "00ff", "--hex", "--json")))
    assert hexed["items"] == [{"key": "00ff10", "value": "deadbeef00"}]


def test_data_and_workload_answer_as_json_or_yaml(data_cluster: Cluster, tmp_path: Path) -> None:
    """``-o json`` and ``-o yaml`` give the same data; ``workload run`` draws its bar on a
    terminal's stderr only, never on stdout."""
    c = data_cluster

    def both(*args: str) -> Any:
        as_json = json.loads(ok(placectl(c, *args, "-o", "json")))
        assert yaml.safe_load(ok(placectl(c, *args, "-o", "yaml"))) == as_json, args
        return as_json

    put = json.loads(ok(placectl(c, "data", "put", ZONE, "fmt-1", "yes", "-o", "json")))
    assert (put["key"], put["index"] > 0) == ("fmt-1", True)
    put = yaml.safe_load(ok(placectl(c, "data", "put", ZONE, "fmt-2", "1.0", "-o", "yaml")))
    assert put["key"] == "fmt-2"
    assert both("data", "get", ZONE, "fmt-1") == {"key": "fmt-1", "value": "yes"}
    scanned = both("data", "scan", ZONE, "--prefix", "fmt-")
    assert scanned["items"] == [
        {"key": "fmt-1", "value": "yes"},
        {"key": "fmt-2", "value": "1.0"},  # a YAML number-looking string stays a string
    ]
    assert ok(placectl(c, "data", "get", ZONE, "fmt-1", "-o", "wide")) == "yes\n"
    deleted = yaml.safe_load(ok(placectl(c, "data", "delete", ZONE, "fmt-2", "-o", "yaml")))
    assert deleted["existed"] is True

    record = tmp_path / "fmt.jsonl"
    run = [
        "workload", "run", "--zone", ZONE, "--writers", "2", "--keys-per-writer", "5",
        "--duration", "2", "--record", str(record),
    ]  # fmt: skip
    stats = yaml.safe_load(ok(placectl(c, *run, "-o", "yaml")))
    assert stats["acked"] > 0
    assert stats["zone"] == ZONE
    piped = placectl(c, *run)
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == ""  # stderr is a pipe: no bar
    code, out, drawn = with_terminal_stderr(
        [sys.executable, "-m", "placement", "--endpoint", ",".join(c.driver_apis), *run],
        {**os.environ, **c.env("client")},
    )
    assert code == 0, drawn
    assert out.startswith("run ")
    assert len(out.splitlines()) == 1  # the bar never reaches stdout
    assert "writing" in drawn
    assert "2/2" in drawn  # the seconds of --duration, all done
    assert " acknowledged, 0 failed" in drawn
    code, out, drawn = with_terminal_stderr(
        [sys.executable, "-m", "placement", "--endpoint", ",".join(c.driver_apis), *run, "--json"],
        {**os.environ, **c.env("client")},
    )
    assert code == 0, drawn
    assert json.loads(out)["acked"] > 0
    assert drawn == ""  # -o json: no bar even on a terminal
    verdict = both("workload", "check", "--zone", ZONE, "--record", str(record))
    assert verdict["ok"] is True, verdict


def test_bad_cli_input_is_one_line_and_exit_2(data_cluster: Cluster, tmp_path: Path) -> None:
    c = data_cluster
    one_line_error(placectl(c, "data", "put", ZONE, "", "v"), 2, "KEY")
    one_line_error(placectl(c, "data", "get", ZONE, "zz", "--hex"), 2, "KEY", "not hex")
    one_line_error(placectl(c, "data", "put", ZONE, "6b", "xyz", "--hex"), 2, "VALUE", "not hex")
    one_line_error(placectl(c, "data", "scan", ZONE, "--prefix", "q", "--hex"), 2, "--prefix")
    one_line_error(placectl(c, "data", "get", "no-such-zone", "k"), 2, "no-such-zone")
    one_line_error(
        placectl(c, "workload", "run", "--zone", ZONE, "--writers", "0", "--record", "x"),
        2,
        "--writers",
    )
    one_line_error(
        placectl(c, "workload", "check", "--zone", ZONE, "--record", str(tmp_path / "none")),
        2,
        "--record",
    )


async def test_a_key_sent_to_a_non_primary_is_redirected(data_cluster: Cluster) -> None:
    c = data_cluster
    key = b"redirect-me"
    async with DataClient(c.driver_apis, tls=c.tls("client")) as client:
        routes = await client.routes(ZONE, refresh=True)
        p = partition_of(key, routes.partitions)
        primary = routes.route(p).primary
        other = next(n for n in routes.route(p).stable if n != primary)
        assert primary

        # straight to the agent: FAILED_PRECONDITION naming the primary
        async with channel_to(routes.addresses[other], c.tls("client")) as channel:
            stub = data_pb2_grpc.DataServiceStub(channel)
            request = data_pb2.PutRequest(
                partition=common_pb2.PartitionRef(zone=ZONE, partition=p), key=key, value=b"x"
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Put(request, timeout=10)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        hint = parse_primary_hint(header_value(caught.value.trailing_metadata(), PRIMARY_HEADER))
        assert hint is not None
        assert (hint.node, hint.address) == (primary, routes.addresses[primary])

    # a client whose table names the wrong primary follows the redirect and learns the right one
    class WrongPrimary(DriverRoutes):
        async def load(self, zone: str) -> ZoneRoutes:
            loaded = await super().load(zone)
            wrong = list(loaded.routes)
            wrong[p] = replace(wrong[p], primary=other)
            return replace(loaded, routes=tuple(wrong))

    async with DataClient(
        c.driver_apis,
        tls=c.tls("client"),
        route_source=WrongPrimary(c.driver_apis, tls=c.tls("client")),
    ) as client:
        await client.put(ZONE, key, b"redirected")
        assert (await client.routes(ZONE)).route(p).primary == primary
        assert await client.get(ZONE, key) == b"redirected"


async def test_a_request_under_another_layout_generation_is_refused_naming_the_layout(
    data_cluster: Cluster,
) -> None:
    """design/resharding.md, "Routing": an agent serves only the generation in force; another
    one gets FAILED_PRECONDITION with x-layout, and the routing client re-reads the layout."""
    c = data_cluster
    key = b"layout-check"
    async with DataClient(c.driver_apis, tls=c.tls("client")) as client:
        routes = await client.routes(ZONE, refresh=True)
        assert routes.layout > 0  # the leader wrote the zone's first layout
        p = partition_of(key, routes.partitions)
        primary = routes.route(p).primary
        async with channel_to(routes.addresses[primary], c.tls("client")) as channel:
            stub = data_pb2_grpc.DataServiceStub(channel)
            for generation in (routes.layout + 1, routes.layout - 1):
                ref = common_pb2.PartitionRef(zone=ZONE, partition=p, generation=generation)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.Put(data_pb2.PutRequest(partition=ref, key=key, value=b"x"))
                assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert f"not {generation}" in (caught.value.details() or "")
                trailers = caught.value.trailing_metadata()
                assert (
                    header_value(trailers, LAYOUT_HEADER) == f"{routes.layout}/{routes.partitions}"
                )
                # and where the key goes under that layout: its primary, to retry at once
                hint = f"{primary}@{routes.addresses[primary]}"
                assert header_value(trailers, PRIMARY_HEADER) == hint
            # the right generation, and none at all (0: only the key's partition is checked)
            for generation in (routes.layout, 0):
                ref = common_pb2.PartitionRef(zone=ZONE, partition=p, generation=generation)
                await stub.Put(data_pb2.PutRequest(partition=ref, key=key, value=b"ok"))
        # nothing was written under the wrong generations
        assert await client.get(ZONE, key) == b"ok"

    class StaleLayout(DriverRoutes):
        """A table read under an older generation, the first time only."""

        loads = 0

        async def load(self, zone: str) -> ZoneRoutes:
            loaded = await super().load(zone)
            StaleLayout.loads += 1
            return replace(loaded, layout=loaded.layout - 1) if StaleLayout.loads == 1 else loaded

    async with DataClient(
        c.driver_apis,
        tls=c.tls("client"),
        route_source=StaleLayout(c.driver_apis, tls=c.tls("client")),
    ) as client:
        await client.put(ZONE, key, b"relayout")
        # refused once (the agent's x-primary hint sends it on at once), the routes re-read in
        # the background: wait for that re-read, bounded, rather than racing it
        await eventually_true(lambda: StaleLayout.loads == 2, within=10)
        assert (await client.routes(ZONE)).layout == routes.layout
        assert await client.get(ZONE, key) == b"relayout"


async def test_write_batch_answers_each_op_as_put_or_delete_would(data_cluster: Cluster) -> None:
    """design/data-plane.md, "Client batches": one call, each op answered on its own — applied,
    redirected to its primary, refused as invalid — and a malformed call writes nothing."""
    c = data_cluster
    async with DataClient(c.driver_apis, tls=c.tls("client")) as client:
        routes = await client.routes(ZONE, refresh=True)
        primary = routes.route(0).primary
        led = [p for p in range(routes.partitions) if routes.route(p).primary == primary]
        other = next(p for p in range(routes.partitions) if routes.route(p).primary != primary)
        keys: dict[int, bytes] = {}
        i = 0
        while len(keys) < routes.partitions:
            key = f"batch-{i}".encode()
            keys.setdefault(partition_of(key, routes.partitions), key)
            i += 1
        await client.put(ZONE, keys[led[0]], b"before")

        def ref(p: int) -> common_pb2.PartitionRef:
            return common_pb2.PartitionRef(zone=ZONE, partition=p, generation=routes.layout)

        ops = [
            *(data_pb2.WriteOp(partition=ref(p), key=keys[p], value=b"batched") for p in led),
            data_pb2.WriteOp(partition=ref(led[0]), key=keys[led[0]], delete=True),
            data_pb2.WriteOp(partition=ref(other), key=keys[other], value=b"elsewhere"),
            data_pb2.WriteOp(partition=ref(led[0]), key=b"", value=b"no key"),
        ]
        async with channel_to(routes.addresses[primary], c.tls("client")) as channel:
            stub = data_pb2_grpc.DataServiceStub(channel)
            reply = await stub.WriteBatch(data_pb2.WriteBatchRequest(ops=ops), timeout=10)
            for bad in ([], [ops[0]] * 1025):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.WriteBatch(data_pb2.WriteBatchRequest(ops=bad), timeout=10)
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "ops" in (caught.value.details() or "")
                assert "1..1024" in (caught.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                async with channel_to(routes.addresses[primary], c.tls("reader")) as reader:
                    await data_pb2_grpc.DataServiceStub(reader).WriteBatch(
                        data_pb2.WriteBatchRequest(ops=ops[:1]), timeout=10
                    )
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        outcomes = list(reply.outcomes)
        assert len(outcomes) == len(ops)
        applied = outcomes[: len(led) + 1]
        assert [o.code for o in applied] == [0] * len(applied)
        assert all(o.result.index > 0 and o.result.lease_epoch > 0 for o in applied)
        assert applied[-1].result.existed  # the delete saw the batch's own put
        redirected = outcomes[len(led) + 1]
        assert redirected.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        hint = parse_primary_hint(redirected.primary)
        assert hint is not None
        assert hint.node == routes.route(other).primary
        invalid = outcomes[-1]
        assert invalid.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "key" in invalid.detail
        assert await client.get(ZONE, keys[led[0]]) is None
        for p in led[1:]:
            assert await client.get(ZONE, keys[p]) == b"batched"
        assert await client.get(ZONE, keys[other]) is None  # refused, not written

        # the client: concurrent writes to one agent share calls; each is acknowledged alone
        many = {f"shared-{i}".encode(): f"v{i}".encode() for i in range(200)}
        calls_before, writes_before = client.write_batches()
        await asyncio.gather(*(client.put(ZONE, k, v) for k, v in many.items()))
        calls, writes = client.write_batches()
        assert writes - writes_before == len(many)
        assert calls - calls_before < len(many) // 2
        for k, v in many.items():
            assert await client.get(ZONE, k) == v


async def test_workload_in_process_then_checked(data_cluster: Cluster, tmp_path: Path) -> None:
    c = data_cluster
    record = tmp_path / "in-process.jsonl"
    async with DataClient(c.driver_apis, tls=c.tls("client")) as client:
        stats = await run_writers(client, ZONE, 4, 10, 3.0, record, seed=3, readers=2)
        assert stats.acked > 0
        assert stats.failures == {}
        assert stats.p50 <= stats.p99
        result = await check_workload(client, ZONE, record)
    assert result.ok, result.as_json()
    assert result.acked_writes == stats.acked
    assert result.reads == stats.reads > 0  # every key's reads held to linearizability
    assert result.partitions_checked == PARTITIONS
    assert result.replicas_checked == 3 * PARTITIONS


def test_workload_run_and_check_through_the_cli(data_cluster: Cluster, tmp_path: Path) -> None:
    c = data_cluster
    record = tmp_path / "cli.jsonl"
    run = placectl(
        c, "workload", "run", "--zone", ZONE, "--writers", "4", "--keys-per-writer", "10",
        "--duration", "3", "--record", str(record), "--json",
    )  # fmt: skip
    stats = json.loads(ok(run))
    assert stats["acked"] > 0
    assert stats["failures"] == {}
    checked = placectl(c, "workload", "check", "--zone", ZONE, "--record", str(record), "--json")
    verdict = json.loads(ok(checked))
    assert verdict["ok"] is True, verdict
    assert verdict["acked_writes"] == stats["acked"]
    assert verdict["lost"] == verdict["wrong"] == verdict["divergent_replicas"] == 0
    human = placectl(c, "workload", "check", "--zone", ZONE, "--record", str(record))
    assert ok(human).startswith("OK: zone kv run ")

    # a record that claims an acknowledged write the zone does not hold fails the check (exit 1)
    lines = record.read_text().splitlines()
    header = json.loads(lines[0])
    forged = tmp_path / "forged.jsonl"
    forged.write_text(
        "\n".join(
            [
                lines[0],
                json.dumps(
                    {
                        "t": "attempt",
                        "w": 0,
                        "seq": 1,
                        "key": f"{header['key_prefix']}ghost",
                        "op": "put",
                        "value": "v1",
                    }
                ),
                json.dumps({"t": "ack", "w": 0, "seq": 1, "index": 1, "epoch": 1}),
            ]
        )
        + "\n"
    )
    failed = placectl(
        c, "workload", "check", "--zone", ZONE, "--record", str(forged), "--settle", "0"
    )
    assert failed.returncode == 1, (failed.stdout, failed.stderr)
    assert failed.stdout.startswith("FAILED")
    assert "ghost" in failed.stdout


async def test_replicate_refuses_bad_calls_and_changes_nothing(data_cluster: Cluster) -> None:
    """The pair stream's ``Replicate``: a call meant for another node, a malformed partition or
    too many appends get a clear status naming the field, and no append is applied."""
    async with DataClient(data_cluster.driver_apis, tls=data_cluster.tls("client")) as client:
        routes = await client.routes(ZONE, refresh=True)
    node, address = sorted(routes.addresses.items())[0]
    sender = next(n for n in sorted(routes.addresses) if n != node)
    before = await _settled_replica_state(address, data_cluster)
    good = data_pb2.AppendRequest(
        partition=common_pb2.PartitionRef(zone=ZONE, partition=0), lease_epoch=1 << 40
    )
    bad_ref = common_pb2.PartitionRef(zone="no such", partition=0)
    bad_zone = data_pb2.AppendRequest(partition=bad_ref)
    cases = [
        (
            data_pb2.ReplicateRequest(from_node=sender, to_node=f"{node}-other", appends=[good]),
            grpc.StatusCode.FAILED_PRECONDITION,
            "not",
        ),
        (
            data_pb2.ReplicateRequest(from_node=sender, to_node=node, appends=[good, bad_zone]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "appends[1].partition.zone",
        ),
        (
            data_pb2.ReplicateRequest(from_node=sender, to_node=node, appends=[good] * 4097),
            grpc.StatusCode.INVALID_ARGUMENT,
            "appends",
        ),
        (
            data_pb2.ReplicateRequest(from_node="", to_node=node, appends=[good]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "from_node",
        ),
        (  # a node speaks only for itself: the sender is the name in its certificate
            data_pb2.ReplicateRequest(from_node=node, to_node=node, appends=[good]),
            grpc.StatusCode.PERMISSION_DENIED,
            f"its certificate names {sender!r}",
        ),
    ]
    async with channel_to(address, data_cluster.tls(sender)) as channel:
        stub = data_pb2_grpc.ReplicationServiceStub(channel)
        for request, code, words in cases:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await replicate(stub, request)
            assert caught.value.code() == code, caught.value
            assert words in (caught.value.details() or ""), caught.value.details()
        # the pair heartbeat: an empty call is answered with no replies
        empty = await replicate(stub, data_pb2.ReplicateRequest(from_node=sender, to_node=node))
        assert list(empty.replies) == []
    # only agents replicate: a client certificate may not call Replicate at all
    async with channel_to(address, data_cluster.tls("client")) as channel:
        stub = data_pb2_grpc.ReplicationServiceStub(channel)
        # The role check refuses on the certificate alone, before any message is read, so the
        # stream is opened and read without a write: a write racing the refusal fails in the
        # client's own transport and grpc.aio then ends the call INTERNAL on its side, hiding
        # the server's status (a race CI hit).
        stream: Any = stub.Replicate(timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stream.read()
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, caught.value
        assert "needs role agent" in (caught.value.details() or "")
    assert await _replica_state(address, data_cluster) == before
    # Had the huge epoch been applied, partition 0's replica on that node would fence its primary
    # out (STALE_EPOCH) and no write of partition 0 could be acknowledged any more.
    await _partition_0_still_written(data_cluster, "fence")


async def test_an_append_its_sender_does_not_hold_the_lease_for_is_refused(
    data_cluster: Cluster,
) -> None:
    """design/data-plane.md, "Who may append": a follower applies an append only when its view
    of etcd shows the append's sender holding the partition's lease at that epoch. Appends with
    a huge epoch — from the real primary's name, from another member's — and one whose sender
    is not the node it names are answered UNPROVEN and change nothing; one below the lease's
    epoch is STALE_EPOCH. The real primary still writes afterwards."""
    async with DataClient(data_cluster.driver_apis, tls=data_cluster.tls("client")) as client:
        routes = await client.routes(ZONE, refresh=True)
    holder = routes.route(0).primary
    follower = next(n for n in routes.route(0).stable if n != holder)
    other = next(n for n in routes.route(0).stable if n not in (holder, follower))
    address = routes.addresses[follower]
    last, _ = before = await _settled_replica_state(address, data_cluster)
    ref = common_pb2.PartitionRef(zone=ZONE, partition=0)

    def append(sender: str, primary: str, epoch: int) -> data_pb2.ReplicateRequest:
        entry = data_pb2.LogEntry(index=last + 1, epoch=epoch, key=b"forged", value=b"x")
        call = data_pb2.AppendRequest(
            partition=ref,
            lease_epoch=epoch,
            primary=primary,
            prev_index=last,
            prev_epoch=0,
            entries=[entry],
            commit_index=last + 1,
        )
        return data_pb2.ReplicateRequest(from_node=sender, to_node=follower, appends=[call])

    cases = [
        (append(holder, holder, 1 << 40), data_pb2.APPEND_UNPROVEN),
        (append(other, other, 1 << 40), data_pb2.APPEND_UNPROVEN),
        (append(other, holder, 1 << 40), data_pb2.APPEND_UNPROVEN),
        (append(holder, holder, 0), data_pb2.APPEND_STALE_EPOCH),
    ]
    for request, outcome in cases:
        # each sent with the certificate of the node it names as its sender
        async with channel_to(address, data_cluster.tls(request.from_node)) as channel:
            stub = data_pb2_grpc.ReplicationServiceStub(channel)
            reply = await replicate(stub, request)
            assert [r.outcome for r in reply.replies] == [outcome], request
    # and an agent cannot speak for the lease holder: its certificate names another node
    async with channel_to(address, data_cluster.tls(other)) as channel:
        stub = data_pb2_grpc.ReplicationServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await replicate(stub, append(holder, holder, 1 << 40))
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, caught.value
    assert await _replica_state(address, data_cluster) == before
    await _partition_0_still_written(data_cluster, "proof")
    assert (await _replica_state(address, data_cluster))[0] > last


async def replicate(
    stub: data_pb2_grpc.ReplicationServiceStub, request: data_pb2.ReplicateRequest
) -> data_pb2.ReplicateResponse:
    """``request`` as the one request of a ``Replicate`` stream: its answer, or the status the
    stream ended with (AioRpcError)."""
    stream: Any = stub.Replicate(timeout=10)
    try:
        await stream.write(request)
        await stream.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        # The server ended the stream first (e.g. refused the caller at once): the write fails
        # with a transport error; the status it ended with comes from the read, as for
        # ``replica.data.peers`` (the agent's own stream).
        pass
    reply = await stream.read()
    if reply is grpc.aio.EOF:
        raise AssertionError(f"the stream ended with no answer: {await stream.code()}")
    return reply  # type: ignore[no-any-return]


async def _partition_0_still_written(cluster: Cluster, prefix: str) -> None:
    """Partition 0's real primary still acknowledges a write (and reads it back)."""
    keys = (f"{prefix}-{i}".encode() for i in range(999))
    key = next(k for k in keys if partition_of(k, PARTITIONS) == 0)
    async with DataClient(cluster.driver_apis, tls=cluster.tls("client"), deadline=20.0) as client:
        await client.put(ZONE, key, b"still written")
        assert await client.get(ZONE, key) == b"still written"


async def _settled_replica_state(address: str, cluster: Cluster) -> tuple[int, int]:
    """``_replica_state`` once the replica's commit index has caught up with its log: a
    follower learns the last commits from the primary's commit notice a moment after the
    writes of the tests before, which would otherwise look like a change made by this one."""
    deadline = time.monotonic() + 30
    while True:
        state = await _replica_state(address, cluster)
        if state[0] == state[1] or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.1)


async def _replica_state(address: str, cluster: Cluster) -> tuple[int, int]:
    async with channel_to(address, cluster.tls("reader")) as channel:
        stub = data_pb2_grpc.ReplicationServiceStub(channel)
        reply = await stub.ReadReplica(
            data_pb2.ReadReplicaRequest(partition=common_pb2.PartitionRef(zone=ZONE, partition=0)),
            timeout=10,
        )
    return reply.last_index, reply.commit_index
