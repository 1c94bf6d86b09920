"""``PlacementClient.call``: failover between endpoints and its pauses between rounds."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from placement.api.client import ApiError, PlacementClient


class Stop(Exception):
    """Ends the retry loop from the injected sleep."""


def unavailable() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down"
    )


async def test_rounds_pause_0_1_doubling_to_2_seconds_without_jitter() -> None:
    delays: list[float] = []

    async def sleep(delay: float) -> None:
        delays.append(delay)
        if len(delays) == 7:
            raise Stop

    tried: list[str] = []

    async def method(stub: Any, call_timeout: float) -> None:
        tried.append("call")
        raise unavailable()

    async with PlacementClient(["127.0.0.1:1", "127.0.0.1:2"], deadline=60, sleep=sleep) as c:
        with pytest.raises(Stop):
            await c.call(method)
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert len(tried) == 2 * 7  # every endpoint once per round


async def test_gives_up_after_the_deadline_naming_the_endpoints() -> None:
    async def sleep(delay: float) -> None:
        pass

    async def method(stub: Any, call_timeout: float) -> None:
        raise unavailable()

    async with PlacementClient("127.0.0.1:1", deadline=0.05, sleep=sleep) as c:
        with pytest.raises(ApiError) as info:
            await c.call(method)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert str(info.value) == "no placement driver answered at 127.0.0.1:1 (down)"
