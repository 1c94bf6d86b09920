"""The chaos campaign (``bench/chaos_campaign.py``; design/architecture.md, "Chaos campaign")
at a small size: 10 seeded faults — every kind of its menu at least once — against the cluster
``placectl up --etcd-members 3`` starts (secure, three etcd members, two drivers, five agents)
under recorded writes and reads.

Asserted: every fault recovered within the stuck bound (60 s); no acknowledged write lost or
wrong on the API or on any stable replica; every key's history linearizable; no write by a
deposed leader term after its leader key was deleted in etcd's history; no traceback in any log.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from test_driver import assert_clean_log

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))

from chaos_campaign import (  # noqa: E402
    MENU,
    campaign_options,
    render,
    run_campaign,
    schedule,
    start,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SEED = 7
FAULTS = 10


def test_ten_seeded_faults_of_every_kind_lose_nothing_and_stay_linearizable(
    tmp_path: Path,
) -> None:
    steps = schedule(SEED, FAULTS, nodes=5, max_gap=1.5)
    assert {s.kind for s in steps} == set(MENU), "the schedule must cover every fault kind"
    opts = campaign_options(nodes=5, drivers=2, ttl=3)
    cluster = start(opts, tmp_path / "cluster")
    try:
        outcome = asyncio.run(run_campaign(cluster, opts, steps, tmp_path, seed=SEED))
    finally:
        cluster.stop()
    report = render(outcome, "pytest", "test", "test")
    (tmp_path / "campaign.md").write_text(report)
    print(report)
    assert [f.kind for f in outcome.faults] == [s.kind for s in steps], report
    assert all(f.recovery is not None and not f.stuck for f in outcome.faults), report
    assert outcome.failures() == [], report
    check, audit, stats = outcome.check, outcome.audit, outcome.stats
    assert check is not None
    assert audit is not None
    assert stats is not None
    assert check.acked_writes == stats.acked > 0
    assert check.reads == stats.reads > 0
    assert check.ok, report
    assert outcome.lost == 0, report
    assert check.nonlinearizable == 0, report
    assert audit.stale == (), report
    assert audit.terms_ended >= 2, "the driver faults must have ended leader terms"
    for log in (tmp_path / "cluster" / "logs").glob("*.log"):
        assert_clean_log(log)
