"""The routing client: its pure decisions, the scan merge, and the call loop against fakes
(routes from a fake driver, stubs that answer like agents; no sockets, a fake clock)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.api.client import ApiError
from placement.core.retry import RetryPolicy
from placement.data.client import (
    ClientClosed,
    DataClient,
    DataRequestFailed,
    DataUnavailable,
    Fail,
    PrimaryHint,
    Redirect,
    Relayout,
    Retry,
    ScanMerge,
    ScanProtocolError,
    Wait,
    WriteResult,
    ZoneRoutes,
    build_routes,
    decide,
    header_value,
    parse_primary_hint,
    pick_target,
)
from placement.data.partitioning import partition_of
from placement.errors import InvalidInput
from placement.v1 import data_pb2

Code = grpc.StatusCode

# -- pure parts --------------------------------------------------------------------------------


def test_parse_primary_hint() -> None:
    assert parse_primary_hint("n2@127.0.0.1:7001") == PrimaryHint("n2", "127.0.0.1:7001")
    assert parse_primary_hint("n2@[::1]:7001") == PrimaryHint("n2", "[::1]:7001")
    for bad in (None, "", "n2", "@h:1", "n2@h", "n2@:1", "n2@h:0", "n2@h:99999", "n2@h:x"):
        assert parse_primary_hint(bad) is None, bad


def test_header_value_is_case_insensitive_and_decodes_bytes() -> None:
    assert header_value(None, "x-primary") is None
    assert header_value([("a", "1")], "x-primary") is None
    assert header_value([("X-Primary", b"n1@h:1"), ("x-primary", "n2@h:2")], "x-primary") == (
        "n1@h:1"
    )


def test_decide() -> None:
    fp = Code.FAILED_PRECONDITION
    hint = PrimaryHint("n2", "h:2")
    assert decide(fp, "not primary", "n2@h:2", target="h:1", redirects=0) == Redirect(hint)
    # no hint, the hint is where we just were, or too many hops: refresh and back off instead
    assert isinstance(decide(fp, "", "", target="h:1", redirects=0), Retry)
    assert isinstance(decide(fp, "", None, target="h:1", redirects=0), Retry)
    assert isinstance(decide(fp, "", "n2@h:2", target="h:2", redirects=0), Retry)
    assert isinstance(decide(fp, "", "n2@h:2", target="h:1", redirects=3), Retry)
    retried = (Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED, Code.ABORTED, Code.NOT_FOUND)
    for code in retried:
        assert isinstance(decide(code, "x", None, target="h:1", redirects=0), Retry)
    # an agent whose server stopped the call (a SIGTERM's shutdown): its fate is unknown, as
    # after a dropped connection — sent again (test_drain's SIGTERM test saw it fail a write)
    assert isinstance(decide(Code.CANCELLED, "CANCELLED", None, target="h:1", redirects=0), Retry)
    assert decide(Code.INVALID_ARGUMENT, "bad key", None, target="h:1", redirects=0) == Fail(
        Code.INVALID_ARGUMENT, "bad key"
    )
    assert isinstance(decide(Code.INTERNAL, "boom", None, target="h:1", redirects=0), Fail)
    retry = decide(Code.UNAVAILABLE, "in-sync set below minimum", None, target="h:1", redirects=0)
    assert isinstance(retry, Retry)
    assert "h:1" in retry.reason
    assert "below minimum" in retry.reason


def test_decide_re_routes_at_once_when_the_agent_is_at_another_layout_generation() -> None:
    fp = Code.FAILED_PRECONDITION
    got = decide(
        fp, "zone z is at layout generation 7", None, target="h:1", redirects=0, x_layout="7/16"
    )
    assert got == Relayout("h:1: FAILED_PRECONDITION zone z is at layout generation 7")
    # the layout wins over a primary hint; after too many hops: refresh and back off
    assert isinstance(
        decide(fp, "", "n2@h:2", target="h:1", redirects=0, x_layout="7/16"), Relayout
    )
    assert isinstance(decide(fp, "", None, target="h:1", redirects=3, x_layout="7/16"), Retry)
    assert isinstance(decide(fp, "", "n2@h:2", target="h:1", redirects=0, x_layout=""), Redirect)
    # the agent's layout and the key's primary under it travel with the decision ...
    hinted = decide(fp, "", "n2@h:2", target="h:1", redirects=0, x_layout="7/16")
    assert hinted == Relayout("h:1: FAILED_PRECONDITION", (7, 16), PrimaryHint("n2", "h:2"))
    # ... only when both parse: otherwise the routes are re-read first, as before
    for bad_layout, primary in [("7", "n2@h:2"), ("x/16", "n2@h:2"), ("0/16", "n2@h:2")]:
        got = decide(fp, "", primary, target="h:1", redirects=0, x_layout=bad_layout)
        assert got == Relayout("h:1: FAILED_PRECONDITION"), bad_layout
    assert decide(fp, "", "n2@", target="h:1", redirects=0, x_layout="7/16") == Relayout(
        "h:1: FAILED_PRECONDITION"
    )


def test_decide_waits_as_told_for_a_sealed_partition_and_backs_off_for_nonsense() -> None:
    un = Code.UNAVAILABLE
    sealed = decide(un, "z/3 is sealed", None, target="h:1", redirects=0, x_retry_after="20")
    assert sealed == Wait("h:1: UNAVAILABLE z/3 is sealed", 0.02)
    for bad in ("", "x", "-5", "1001", "1e3"):
        assert isinstance(decide(un, "", None, target="h:1", redirects=0, x_retry_after=bad), Retry)
    fp = Code.FAILED_PRECONDITION  # only an UNAVAILABLE answer is waited out
    assert isinstance(decide(fp, "", None, target="h:1", redirects=0, x_retry_after="20"), Retry)


def _routes() -> ZoneRoutes:
    return build_routes(
        "z",
        3,
        [(0, "n1", ["n1", "n2", "n3"]), (1, "n9", ["n2", "n3"]), (2, "", ["n3", "n1"])],
        [("n1", "h:1"), ("n2", "h:2"), ("n3", "h:3"), ("n4", "")],
    )


def test_build_routes_and_pick_target() -> None:
    routes = _routes()
    assert routes.partitions == 3
    assert "n4" not in routes.addresses
    assert pick_target(routes, 0, 0) == ("n1", "h:1")
    # primary n9 has no address: the stable members in turn (they redirect)
    assert [pick_target(routes, 1, a) for a in range(3)] == [
        ("n2", "h:2"),
        ("n3", "h:3"),
        ("n2", "h:2"),
    ]
    assert pick_target(routes, 2, 1) == ("n1", "h:1")
    assert pick_target(build_routes("z", 1, [], []), 0, 0) is None
    assert pick_target(routes, 7, 0) is None


def test_with_primary_learns_a_redirect() -> None:
    routes = _routes().with_primary(1, PrimaryHint("n9", "h:9"))
    assert pick_target(routes, 1, 0) == ("n9", "h:9")
    assert pick_target(routes, 0, 0) == ("n1", "h:1")


@given(st.integers(0, 100), st.floats(0, 1))
def test_backoff_is_capped_and_non_negative(attempt: int, r: float) -> None:
    b = RetryPolicy(initial=0.05, cap=1.0)
    assert 0 <= b.delay(attempt, lambda: r) <= 1.0


def _drive(merge: ScanMerge, pages: Callable[[int, bytes], tuple[list[Any], bool]]) -> list[Any]:
    out: list[Any] = []
    while True:
        needed = merge.needs()
        if needed:
            for p in needed:
                merge.feed(p, *pages(p, merge.after[p]))
            continue
        item = merge.pop()
        if item is None:
            return out
        out.append(item)


@settings(max_examples=200)
@given(
    st.dictionaries(st.binary(min_size=1, max_size=6), st.binary(max_size=4), max_size=60),
    st.integers(1, 7),
    st.integers(1, 5),
)
def test_scan_merge_yields_every_key_once_in_order(
    data: dict[bytes, bytes], partitions: int, page: int
) -> None:
    by_partition: dict[int, list[tuple[bytes, bytes]]] = {p: [] for p in range(partitions)}
    for k, v in data.items():
        by_partition[partition_of(k, partitions)].append((k, v))

    def pages(p: int, after: bytes) -> tuple[list[Any], bool]:
        rest = sorted(kv for kv in by_partition[p] if kv[0] > after)
        return rest[:page], len(rest) > page

    assert _drive(ScanMerge(range(partitions)), pages) == sorted(data.items())


def test_scan_merge_rejects_contract_breaks() -> None:
    merge = ScanMerge([0])
    with pytest.raises(ScanProtocolError):
        merge.feed(0, [], True)
    merge = ScanMerge([0])
    with pytest.raises(ScanProtocolError):
        merge.feed(0, [(b"b", b""), (b"a", b"")], False)
    merge = ScanMerge([0, 1])
    merge.feed(0, [(b"a", b"1")], False)
    with pytest.raises(ValueError, match="pop before"):
        merge.pop()


# -- the call loop against fakes ---------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        self.now += delay


@dataclass
class FakeSource:
    routes: ZoneRoutes
    loads: int = 0
    error: Exception | None = None

    async def load(self, zone: str) -> ZoneRoutes:
        self.loads += 1
        if self.error is not None:
            raise self.error
        return self.routes

    async def close(self) -> None:
        pass


def rpc_error(
    code: grpc.StatusCode, detail: str = "", primary: str | None = None, **trailers: str
) -> Exception:
    """An agent's error answer; ``trailers`` by name with ``_`` for ``-`` (``x_layout=...``)."""
    pairs = [("x-primary", primary)] if primary is not None else []
    pairs += [(name.replace("_", "-"), value) for name, value in trailers.items()]
    trailing = grpc.aio.Metadata(*pairs) if pairs else None
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, detail)


