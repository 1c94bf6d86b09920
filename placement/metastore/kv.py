"""What etcd reads and watches return, as typed values: keys, ranges, results, watch events.

Pure data (no ``aetcd``, gRPC or asyncio). Everyone may read these; only the metastore layer
builds transactions (:mod:`placement.metastore.txn`, design/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TypeAlias

# -- typed results -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as etcd stores it. ``lease`` is 0 when the key has none."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True, slots=True)
class Range:
    """The answer of a read: ``kvs`` in key order as they were at ``revision``.

    ``revision`` is the revision the read reflects: the pinned one when a revision was asked for,
    else the header revision of the answer. ``more`` is set when ``limit`` cut the answer short.
    """

    kvs: tuple[KeyValue, ...]
    revision: int
    more: bool = False
    count: int = 0

    def first(self) -> KeyValue | None:
        return self.kvs[0] if self.kvs else None


@dataclass(frozen=True, slots=True)
class PutResult:
    revision: int
    prev_kv: KeyValue | None = None


@dataclass(frozen=True, slots=True)
class DeleteResult:
    revision: int
    deleted: int
    prev_kvs: tuple[KeyValue, ...] = ()


@dataclass(frozen=True, slots=True)
class TxnResult:
    """``succeeded`` tells which branch ran; ``responses`` are that branch's results, in order.

    ``revision`` is the store revision after the transaction (unchanged when nothing was written).
    """

    succeeded: bool
    revision: int
    responses: tuple[OpResult, ...]


OpResult: TypeAlias = Range | PutResult | DeleteResult | TxnResult


class EventKind(Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change; for DELETE, ``kv`` holds the key and the deleting revision, no value."""

    kind: EventKind
    kv: KeyValue
    prev_kv: KeyValue | None


@dataclass(frozen=True, slots=True)
class WatchBatch:
    """Events of one watch response, in revision order; empty for a progress notification.

    ``revision``: every change to the watched range up to this revision has been delivered.
    """

    revision: int
    events: tuple[WatchEvent, ...]


@dataclass(frozen=True, slots=True)
class Alarm:
    """An alarm raised on an etcd member: ``kind`` NOSPACE (its space quota is exhausted: the
    cluster refuses writes) or CORRUPT (its data disagrees with the others')."""

    member_id: int
    kind: str

    def __str__(self) -> str:
        return f"{self.kind} on member {self.member_id:x}"
