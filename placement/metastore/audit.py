"""An audit of etcd's history for writes by a deposed leader (design/metastore.md, "5. Election
and fencing"; used by the chaos tests and ``bench/chaos_campaign.py``, design/architecture.md,
"Chaos campaign").

Every value a driver writes carries the epoch (its leader key's create revision) of the term
that wrote it. Once that leader key is deleted — its lease expired or it resigned — the epoch's
compare can no longer hold, so no value carrying it may be written after the deletion: such a
write would be a **stale application** by a deposed leader. Agents' keys are exempt: a move
report carries the epoch of the move it reports on and is written when the catch-up ends,
whoever leads by then.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from placement.metastore.etcd import EtcdClient, read_history
from placement.metastore.keys import KeySpace, prefix_range_end
from placement.metastore.kv import EventKind, WatchEvent


def agent_written(keys: KeySpace, key: bytes) -> bool:
    """Whether agents write ``key`` — registrations, move reports (they carry the epoch of the
    move they report on, written after the catch-up ends, whoever leads by then), in-sync sets,
    sizes, reshard reports — rather than the leader, whose epoch fences it."""
    return key.startswith(
        (
            keys.nodes_prefix(),
            keys.progress_prefix(),
            keys.isr_prefix(),
            keys.sizes_prefix(),
            keys.reshard_prefix(),
        )
    )


def epoch_of(value: bytes) -> int | None:
    """The writer epoch a driver-written value carries (JSON, or be8 + JSON for triggers)."""
    for body in (value, value[8:]):
        try:
            obj = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(obj, dict) and isinstance(obj.get("epoch"), int):
            return int(obj["epoch"])
    return None


@dataclass(frozen=True, slots=True)
class StaleWrite:
    """A value written with ``epoch`` at ``revision``, after that epoch's leader key was
    deleted at ``ended_at``."""

    key: bytes
    revision: int
    epoch: int
    ended_at: int


@dataclass(frozen=True, slots=True)
class DeposalAudit:
    """Leader terms that ended in the history read, and the writes made after their end."""

    from_revision: int
    to_revision: int
    events: int
    terms_ended: int
    stale: tuple[StaleWrite, ...]


def stale_writes(keys: KeySpace, events: Iterable[WatchEvent]) -> tuple[int, list[StaleWrite]]:
    """``(leader keys deleted, writes by their epochs after the deletion)`` in ``events``."""
    events = list(events)
    ended: dict[int, int] = {}  # epoch -> the revision its key was deleted at
    for e in events:
        if e.kind is EventKind.DELETE and e.kv.key.startswith(keys.leader_prefix()):
            if e.prev_kv is None:
                raise ValueError("a history without the deleted leader key's value")
            ended[e.prev_kv.create_revision] = e.kv.mod_revision
    late = [
        StaleWrite(e.kv.key, e.kv.mod_revision, epoch, ended[epoch])
        for e in events
        if e.kind is EventKind.PUT
        and not agent_written(keys, e.kv.key)
        and (epoch := epoch_of(e.kv.value)) in ended
        and e.kv.mod_revision > ended[epoch]
    ]
    return len(ended), late


async def audit_deposed_writes(
    etcd: EtcdClient, keys: KeySpace, start: int, *, catch_up_within: float = 60.0
) -> DeposalAudit:
    """Reads every change under the prefix since revision ``start`` (all of it: ``read_history``
    raises rather than return a truncated history) and audits it with :func:`stale_writes`."""
    base = keys.prefix.encode() + b"/"
    history = await read_history(
        etcd, base, prefix_range_end(base), from_revision=start, catch_up_within=catch_up_within
    )
    terms, late = stale_writes(keys, history.events)
    return DeposalAudit(
        history.from_revision, history.to_revision, len(history.events), terms, tuple(late)
    )