@dataclass
class FakeAgent:
    """Answers like an agent: ``script`` holds errors to raise first, then it serves ``kv``."""

    address: str
    kv: dict[bytes, bytes]
    script: list[Exception] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    #: an agent from before WriteBatch
    old: bool = False

    def _next(self, method: str) -> None:
        self.calls.append(method)
        if self.script:
            raise self.script.pop(0)

    async def Put(self, r: data_pb2.PutRequest, **_: float) -> data_pb2.WriteResponse:
        self._next("Put")
        self.kv[r.key] = r.value
        return data_pb2.WriteResponse(index=len(self.calls), lease_epoch=7)

    async def Delete(self, r: data_pb2.DeleteRequest, **_: float) -> data_pb2.WriteResponse:
        self._next("Delete")
        existed = self.kv.pop(r.key, None) is not None
        return data_pb2.WriteResponse(index=len(self.calls), lease_epoch=7, existed=existed)

    async def WriteBatch(
        self, r: data_pb2.WriteBatchRequest, **_: float
    ) -> data_pb2.WriteBatchResponse:
        """Each op as its Put or Delete (the script applies per op), failures as outcomes."""
        if self.old:
            self.calls.append("WriteBatch")
            raise rpc_error(Code.UNIMPLEMENTED, "Method not found!")
        self.batches.append(len(r.ops))
        await asyncio.sleep(0)  # answered a loop round later, as over a connection
        outcomes = []
        for op in r.ops:
            try:
                if op.delete:
                    reply = await self.Delete(
                        data_pb2.DeleteRequest(partition=op.partition, key=op.key)
                    )
                else:
                    reply = await self.Put(
                        data_pb2.PutRequest(partition=op.partition, key=op.key, value=op.value)
                    )
                outcomes.append(data_pb2.WriteOutcome(result=reply))
            except grpc.aio.AioRpcError as e:
                trailers = dict(e.trailing_metadata() or ())
                outcomes.append(
                    data_pb2.WriteOutcome(
                        code=e.code().value[0],
                        detail=e.details() or "",
                        primary=str(trailers.get("x-primary", "")),
                        layout=str(trailers.get("x-layout", "")),
                        retry_after_ms=int(trailers.get("x-retry-after-ms", 0) or 0),
                    )
                )
        return data_pb2.WriteBatchResponse(outcomes=outcomes)

    async def Get(self, r: data_pb2.GetRequest, **_: float) -> data_pb2.GetResponse:
        self._next("Get")
        value = self.kv.get(r.key)
        return data_pb2.GetResponse(found=value is not None, value=value or b"")

    async def Scan(self, r: data_pb2.ScanRequest, **_: float) -> data_pb2.ScanResponse:
        self._next("Scan")
        keys = sorted(
            k
            for k in self.kv
            if k.startswith(r.prefix)
            and k > r.start_after
            and partition_of(k, PARTITIONS) == r.partition.partition
        )
        page = keys[: r.limit or 1000]
        return data_pb2.ScanResponse(
            items=[data_pb2.KeyValue(key=k, value=self.kv[k]) for k in page],
            more=len(keys) > len(page),
        )


