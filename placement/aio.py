"""The one way to race asyncio work, to wait for an event with a timeout, to cancel a task and
wait for it, and to stop on SIGTERM/SIGINT (design/architecture.md, "One of each")."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Iterator, Sequence
from typing import Any


async def first_done(
    *work: Awaitable[Any], at_most: float | None = None
) -> tuple[asyncio.Future[Any], ...]:
    """Runs ``work`` as tasks until the first one finishes (or ``at_most`` seconds pass), then
    cancels the others and waits for them. Returns the tasks in order: a finished one holds its
    result or exception, the others are cancelled."""
    tasks = tuple(asyncio.ensure_future(w) for w in work)
    try:
        await asyncio.wait(tasks, timeout=at_most, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return tasks


async def wait_event(event: asyncio.Event, at_most: float | None) -> bool:
    """Waits until ``event`` is set (True) or ``at_most`` seconds passed (False; None = no
    limit). Unlike ``asyncio.wait_for`` on Python 3.11, a cancellation that arrives as the event
    is set is never lost (``asyncio.timeout`` uncancels only its own), so a loop around it stops
    when its task is cancelled."""
    try:
        async with asyncio.timeout(at_most):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancels ``task`` (nothing when None) and waits until it has ended; its cancellation is not
    re-raised here (an error it ended with is)."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@contextlib.contextmanager
def stop_on_signals(
    stop: asyncio.Event, signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
) -> Iterator[None]:
    """Inside the block, ``signals`` set ``stop`` (instead of ending the process); the handlers
    are removed on the way out."""
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in signals:
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)
