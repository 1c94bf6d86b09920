"""Run one replica agent: ``ReplicaService`` (and the data plane's services) on a server from
:mod:`placement.rpc` (standard health checking and reflection).

Startup: bind → lock and open the data dir → resume unfinished catch-ups → serve → SERVING →
announce. Shutdown (SIGTERM/SIGINT or a fatal store error): NOT_SERVING →
``server.stop(grace)`` lets in-flight RPCs finish → stop catch-ups (they resume on restart) →
close the store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from grpc_health.v1 import health

from placement.aio import stop_on_signals
from placement.core.names import validate_name
from placement.errors import CredentialError
from placement.metastore.codec import NodeRecord, encode_node
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace
from placement.metrics import MetricsServer, parse_listen, register_collector, serve_metrics
from placement.rpc import advertised_address, bind_server, set_serving, start_server
from placement.security.credentials import EtcdCredentials
from placement.security.pki import Role, require_identity
from placement.security.tls import TlsMaterial
from placement.v1 import data_pb2, data_pb2_grpc, replica_pb2, replica_pb2_grpc
from replica.data.plane import DataConfig, DataPlane
from replica.data.servicers import DataServicer, ReplicationServicer
from replica.records import AgentStore, StoreThread
from replica.registration import Registration
from replica.service import CatchUp, ReplicaAgent
from replica.servicer import ReplicaServicer

log = logging.getLogger(__name__)

SERVICE_NAME: str = replica_pb2.DESCRIPTOR.services_by_name["ReplicaService"].full_name
DATA_SERVICE_NAME: str = data_pb2.DESCRIPTOR.services_by_name["DataService"].full_name
REPLICATION_SERVICE_NAME: str = data_pb2.DESCRIPTOR.services_by_name["ReplicationService"].full_name


class RunningAgent:
    """A started agent; ``address`` is the bound ``host:port`` (useful with port 0)."""

    def __init__(
        self,
        node: str,
        address: str,
        server: grpc.aio.Server,
        agent: ReplicaAgent,
        health_servicer: health.aio.HealthServicer,
        plane: DataPlane | None = None,
        services: Sequence[str] = (),
        replication: ReplicationServicer | None = None,
    ) -> None:
        self.plane = plane
        self._replication = replication
        self.services = tuple(services)
        self.node = node
        self.address = address
        self._server = server
        self._agent = agent
        self._health = health_servicer

    @property
    def agent(self) -> ReplicaAgent:
        return self._agent

    async def set_serving(self, serving: bool) -> None:
        """Health of every service: NOT_SERVING while the node's registration has lapsed."""
        await set_serving(self._health, self.services, serving)

    async def stop(self, grace: float) -> None:
        await self._health.enter_graceful_shutdown()
        if self._replication is not None:
            self._replication.close()  # peers' pair streams would hold the stop for its grace
        await self._server.stop(grace)
        if self.plane is not None:
            await self.plane.close()
        await self._agent.close()


async def start_agent(
    node: str,
    listen: str,
    data_dir: Path,
    *,
    catch_up: CatchUp | None = None,
    on_fatal: Callable[[BaseException], None] | None = None,
    etcd_client: EtcdClient | None = None,
    keys: KeySpace | None = None,
    data_config: DataConfig | None = None,
    advertise: str | None = None,
    tls: TlsMaterial | None = None,
    store_executor: ThreadPoolExecutor | None = None,
) -> RunningAgent:
    """Bind ``listen``, open the data dir, start serving; raises ``PlacementError`` on bad input.

    Binding comes first so that a bad or taken address leaves the data dir untouched. With an
    etcd client the agent also runs the data plane (``DataService``, ``ReplicationService``) and
    a rebalance's catch-up copies data (unless ``catch_up`` is given). ``store_executor``: the
    store's thread, shared with other agents of the process (:class:`StoreThread`).
    """
    validate_name(node, "--node")
    if tls is not None:  # peers accept this node's appends only under its own name
        require_identity(tls.cert, Role.AGENT, node)
    advertised_address(listen, advertise)  # bad input fails before anything binds
    server, bound = bind_server(listen, tls=tls)
    address = advertised_address(listen, advertise, bound)
    try:
        store = await asyncio.to_thread(AgentStore.open, data_dir, node)
    except BaseException:
        await server.stop(None)
        raise
    db = StoreThread(store, store_executor)
    plane: DataPlane | None = None
    if etcd_client is not None and keys is not None:
        plane = DataPlane(
            node, db, etcd_client, keys, config=data_config, tls=tls, on_fatal=on_fatal
        )
        catch_up = catch_up if catch_up is not None else plane.catch_up
    agent = ReplicaAgent(
        node,
        db,
        catch_up=catch_up,
        on_fatal=on_fatal,
        isr_names_me=plane.isr_names_me if plane is not None else None,
        pause_learner=plane.learner_paused if plane is not None else None,
    )
    served = [SERVICE_NAME]  # the agent's own services: reported SERVING by health checks
    replication: ReplicationServicer | None = None
    try:
        if plane is not None:
            await plane.start()
            data_pb2_grpc.add_DataServiceServicer_to_server(DataServicer(plane), server)
            replication = ReplicationServicer(plane)
            data_pb2_grpc.add_ReplicationServiceServicer_to_server(replication, server)
            served += [DATA_SERVICE_NAME, REPLICATION_SERVICE_NAME]
        await agent.start()
        replica_pb2_grpc.add_ReplicaServiceServicer_to_server(ReplicaServicer(agent), server)
        health_servicer = await start_server(server, served)
    except BaseException:
        await server.stop(None)
        if plane is not None:
            await plane.close()
        await agent.close()
        raise
    return RunningAgent(node, address, server, agent, health_servicer, plane, served, replication)