@dataclass
class FakeConnector:
    agents: dict[str, FakeAgent]
    dialed: list[str] = field(default_factory=list)

    def data(self, address: str) -> Any:
        self.dialed.append(address)
        agent = self.agents.get(address)
        if agent is None:
            return FakeAgent(address, {}, [rpc_error(Code.UNAVAILABLE, "connection refused")] * 99)
        return agent

    def replication(self, address: str) -> Any:
        raise NotImplementedError

    async def refusal(self, address: str, detail: str, budget: float) -> str | None:
        return None  # plaintext fakes: nothing to refuse

    async def close(self) -> None:
        pass


PARTITIONS = 4


def make_client(
    primary: str = "n1", agents: Sequence[FakeAgent] = (), deadline: float = 15.0
) -> tuple[DataClient, FakeSource, FakeConnector, FakeClock]:
    routes = build_routes(
        "z",
        PARTITIONS,
        [(p, primary, ["n1", "n2", "n3"]) for p in range(PARTITIONS)],
        [("n1", "h:1"), ("n2", "h:2"), ("n3", "h:3")],
    )
    source = FakeSource(routes)
    connector = FakeConnector({a.address: a for a in agents})
    clock = FakeClock()
    client = DataClient(
        "127.0.0.1:7400",
        deadline=deadline,
        route_source=source,
        connector=connector,
        clock=clock,
        sleep=clock.sleep,
        rng=lambda: 1.0,
    )
    return client, source, connector, clock


