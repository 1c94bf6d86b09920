"""Failpoints: named places in the driver and the agents where a test makes the process crash,
pause or fail, deterministically (design/architecture.md, "Failpoints").

Enabled only through the environment of the process::

    PLACEMENT_FAILPOINTS="NAME=ACTION[,NAME=ACTION...]"

ACTION is ``crash`` (SIGKILL of the process itself: no clean-up, no flush, as if killed from
outside), ``pause(MS)`` (the task that reached the point waits MS milliseconds there; the rest of
the process runs on) or ``error`` (raises :class:`FailpointError`, an unavailable store: whoever
called does not know whether what came before the point took effect — a lost reply). Each
action first writes one line on stderr naming the point. Plain ``ACTION`` acts at every hit;
``N*ACTION`` at the Nth hit only (one fault, at an exact step). Unset, a point costs one check of
an empty dict. A name or action that does not exist is an
:class:`~placement.errors.InvalidInput` naming the variable, raised when the process starts
(:func:`load`, called by every process's command) — never a silently ignored typo.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from dataclasses import dataclass

from placement.errors import InvalidInput, StoreUnavailable

ENV = "PLACEMENT_FAILPOINTS"

#: Every failpoint, with where it sits. Names are ``process.place``.
POINTS: dict[str, str] = {
    "driver.after-trigger": "a trigger transaction (pending or planned written) committed, "
    "before the pass goes on",
    "driver.after-finish": "a move's end (stable switched, or its cancel) committed, before the "
    "driver handles the result",
    "driver.reshard-begin": "the layout write that starts a reshard (PREPARE) committed",
    "driver.reshard-advance": "a layout write PREPARE → COPY or COPY → SEAL committed",
    "driver.reshard-flip": "the cut-over (SEAL → CLEANUP) committed",
    "driver.reshard-abort": "a reshard's abort committed",
    "driver.reshard-finish": "the layout write that ends a reshard committed",
    "agent.after-decision": "an agent persisted a Rebalance, CancelRebalance or Retire decision, "
    "before it starts the catch-up and answers",
    "agent.mid-catch-up": "a learner wrote a snapshot page, before it fetches the next",
    "primary.after-append": "a primary appended a batch to its own log, before replicating it",
    "metastore.end-moves-reply-lost": "a transaction ending moves (finish or finish_cancel) "
    "committed; its reply is about to be handled (error: as if it were lost)",
}

_ACTION = re.compile(r"^(?:(\d+)\*)?(crash|error|pause\((\d+)\))$")


class FailpointError(StoreUnavailable):
    """Raised by a failpoint set to ``error``: the outcome of what came before is unknown."""


@dataclass(frozen=True, slots=True)
class Action:
    kind: str  # "crash" | "pause" | "error"
    #: Act at this hit only (0: at every hit).
    hit: int = 0
    pause_ms: int = 0


def parse(text: str) -> dict[str, Action]:
    """``PLACEMENT_FAILPOINTS``'s value → the actions by name; InvalidInput naming what is
    wrong and the fix."""
    actions: dict[str, Action] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, spec = part.partition("=")
        name, spec = name.strip(), spec.strip()
        if not sep or name not in POINTS:
            raise InvalidInput(
                ENV,
                f"{part!r} names no failpoint" if sep else f"{part!r} is not NAME=ACTION",
                "NAME is one of " + ", ".join(sorted(POINTS)),
            )
        match = _ACTION.match(spec)
        if match is None or (match.group(1) is not None and int(match.group(1)) < 1):
            raise InvalidInput(
                ENV,
                f"{name}: {spec!r} is not an action",
                "use crash, error or pause(MS), optionally after N* (at the Nth hit only)",
            )
        count, kind, pause = match.groups()
        kind = "pause" if pause is not None else kind
        actions[name] = Action(kind, int(count or 0), int(pause or 0))
    return actions


_active: dict[str, Action] | None = None
_hits: dict[str, int] = {}


def load(environ: dict[str, str] | None = None) -> dict[str, Action]:
    """Read the failpoints from the environment (once per process; again when ``environ`` is
    given). Every process's command calls it first, so a bad value stops it at start."""
    global _active
    env = os.environ if environ is None else environ
    _active = parse(env.get(ENV, ""))
    _hits.clear()
    return dict(_active)


async def failpoint(name: str) -> None:
    """Act at the failpoint ``name`` as ``PLACEMENT_FAILPOINTS`` says (nothing when unset)."""
    active = _active if _active is not None else load()
    if not active:
        return
    action = active.get(name)
    if action is None:
        return
    hits = _hits[name] = _hits.get(name, 0) + 1
    if action.hit and hits != action.hit:
        return
    os.write(2, f"failpoint {name}: {action.kind} (hit {hits}, pid {os.getpid()})\n".encode())
    if action.kind == "pause":
        await asyncio.sleep(action.pause_ms / 1000)
    elif action.kind == "error":
        raise FailpointError(f"failpoint {name}: error (hit {hits})")
    else:
        os.kill(os.getpid(), signal.SIGKILL)
