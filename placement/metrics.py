"""Every Prometheus metric of the product, defined once, and the one ``/metrics`` endpoint
(design/observability.md lists each: name, type, labels, meaning).

Counters and histograms are updated where the event happens (one increment, no I/O); gauges that
mirror state — replicas and primaries per node, zone states, hosted replicas, in-sync-set sizes —
are computed only when scraped, by collectors the driver and the agent register
(:func:`register_collector`), so an idle process pays nothing per partition for its metrics.

Labels stay bounded: zones, nodes and small enums, never partitions or keys.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from placement.errors import InvalidInput
from placement.security.tls import TlsMaterial

#: Every metric of the product lives in this registry (not the library's global one, so a test
#: process that imports the product twice, or a library of its own, cannot collide with it).
REGISTRY = CollectorRegistry(auto_describe=True)

_FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_SLOW = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)

# -- the driver ------------------------------------------------------------------------------------

DRIVER_LEADER = Gauge(
    "placement_driver_leader",
    "1 while this driver instance is the elected leader, else 0.",
    registry=REGISTRY,
)
DRIVER_EPOCH = Gauge(
    "placement_driver_epoch",
    "Leadership epoch (the leader key's create revision) of this instance's current term; 0"
    " when not leading.",
    registry=REGISTRY,
)
DRIVER_TERMS = Counter(
    "placement_driver_terms",
    "Terms this instance has led (elections won).",
    registry=REGISTRY,
)
#: A pass's buckets: 150 ms around the 100 ms goal, and tails to a minute (a fleet's passes).
_PASSES = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
PASS_SECONDS = Histogram(
    "placement_driver_pass_seconds",
    "Duration of one leader pass: view, plan and the writes it makes.",
    buckets=_PASSES,
    registry=REGISTRY,
)
ZONES_DEFERRED = Counter(
    "placement_driver_zones_deferred",
    "Zones a pass left for the next one, its budget of partitions decided spent"
    ' (design/control-plane.md, "A budget per pass"); the next pass follows at once.',
    registry=REGISTRY,
)
MOVES = Counter(
    "placement_driver_moves",
    "Rebalances of the zone that ended: done (stable switched), cancelled (reverted to the old"
    " assignment) or failed (an agent answered FAILED; the mover resends).",
    ["zone", "outcome"],
    registry=REGISTRY,
)
REBALANCE_RPCS = Counter(
    "placement_driver_rebalance_rpcs",
    "Rebalance and CancelRebalance calls to agents, by the agent's answer (unavailable: none).",
    ["outcome"],
    registry=REGISTRY,
)
ADOPTS = Counter(
    "placement_driver_adopts",
    "Adopts ended (a member of an idle stable given its replica record: a new zone's members,"
    " the term's sweep, after a cancel): done, stale (a newer move covers the node) or left"
    " (no answer after its attempts: the next term's sweep sends it again).",
    ["outcome"],
    registry=REGISTRY,
)
LEASE_WRITES = Counter(
    "placement_driver_primary_lease_writes",
    "Primary-lease writes by the leader: granted (a new holder or epoch), capped (the same holder:"
    " an end set or lifted), term (a node's lease term renewed, which every lease it holds"
    " follows); withheld: not written because the holder's agent did not answer a health check.",
    ["kind"],
    registry=REGISTRY,
)

# -- etcd ------------------------------------------------------------------------------------------

ETCD_TXN_SECONDS = Histogram(
    "placement_etcd_txn_seconds",
    "Latency of one etcd transaction by outcome: applied (its compares held; read-only ones"
    " too), stale (a compare failed; fenced ones as well), unavailable (no answer: the outcome is"
    " unknown).",
    ["outcome"],
    buckets=_FAST,
    registry=REGISTRY,
)
ETCD_FENCED = Counter(
    "placement_etcd_fenced",
    "Writes refused because the writer's leadership fence no longer held (NotLeader).",
    registry=REGISTRY,
)

# -- agents ----------------------------------------------------------------------------------------

DATA_SECONDS = Histogram(
    "placement_data_request_seconds",
    "Latency of a data request at the agent, from its arrival to its answer, by operation and"
    " outcome (ok, or the status code's name).",
    ["op", "outcome"],
    buckets=_FAST,
    registry=REGISTRY,
)
CATCH_UP_BYTES = Counter(
    "placement_catch_up_bytes",
    "Bytes (keys plus values) a learner on this agent copied from primaries.",
    registry=REGISTRY,
)
CATCH_UP_RATE = Gauge(
    "placement_catch_up_rate_bytes_per_second",
    "The rate this agent's catch-up and re-sharding copies run at: --catch-up-mbps, or below it"
    " while they slow the agent's client writes (design/data-plane.md).",
    registry=REGISTRY,
)
CATCH_UP_SECONDS = Histogram(
    "placement_catch_up_seconds",
    "Duration of a rebalance's catch-up on this agent: from the replica's creation until it is"
    " in the in-sync set.",
    buckets=_SLOW,
    registry=REGISTRY,
)
ISR_CHANGES = Counter(
    "placement_isr_changes",
    "In-sync-set writes by this agent's primaries: shrink (members removed), expand (a"
    " learner added) or other (first set, or both at once).",
    ["change"],
    registry=REGISTRY,
)
LACKING_PRIMARIES = Counter(
    "placement_primaries_lacking_entries",
    "Primaries of this agent that found their replica lacks entries a member knows are"
    " committed, and left the in-sync set instead of serving (should stay 0).",
    registry=REGISTRY,
)
LEASES_LOST = Counter(
    "placement_primary_leases_lost",
    "Primaries on this agent that stopped leading: expired (its lease ran out locally) or moved"
    " (the driver gave it to another node, or a newer epoch to this one).",
    ["reason"],
    registry=REGISTRY,
)
LINKS_DOWN = Counter(
    "placement_replication_links_down",
    "Times a pair stream to another agent went DOWN (no answer for the in-sync timeout).",
    registry=REGISTRY,
)


# Every known value of a fixed label is exported from the start (at 0), so a dashboard's query
# finds its series before the first event.
for _outcome in ("applied", "stale", "unavailable"):
    ETCD_TXN_SECONDS.labels(_outcome)
for _change in ("shrink", "expand", "other"):
    ISR_CHANGES.labels(_change)
for _reason in ("expired", "moved"):
    LEASES_LOST.labels(_reason)
for _kind in ("granted", "capped", "term"):
    LEASE_WRITES.labels(_kind)


# -- scrape-time gauges ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GaugeFamily:
    """One gauge computed at scrape time: ``samples`` maps label values to the value."""

    name: str
    help: str
    labels: tuple[str, ...]
    samples: Mapping[tuple[str, ...], float]


class _StateCollector(Collector):
    def __init__(self, families: Callable[[], Iterable[GaugeFamily]]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        for family in self._families():
            gauge = GaugeMetricFamily(family.name, family.help, labels=list(family.labels))
            for labels, value in sorted(family.samples.items()):
                gauge.add_metric(list(labels), value)
            yield gauge

    def describe(self) -> Iterable[Metric]:
        return []  # computed at scrape time: nothing to describe up front


def register_collector(families: Callable[[], Iterable[GaugeFamily]]) -> Callable[[], None]:
    """Add gauges computed by ``families()`` at every scrape (it runs on the HTTP server's
    thread: it must only read plain values); returns the function that removes them."""
    collector = _StateCollector(families)
    REGISTRY.register(collector)
    return lambda: REGISTRY.unregister(collector)


# -- the endpoint ----------------------------------------------------------------------------------


@dataclass(slots=True)
class MetricsServer:
    """``/metrics`` on ``address`` (HOST:PORT, the port as bound); :meth:`close` stops it."""

    address: str
    _server: WSGIServer
    _thread: threading.Thread

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def parse_listen(value: str, field: str = "--metrics-listen") -> tuple[str, int]:
    """``HOST:PORT`` (port 0 = any free) → (host, port); InvalidInput naming ``field``."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidInput(field, f"{value!r} is not HOST:PORT", "pass e.g. 127.0.0.1:9100")
    return host.strip("[]"), int(port)


