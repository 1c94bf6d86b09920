"""The one ``async with`` protocol of the clients (design/architecture.md): leaving the block
calls ``close()``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Self


class AsyncClosing(ABC):
    """``async with obj:`` returns ``obj`` and awaits ``obj.close()`` on the way out."""

    @abstractmethod
    async def close(self) -> None:
        """Release what the object holds; safe to call more than once."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
