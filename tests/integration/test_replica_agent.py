"""A real replica agent subprocess over real gRPC: idempotence, staleness, crash recovery, cancel.

Most tests run the real entry point ``python -m replica``. Tests that need a move to *stay* in
progress run the same ``serve()`` with one injected ``CatchUp`` (the seam the data issue fills):
it creates the partial replica like the real one, then finishes only once the test opens a gate
file — a stand-in for a long data copy that the test controls, never a timed sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from placement.driver.agents import AgentAnswer, AgentClient, AgentUnavailable
from placement.errors import PlacementError, StoreUnavailable
from placement.metastore.codec import (
    Assignment,
    InSyncSet,
    PrimaryLease,
    decode_isr,
    encode_assignment,
    encode_isr,
    encode_primary,
)
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import AssignField, KeySpace
from placement.v1 import common_pb2, replica_pb2, replica_pb2_grpc
from replica.data.model import Unavailable
from replica.data.plane import DataPlane
from replica.protocol import (
    MoveRequest,
    PartitionRecord,
    Phase,
    RebalanceOutcome,
    RetireOutcome,
    RetireRequest,
)
from replica.records import AgentStore, ReplicaRow, StoreThread
from replica.service import ISR_READ_TIMEOUT, ReplicaAgent

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 20.0 * float(os.environ.get("TEST_TIMEOUT_MULTIPLIER", "1"))
CALL_TIMEOUT = 10.0
ZONE = "orders"

_GATED_AGENT = """
import asyncio, sys
from pathlib import Path
from replica.server import serve
from replica.service import record_catch_up

gate = Path(sys.argv[4])

async def gated_catch_up(job, db):
    await record_catch_up(job, db)
    while not gate.exists():
        await asyncio.sleep(0.01)

sys.exit(asyncio.run(serve(sys.argv[1], sys.argv[2], Path(sys.argv[3]), catch_up=gated_catch_up)))
"""


class Agent:
    """One agent process, its channel and stub; ``gate`` exists only for gated agents."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        port: int,
        data_dir: Path,
        log: Path,
        gate: Path | None,
    ) -> None:
        self.proc = proc
        self.port = port
        self.data_dir = data_dir
        self.log = log
        self.gate = gate
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.stub = replica_pb2_grpc.ReplicaServiceStub(self.channel)

    def open_gate(self) -> None:
        assert self.gate is not None
        self.gate.touch()

    async def kill(self) -> None:
        """SIGKILL: a crash, no graceful anything."""
        self.proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(self.proc.wait(), TIMEOUT)
        await self.channel.close()

    async def terminate(self) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self.proc.wait(), TIMEOUT)
        await self.channel.close()
        return code


class Agents:
    """Starts agents on free ports; at teardown stops them with SIGTERM (must exit 0) and fails
    on any traceback in their logs."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[Agent] = []

    async def start(self, data_dir: Path, *, node: str = "n1", gated: bool = False) -> Agent:
        index = len(self.started)
        log = self.tmp_path / f"agent{index}.log"
        gate = self.tmp_path / f"gate{index}" if gated else None
        args = ["--node", node, "--listen", "127.0.0.1:0", "--data-dir", str(data_dir)]
        if gate is None:
            command = [sys.executable, "-m", "replica", *args]
        else:
            command = [
                sys.executable,
                "-c",
                _GATED_AGENT,
                node,
                "127.0.0.1:0",
                str(data_dir),
                str(gate),
            ]
        with log.open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                *command,
                cwd=ROOT,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                stdin=asyncio.subprocess.DEVNULL,
            )
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), TIMEOUT)).decode()
        if not line.startswith(f"agent {node} listening on 127.0.0.1:"):
            await proc.wait()
            pytest.fail(
                f"agent did not start (exit {proc.returncode}): {line!r}\n{log.read_text()}"
            )
        agent = Agent(proc, int(line.rsplit(":", 1)[1]), data_dir, log, gate)
        self.started.append(agent)
        return agent

    async def close(self) -> None:
        for agent in self.started:
            if agent.proc.returncode is None:
                assert await agent.terminate() == 0, agent.log.read_text()
        for agent in self.started:
            text = agent.log.read_text()
            assert "Traceback" not in text, text


@pytest.fixture
async def agents(tmp_path: Path) -> AsyncIterator[Agents]:
    pool = Agents(tmp_path)
    try:
        yield pool
    finally:
        await pool.close()


def rebalance_request(
    partition: int, old: list[str], new: list[str], revision: int, epoch: int = 1
) -> replica_pb2.RebalanceRequest:
    return replica_pb2.RebalanceRequest(
        partition=common_pb2.PartitionRef(zone=ZONE, partition=partition),
        old_peers=common_pb2.Peers(names=old),
        new_peers=common_pb2.Peers(names=new),
        revision=revision,
        epoch=epoch,
    )


def cancel_request(
    partition: int, old: list[str], new: list[str], revision: int, epoch: int = 1
) -> replica_pb2.CancelRebalanceRequest:
    return replica_pb2.CancelRebalanceRequest(
        partition=common_pb2.PartitionRef(zone=ZONE, partition=partition),
        old_peers=common_pb2.Peers(names=old),
        new_peers=common_pb2.Peers(names=new),
        revision=revision,
        epoch=epoch,
    )


#: n1 joins (it has to catch up) / n1 leaves (nothing to copy: done at once, replica kept).
JOIN = (["n2", "n3"], ["n1", "n2"])
LEAVE = (["n1", "n2"], ["n2", "n3"])


async def state(agent: Agent, partition: int) -> replica_pb2.GetPartitionStateResponse:
    ref = common_pb2.PartitionRef(zone=ZONE, partition=partition)
    answer: replica_pb2.GetPartitionStateResponse = await agent.stub.GetPartitionState(
        replica_pb2.GetPartitionStateRequest(partition=ref), timeout=CALL_TIMEOUT
    )
    return answer


async def known(agent: Agent, partition: int) -> replica_pb2.GetPartitionStateResponse | None:
    """The partition's state, or None when the agent answers NOT_FOUND."""
    try:
        return await state(agent, partition)
    except grpc.aio.AioRpcError as e:
        if e.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return None


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out after {TIMEOUT}s waiting for {what}")
        await asyncio.sleep(0.02)


