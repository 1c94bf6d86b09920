"""A driver's gRPC health follows its etcd (design/deployment.md, "Health"): NOT_SERVING while a
linearizable read — which only a member with a quorum behind it answers — fails, or while etcd
has an alarm raised (NOSPACE: it refuses every write, so nothing moves and no primary lease is
renewed; design/deployment.md, "etcd out of space"); SERVING again once a read succeeds with no
alarm. One small read and one alarm list per ``every`` seconds per driver instance.

:class:`EtcdHealth` holds what the probe saw last, for whoever reports it: zone status (a line in
its details), the ``placement_etcd_alarm`` gauge and the health service."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from placement import metrics
from placement.core.retry import Sleep
from placement.errors import PlacementError
from placement.metastore.etcd import NOSPACE_FIX, EtcdClient
from placement.metastore.kv import Alarm

log = logging.getLogger(__name__)

#: Seconds between probes.
PROBE_EVERY = 1.0

#: The alarm kinds etcd has (each one exported by the gauge, 0 when not raised).
ALARM_KINDS = ("NOSPACE", "CORRUPT")


class EtcdHealth:
    """What the last probe saw: whether etcd answered, and the alarms it has raised."""

    def __init__(self) -> None:
        self.reachable = True
        self.alarms: tuple[Alarm, ...] = ()

    @property
    def serving(self) -> bool:
        return self.reachable and not self.alarms

    def details(self) -> tuple[str, ...]:
        """One line per raised alarm, naming what it stops and what the operator does."""
        lines = []
        for alarm in self.alarms:
            if alarm.kind == "NOSPACE":
                lines.append(
                    f"etcd alarm {alarm}: etcd refuses every write — nothing moves and primary "
                    f"leases are not renewed; {NOSPACE_FIX}"
                )
            else:
                lines.append(
                    f"etcd alarm {alarm}: etcd refuses writes; restore the member from a "
                    "snapshot of a healthy one, then disarm the alarm"
                )
        return tuple(lines)

    def raised(self, kind: str) -> bool:
        return any(a.kind == kind for a in self.alarms)

    def gauges(self) -> list[metrics.GaugeFamily]:
        """``placement_etcd_alarm``: 1 per alarm kind raised, as this driver last saw it."""
        return [
            metrics.GaugeFamily(
                "placement_etcd_alarm",
                "1 while etcd has this alarm raised (NOSPACE: it refuses writes), as the "
                "driver's health probe last saw it.",
                ("alarm",),
                {(kind,): float(self.raised(kind)) for kind in ALARM_KINDS},
            )
        ]


async def follow_etcd(
    client: EtcdClient,
    key: bytes,
    set_serving: Callable[[bool], Awaitable[None]],
    health: EtcdHealth | None = None,
    *,
    every: float = PROBE_EVERY,
    sleep: Sleep = asyncio.sleep,
) -> None:
    """Until cancelled: read ``key`` (linearizable) and list etcd's alarms every ``every``
    seconds, keep ``health`` current, and report through ``set_serving`` on each change of
    :attr:`EtcdHealth.serving` (the first report: SERVING assumed)."""
    health = health if health is not None else EtcdHealth()
    serving = True
    while True:
        reason = ""
        try:
            await client.range(key, limit=1, keys_only=True)
            health.reachable = True
        except PlacementError as e:  # unreachable, or a credential etcd now refuses
            health.reachable = False
            reason = f"no etcd quorum ({e})"
        try:
            alarms = await client.alarms() if health.reachable else health.alarms
        except PlacementError as e:  # the alarms stay as last seen; the next probe asks again
            log.debug("etcd alarm list failed: %s", e)
            alarms = health.alarms
        if health.reachable:
            if alarms != health.alarms:
                for alarm in set(alarms) - set(health.alarms):
                    log.error("etcd raised alarm %s", alarm)
                for alarm in set(health.alarms) - set(alarms):
                    log.warning("etcd alarm %s is disarmed", alarm)
                health.alarms = alarms
            reason = "; ".join(health.details())
        if health.serving != serving:
            serving = health.serving
            if serving:
                log.info("etcd answers with no alarm: health SERVING")
            else:
                log.warning("%s: health NOT_SERVING", reason)
            await set_serving(serving)
        await sleep(every)
