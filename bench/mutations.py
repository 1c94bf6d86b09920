"""Mutation check of fencing, idempotency and the checkers (design/architecture.md, "Mutation
check"): each mutant is one small edit of the product (or of a checker) that a test must catch.

For every mutant: a scratch worktree of HEAD (``git worktree add``), the edit applied (its text
must occur exactly once), the named tests run there — the worktree's code first on the path, so
in-process imports and the processes the tests start both run the mutant — and the verdict:
**caught** (a test failed), **survived** (they all passed) or **broken** (the edit did not apply,
or pytest could not run: exit code other than 0 or 1). The unmutated tree must pass the same
tests first. Results go to ``bench/results/mutations.md`` (``--out``).

    .venv/bin/python bench/mutations.py [--only NAME ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600


@dataclass(frozen=True)
class Mutant:
    name: str
    kind: str  # fencing | idempotency | checker | durability
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    what: str


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "fence-single",
        "fencing",
        "placement/metastore/store.py",
        "(fence.compare(), *decision.write.compares),",
        "(*decision.write.compares,),",
        ("tests/integration/test_metastore.py::test_every_write_is_fenced",),
        "a single transition (trigger, finish, cancel) without the leader-key compare",
    ),
    Mutant(
        "fence-batch",
        "fencing",
        "placement/metastore/transitions.py",
        "(fence.compare(), *(c for u in batch for c in u.compares)),",
        "(*(c for u in batch for c in u.compares),),",
        ("tests/integration/test_metastore.py::test_every_write_is_fenced",),
        "a batch transaction (creates, triggers, ends) without the leader-key compare",
    ),
    Mutant(
        "lease-no-margin",
        "fencing",
        "placement/metastore/etcd.py",
        "return min(1.0, ttl / 8)",
        "return 0.0",
        (
            "tests/integration/test_etcd_client.py::"
            "test_a_lease_is_given_up_a_margin_before_etcd_can_expire_it",
            "tests/integration/test_driver_chaos.py::"
            "test_a_leader_cut_off_from_etcd_steps_down_before_its_key_expires[plaintext]",
        ),
        "a lease given up at the TTL instead of a margin before etcd can expire it",
    ),
    Mutant(
        "agent-older-epoch",
        "fencing",
        "replica/protocol.py",
        "if r == rec.accepted_revision and e < rec.accepted_epoch:",
        "if False:",
        ("tests/unit/test_replica_protocol.py",),
        "an agent accepting a Rebalance of the accepted revision from an older epoch",
    ),
    Mutant(
        "agent-resend-restarts",
        "idempotency",
        "replica/protocol.py",
        "if r == rec.accepted_revision and move is not None and move.revision == r:",
        "if False:",
        ("tests/unit/test_replica_protocol.py",),
        "an agent starting a resent Rebalance again instead of answering it as it stands",
    ),
    Mutant(
        "finish-without-pending-compare",
        "idempotency",
        "placement/metastore/transitions.py",
        '        Compare.mod(keys.assign(z, p, AssignField.PENDING), "==", pending_revision),\n'
        '        Compare.version(keys.assign(z, p, AssignField.CANCEL), "==", 0),\n'
        "        _mod_is(keys, state, AssignField.PLANNED),\n"
        "    )\n"
        "    puts, deletes = _promote_planned(state, epoch, ts)\n"
        "    puts[AssignField.STABLE]",
        '        Compare.version(keys.assign(z, p, AssignField.CANCEL), "==", 0),\n'
        "        _mod_is(keys, state, AssignField.PLANNED),\n"
        "    )\n"
        "    puts, deletes = _promote_planned(state, epoch, ts)\n"
        "    puts[AssignField.STABLE]",
        (
            "tests/integration/test_metastore.py::test_a_stale_observation_never_writes_wrong",
            "tests/integration/test_protocol_stateful.py",
        ),
        "a finish that does not compare pending's revision: a late or repeated end applies",
    ),
    Mutant(
        "primary-acks-unreplicated",
        "durability",
        "replica/data/primary.py",
        "            self._remember(entries)\n"
        "            try:\n"
        "                await self._replicate(self.state.last_index)\n",
        "            self._remember(entries)\n            try:\n                pass\n",
        (
            "tests/integration/test_data_plane.py::"
            "test_a_write_is_acknowledged_only_once_the_in_sync_set_holds_it",
            "tests/integration/test_data_plane.py::"
            "test_sigkill_of_a_busy_primary_loses_no_acknowledged_write",
        ),
        "a primary acknowledging a write once it is in its own log, before the in-sync set has it",
    ),
    Mutant(
        "learner-undoes-at-start",
        "durability",
        "replica/data/follower.py",
        "        state = await self._durable()\n        fresh = state.last_index == 0",
        "        state = await self._durable()\n"
        "        if not state.loading_snapshot and state.last_index > state.commit_index:\n"
        "            state = await self._write(self._data.truncate, state.commit_index)\n"
        "        fresh = state.last_index == 0",
        ("tests/unit/test_learner.py",),
        "a learner undoing its log down to its lazily written commit index when it starts (the"
        " chaos campaign's lost write: the node was an in-sync member and took the lease next)",
    ),
    Mutant(
        "learner-keeps-foreign-suffix",
        "durability",
        "replica/data/storage.py",
        "            tail = after_index + len(entries) >= commit_index\n",
        "            tail = False\n",
        ("tests/unit/test_learner.py",),
        "a learner keeping entries past the primary's last one that the primary does not hold",
    ),
    Mutant(
        "learner-remembers-position",
        "durability",
        "replica/data/follower.py",
        "            if _position(durable) != _position(state):\n",
        "            if False:\n",
        ("tests/unit/test_learner.py",),
        "a learner fetching with the position it remembers after its replica was retired and"
        " created again under it (the primary adds an empty replica to the in-sync set)",
    ),
    Mutant(
        "linearizability-accepts-all",
        "checker",
        "placement/data/linearizability.py",
        '            stack.append((done | 1 << i, op.value))\n    return "violation"',
        '            stack.append((done | 1 << i, op.value))\n    return "ok"',
        ("tests/unit/test_linearizability.py",),
        "the linearizability checker calling a history with no valid order linearizable",
    ),
    Mutant(
        "lost-write-checker-accepts-all",
        "checker",
        "placement/data/checker.py",
        '    if observed in allowed_states(history):\n        return "ok"',
        '    if True:\n        return "ok"',
        ("tests/unit/test_workload.py",),
        "the lost-write checker calling any value read back right",
    ),
    Mutant(
        "audit-blind",
        "checker",
        "placement/metastore/audit.py",
        "and e.kv.mod_revision > ended[epoch]\n",
        "and e.kv.mod_revision > ended[epoch] + 10**12\n",
        ("tests/unit/test_audit.py",),
        "the deposed-epoch audit missing writes made after the epoch's key went",
    ),
)


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    began = time.monotonic()
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        code, out = -1, f"timed out after {TIMEOUT_S}s: {e}"
    return code, out, time.monotonic() - began


def _pytest(tree: Path, tests: tuple[str, ...]) -> tuple[int, str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    return _run(argv, tree, env)


def _worktree(base: Path, name: str) -> Path:
    tree = base / name
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-q", str(tree), "HEAD"], cwd=ROOT, check=True
    )
    return tree


def _drop(tree: Path) -> None:
    subprocess.run(
        ["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True
    )
    shutil.rmtree(tree, ignore_errors=True)


def _last_line(out: str) -> str:
    lines = [line for line in out.strip().splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="mutant names to run")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/mutations.md")
    args = parser.parse_args()
    mutants = [m for m in MUTANTS if args.only is None or m.name in args.only]
    unknown = set(args.only or ()) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"--only: no mutant named {', '.join(sorted(unknown))}")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    rows: list[str] = []
    survived = broken = 0
    with tempfile.TemporaryDirectory(prefix="mutants-") as scratch:
        base = Path(scratch)
        clean = _worktree(base, "clean")
        try:
            tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
            code, out, took = _pytest(clean, tests)
            print(f"unmutated: exit {code} in {took:.0f}s: {_last_line(out)}", flush=True)
            if code != 0:
                print(out[-4000:])
                return 2
        finally:
            _drop(clean)
        for m in mutants:
            tree = _worktree(base, m.name)
            try:
                source = tree / m.path
                text = source.read_text()
                if text.count(m.old) != 1:
                    verdict, detail, took = "broken", f"edit found {text.count(m.old)} times", 0.0
                else:
                    source.write_text(text.replace(m.old, m.new))
                    code, out, took = _pytest(tree, m.tests)
                    verdict = {0: "survived", 1: "caught"}.get(code, "broken")
                    detail = _last_line(out)
            finally:
                _drop(tree)
            survived += verdict == "survived"
            broken += verdict == "broken"
            print(f"{m.name}: {verdict} in {took:.0f}s ({detail})", flush=True)
            tests_text = "<br>".join(f"`{t}`" for t in m.tests)
            rows.append(
                f"| `{m.name}` | {m.kind} | {m.what} (`{m.path}`) | {tests_text} | **{verdict}** "
                f"| {took:.0f} s: {detail.replace('|', '/')} |"
            )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    header = [
        "# Mutation check: fencing, idempotency, durability and the checkers",
        "",
        f"Command: `.venv/bin/python bench/mutations.py` — tree {commit}, "
        f"{os.cpu_count()} cores, {platform.machine()}, load average at the end {load}.",
        "Each mutant is one edit in a scratch worktree of HEAD; its tests run against it "
        '(design/architecture.md, "Mutation check"). Caught: a test failed; survived: '
        "every test passed.",
        "",
        "| mutant | kind | the defect it plants | tests | verdict | run |",
        "|---|---|---|---|---|---|",
    ]
    caught = len(rows) - survived - broken
    footer = ["", f"{caught} caught, {survived} survived, {broken} broken of {len(rows)}."]
    args.out.write_text("\n".join(header + rows + footer) + "\n")
    print(f"{caught} caught, {survived} survived, {broken} broken -> {args.out}")
    return 0 if survived == 0 and broken == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