async def test_put_get_delete_at_the_primary() -> None:
    agent = FakeAgent("h:1", {})
    client, source, _, clock = make_client(agents=[agent])
    async with client:
        result = await client.put("z", b"k", b"v")
        assert (result.lease_epoch, result.existed) == (7, False)
        assert await client.get("z", b"k") == b"v"
        assert await client.delete("z", b"k") is True
        assert await client.get("z", b"k") is None
        assert await client.delete("z", b"k") is False
    assert source.loads == 1
    assert clock.sleeps == []


async def test_a_redirect_is_followed_at_once_and_remembered() -> None:
    stale = FakeAgent("h:1", {}, [rpc_error(Code.FAILED_PRECONDITION, "not primary", "n2@h:2")])
    primary = FakeAgent("h:2", {})
    client, source, connector, clock = make_client(agents=[stale, primary])
    await client.put("z", b"k", b"v")
    assert primary.kv == {b"k": b"v"}
    assert connector.dialed == ["h:1", "h:2"]
    assert clock.sleeps == []
    assert await client.get("z", b"k") == b"v"
    assert connector.dialed[-1] == "h:2"
    assert source.loads == 1


async def test_redirect_loops_are_cut_by_backoff_and_refresh() -> None:
    ping = FakeAgent("h:1", {}, [rpc_error(Code.FAILED_PRECONDITION, "", "n2@h:2")] * 4)
    pong = FakeAgent("h:2", {}, [rpc_error(Code.FAILED_PRECONDITION, "", "n1@h:1")] * 4)
    client, source, _, clock = make_client(agents=[ping, pong])
    await client.put("z", b"k", b"v")
    assert len(clock.sleeps) >= 1
    assert source.loads >= 2


