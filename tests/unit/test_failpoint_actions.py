"""Failpoints (placement/failpoints.py): the variable's grammar, its clear errors, each action, and
that the names the code uses are exactly the documented ones."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from placement import failpoints
from placement.errors import InvalidInput, StoreUnavailable
from placement.failpoints import ENV, POINTS, Action, FailpointError, failpoint, parse

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    yield
    failpoints.load({})


def test_parse_reads_every_action_and_hit_count() -> None:
    got = parse(
        " driver.after-trigger=crash, agent.mid-catch-up=3*pause(250),primary.after-append=error,"
    )
    assert got == {
        "driver.after-trigger": Action("crash"),
        "agent.mid-catch-up": Action("pause", 3, 250),
        "primary.after-append": Action("error"),
    }
    assert parse("") == {}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("driver.after-trigr=crash", "names no failpoint"),
        ("driver.after-trigger", "is not NAME=ACTION"),
        ("driver.after-trigger=explode", "is not an action"),
        ("driver.after-trigger=pause(abc)", "is not an action"),
        ("driver.after-trigger=0*crash", "is not an action"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable_and_the_fix(text: str, says: str) -> None:
    with pytest.raises(InvalidInput) as e:
        parse(text)
    assert e.value.field == ENV
    assert says in str(e.value)
    assert e.value.fix


async def test_unset_does_nothing_and_error_acts_at_the_nth_hit_only() -> None:
    failpoints.load({})
    await failpoint("driver.after-trigger")
    failpoints.load({ENV: "driver.after-trigger=2*error"})
    await failpoint("driver.after-trigger")  # the first hit passes
    await failpoint("driver.after-finish")  # another point is not set
    with pytest.raises(FailpointError, match=r"driver\.after-trigger") as raised:
        await failpoint("driver.after-trigger")
    assert isinstance(raised.value, StoreUnavailable)  # an unknown outcome, as callers see it
    await failpoint("driver.after-trigger")  # the third passes again
    failpoints.load({ENV: "driver.after-trigger=error"})
    for _ in range(2):  # without N*, every hit
        with pytest.raises(FailpointError):
            await failpoint("driver.after-trigger")


async def test_pause_holds_only_the_task_that_reached_it() -> None:
    failpoints.load({ENV: "agent.mid-catch-up=pause(200)"})
    ticks = 0

    async def other() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    runner = asyncio.create_task(other())
    started = time.monotonic()
    await failpoint("agent.mid-catch-up")
    paused = time.monotonic() - started
    runner.cancel()
    assert paused >= 0.2
    assert ticks >= 5  # the loop ran on meanwhile


def test_crash_kills_the_process_with_sigkill_after_naming_the_point() -> None:
    code = "import asyncio; from placement.failpoints import failpoint; " + (
        "asyncio.run(failpoint('primary.after-append')); print('survived')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, ENV: "primary.after-append=crash"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL
    assert "survived" not in done.stdout
    assert "failpoint primary.after-append: crash" in done.stderr


def test_the_code_uses_exactly_the_documented_points() -> None:
    used: set[str] = set()
    for base in ("placement", "replica"):
        for path in (ROOT / base).rglob("*.py"):
            used |= set(re.findall(r'failpoint\("([a-z.-]+)"\)', path.read_text()))
            used |= set(re.findall(r'"(driver\.reshard-[a-z]+)"', path.read_text()))
    assert used == set(POINTS)
    design = (ROOT / "design" / "architecture.md").read_text()
    missing = [name for name in POINTS if f"`{name}`" not in design]
    assert not missing, f"design/architecture.md does not list {missing}"