async def _hand_over(registration: Registration, running: RunningAgent, within: float) -> None:
    """Before the registration goes: say the agent stops, and wait (bounded) until the leader
    moved its primary leases to other in-sync members — writes then pause only for a redirect,
    not for a lease's expiry (design/control-plane.md, "Drain")."""
    if running.plane is None or not running.plane.leases_held():
        return
    if not await registration.mark_stopping():
        return
    started = time.monotonic()
    held = await running.plane.hand_over(within)
    log.info(
        "stopping: primary leases handed over in %.2fs (%d still held: they move on expiry)",
        time.monotonic() - started,
        held,
    )


async def serve(
    node: str,
    listen: str,
    data_dir: Path,
    *,
    grace: float = 5.0,
    catch_up: CatchUp | None = None,
    announce: Callable[[str], None] | None = None,
    etcd: str | None = None,
    prefix: str = "/placement",
    attributes: Mapping[str, str] | None = None,
    lease_ttl: int = 5,
    data_config: DataConfig | None = None,
    advertise: str | None = None,
    tls: TlsMaterial | None = None,
    etcd_credentials: EtcdCredentials | None = None,
    metrics_listen: str | None = None,
) -> int:
    """Run an agent until SIGTERM/SIGINT (exit status 0) or a fatal store error (1). With
    ``metrics_listen`` (HOST:PORT) it serves Prometheus metrics at ``/metrics`` there.

    With ``etcd`` the agent registers ``{prefix}/nodes/{node}`` (its address and ``attributes``)
    under a lease it keeps alive (:mod:`replica.registration`) once it serves, and revokes the
    lease first on shutdown, so the driver sees it leave at once; it also pushes move reports
    (``{prefix}/progress/...``, under the same lease) when a catch-up ends. Announces
    ``agent NODE listening on HOST:PORT`` once it serves (and is registered); tests and scripts
    wait for it.
    """
    keys = KeySpace(prefix) if etcd is not None else None
    if etcd is not None:  # bad input fails before the data dir is touched
        encode_node(NodeRecord(node, "127.0.0.1:1", dict(attributes or {})))
    if metrics_listen is not None:
        parse_listen(metrics_listen)
    stop = asyncio.Event()
    fatal: list[BaseException] = []

    def on_fatal(error: BaseException) -> None:
        fatal.append(error)
        stop.set()

    client = EtcdClient(etcd, credentials=etcd_credentials) if etcd is not None else None
    try:
        if client is not None:
            await client.check_access(prefix)  # a refused credential ends the process now
        running = await start_agent(
            node,
            listen,
            data_dir,
            catch_up=catch_up,
            on_fatal=on_fatal,
            etcd_client=client,
            keys=keys,
            data_config=data_config,
            advertise=advertise,
            tls=tls,
        )
    except BaseException:
        if client is not None:
            await client.close()
        raise
    collectors = [register_collector(running.plane.gauges)] if running.plane is not None else []
    metrics_server: MetricsServer | None = None

    def close_metrics() -> None:
        for unregister in collectors:
            unregister()
        if metrics_server is not None:
            metrics_server.close()

    try:
        metrics_server = serve_metrics(metrics_listen, tls) if metrics_listen is not None else None
    except BaseException:
        close_metrics()
        await running.stop(grace)
        if client is not None:
            await client.close()
        raise
    if metrics_server is not None:
        log.info("metrics at http://%s/metrics", metrics_server.address)
    registration: Registration | None = None
    if client is not None and keys is not None:
        record = NodeRecord(node, running.address, dict(attributes or {}))
        registration = Registration(
            client,
            keys,
            record,
            ttl=lease_ttl,
            on_change=running.set_serving,
            on_fatal=on_fatal,
        )
        try:
            await registration.start()
        except BaseException:
            close_metrics()
            await running.stop(grace)
            await client.close()
            raise
        running.agent.reporter = registration.report
        if running.plane is not None:
            running.plane.put_owned = registration.put_owned_many
    try:
        with stop_on_signals(stop):
            line = f"agent {node} listening on {running.address}"
            if announce is None:
                print(line, flush=True)
            else:
                announce(line)
            await stop.wait()
    finally:
        try:
            if registration is not None:
                await _hand_over(registration, running, grace)
                await registration.stop()
        finally:
            try:
                await running.stop(grace)
            finally:
                close_metrics()
                if client is not None:
                    await client.close()
    refused = [e for e in fatal if isinstance(e, CredentialError)]
    if refused:
        raise refused[0]  # one line naming the credential, exit 2
    return 1 if fatal else 0