async def test_unavailable_refreshes_backs_off_and_retries() -> None:
    agent = FakeAgent(
        "h:1",
        {},
        [
            rpc_error(Code.UNAVAILABLE, "in-sync set below minimum"),
            rpc_error(Code.DEADLINE_EXCEEDED),
        ],
    )
    client, source, _, clock = make_client(agents=[agent])
    await client.put("z", b"k", b"v")
    assert agent.kv == {b"k": b"v"}
    assert clock.sleeps == [0.05, 0.1]
    assert source.loads == 3


async def test_no_primary_known_tries_stable_members_which_redirect() -> None:
    redirecting = FakeAgent("h:1", {}, [rpc_error(Code.FAILED_PRECONDITION, "", "n3@h:3")])
    primary = FakeAgent("h:3", {})
    client, _, connector, _ = make_client(primary="", agents=[redirecting, primary])
    await client.put("z", b"k", b"v")
    assert connector.dialed == ["h:1", "h:3"]


async def test_gives_up_at_the_deadline_with_a_domain_error() -> None:
    client, _, _, clock = make_client(agents=[], deadline=2.0)
    with pytest.raises(DataUnavailable) as caught:
        await client.put("z", b"k", b"v")
    message = str(caught.value)
    assert f"put z/{partition_of(b'k', PARTITIONS)}" in message
    assert "n1@h:1: UNAVAILABLE connection refused" in message
    assert clock.now <= 2.0
    assert caught.value.partition == partition_of(b"k", PARTITIONS)


async def test_invalid_argument_is_invalid_input_and_other_errors_are_final() -> None:
    agent = FakeAgent("h:1", {}, [rpc_error(Code.INVALID_ARGUMENT, "wrong partition")] * 2)
    client, source, _, _ = make_client(agents=[agent])
    with pytest.raises(InvalidInput, match="wrong partition"):
        await client.put("z", b"k", b"v")
    assert source.loads == 2  # refreshed once: the partition count might have changed
    agent.script = [rpc_error(Code.INTERNAL, "disk on fire")]
    with pytest.raises(DataRequestFailed, match="disk on fire"):
        await client.get("z", b"k")


async def test_bad_keys_and_unknown_zones_are_invalid_input() -> None:
    client, source, _, _ = make_client(agents=[FakeAgent("h:1", {})])
    with pytest.raises(InvalidInput, match="key"):
        await client.put("z", b"", b"v")
    with pytest.raises(InvalidInput, match="value"):
        await client.put("z", b"k", b"x" * ((1 << 20) + 1))
    source.error = ApiError(Code.NOT_FOUND, "zone 'nope' does not exist")
    with pytest.raises(InvalidInput, match="does not exist"):
        await client.get("nope", b"k")


async def test_drivers_down_count_as_unavailable() -> None:
    client, source, _, _ = make_client(agents=[FakeAgent("h:1", {})], deadline=1.0)
    source.error = ApiError(Code.UNAVAILABLE, "no placement driver answered")
    with pytest.raises(DataUnavailable, match="placement drivers"):
        await client.get("z", b"k")


