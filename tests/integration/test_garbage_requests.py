"""Random bytes and truncated protobuf sent to every RPC of a live, secure cluster (one driver,
three agents, mutual TLS, started like ``placectl up``): each call is answered with a status that
says what is wrong — never UNKNOWN (an unhandled exception), never a dead server — every server
still answers a well-formed call afterwards, nothing placement keeps in etcd changes, and no
process logs a traceback (checked at teardown).

Each method gets seeded random payloads and every strict prefix of a well-formed request that
names things that do not exist (zone ``zz-garbage``): a prefix that ends on a field boundary is a
valid message with fields missing, so it must be refused by validation, not by the decoder.
``PauseRebalancing`` and ``ResumeRebalancing`` take an empty request, which any parseable payload
is (unknown fields are ignored by protobuf): they are left out of the random part.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from test_resharding import _cluster

from placement.local.cluster import Cluster
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace
from placement.rpc import API_PROFILE, channel
from placement.v1 import data_pb2, driver_pb2, replica_pb2

#: Statuses that name the problem. UNAVAILABLE is a data-plane refusal ("no primary of ...");
#: a dead server would show as UNAVAILABLE too, which the health calls after the run rule out.
ANSWERS = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.INTERNAL,  # the request did not decode
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAVAILABLE,
}
EMPTY_REQUESTS = {"PauseRebalancing", "ResumeRebalancing"}
RANDOM_PAYLOADS = 12


@pytest.fixture
def live(etcd: Any, tmp_path: Path) -> Iterator[Cluster]:
    yield from _cluster(etcd, tmp_path)


def well_formed(descriptor: Descriptor, depth: int = 0) -> Message:
    """A request with every field set, naming nothing that exists."""
    message = GetMessageClass(descriptor)()
    for f in descriptor.fields:
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            if depth >= 3 or f.message_type.GetOptions().map_entry:
                continue
            value: Any = well_formed(f.message_type, depth + 1)
        elif f.type == FieldDescriptor.TYPE_STRING:
            value = "zz-garbage"
        elif f.type == FieldDescriptor.TYPE_BYTES:
            value = b"zz-garbage"
        elif f.type == FieldDescriptor.TYPE_BOOL:
            value = True
        elif f.type == FieldDescriptor.TYPE_ENUM:
            value = f.enum_type.values[-1].number
        else:
            value = 3
        if f.is_repeated:
            if f.type == FieldDescriptor.TYPE_MESSAGE:
                getattr(message, f.name).add().CopyFrom(value)
            else:
                getattr(message, f.name).append(value)
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(message, f.name).CopyFrom(value)
        else:
            setattr(message, f.name, value)
    return message


def payloads(method: MethodDescriptor) -> list[bytes]:
    whole = well_formed(method.input_type).SerializeToString()
    found = [whole[:n] for n in range(len(whole))]
    if method.name not in EMPTY_REQUESTS:
        rng = random.Random(method.full_name)
        found += [rng.randbytes(rng.randint(1, 64)) for _ in range(RANDOM_PAYLOADS)]
    return found


async def send(ch: grpc.aio.Channel, method: MethodDescriptor, payload: bytes) -> grpc.StatusCode:
    path = f"/{method.containing_service.full_name}/{method.name}"
    try:
        if method.client_streaming:
            call = ch.stream_stream(path)(iter([payload]), timeout=2)
            async for _ in call:
                break
        elif method.server_streaming:
            stream = ch.unary_stream(path)(payload, timeout=2)
            async for _ in stream:
                break
        else:
            await ch.unary_unary(path)(payload, timeout=5)
    except grpc.aio.AioRpcError as e:
        if e.code() is grpc.StatusCode.DEADLINE_EXCEEDED and method.server_streaming:
            return grpc.StatusCode.OK  # a watch that parsed: it waits for changes
        return e.code()
    return grpc.StatusCode.OK


async def placement_state(client: EtcdClient, keys: KeySpace) -> dict[bytes, bytes]:
    """Every zone config, assignment, layout and data-node key with its value."""
    found: dict[bytes, bytes] = {}
    prefixes = (keys.zones_prefix(), keys.assign_prefix(), keys.layout_prefix(),
                keys.datanodes_prefix(), keys.control_prefix(), keys.drain_prefix())  # fmt: skip
    for prefix in prefixes:
        listed = await client.list_prefix(prefix)
        found.update((kv.key, kv.value) for kv in listed.kvs)
    return found


async def created(client: EtcdClient, keys: KeySpace) -> dict[bytes, bytes]:
    """The placement state once zone ``kv`` is fully created (each partition's stable
    written, nothing pending): from then on only garbage could change it."""
    deadline = time.monotonic() + 60
    while True:
        state = await placement_state(client, keys)
        stables = [k for k in state if k.endswith(b"/stable")]
        if len(stables) == 4 and not any(k.endswith(b"/pending") for k in state):
            return state
        assert time.monotonic() < deadline, f"zone kv never settled: {sorted(state)}"
        await asyncio.sleep(0.1)


async def test_garbage_to_every_rpc_is_refused_and_changes_nothing(
    live: Cluster, etcd: Any
) -> None:
    c = live
    keys = KeySpace(c.prefix)
    api = channel(c.driver_apis[0], API_PROFILE, c.tls())
    admin = driver_pb2.DESCRIPTOR.services_by_name["PlacementService"]
    try:
        config = driver_pb2.ZoneConfig(partitions=4, replicas=3)
        create = driver_pb2.CreateZoneRequest(name="kv", config=config)
        await api.unary_unary(
            f"/{admin.full_name}/CreateZone",
            request_serializer=driver_pb2.CreateZoneRequest.SerializeToString,
        )(create, timeout=10)
        nodes = await api.unary_unary(
            f"/{admin.full_name}/ListNodes",
            request_serializer=driver_pb2.ListNodesRequest.SerializeToString,
            response_deserializer=driver_pb2.ListNodesResponse.FromString,
        )(driver_pb2.ListNodesRequest(), timeout=10)
        agents = {n.name: n.address for n in nodes.nodes}
        assert len(agents) == 3
        targets: list[tuple[Any, str, str]] = [
            (admin, c.driver_apis[0], "admin"),
            (
                replica_pb2.DESCRIPTOR.services_by_name["ReplicaService"],
                agents["node-1"],
                "driver-1",
            ),
            (data_pb2.DESCRIPTOR.services_by_name["DataService"], agents["node-2"], "client"),
            (
                data_pb2.DESCRIPTOR.services_by_name["ReplicationService"],
                agents["node-3"],
                "node-1",
            ),
        ]
        async with EtcdClient([etcd.endpoint]) as client:
            before = await created(client, keys)
            answered: dict[str, set[str]] = {}
            for service, address, who in targets:
                async with _open(address, c, who) as ch:
                    for method in service.methods:
                        for payload in payloads(method):
                            code = await send(ch, method, payload)
                            assert code in ANSWERS, (
                                f"{method.full_name} answered {code.name} to {payload!r}"
                            )
                            answered.setdefault(method.full_name, set()).add(code.name)
            print({m: sorted(codes) for m, codes in answered.items()})
            every = {m.full_name for s, _, _ in targets for m in s.methods}
            assert set(answered) == {m for m in every if m.rsplit(".", 1)[1] not in EMPTY_REQUESTS}
            # Every server is up and answers a well-formed call.
            for _service, address, who in targets:
                async with _open(address, c, who) as ch:
                    health = ch.unary_unary("/grpc.health.v1.Health/Check")
                    assert await health(b"", timeout=5) is not None
            after = await placement_state(client, keys)
        changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        assert not changed, f"garbage changed placement state: {sorted(changed)}"
        assert not any(b"zz-garbage" in k for k in after), "a garbage name reached etcd"
    finally:
        await api.close()


@contextlib.asynccontextmanager
async def _open(address: str, c: Cluster, who: str) -> AsyncIterator[grpc.aio.Channel]:
    """A channel to ``address`` presenting the certificate of ``who`` (the role each service
    serves: its handlers, not the role check, are what the garbage must reach)."""
    ch = channel(address, API_PROFILE, c.tls(who))
    try:
        yield ch
    finally:
        await ch.close()
