"""The values of a partition's control keys (design/resharding.md, "Control keys").

A partition's re-sharding state that must survive a change of its primary travels through the
partition's own log as data, under :data:`~placement.data.partitioning.CONTROL_PREFIX` keys:

* :class:`Seal` (key :data:`~placement.data.partitioning.SEAL_KEY`) on a source: from the moment
  it is queued, client writes to the keys the reshard moves are refused;
* :class:`Cursor` (key :func:`cursor_key`) on a destination: how far the copy from one source
  got, committed together with the copied data, so a new primary resumes instead of restarting.

Both are canonical JSON; a value that does not decode is treated as absent (a cursor starts over,
which is always safe; a seal is re-written by the next SEAL phase).

Pure code: no I/O.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from placement.data.partitioning import control_key


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _load(raw: bytes, fields: set[str]) -> dict[str, object] | None:
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(obj, dict) or set(obj) != fields:
        return None
    return obj


@dataclass(frozen=True, slots=True)
class Seal:
    """Reshard ``attempt`` from ``source`` to ``target`` partitions sealed this partition."""

    attempt: int
    source: int
    target: int

    def encode(self) -> bytes:
        return _dumps(asdict(self))

    @staticmethod
    def decode(raw: bytes) -> Seal | None:
        obj = _load(raw, {"attempt", "source", "target"})
        if obj is None or not all(type(v) is int for v in obj.values()):
            return None
        return Seal(int(obj["attempt"]), int(obj["source"]), int(obj["target"]))  # type: ignore[call-overload]


def cursor_key(source: int) -> bytes:
    """A destination's cursor of the copy from partition ``source``."""
    return control_key("cursor", source)


@dataclass(frozen=True, slots=True)
class Cursor:
    """How far a destination's copy from one source got, for reshard ``attempt``.

    ``snapshot``: still paging the source's (selected) snapshot, resuming after ``after``
    (hex of the last key examined); ``base`` is the first page's snapshot index — the log is
    replayed from there. Then ``index``: the source log is copied up to it. ``seal_bound``: an
    index at or above the source's seal (0 = no seal seen yet); once ``index`` reaches it (the
    snapshot done) the destination holds every write the source will ever take for its keys.
    """

    attempt: int
    snapshot: bool = True
    after: str = ""
    base: int = 0
    index: int = 0
    seal_bound: int = 0

    @property
    def drained(self) -> bool:
        return not self.snapshot and self.seal_bound > 0 and self.index >= self.seal_bound

    def encode(self) -> bytes:
        return _dumps(asdict(self))

    @staticmethod
    def decode(raw: bytes) -> Cursor | None:
        obj = _load(raw, {"attempt", "snapshot", "after", "base", "index", "seal_bound"})
        if obj is None:
            return None
        try:
            cursor = Cursor(**obj)  # type: ignore[arg-type]
        except TypeError:
            return None
        ints = (cursor.attempt, cursor.base, cursor.index, cursor.seal_bound)
        if not all(type(v) is int for v in ints) or type(cursor.snapshot) is not bool:
            return None
        if not isinstance(cursor.after, str):
            return None
        try:
            bytes.fromhex(cursor.after)
        except ValueError:
            return None
        return cursor