async def test_scan_merges_every_partition_in_key_order_with_paging() -> None:
    data = {f"key-{i:03d}".encode(): f"v{i}".encode() for i in range(50)}
    data[b"other"] = b"x"
    agent = FakeAgent("h:1", dict(data))
    client, _, _, _ = make_client(agents=[agent])
    got = [kv async for kv in client.scan("z", b"key-", page_size=3)]
    assert got == sorted((k, v) for k, v in data.items() if k.startswith(b"key-"))
    assert agent.calls.count("Scan") > PARTITIONS
    assert [kv async for kv in client.scan("z", b"nothing")] == []


async def test_a_sealed_partition_is_retried_after_the_time_it_names_without_a_refresh() -> None:
    sealed = rpc_error(Code.UNAVAILABLE, "z/0 is sealed", x_retry_after_ms="20")
    agent = FakeAgent("h:1", {}, [sealed, sealed, sealed])
    client, source, connector, clock = make_client(agents=[agent])
    await client.put("z", b"k", b"v")
    assert agent.kv == {b"k": b"v"}
    assert clock.sleeps == [0.02, 0.02, 0.02]  # not the growing backoff
    assert source.loads == 1  # the routes were right all along
    assert connector.dialed == ["h:1"] * 4
    agent.script = [sealed] * 1000  # 20 s of seal: past the 15 s deadline
    client_deadline = clock.now + client.deadline
    # the last error is the seal, or the last attempt's own deadline (the fake clock leaves it
    # a few picoseconds of real time)
    with pytest.raises(DataUnavailable, match=r"sealed|no answer within"):
        await client.put("z", b"k", b"w")
    assert clock.now <= client_deadline


@dataclass
class LayoutAgent(FakeAgent):
    """An agent whose zone is at layout ``generation`` of ``partitions``; it refuses a request
    of another generation with ``x-layout``, and ``flip_after`` scans it moves to the next
    layout (as a re-sharding's flip does), telling ``source``."""

    generation: int = 5
    partitions: int = 4
    flip_after: int = 3
    flip_to: int = 8
    source: FakeSource | None = None

    async def Scan(self, r: data_pb2.ScanRequest, **_: float) -> data_pb2.ScanResponse:
        self.calls.append("Scan")
        if self.calls.count("Scan") == self.flip_after:
            self.generation, self.partitions = self.generation + 1, self.flip_to
            assert self.source is not None
            self.source.routes = _layout_routes(self.generation, self.partitions)
        if r.partition.generation != self.generation:
            raise rpc_error(
                Code.FAILED_PRECONDITION,
                f"zone z is at layout generation {self.generation}",
                x_layout=f"{self.generation}/{self.partitions}",
            )
        keys = sorted(
            k
            for k in self.kv
            if k.startswith(r.prefix)
            and k > r.start_after
            and partition_of(k, self.partitions) == r.partition.partition
        )
        page = keys[: r.limit or 1000]
        return data_pb2.ScanResponse(
            items=[data_pb2.KeyValue(key=k, value=self.kv[k]) for k in page],
            more=len(keys) > len(page),
        )


def _layout_routes(generation: int, partitions: int) -> ZoneRoutes:
    return build_routes(
        "z",
        partitions,
        [(p, "n1", ["n1"]) for p in range(partitions)],
        [("n1", "h:1")],
        layout=generation,
    )