def serve_metrics(listen: str, tls: TlsMaterial | None = None) -> MetricsServer:
    """Serve every metric of :data:`REGISTRY` at ``/metrics`` on ``listen`` from a thread of its
    own (scrapes never wait on the event loop). With ``tls`` (the process's own material) it is
    HTTPS with mutual TLS — the scraper presents a certificate of the same CA, any role — else
    plain HTTP. InvalidInput when ``listen`` is malformed or cannot be bound."""
    host, port = parse_listen(listen)
    try:
        if tls is None:
            server, thread = start_http_server(port, addr=host, registry=REGISTRY)
        else:
            # The ssl module loads keys from files only: a private directory, gone once loaded.
            with tempfile.TemporaryDirectory(prefix="placement-metrics-") as private:
                paths = {}
                for name, pem in (("ca", tls.ca), ("cert", tls.cert), ("key", tls.key)):
                    path = os.path.join(private, f"{name}.pem")
                    with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as out:
                        out.write(pem)
                    paths[name] = path
                server, thread = start_http_server(
                    port,
                    addr=host,
                    registry=REGISTRY,
                    certfile=paths["cert"],
                    keyfile=paths["key"],
                    client_cafile=paths["ca"],
                    client_auth_required=True,
                )
    except OSError as e:
        raise InvalidInput(
            "--metrics-listen", f"cannot listen on {listen}: {e.strerror}", "pick a free port"
        ) from e
    bound = server.server_address[1]
    return MetricsServer(f"{host}:{bound}", server, thread)