async def finished(agent: Agent, partition: int) -> None:
    async def done() -> bool:
        return not (await state(agent, partition)).rebalance_in_progress

    await eventually(done, f"partition {partition} to finish its move")


def journal(data_dir: Path, partition: int) -> list[str]:
    store = AgentStore.inspect(data_dir)
    try:
        return [entry.effect for entry in store.journal(ZONE, partition)]
    finally:
        store.close()


def inspect(data_dir: Path, partition: int) -> tuple[PartitionRecord | None, ReplicaRow | None]:
    """(record, replica row) as persisted on disk."""
    store = AgentStore.inspect(data_dir)
    try:
        return store.load(ZONE, partition), store.replica(ZONE, partition)
    finally:
        store.close()


# --- the server ----------------------------------------------------------------------------------


async def test_health_is_serving_and_reflection_lists_the_replica_service(
    agents: Agents, tmp_path: Path
) -> None:
    agent = await agents.start(tmp_path / "data")
    health = health_pb2_grpc.HealthStub(agent.channel)
    for service in ("", "placement.v1.ReplicaService"):
        answer = await health.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=CALL_TIMEOUT
        )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    call = reflection_pb2_grpc.ServerReflectionStub(agent.channel).ServerReflectionInfo(
        timeout=CALL_TIMEOUT
    )
    await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    listed = await call.read()
    await call.done_writing()
    names = {s.name for s in listed.list_services_response.service}
    assert {"placement.v1.ReplicaService", "grpc.health.v1.Health"} <= names


# --- idempotence and staleness -------------------------------------------------------------------


async def test_twenty_concurrent_identical_rebalances_answer_alike_and_act_once(
    agents: Agents, tmp_path: Path
) -> None:
    agent = await agents.start(tmp_path / "data", gated=True)
    request = rebalance_request(0, *JOIN, revision=7, epoch=3)
    answers = await asyncio.gather(
        *(agent.stub.Rebalance(request, timeout=CALL_TIMEOUT) for _ in range(20))
    )
    assert {a.outcome for a in answers} == {replica_pb2.ACCEPTED}
    assert {(a.accepted_revision, a.accepted_epoch) for a in answers} == {(7, 3)}
    assert (await state(agent, 0)).rebalance_in_progress
    assert journal(agent.data_dir, 0) == ["StartCatchUp"]

    agent.open_gate()
    await finished(agent, 0)
    replays = await asyncio.gather(
        *(agent.stub.Rebalance(request, timeout=CALL_TIMEOUT) for _ in range(20))
    )
    assert all(r == replays[0] for r in replays)
    assert replays[0].outcome == replica_pb2.DONE
    assert journal(agent.data_dir, 0) == ["StartCatchUp", "CreateReplica"]
    final = await state(agent, 0)
    assert list(final.current_peers.names) == JOIN[1]


