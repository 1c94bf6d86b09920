"""The checked-in generated code in placement/v1 must be what scripts/gen_proto.py writes."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_current(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    fresh = tmp_path / "placement" / "v1"
    checked_in = ROOT / "placement" / "v1"
    names = sorted(p.name for p in fresh.iterdir() if p.is_file())
    assert names == sorted(p.name for p in checked_in.iterdir() if p.is_file()), (
        "placement/v1 has other files than the generator writes: run scripts/gen_proto.py"
    )
    _, mismatch, errors = filecmp.cmpfiles(fresh, checked_in, names, shallow=False)
    assert not errors, errors
    assert not mismatch, f"stale generated code {mismatch}: run scripts/gen_proto.py"


def test_generated_services_expose_the_protocol() -> None:
    from placement.v1 import driver_pb2_grpc, replica_pb2

    assert {"Rebalance", "CancelRebalance"} <= set(
        replica_pb2.DESCRIPTOR.services_by_name["ReplicaService"].methods_by_name
    )
    assert hasattr(driver_pb2_grpc, "PlacementServiceStub")
