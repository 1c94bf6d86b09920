"""The role table (placement.security.roles): every method of every service has a row (a new RPC
cannot be forgotten open), and the rows say what design/deployment.md says."""

from __future__ import annotations

import pytest

from placement.security.pki import Role
from placement.security.roles import TABLE, denial
from placement.v1 import data_pb2, driver_pb2, replica_pb2


def _methods() -> list[str]:
    return [
        f"/{service.full_name}/{method.name}"
        for module in (driver_pb2, data_pb2, replica_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    ]


def test_every_method_of_every_service_has_a_row_and_no_row_is_stale() -> None:
    methods = _methods()
    assert set(methods) == set(TABLE), set(methods) ^ set(TABLE)


@pytest.mark.parametrize(
    ("method", "role", "allowed"),
    [
        ("/placement.v1.PlacementService/CreateZone", Role.ADMIN, True),
        ("/placement.v1.PlacementService/CreateZone", Role.READER, False),
        ("/placement.v1.PlacementService/DropZone", Role.AGENT, False),
        ("/placement.v1.PlacementService/DropZone", Role.CLIENT, False),
        ("/placement.v1.PlacementService/GetAssignments", Role.CLIENT, True),
        ("/placement.v1.PlacementService/WatchAssignments", Role.READER, True),
        ("/placement.v1.ReplicaService/Retire", Role.DRIVER, True),
        ("/placement.v1.ReplicaService/Retire", Role.ADMIN, False),
        ("/placement.v1.ReplicaService/Retire", Role.AGENT, False),
        ("/placement.v1.DataService/Put", Role.CLIENT, True),
        ("/placement.v1.DataService/Put", Role.READER, False),
        ("/placement.v1.DataService/Get", Role.READER, True),
        ("/placement.v1.ReplicationService/Replicate", Role.AGENT, True),
        ("/placement.v1.ReplicationService/Replicate", Role.DRIVER, False),
        ("/placement.v1.ReplicationService/Fetch", Role.CLIENT, False),
        ("/grpc.health.v1.Health/Check", Role.READER, True),
        ("/grpc.health.v1.Health/Check", None, True),
    ],
)
def test_the_table_allows_and_denies_as_designed(
    method: str, role: Role | None, allowed: bool
) -> None:
    assert (denial(method, role) == "") is allowed


def test_a_denial_names_the_roles_needed_and_what_the_caller_has() -> None:
    why = denial("/placement.v1.PlacementService/AlterZone", Role.READER)
    assert why == (
        "/placement.v1.PlacementService/AlterZone needs role admin or driver;"
        " the caller has role reader"
    )
    assert "without a role" in denial("/placement.v1.DataService/Put", None)
    assert "not open to any role" in denial("/placement.v1.PlacementService/Nope", Role.ADMIN)
