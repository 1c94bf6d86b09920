"""Primary leases: which member of stable is each partition's primary. Pure: no I/O, no clock.

Per partition, the lease ``{p}/primary/{zone}/{partition:05d}`` names one node until an expiry
(unix ms). States of a partition's lease::

    NONE --grant--> HELD(node, lease_epoch=1)
    HELD --now >= expiry - renew_before--> HELD (renewed: same node and lease_epoch, later expiry)
    HELD --holder left stable / its node record is gone / lease expired--> HELD(other node,
         lease_epoch + 1)   (moved to a live member of stable)

A new holder is the preferred primary (first member of stable) when it is live — placement
balances preferred primaries ±1 per node, so the leases are ±1 too. Otherwise it is the live member
of stable with the fewest leases in the zone so far (leases kept and granted counted), ties broken
by position in stable. A lease held by a live member that is not the preferred primary (after a
join the preferred primaries move to the new node; after an outage the preferred one is back) is
handed to the preferred primary when it comes up for renewal, instead of being renewed: leases
converge to the ±1 balance within one renewal period, and a lease moves at most once per period.
The hand-over increments ``lease_epoch``, which the data plane uses to fence the former holder.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Set
from dataclasses import dataclass

from placement.codec import PrimaryLease
from placement.metastore import Versioned
from placement.model import Peers


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    """``duration_ms``: lease length; renewed when less than ``renew_before_ms`` is left."""

    duration_ms: int = 10_000
    renew_before_ms: int = 5_000


def plan_primaries(
    stables: Mapping[int, Peers],
    current: Mapping[int, Versioned[PrimaryLease]],
    live: Set[str],
    now_ms: int,
    config: LeaseConfig,
) -> dict[int, tuple[PrimaryLease, int]]:
    """Leases to write: partition -> (new lease, expected mod_revision of the key, 0 = absent).

    Partitions whose lease is fine are not in the result. A partition with no live member of
    stable keeps its lease as it is (nobody to give it to).
    """
    keep: dict[int, PrimaryLease] = {}
    move: list[int] = []
    for p, peers in sorted(stables.items()):
        entry = current.get(p)
        lease = entry.value if entry is not None else None
        if (
            isinstance(lease, PrimaryLease)
            and lease.node in peers
            and lease.node in live
            and lease.expiry > now_ms
        ):
            keep[p] = lease
        else:
            move.append(p)
    counts = Counter(lease.node for lease in keep.values())
    writes: dict[int, tuple[PrimaryLease, int]] = {}
    for p, lease in keep.items():
        if lease.expiry - now_ms < config.renew_before_ms:
            preferred = stables[p][0]
            if lease.node != preferred and preferred in live:
                counts[lease.node] -= 1
                counts[preferred] += 1
                handed = PrimaryLease(preferred, lease.lease_epoch + 1, now_ms + config.duration_ms)
                writes[p] = (handed, current[p].mod_revision)
                continue
            renewed = PrimaryLease(lease.node, lease.lease_epoch, now_ms + config.duration_ms)
            writes[p] = (renewed, current[p].mod_revision)
    for p in move:
        candidates = [n for n in stables[p] if n in live]
        if not candidates:
            continue
        if candidates[0] == stables[p][0]:
            holder = candidates[0]
        else:
            holder = min(candidates, key=lambda n: (counts[n], stables[p].index(n)))
        counts[holder] += 1
        entry = current.get(p)
        old = entry.value if entry is not None else None
        lease_epoch = old.lease_epoch + 1 if isinstance(old, PrimaryLease) else 1
        writes[p] = (
            PrimaryLease(holder, lease_epoch, now_ms + config.duration_ms),
            entry.mod_revision if entry is not None else 0,
        )
    return writes
