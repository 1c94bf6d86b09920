"""Which role may call which method: the one table every server enforces (design/deployment.md).

Pure: method names are gRPC's full paths (``/placement.v1.PlacementService/CreateZone``). A
method the table does not name is refused to everyone — a new RPC is closed until it is given a
row (``tests/unit/test_roles.py`` checks every method of every service has one). Health checks
and reflection are open to any caller with a valid certificate.
"""

from __future__ import annotations

from collections.abc import Mapping

from placement.security.pki import Role

DRIVER, AGENT, ADMIN, READER, CLIENT = (
    Role.DRIVER,
    Role.AGENT,
    Role.ADMIN,
    Role.READER,
    Role.CLIENT,
)

#: Reads of the control plane: operators, data clients (their routing), and drivers (a
#: follower driver forwards its callers' requests to the leader with its own certificate;
#: its own guard checked theirs first).
_READS = frozenset({READER, CLIENT, ADMIN, DRIVER})
#: Changes an operator makes: zone CRUD, cancel, pause (and the forwarding driver).
_ADMIN = frozenset({ADMIN, DRIVER})

#: Services any certified caller may use.
OPEN_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection")

_P = "/placement.v1.PlacementService/"
_R = "/placement.v1.ReplicaService/"
_D = "/placement.v1.DataService/"
_X = "/placement.v1.ReplicationService/"

#: Method → the roles that may call it.
TABLE: Mapping[str, frozenset[Role]] = {
    _P + "CreateZone": _ADMIN,
    _P + "AlterZone": _ADMIN,
    _P + "DropZone": _ADMIN,
    _P + "CancelRebalance": _ADMIN,
    _P + "CancelReshard": _ADMIN,
    _P + "PauseRebalancing": _ADMIN,
    _P + "ResumeRebalancing": _ADMIN,
    _P + "DrainNode": _ADMIN,
    _P + "CordonNode": _ADMIN,
    _P + "GetNodeStatus": _READS,
    _P + "Plan": _READS,
    _P + "GetZone": _READS,
    _P + "ListZones": _READS,
    _P + "GetZoneStatus": _READS,
    _P + "ListNodes": _READS,
    _P + "GetAssignments": _READS,
    _P + "WatchAssignments": _READS,
    # The driver's protocol to agents: only a driver moves or deletes replicas.
    _R + "Rebalance": frozenset({DRIVER}),
    _R + "CancelRebalance": frozenset({DRIVER}),
    _R + "Retire": frozenset({DRIVER}),
    _R + "RebalanceBatch": frozenset({DRIVER}),
    _R + "RetireBatch": frozenset({DRIVER}),
    _R + "GetPartitionState": frozenset({DRIVER, ADMIN, READER}),
    _R + "ListHosted": frozenset({DRIVER, ADMIN, READER}),
    # Data: reads for readers and clients, writes for clients only.
    _D + "Put": frozenset({CLIENT}),
    _D + "Delete": frozenset({CLIENT}),
    _D + "WriteBatch": frozenset({CLIENT}),
    _D + "Get": frozenset({READER, CLIENT}),
    _D + "Scan": frozenset({READER, CLIENT}),
    # Replication between agents; a replica's copy may be read for checking.
    _X + "Replicate": frozenset({AGENT}),
    _X + "Fetch": frozenset({AGENT}),
    _X + "ReadReplica": frozenset({AGENT, ADMIN, READER, CLIENT}),
}


def is_open(method: str) -> bool:
    return any(method.startswith(f"/{service}/") for service in OPEN_SERVICES)


def denial(method: str, role: Role | None) -> str:
    """Why a caller in ``role`` (None: its certificate names none) may not call ``method``;
    "" when it may."""
    if is_open(method):
        return ""
    allowed = TABLE.get(method)
    if allowed is None:
        return f"{method} is not open to any role"
    if role in allowed:
        return ""
    needed = " or ".join(sorted(r.value for r in allowed))
    who = f"role {role.value}" if role is not None else "a certificate without a role"
    return f"{method} needs role {needed}; the caller has {who}"
