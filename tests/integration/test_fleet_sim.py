"""The fleet benchmark's scenario at a small size (``bench/fleet_bench.py``, issue 14).

Real processes on free 127.0.0.1 ports: etcd, the driver, and 2 fleet processes of simulated
agents (``python -m replica.sim``: the real replica protocol, store and registration, no data
plane) — 30 nodes, 4 zones × 50 partitions × R=3. The scenario: create the zones → every zone
READY; one node joins → stable; one leaves → stable; a rolling restart of 3 nodes under a
scale-down delay → stable, nothing moved. Checked: every phase settled (every zone READY, no
pending/planned, the data-nodes records as expected), every stable is exactly the placement
function's target for the final node set from the assignment before the phase (so the joiner
got what placement gives it and the leaver holds nothing), and the driver never lost its
election.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))

from fleet_bench import Params, kill_leftovers, run  # noqa: E402

pytestmark = pytest.mark.timeout(120)


async def test_a_small_fleet_creates_joins_leaves_and_restarts_onto_placements_targets(
    etcd_binary: str, tmp_path: Path
) -> None:
    params = Params(
        nodes=30,
        zones=4,
        partitions=50,
        replicas=3,
        processes=2,
        idle=0.0,
        restart_fraction=0.1,
        restart_batch=2,
        restart_delay=20.0,
        restart_downtime=0.3,
        phase_timeout=40.0,
        data_root=tmp_path,
        driver_rss_limit=2048.0,
    )
    try:
        outcome = await run(params, tmp_path / "work")
    finally:
        kill_leftovers()
    assert outcome.error is None, "\n".join(outcome.log)
    phases = {ph.name: ph for ph in outcome.phases}
    assert list(phases) == ["create", "join", "leave", "rolling restart"]

    create = phases["create"]
    assert create.off_target == 0  # every stable is place() of the zone on the 30 nodes
    assert create.delta("stable puts") == 4 * 50

    for name in ("join", "leave"):
        phase = phases[name]
        assert phase.seconds is not None, name
        assert phase.seconds < 30.0, name
        assert phase.moved, f"{name}: nothing moved"
        assert phase.off_target == 0, f"{name}: stable is not placement's target"
        assert phase.delta("pending puts") >= phase.moved

    restart = phases["rolling restart"]
    assert restart.moved == 0  # the scale-down delay rides the restarts out
    assert restart.off_target == 0
    assert restart.delta("pending puts") == 0

    for phase in outcome.phases:
        assert phase.leader_events == 0, f"{phase.name}: the driver lost its election"
        assert phase.terms == 0, f"{phase.name}: the driver started another term"
        assert phase.passes is not None, phase.name
        assert phase.passes.count > 0, phase.name