async def test_concurrent_rebalances_go_in_few_batch_calls_answered_as_single_calls(
    agents: Agents, tmp_path: Path
) -> None:
    """The driver's client sends what it has for one agent in RebalanceBatch calls: 200
    concurrent moves (a leave each: DONE at once) take a handful of calls, every answer is the
    one Rebalance gives for the same request, and one invalid request among them is refused
    alone, naming the field; Retire requests likewise in RetireBatch calls."""
    agent = await agents.start(tmp_path / "data")
    address = f"127.0.0.1:{agent.port}"
    client = AgentClient(timeout=CALL_TIMEOUT)
    try:
        old, new = (tuple(names) for names in LEAVE)
        results = await asyncio.gather(
            *(client.rebalance(address, ZONE, p, old, new, 100 + p, 1) for p in range(200)),
            client.rebalance(address, ZONE, 999_999, old, new, 5, 1),
            return_exceptions=True,
        )
        *answers, invalid = results
        assert all(isinstance(a, AgentAnswer) for a in answers), answers
        assert [a.outcome for a in answers] == ["DONE"] * 200  # type: ignore[union-attr]
        assert isinstance(invalid, AgentUnavailable)
        assert "INVALID_ARGUMENT" in str(invalid)
        assert "partition" in str(invalid)
        assert 1 <= client.batch_calls <= 10
        assert client.batched == 201
        for p in (0, 77, 199):  # the single call answers the same (a replay)
            single = await agent.stub.Rebalance(
                rebalance_request(p, *LEAVE, revision=100 + p), timeout=CALL_TIMEOUT
            )
            assert single.outcome == replica_pb2.DONE
            assert (single.accepted_revision, single.accepted_epoch) == (
                answers[p].accepted_revision,  # type: ignore[union-attr]
                answers[p].accepted_epoch,  # type: ignore[union-attr]
            )
            assert (await state(agent, p)).accepted_revision == 100 + p
        # retires batch the same way: stable no longer names n1 (RETIRED), or names it (KEPT)
        calls = client.batch_calls
        retired = await asyncio.gather(
            *(
                client.retire(address, ZONE, p, ("n2", "n3") if p % 2 else ("n1", "n2"), 400, 1)
                for p in range(200)
            )
        )
        assert [a.outcome for a in retired] == ["KEPT", "RETIRED"] * 100
        assert 1 <= client.batch_calls - calls <= 10
        single = await agent.stub.Retire(
            retire_request(1, ["n2", "n3"], 400, 1), timeout=CALL_TIMEOUT
        )
        assert single.outcome == replica_pb2.RETIRED
        assert not (await state(agent, 1)).hosted
    finally:
        await client.close()


async def test_older_revision_is_stale_and_a_replay_is_answered_identically(
    agents: Agents, tmp_path: Path
) -> None:
    agent = await agents.start(tmp_path / "data")
    first = await agent.stub.Rebalance(
        rebalance_request(1, *LEAVE, revision=10, epoch=2), timeout=CALL_TIMEOUT
    )
    assert first.outcome == replica_pb2.DONE
    replay = await agent.stub.Rebalance(
        rebalance_request(1, *LEAVE, revision=10, epoch=2), timeout=CALL_TIMEOUT
    )
    assert replay == first
    older = await agent.stub.Rebalance(
        rebalance_request(1, *LEAVE, revision=9, epoch=5), timeout=CALL_TIMEOUT
    )
    assert older.outcome == replica_pb2.STALE
    assert (older.accepted_revision, older.accepted_epoch) == (10, 2)
    lower_epoch = await agent.stub.Rebalance(
        rebalance_request(1, *LEAVE, revision=10, epoch=1), timeout=CALL_TIMEOUT
    )
    assert lower_epoch.outcome == replica_pb2.STALE
    adopted = await agent.stub.Rebalance(
        rebalance_request(1, *LEAVE, revision=10, epoch=4), timeout=CALL_TIMEOUT
    )
    assert (adopted.outcome, adopted.accepted_epoch) == (replica_pb2.DONE, 4)
    now = await state(agent, 1)
    assert (now.accepted_revision, now.accepted_epoch, list(now.current_peers.names)) == (
        10,
        4,
        LEAVE[1],
    )
    assert journal(agent.data_dir, 1) == []


# --- crashes -------------------------------------------------------------------------------------


