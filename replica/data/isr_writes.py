"""An agent's in-sync-set writes, batched (design/data-plane.md, "ISR changes").

Primaries write their partition's ISR through :class:`IsrWrites`: the writes that arrive while one
transaction is in flight go out together in the next (a :class:`~placement.aio.Coalescer` over
``Metastore.write_isrs``: each partition still fenced by its own lease key's and ISR key's
revisions, one write per partition per transaction). When a batch loses a compare, none of it is
written and every caller falls back to its own checked write — a stale one never holds the others
back for long, and each caller still learns exactly why its own write failed.
"""

from __future__ import annotations

from placement.aio import Coalescer
from placement.errors import PlacementError
from placement.metastore.store import ISR_BATCH, IsrWrite, Metastore


class _Closed(Exception):
    """The agent closed its ISR writes before this one was written."""


class IsrWrites:
    """See the module docstring. ``transactions`` and ``written`` count for tests."""

    def __init__(self, metastore: Metastore) -> None:
        self._metastore = metastore
        self._batches: Coalescer[IsrWrite, int | None] = Coalescer(
            self._flush,
            limit=ISR_BATCH,
            name="isr-writes",
            key=lambda w: (w.zone, w.partition),  # a second write of one partition waits its turn
        )
        self.transactions = 0
        self.written = 0

    async def write(self, write: IsrWrite) -> int | None:
        """The new revision once written with others, or None: not written, check and retry."""
        try:
            return await self._batches.submit(write)
        except _Closed:
            return None

    async def close(self) -> None:
        """Stop writing; a write not written yet answers None."""
        await self._batches.close(_Closed())

    async def _flush(self, writes: list[IsrWrite]) -> list[int | None]:
        try:
            revision = await self._metastore.write_isrs(writes)
        except PlacementError:
            revision = None  # each caller's own checked write says what is wrong
        self.transactions += 1
        if revision is not None:
            self.written += len(writes)
        return [revision] * len(writes)