@dataclass
class GatedSource(FakeSource):
    """Route loads that wait for ``gate`` (drivers slow to answer)."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def load(self, zone: str) -> ZoneRoutes:
        self.loads += 1
        await self.gate.wait()
        return self.routes


@dataclass
class RecordingAgent(FakeAgent):
    """A FakeAgent that keeps the partition reference of every write."""

    refs: list[tuple[int, int]] = field(default_factory=list)

    async def Put(self, r: data_pb2.PutRequest, **_: float) -> data_pb2.WriteResponse:
        self.refs.append((r.partition.generation, r.partition.partition))
        return await super().Put(r)


def _layout_client(source: FakeSource, connector: FakeConnector) -> tuple[DataClient, FakeClock]:
    clock = FakeClock()
    client = DataClient(
        "127.0.0.1:7400",
        route_source=source,
        connector=connector,
        clock=clock,
        sleep=clock.sleep,
        rng=lambda: 1.0,
    )
    return client, clock


async def test_a_write_under_an_old_layout_goes_straight_to_the_key_s_new_primary() -> None:
    """After a flip the old source names the new layout and the key's primary under it: the
    write is sent there at once, under that layout, while the routes are re-read beside it —
    no write waits for the drivers (the cut-over pause, design/resharding.md); once the routes
    catch up, writes go straight to the new primaries."""
    key = next(k for k in (b"k%d" % i for i in range(100)) if partition_of(k, 8) >= 4)
    moved = partition_of(key, 8)
    flipped = rpc_error(
        Code.FAILED_PRECONDITION,
        "zone z is at layout generation 6",
        x_layout="6/8",
        x_primary="n2@h:2",
    )
    old = FakeAgent("h:1", {}, [flipped] * 2)
    new = RecordingAgent("h:2", {})
    source = GatedSource(_layout_routes(5, 4))
    source.gate.set()
    connector = FakeConnector({"h:1": old, "h:2": new})
    client, clock = _layout_client(source, connector)
    async with client:
        await client.routes("z")
        source.gate.clear()  # the drivers are slow from now on
        source.routes = build_routes(
            "z", 8, [(p, "n2", ["n2"]) for p in range(8)], [("n2", "h:2")], layout=6
        )
        await asyncio.wait_for(client.put("z", key, b"v1"), 1)
        assert new.kv == {key: b"v1"}
        assert new.refs == [(6, moved)]
        # a second write before the re-read lands: the old source again, then the hint
        await asyncio.wait_for(client.put("z", key, b"v2"), 1)
        assert new.refs == [(6, moved)] * 2
        assert old.calls == ["Put", "Put"]
        assert clock.sleeps == []
        assert source.loads == 2  # one re-read for both, still waiting
        source.gate.set()
        await asyncio.sleep(0.01)
        assert (await client.routes("z")).layout == 6
        await client.put("z", key, b"v3")
        assert old.calls == ["Put", "Put"]  # straight to the new primary now
        assert new.refs == [(6, moved)] * 3
        assert new.kv == {key: b"v3"}


async def test_a_redirect_under_a_hinted_layout_is_followed_and_not_learned_as_an_old_route() -> (
    None
):
    """The hinted primary moved on too and redirects: the write follows it under the hinted
    layout, and the cached table of the old layout is not taught a partition of the new one."""
    key = next(k for k in (b"k%d" % i for i in range(100)) if partition_of(k, 8) < 4)
    moved = partition_of(key, 8)
    flipped = rpc_error(Code.FAILED_PRECONDITION, "", x_layout="6/8", x_primary="n2@h:2")
    old = FakeAgent("h:1", {}, [flipped])
    hinted = FakeAgent("h:2", {}, [rpc_error(Code.FAILED_PRECONDITION, "not primary", "n3@h:3")])
    new = RecordingAgent("h:3", {})
    source = GatedSource(_layout_routes(5, 4))
    source.gate.set()
    client, _ = _layout_client(source, FakeConnector({"h:1": old, "h:2": hinted, "h:3": new}))
    async with client:
        before = await client.routes("z")
        source.gate.clear()
        await asyncio.wait_for(client.put("z", key, b"v"), 1)
        assert new.refs == [(6, moved)]
        assert client._routes["z"].routes == before.routes  # nothing learned into it
        source.gate.set()


async def test_a_hint_from_an_agent_behind_the_client_s_layout_is_not_followed() -> None:
    """An agent whose view lags names an older layout (and its primary): the client keeps its
    newer routes and re-reads them, as for a plain ``x-layout``."""
    lagging = rpc_error(Code.FAILED_PRECONDITION, "", x_layout="5/4", x_primary="n9@h:9")
    agent = FakeAgent("h:1", {}, [lagging])
    source = FakeSource(_layout_routes(6, 8))
    connector = FakeConnector({"h:1": agent})
    client, _ = _layout_client(source, connector)
    async with client:
        await client.put("z", b"k", b"v")
    assert "h:9" not in connector.dialed
    assert connector.dialed == ["h:1", "h:1"]
    assert source.loads == 2  # re-read at once, as before the hints


@pytest.mark.parametrize("flip_to", [8, 3])
async def test_a_scan_across_a_flip_goes_on_under_the_new_layout_never_mixing_two(
    flip_to: int,
) -> None:
    """The zone grows 4 → 8 (or shrinks 4 → 3) in the middle of a paged scan: every key comes
    exactly once, in order — partitions of the old layout are not read under the new one."""
    data = {f"key-{i:03d}".encode(): f"v{i}".encode() for i in range(60)}
    source = FakeSource(_layout_routes(5, 4))
    agent = LayoutAgent("h:1", dict(data), flip_to=flip_to, source=source)
    client = DataClient(
        "127.0.0.1:7400",
        route_source=source,
        connector=FakeConnector({"h:1": agent}),
        sleep=FakeClock().sleep,
    )
    got = [kv async for kv in client.scan("z", b"key-", page_size=4)]
    assert got == sorted(data.items())
    assert agent.generation == 6


async def test_concurrent_writes_to_one_agent_share_a_call_and_are_answered_alone() -> None:
    wrong = rpc_error(Code.FAILED_PRECONDITION, "not the primary", "n2@h:2")
    agent, other = FakeAgent("h:1", {}), FakeAgent("h:2", {})
    client, _, _, _ = make_client(agents=[agent, other])
    async with client:
        await client.put("z", b"first", b"1")
        agent.script = [rpc_error(Code.INVALID_ARGUMENT, "bad"), wrong]
        keys = [f"k{i}".encode() for i in range(40)]
        results = await asyncio.gather(
            *(client.put("z", k, b"v") for k in keys), return_exceptions=True
        )
    # one call for the 40; its first op was refused alone, its second redirected alone
    assert agent.batches == [1, 40]
    assert other.calls == ["Put"]  # the redirected write, in a batch of its own at h:2
    assert isinstance(results[0], InvalidInput)
    assert all(isinstance(r, WriteResult) for r in results[1:])
    assert set(agent.kv) | set(other.kv) == {b"first", *keys[1:]}
    assert len(other.kv) == 1
    calls, writes = client.write_batches()
    assert (calls, writes) == (3, 42)


async def test_an_agent_without_write_batch_gets_single_calls_from_then_on() -> None:
    agent = FakeAgent("h:1", {}, old=True)
    client, _, _, _ = make_client(agents=[agent])
    async with client:
        await client.put("z", b"a", b"1")
        await client.put("z", b"b", b"2")
        assert await client.delete("z", b"a")
    assert agent.calls == ["WriteBatch", "Put", "Put", "Delete"]
    assert agent.kv == {b"b": b"2"}


async def test_closing_the_client_fails_its_queued_writes_with_client_closed() -> None:
    release = asyncio.Event()

    class SlowAgent(FakeAgent):
        async def WriteBatch(
            self, r: data_pb2.WriteBatchRequest, **_: float
        ) -> data_pb2.WriteBatchResponse:
            await release.wait()
            return await super().WriteBatch(r)

    agent = SlowAgent("h:1", {})
    client, _, _, _ = make_client(agents=[agent])
    first = asyncio.ensure_future(client.put("z", b"a", b"1"))
    await asyncio.sleep(0.01)
    queued = asyncio.ensure_future(client.put("z", b"b", b"2"))  # behind the call in flight
    await asyncio.sleep(0.01)
    await client.close()
    for write in (first, queued):
        with pytest.raises(ClientClosed, match="closed"):
            await write
    assert agent.kv == {}