async def test_sigkill_mid_rebalance_then_restart_resumes_and_keeps_the_accepted_revision(
    agents: Agents, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    agent = await agents.start(data, gated=True)
    joining = await agent.stub.Rebalance(
        rebalance_request(0, *JOIN, revision=20, epoch=2), timeout=CALL_TIMEOUT
    )
    leaving = await agent.stub.Rebalance(
        rebalance_request(1, *LEAVE, revision=21, epoch=2), timeout=CALL_TIMEOUT
    )
    assert (joining.outcome, leaving.outcome) == (replica_pb2.ACCEPTED, replica_pb2.DONE)
    await agent.kill()

    record, replica = inspect(data, 0)
    assert isinstance(record, PartitionRecord)
    assert record.move is not None
    assert record.move.phase is Phase.IN_PROGRESS
    assert isinstance(replica, ReplicaRow)
    assert not replica.complete, "the catch-up left a partial replica"

    again = await agents.start(data)  # the real entry point; its catch-up completes at once
    await finished(again, 0)
    older = await again.stub.Rebalance(
        rebalance_request(0, *JOIN, revision=19, epoch=9), timeout=CALL_TIMEOUT
    )
    assert (older.outcome, older.accepted_revision, older.accepted_epoch) == (
        replica_pb2.STALE,
        20,
        2,
    )
    same = await again.stub.Rebalance(
        rebalance_request(1, *LEAVE, revision=21, epoch=2), timeout=CALL_TIMEOUT
    )
    assert same == leaving
    resumed = await again.stub.Rebalance(
        rebalance_request(0, *JOIN, revision=20, epoch=2), timeout=CALL_TIMEOUT
    )
    assert (resumed.outcome, resumed.accepted_revision, resumed.accepted_epoch) == (
        replica_pb2.DONE,
        20,
        2,
    )
    assert journal(data, 0) == ["StartCatchUp", "CreateReplica"]
    assert (await state(again, 0)).accepted_revision == 20


async def test_every_answer_given_before_a_sigkill_survives_it(
    agents: Agents, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    agent = await agents.start(data)
    partitions = range(200)
    calls = {
        p: asyncio.ensure_future(
            agent.stub.Rebalance(
                rebalance_request(p, *JOIN, revision=100 + p), timeout=CALL_TIMEOUT
            )
        )
        for p in partitions
    }
    pending = set(calls.values())
    while len(pending) > len(calls) - 20:
        _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    await agent.kill()
    await asyncio.gather(*calls.values(), return_exceptions=True)
    answered = {p: c.result() for p, c in calls.items() if not c.cancelled() and not c.exception()}
    assert len(answered) < len(calls), "the kill came too late to interrupt anything"

    again = await agents.start(data)
    for p in partitions:
        if await known(again, p) is None:
            assert p not in answered, f"partition {p} lost the revision it accepted"
            continue
        await finished(again, p)
        after = await state(again, p)
        assert after.accepted_revision == 100 + p
        assert list(after.current_peers.names) == JOIN[1]
        assert journal(data, p).count("CreateReplica") == 1


# --- cancel --------------------------------------------------------------------------------------


async def test_cancel_outcomes(agents: Agents, tmp_path: Path) -> None:
    agent = await agents.start(tmp_path / "data", gated=True)
    stub = agent.stub

    accepted = await stub.Rebalance(rebalance_request(0, *JOIN, revision=30), timeout=CALL_TIMEOUT)
    assert accepted.outcome == replica_pb2.ACCEPTED
    cancelled = await stub.CancelRebalance(
        cancel_request(0, *JOIN, revision=30), timeout=CALL_TIMEOUT
    )
    assert cancelled.outcome == replica_pb2.CANCELLED
    assert (
        await stub.CancelRebalance(cancel_request(0, *JOIN, revision=30), timeout=CALL_TIMEOUT)
        == cancelled
    )
    resend = await stub.Rebalance(
        rebalance_request(0, *JOIN, revision=30, epoch=2), timeout=CALL_TIMEOUT
    )
    assert resend.outcome == replica_pb2.STALE
    assert "cancelled" in resend.detail
    back = await state(agent, 0)
    assert (list(back.current_peers.names), back.rebalance_in_progress) == (JOIN[0], False)
    assert inspect(agent.data_dir, 0)[1] is None, "the partial replica must be discarded"

    nothing = await stub.CancelRebalance(
        cancel_request(1, *JOIN, revision=31), timeout=CALL_TIMEOUT
    )
    assert nothing.outcome == replica_pb2.NOTHING_TO_CANCEL
    late = await stub.Rebalance(rebalance_request(1, *JOIN, revision=31), timeout=CALL_TIMEOUT)
    assert late.outcome == replica_pb2.STALE

    done = await stub.Rebalance(rebalance_request(2, *LEAVE, revision=32), timeout=CALL_TIMEOUT)
    assert done.outcome == replica_pb2.DONE
    already = await stub.CancelRebalance(
        cancel_request(2, *LEAVE, revision=32), timeout=CALL_TIMEOUT
    )
    assert already.outcome == replica_pb2.ALREADY_DONE

    stale = await stub.CancelRebalance(
        cancel_request(2, *LEAVE, revision=31, epoch=7), timeout=CALL_TIMEOUT
    )
    assert (stale.outcome, stale.accepted_revision) == (replica_pb2.CANCEL_STALE, 32)

    agent.open_gate()  # the stopped catch-up must not come back and complete the cancelled move
    await stub.Rebalance(rebalance_request(3, *JOIN, revision=33), timeout=CALL_TIMEOUT)
    await finished(agent, 3)
    assert journal(agent.data_dir, 0) == ["StartCatchUp", "StopCatchUp", "DiscardReplica"]
    assert list((await state(agent, 0)).current_peers.names) == JOIN[0]


# --- retire --------------------------------------------------------------------------------------


def retire_request(
    partition: int, stable: list[str], revision: int, epoch: int = 1
) -> replica_pb2.RetireRequest:
    return replica_pb2.RetireRequest(
        partition=common_pb2.PartitionRef(zone=ZONE, partition=partition),
        stable_peers=common_pb2.Peers(names=stable),
        revision=revision,
        epoch=epoch,
    )


async def test_retire_discards_the_replica_only_when_stable_drops_the_node_and_survives_restart(
    agents: Agents, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    agent = await agents.start(data)
    joined = await agent.stub.Rebalance(
        rebalance_request(0, *JOIN, revision=40, epoch=2), timeout=CALL_TIMEOUT
    )
    assert joined.outcome == replica_pb2.ACCEPTED
    await finished(agent, 0)
    hosting = await state(agent, 0)
    assert (hosting.hosted, hosting.phase) == (True, replica_pb2.MOVE_PHASE_DONE)

    stale = await agent.stub.Retire(retire_request(0, ["n2", "n3"], 39, 5), timeout=CALL_TIMEOUT)
    assert (stale.outcome, stale.accepted_revision, stale.accepted_epoch) == (
        replica_pb2.RETIRE_STALE,
        40,
        2,
    )
    kept = await agent.stub.Retire(retire_request(0, ["n1", "n2"], 41, 2), timeout=CALL_TIMEOUT)
    assert kept.outcome == replica_pb2.KEPT
    assert inspect(data, 0)[1] == ReplicaRow(ZONE, 0, True)

    retired = await agent.stub.Retire(retire_request(0, ["n2", "n3"], 43, 2), timeout=CALL_TIMEOUT)
    assert (retired.outcome, retired.accepted_revision) == (replica_pb2.RETIRED, 40)
    again = await agent.stub.Retire(retire_request(0, ["n2", "n3"], 43, 2), timeout=CALL_TIMEOUT)
    assert again == retired
    assert not (await state(agent, 0)).hosted
    assert journal(data, 0) == ["StartCatchUp", "CreateReplica", "DiscardReplica"]
    record, replica = inspect(data, 0)
    assert replica is None
    assert record is not None
    assert not record.hosted

    await agent.kill()
    restarted = await agents.start(data)
    after = await state(restarted, 0)
    assert (after.hosted, after.accepted_revision, after.accepted_epoch) == (False, 40, 2)
    assert inspect(data, 0)[1] is None
    assert (
        await restarted.stub.Retire(retire_request(0, ["n2", "n3"], 43, 2), timeout=CALL_TIMEOUT)
        == retired
    )
    assert journal(data, 0) == ["StartCatchUp", "CreateReplica", "DiscardReplica"]


async def test_retire_keeps_a_catch_up_in_progress_and_rejects_bad_input(
    agents: Agents, tmp_path: Path
) -> None:
    agent = await agents.start(tmp_path / "data", gated=True)
    await agent.stub.Rebalance(rebalance_request(0, *JOIN, revision=50), timeout=CALL_TIMEOUT)
    kept = await agent.stub.Retire(retire_request(0, ["n2", "n3"], 51), timeout=CALL_TIMEOUT)
    assert kept.outcome == replica_pb2.KEPT
    moving = await state(agent, 0)
    assert (moving.phase, moving.rebalance_in_progress) == (
        replica_pb2.MOVE_PHASE_IN_PROGRESS,
        True,
    )
    assert inspect(agent.data_dir, 0)[1] == ReplicaRow(ZONE, 0, False)
    for request, field in (
        (retire_request(0, ["n2"], 0), "revision"),
        (retire_request(0, ["n2"], 5, 0), "epoch"),
        (retire_request(0, ["n2", "n2"], 5), "stable_peers"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await agent.stub.Retire(request, timeout=CALL_TIMEOUT)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith(f"{field}: ")
    # no stable peers: the partition was removed by re-sharding — a catch-up in progress still
    # keeps its replica (design/resharding.md)
    removed = await agent.stub.Retire(retire_request(0, [], 60), timeout=CALL_TIMEOUT)
    assert removed.outcome == replica_pb2.KEPT
    agent.open_gate()
    await finished(agent, 0)


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "revision", "epoch", "field"),
    [
        (["n2"], ["n1"], 0, 1, "revision"),
        (["n2"], ["n1"], -4, 1, "revision"),
        (["n2"], ["n1"], 5, 0, "epoch"),
        (["n1"], [], 5, 1, "new_peers"),
        (["n2", "n2"], ["n1"], 5, 1, "old_peers"),
        (["n2"], ["n1", "n1"], 5, 1, "new_peers"),
        (["n2"], ["n3"], 5, 1, "new_peers"),
    ],
)
async def test_invalid_requests_are_rejected_naming_the_field_and_persist_nothing(
    agents: Agents,
    tmp_path: Path,
    old: list[str],
    new: list[str],
    revision: int,
    epoch: int,
    field: str,
) -> None:
    agent = await agents.start(tmp_path / "data")
    with pytest.raises(grpc.aio.AioRpcError) as rebalance:
        await agent.stub.Rebalance(
            rebalance_request(0, old, new, revision, epoch), timeout=CALL_TIMEOUT
        )
    with pytest.raises(grpc.aio.AioRpcError) as cancel:
        await agent.stub.CancelRebalance(
            cancel_request(0, old, new, revision, epoch), timeout=CALL_TIMEOUT
        )
    for err in (rebalance, cancel):
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith(f"{field}: ")
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await state(agent, 0)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert inspect(agent.data_dir, 0) == (None, None)


async def test_unusable_data_dirs_fail_with_the_path_named(agents: Agents, tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "agent.db").write_bytes(b"this is not a database" * 100)
    busy = tmp_path / "busy"
    await agents.start(busy)
    for data_dir, problem in (
        (corrupt, "unreadable"),
        (busy, "another agent uses this data directory"),
    ):
        args = ["--node", "n1", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir)]
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "replica", *args),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
        assert proc.returncode == 2
        assert str(data_dir / "agent.db") in err.decode()
        assert problem in err.decode()
        assert out == b""


async def test_moves_and_retires_read_the_in_sync_set_from_etcd_and_fail_safe(
    tmp_path: Path,
) -> None:
    """The in-sync set is read when a decision needs it (not taken from a watched view that may
    lag), and only then: a resend's repeat never reads; when it cannot be read, a hosted
    replica catches up before DONE and nothing is deleted (design/replica-protocol.md, "In
    sync")."""
    answer: list[bool | Exception | asyncio.Event | None] = [None]
    asked: list[tuple[str, int]] = []

    async def isr_names_me(zone: str, partition: int) -> bool | None:
        asked.append((zone, partition))
        value = answer[0]
        if isinstance(value, asyncio.Event):
            await value.wait()
            return None
        if isinstance(value, Exception):
            raise value
        return value

    store = await asyncio.to_thread(AgentStore.open, tmp_path / "agent", "n1")
    agent = ReplicaAgent("n1", StoreThread(store), isr_names_me=isr_names_me)

    async def hosted(partition: int) -> None:
        move = MoveRequest("z", partition, ("n2",), ("n1", "n2"), 10, 1)
        assert (await agent.rebalance(move)).outcome is RebalanceOutcome.ACCEPTED
        assert ("z", partition) not in asked, "read for a replica this node does not host"
        for _ in range(200):
            if (await agent.rebalance(move)).outcome is RebalanceOutcome.DONE:
                return
            await asyncio.sleep(0.01)
        pytest.fail("the catch-up never finished")

    try:
        await hosted(0)
        await hosted(1)
        # resent after DONE (hosted now): answered from the record, whatever etcd says
        for _ in range(3):
            again = MoveRequest("z", 0, ("n2",), ("n1", "n2"), 10, 2)
            assert (await agent.rebalance(again)).outcome is RebalanceOutcome.DONE
        assert not asked, "a resend's answer does not depend on the in-sync set"
        # etcd cannot be read: a hosted replica is not taken as current
        answer[0] = StoreUnavailable("etcd down")
        move = MoveRequest("z", 0, ("n1", "n2"), ("n1", "n3"), 20, 1)
        assert (await agent.rebalance(move)).outcome is RebalanceOutcome.ACCEPTED
        assert asked == [("z", 0)]
        # ... and nothing is deleted
        retire = RetireRequest("z", 1, ("n2", "n3"), 30, 1)
        assert (await agent.retire(retire)).outcome is RetireOutcome.RETIRE_IN_SYNC
        answer[0] = True  # named: kept
        assert (await agent.retire(retire)).outcome is RetireOutcome.RETIRE_IN_SYNC
        answer[0] = False  # etcd says it left the set: now it goes
        assert (await agent.retire(retire)).outcome is RetireOutcome.RETIRED
        # hosted and named in etcd: a move onto it is done at once
        answer[0] = True
        await hosted(2)
        again = MoveRequest("z", 2, ("n1", "n2"), ("n1", "n3"), 40, 1)
        assert (await agent.rebalance(again)).outcome is RebalanceOutcome.DONE
        # etcd does not answer: the safe answer within ISR_READ_TIMEOUT, not the driver's
        # deadline
        answer[0] = None
        await hosted(3)
        answer[0] = asyncio.Event()  # never set: the read hangs
        began = asyncio.get_running_loop().time()
        stuck = RetireRequest("z", 3, ("n2", "n3"), 50, 1)
        assert (await agent.retire(stuck)).outcome is RetireOutcome.RETIRE_IN_SYNC
        assert asyncio.get_running_loop().time() - began < ISR_READ_TIMEOUT + 1.0
    finally:
        await agent.close()


async def test_the_in_sync_set_is_read_from_etcd(client: EtcdClient, tmp_path: Path) -> None:
    """``DataPlane.isr_names_me``: etcd's record, not the agent's view; no record (a new
    partition) is None; a record that cannot be decoded is an error (the decision then takes
    its safe answer)."""
    keys = KeySpace(f"/t{uuid.uuid4().hex[:12]}/placement")
    store = await asyncio.to_thread(AgentStore.open, tmp_path / "agent", "n1")
    db = StoreThread(store)
    plane = DataPlane("n1", db, client, keys)  # not started: no view at all
    try:
        assert await plane.isr_names_me("z", 0) is None
        await client.put(keys.isr("z", 0), encode_isr(InSyncSet(("n1", "n2"), "n2", 3, 0)))
        assert await plane.isr_names_me("z", 0) is True
        await client.put(keys.isr("z", 0), encode_isr(InSyncSet(("n2", "n3"), "n2", 4, 0)))
        assert await plane.isr_names_me("z", 0) is False
        await client.put(keys.isr("z", 0), b"not json")
        with pytest.raises(PlacementError, match="cannot be read"):
            await plane.isr_names_me("z", 0)
    finally:
        await db.close()


async def test_a_retire_holds_its_nodes_learner_stopped_from_its_in_sync_read_to_its_discard(
    client: EtcdClient, tmp_path: Path
) -> None:
    """A retire reads the in-sync set and discards the replica; this node's own learner must not
    run in between, or its join lands after the read and the set names a replica that is gone —
    which a later catch-up re-created empty and a lease then made primary
    (``test_etcd_faults_mid_rebalance_lose_nothing[sigstop-etcd-leader]``: acknowledged writes
    read as not found). The learner is stopped before the read, no roles pass restarts it, and
    it stays stopped until the discard is committed."""
    keys = KeySpace(f"/t{uuid.uuid4().hex[:12]}/placement")
    store = await asyncio.to_thread(AgentStore.open, tmp_path / "agent", "n1")
    db = StoreThread(store)
    plane = DataPlane("n1", db, client, keys)  # not started: its view is set by hand
    key = ("z", 0)
    seen: list[object] = []

    async def isr_names_me(zone: str, partition: int) -> bool | None:
        seen.append(("learner ended", learner.done(), "paused", key in plane._learners_paused))
        await plane._roles({key}, full=False)  # e.g. a lease change meanwhile
        seen.append(("restarted", key in plane._learners))
        return False

    @contextlib.asynccontextmanager
    async def paused(zone: str, partition: int) -> AsyncIterator[None]:
        async with plane.learner_paused(zone, partition):
            yield
            seen.append(("hosted at the pause's end", (await agent.state(*key)).hosted))

    agent = ReplicaAgent("n1", db, isr_names_me=isr_names_me, pause_learner=paused)
    learner = asyncio.create_task(asyncio.Event().wait(), name="a learner fetching")
    try:
        move = MoveRequest("z", 0, ("n2",), ("n1", "n2"), 10, 1)
        assert (await agent.rebalance(move)).outcome is RebalanceOutcome.ACCEPTED
        for _ in range(200):
            if (await agent.state(*key)).hosted:
                break
            await asyncio.sleep(0.01)
        # its view lags: a lease elsewhere, no in-sync set, an assignment still naming it — the
        # roles pass would run a learner
        plane.view.leases[key] = (PrimaryLease("n2", 1, 0), 5)
        plane.view.assignments[key] = {AssignField.STABLE: frozenset({"n1", "n2"})}
        plane._learners[key] = learner
        retire = RetireRequest("z", 0, ("n2", "n3"), 30, 1)
        assert (await agent.retire(retire)).outcome is RetireOutcome.RETIRED
        assert seen == [
            ("learner ended", True, "paused", True),
            ("restarted", False),
            ("hosted at the pause's end", False),
        ]
        assert not plane._learners_paused
    finally:
        learner.cancel()
        await agent.close()
        await plane.close()


async def test_a_join_judged_by_an_assignment_that_moved_on_is_not_written(
    client: EtcdClient, tmp_path: Path
) -> None:
    """A primary admits a learner by the assignment its view shows; the in-sync set write that
    adds it compares that assignment's revisions. Stable switched meanwhile (the move that drops
    the learner's node, whose retire then finds the set without it): the write is refused,
    batched or checked alone, and the set stays as it was; judged by the current assignment,
    the same join is written."""
    keys = KeySpace(f"/t{uuid.uuid4().hex[:12]}/placement")
    store = await asyncio.to_thread(AgentStore.open, tmp_path / "agent", "n1")
    db = StoreThread(store)
    plane = DataPlane("n1", db, client, keys)
    key = ("z", 0)
    try:
        lease = PrimaryLease("n1", 1, 0)
        lease_rev = await client.put(keys.primary(*key), encode_primary(lease))
        isr_rev = await client.put(keys.isr(*key), encode_isr(InSyncSet(("n1", "n2"), "n1", 1, 0)))
        stable_rev = await client.put(
            keys.assign(*key, AssignField.STABLE),
            encode_assignment(Assignment(("n1", "n2", "n3"), 1, 0, 0)),
        )
        plane.view.leases[key] = (lease, lease_rev)
        plane.view.assignment_mods[key] = {AssignField.STABLE: stable_rev}
        judged_by = plane.view.assignment_revisions(key)
        assert judged_by == ((AssignField.STABLE, stable_rev), (AssignField.PENDING, 0))
        switched = await client.put(
            keys.assign(*key, AssignField.STABLE),
            encode_assignment(Assignment(("n1", "n2"), 1, 0, 0)),
        )
        members = frozenset({"n1", "n2", "n3"})
        with pytest.raises(Unavailable, match=r"assignment .* changed since this in-sync set"):
            await plane.write_isr(key, 1, members, isr_rev, judged_by)
        assert plane._isr_writes.transactions == 1  # the batched try, then the checked one
        found = (await client.get(keys.isr(*key))).first()
        assert found is not None
        assert found.mod_revision == isr_rev
        assert _members(found.value) == ("n1", "n2")
        # a pending written since counts too: judged before it, refused
        plane.view.assignment_mods[key] = {AssignField.STABLE: switched}
        judged_by = plane.view.assignment_revisions(key)
        await client.put(
            keys.assign(*key, AssignField.PENDING),
            encode_assignment(Assignment(("n1", "n3"), 1, 0, 0)),
        )
        with pytest.raises(Unavailable, match="changed since this in-sync set change was judged"):
            await plane.write_isr(key, 1, members, isr_rev, judged_by)
        pending = (await client.get(keys.assign(*key, AssignField.PENDING))).first()
        assert pending is not None
        pending_rev = pending.mod_revision
        plane.view.assignment_mods[key][AssignField.PENDING] = pending_rev
        written = await plane.write_isr(
            key, 1, members, isr_rev, plane.view.assignment_revisions(key)
        )
        found = (await client.get(keys.isr(*key))).first()
        assert found is not None
        assert found.mod_revision == written
        assert _members(found.value) == ("n1", "n2", "n3")
    finally:
        await plane.close()


def _members(raw: bytes) -> tuple[str, ...]:
    isr = decode_isr(raw)
    assert isinstance(isr, InSyncSet)
    return isr.members
