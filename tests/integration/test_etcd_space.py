"""etcd out of space (design/deployment.md, "etcd out of space"): a secure etcd (TLS, auth on,
the product's user allowed only its prefix) with a small ``--quota-backend-bytes``, a real
driver process and real agents.

Filled past its quota, etcd raises the NOSPACE alarm and refuses every write. The product says
so — not a silent retry loop: the driver's health goes NOT_SERVING, ``placement_etcd_alarm
{alarm="NOSPACE"}`` is 1 on its ``/metrics``, every zone's status carries a line naming the alarm
and the fix, and the driver's log names it without spinning. An operator (etcd's root) deletes
the filler, compacts, defragments and disarms: health is SERVING again, the gauge 0, the line
gone, and a replica-count change made then completes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from conftest import ChaosEtcd
from grpc_health.v1 import health_pb2
from prometheus_client.parser import text_string_to_metric_families
from test_driver import eventually, settled
from test_driver_chaos import agents_on, drivers_on, wait_leader
from test_health import _status as health_of

from placement.api.client import ApiError, PlacementClient
from placement.core.model import ZoneSpec
from placement.errors import StoreFull
from placement.local.certs import ETCD_USER, LocalPki, create_pki
from placement.local.cluster import free_ports
from placement.local.etcd import EtcdMember, EtcdTls
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace, prefix_range_end
from placement.security.credentials import EtcdCredentials
from placement.security.pki import Role
from placement.v1 import driver_pb2

pytestmark = pytest.mark.integration

QUOTA = 16 * 1024 * 1024  # bytes: etcd's --quota-backend-bytes
FILLER = b"/filler/"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _alarm_gauge(address: str, pki: LocalPki) -> float | None:
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(str(pki.cert("reader")), str(pki.key("reader")))
    with urllib.request.urlopen(f"https://{address}/metrics", context=context, timeout=10) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "placement_etcd_alarm" and s.labels.get("alarm") == "NOSPACE":
                return float(s.value)
    return None


async def _details(api: PlacementClient, zone: str) -> str:
    status = await api.call(
        lambda s, t: s.GetZoneStatus(driver_pb2.GetZoneRequest(name=zone), timeout=t)
    )
    return "\n".join(status.details)


async def _fill(operator: EtcdClient, value: bytes) -> None:
    """Put ``value`` under new filler keys until etcd refuses (at most 4 × the quota)."""
    for i in range(4 * QUOTA // len(value)):
        await operator.put(FILLER + b"%04d" % i, value)


async def _alter(api: PlacementClient, replicas: int) -> None:
    request = driver_pb2.AlterZoneRequest(
        name="full", config=driver_pb2.ZoneConfig(replicas=replicas), update_fields=["replicas"]
    )
    await api.call(lambda s, t: s.AlterZone(request, timeout=t))


async def test_nospace_is_said_in_health_metrics_and_status_and_recovers(
    etcd_binary: str, tmp_path: Path, prefix: str, keys: KeySpace
) -> None:
    processes = {"d1": Role.DRIVER} | {f"n{i}": Role.AGENT for i in range(3)}
    pki = create_pki(tmp_path / "tls", processes, dt.datetime.now(dt.UTC))
    member = EtcdMember(
        etcd_binary,
        tmp_path / "etcd",
        "m0",
        tuple(free_ports(3)),  # type: ignore[arg-type]
        tls=EtcdTls(pki.ca, pki.cert("etcd"), pki.key("etcd")),
        fast=True,
        extra_args=("--quota-backend-bytes", str(QUOTA)),
    )
    member.start()
    try:
        root = EtcdCredentials(pki.material("etcd-root"))
        product = EtcdCredentials(pki.material("etcd-client"))
        async with (
            # A fresh TLS member on a loaded machine may take seconds to finish a handshake.
            EtcdClient(member.endpoint, credentials=root, call_timeout=20.0) as operator,
            EtcdClient(member.endpoint, credentials=product) as client,
        ):
            await operator.enable_auth(ETCD_USER, None, prefix)
            chaos = ChaosEtcd(member.endpoint, client, pki, product)
            metrics_at = f"127.0.0.1:{free_ports(1)[0]}"
            async with (
                drivers_on(chaos, tmp_path, prefix) as drivers,
                agents_on(chaos, tmp_path, keys, catchup_delay=0.0) as cluster,
            ):
                for n in ("n0", "n1", "n2"):
                    await cluster.start_agent(n)
                d1 = await drivers.start("d1", "--metrics-listen", metrics_at)
                _, fence = await wait_leader(client, keys)
                spec = ZoneSpec("full", partitions=4, replicas=2)
                assert (await cluster.store.create_zone(spec, fence)).applied
                await eventually(lambda: settled(cluster.store, spec), "the zone to be placed")
                async with PlacementClient(d1.address, tls=pki.material("admin")) as api:
                    assert "NOSPACE" not in await _details(api, "full")
                    assert health_of(d1.address, pki) == SERVING
                    assert _alarm_gauge(metrics_at, pki) == 0.0

                    # Fill etcd past its quota, outside the product's prefix.
                    value = b"x" * (1024 * 1024)
                    with pytest.raises(StoreFull) as full:
                        await _fill(operator, value)
                    assert "disarm" in str(full.value), full.value  # the error names the fix
                    assert [a.kind for a in await client.alarms()] == ["NOSPACE"]
                    filled_at = time.monotonic()

                    async def said() -> bool:
                        return (
                            health_of(d1.address, pki) == NOT_SERVING
                            and _alarm_gauge(metrics_at, pki) == 1.0
                            and "NOSPACE" in await _details(api, "full")
                        )

                    await eventually(said, "health, metrics and status to say NOSPACE", 15.0)
                    print(f"NOSPACE said within {time.monotonic() - filled_at:.1f}s")
                    details = await _details(api, "full")
                    assert "etcdctl defrag" in details, details
                    assert "alarm disarm" in details, details
                    # A change made now cannot be written: the API says why at once.
                    with pytest.raises(ApiError) as refused:
                        await _alter(api, 3)
                    assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
                    assert "NOSPACE" in refused.value.detail, refused.value
                    # Nothing spins meanwhile.
                    lines_before = len(d1.text().splitlines())
                    await asyncio.sleep(5.0)
                    grew = len(d1.text().splitlines()) - lines_before
                    assert grew <= 20, f"{grew} log lines in 5 s of NOSPACE:\n{d1.text()[-3000:]}"
                    assert "NOSPACE" in d1.text(), "the driver's log does not name the alarm"

                    # The operator recovers: delete, compact, defragment, disarm.
                    await operator.delete(FILLER, prefix_range_end(FILLER))
                    revision = await operator.current_revision()
                    await operator.compact(revision)
                    await operator.defragment()
                    for alarm in await operator.alarms():
                        await operator.disarm(alarm)
                    assert await client.alarms() == ()

                    async def recovered() -> bool:
                        return (
                            health_of(d1.address, pki) == SERVING
                            and _alarm_gauge(metrics_at, pki) == 0.0
                            and "NOSPACE" not in await _details(api, "full")
                        )

                    await eventually(recovered, "health, metrics and status to recover", 15.0)
                    await _alter(api, 3)
                    grown = ZoneSpec("full", partitions=4, replicas=3)
                    await eventually(lambda: settled(cluster.store, grown), "the change to land")
    finally:
        member.stop()
