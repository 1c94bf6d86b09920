"""A driver's gRPC health follows its etcd quorum (design/deployment.md, "Health"): NOT_SERVING
while a linearizable read — which only a member with a quorum behind it answers — fails, SERVING
again once one succeeds. One small read per ``every`` seconds per driver instance."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from placement.core.retry import Sleep
from placement.errors import PlacementError
from placement.metastore.etcd import EtcdClient

log = logging.getLogger(__name__)

#: Seconds between quorum probes.
PROBE_EVERY = 1.0


async def follow_quorum(
    client: EtcdClient,
    key: bytes,
    set_serving: Callable[[bool], Awaitable[None]],
    *,
    every: float = PROBE_EVERY,
    sleep: Sleep = asyncio.sleep,
) -> None:
    """Until cancelled: read ``key`` (linearizable) every ``every`` seconds and report whether
    etcd answered through ``set_serving`` on each change (the first report: SERVING assumed)."""
    serving = True
    while True:
        try:
            await client.range(key, limit=1, keys_only=True)
            reached = True
        except PlacementError as e:  # unreachable, or a credential etcd now refuses
            reached = False
            reason = str(e)
        if reached != serving:
            serving = reached
            if serving:
                log.info("etcd quorum reached again: health SERVING")
            else:
                log.warning("no etcd quorum (%s): health NOT_SERVING", reason)
            await set_serving(serving)
        await sleep(every)
