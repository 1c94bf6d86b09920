"""An agent's in-sync-set writes, batched (design/data-plane.md, "ISR changes").

Primaries write their partition's ISR through :class:`IsrWrites`: the writes that arrive while one
transaction is in flight go out together in the next (``Metastore.write_isrs``: each partition
still fenced by its own lease key's and ISR key's revisions). When a batch loses a compare, none of
it is written and every caller falls back to its own checked write — a stale one never holds the
others back for long, and each caller still learns exactly why its own write failed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from placement.errors import PlacementError
from placement.metastore.store import ISR_BATCH, IsrWrite, Metastore


@dataclass(slots=True)
class _Queued:
    write: IsrWrite
    future: asyncio.Future[int | None]


class IsrWrites:
    """See the module docstring. ``transactions`` and ``written`` count for tests."""

    def __init__(self, metastore: Metastore) -> None:
        self._metastore = metastore
        self._queue: list[_Queued] = []
        self._task: asyncio.Task[None] | None = None
        self.transactions = 0
        self.written = 0

    async def write(self, write: IsrWrite) -> int | None:
        """The new revision once written with others, or None: not written, check and retry."""
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Queued(write, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._flush(), name="isr-writes")
        return await future

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for queued in self._queue:
            if not queued.future.done():
                queued.future.set_result(None)
        self._queue.clear()

    async def _flush(self) -> None:
        while self._queue:
            batch: list[_Queued] = []
            keys: set[tuple[str, int]] = set()
            rest: list[_Queued] = []
            for queued in self._queue:
                key = (queued.write.zone, queued.write.partition)
                if len(batch) < ISR_BATCH and key not in keys and not queued.future.done():
                    batch.append(queued)
                    keys.add(key)
                elif not queued.future.done():
                    rest.append(queued)  # a second write of one partition waits its turn
            self._queue = rest
            if not batch:
                continue
            try:
                revision = await self._metastore.write_isrs([q.write for q in batch])
            except PlacementError:
                revision = None  # each caller's own checked write says what is wrong
            except asyncio.CancelledError:
                for queued in batch:
                    if not queued.future.done():
                        queued.future.set_result(None)
                raise
            self.transactions += 1
            if revision is not None:
                self.written += len(batch)
            for queued in batch:
                if not queued.future.done():
                    queued.future.set_result(revision)
