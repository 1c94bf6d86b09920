"""The one way to race asyncio work, to wait for an event with a timeout, to broadcast a change
to its waiters (:class:`Pulse`), to cancel a task and wait for it, to stop on SIGTERM/SIGINT, to
batch concurrent requests into one call (:class:`Coalescer`) and to bound the bytes of work in
flight (:class:`ByteBudget`) (design/architecture.md, "One of each")."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


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


class Pulse:
    """A broadcast "it changed": :meth:`fire` wakes every waiter of the current round and starts
    a new one. Take :attr:`round` before looking at what it guards, then wait on that event: a
    change between the look and the wait is not missed (a fresh event per round, never cleared,
    so no waiter can sleep through a fire)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    @property
    def round(self) -> asyncio.Event:
        """The event the next :meth:`fire` sets."""
        return self._event

    def fire(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()


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


@dataclass(slots=True)
class _Waiting(Generic[T, R]):
    item: T
    future: asyncio.Future[R]
    #: Taken into a flush (its submitter's cancellation no longer withdraws it).
    flushing: bool = False


class Coalescer(Generic[T, R]):
    """Batches concurrent requests: the items submitted while one ``flush`` is in flight go out
    together in the next one (no timer: an idle coalescer flushes a lone item at once, a busy
    one gathers as many as arrive during a round trip — Kafka's and etcd's own batching).

    ``flush(items)`` returns one result per item, in order; an exception it raises is raised to
    every submitter of that batch. At most ``limit`` items per flush, and with ``size`` at most
    ``max_size`` of their sizes summed (an item larger than that alone goes out alone); items
    with the same ``key`` never share one (the later waits for the next flush, in submission
    order). A
    submitter's cancellation does not cancel the flush its item is in (other callers share it);
    an item not taken into a flush yet is withdrawn with it (never flushed).
    """

    def __init__(
        self,
        flush: Callable[[list[T]], Awaitable[Sequence[R]]],
        *,
        limit: int,
        name: str,
        key: Callable[[T], Hashable] | None = None,
        size: Callable[[T], int] | None = None,
        max_size: int = 0,
    ) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        if size is not None and max_size < 1:
            raise ValueError("max_size must be >= 1 with size")
        self._flush = flush
        self._limit = limit
        self._size = size
        self._max_size = max_size
        self._name = name
        self._key = key
        self._queue: list[_Waiting[T, R]] = []
        self._task: asyncio.Task[None] | None = None
        #: What the items of a flush cut short by :meth:`close` fail with (None: cancelled).
        self._closing: Exception | None = None
        #: flushes made and items flushed (for tests and benchmarks)
        self.flushes = 0
        self.items = 0

    async def submit(self, item: T) -> R:
        """The item's result once the flush it went out in has ended."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        # a submitter cancelled meanwhile leaves its result unread: read it here, never warned of
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        waiting = _Waiting(item, future)
        self._queue.append(waiting)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=self._name)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if not waiting.flushing:
                future.cancel()  # withdrawn: the next batch skips it
            raise

    async def close(self, error: Exception | None = None) -> None:
        """Stop flushing; every item without a result yet (queued, or in the flush cut short)
        fails with ``error``, or CancelledError when None."""
        self._closing = error
        try:
            await cancel_and_wait(self._task)
        finally:
            self._closing = None
        for waiting in self._queue:
            _fail(waiting.future, error)
        self._queue.clear()

    def _next_batch(self) -> list[_Waiting[T, R]]:
        batch: list[_Waiting[T, R]] = []
        rest: list[_Waiting[T, R]] = []
        keys: set[Hashable] = set()
        total = 0
        full = False  # by size: what comes after waits too, so nothing is overtaken
        for waiting in self._queue:
            if waiting.future.done():
                continue
            key = self._key(waiting.item) if self._key is not None else None
            take = not full and len(batch) < self._limit and (key is None or key not in keys)
            if take and self._size is not None:
                size = self._size(waiting.item)
                take = not batch or total + size <= self._max_size
                full = not take
                total += size
            if take:
                waiting.flushing = True
                batch.append(waiting)
                if key is not None:
                    keys.add(key)
            else:
                rest.append(waiting)
        self._queue = rest
        return batch

    async def _run(self) -> None:
        while self._queue:
            batch = self._next_batch()
            if not batch:
                continue
            self.flushes += 1
            self.items += len(batch)
            try:
                results = await self._flush([w.item for w in batch])
            except asyncio.CancelledError:
                for waiting in batch:
                    _fail(waiting.future, self._closing)
                raise
            except Exception as e:  # every submitter of the batch learns it
                for waiting in batch:
                    if not waiting.future.done():
                        waiting.future.set_exception(e)
                continue
            if len(results) != len(batch):
                error = RuntimeError(f"{self._name}: {len(results)} results for {len(batch)}")
                for waiting in batch:
                    if not waiting.future.done():
                        waiting.future.set_exception(error)
                continue
            for waiting, result in zip(batch, results, strict=True):
                if not waiting.future.done():
                    waiting.future.set_result(result)


def _fail(future: asyncio.Future[Any], error: Exception | None) -> None:
    if future.done():
        return
    if error is None:
        future.cancel()
    else:
        future.set_exception(error)


class ByteBudget:
    """Admits work while the bytes in flight stay within ``capacity``, first come first served
    (a large piece is not overtaken for ever by small ones); a piece larger than the whole
    budget is admitted alone. ``in_flight`` and ``peak`` for tests and metrics."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.in_flight = 0
        self.peak = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    def _fits(self, amount: int) -> bool:
        return self.in_flight == 0 or self.in_flight + amount <= self.capacity

    @contextlib.asynccontextmanager
    async def hold(self, amount: int) -> AsyncIterator[None]:
        """Hold ``amount`` bytes (at most the capacity) of the budget inside the block."""
        amount = max(0, min(amount, self.capacity))
        if self._waiting or not self._fits(amount):
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (amount, future)
            self._waiting.append(entry)
            try:
                await future
            except BaseException:
                if future.done() and not future.cancelled():
                    self._release(amount)  # admitted as it was cancelled: give it back
                else:
                    if entry in self._waiting:
                        self._waiting.remove(entry)
                    self._admit()
                raise
        else:
            self._take(amount)
        try:
            yield
        finally:
            self._release(amount)

    def _take(self, amount: int) -> None:
        self.in_flight += amount
        self.peak = max(self.peak, self.in_flight)

    def _release(self, amount: int) -> None:
        self.in_flight -= amount
        self._admit()

    def _admit(self) -> None:
        while self._waiting and self._fits(self._waiting[0][0]):
            amount, future = self._waiting.popleft()
            if future.done():
                continue
            self._take(amount)
            future.set_result(None)
