"""Primary leases: which member of stable is each partition's primary. Pure: no I/O, no clock.

Per partition, the lease ``{p}/primary/{zone}/{partition:05d}`` names one node until an expiry
(unix ms). States of a partition's lease::

    NONE --grant--> HELD(node, lease_epoch=1)
    HELD --now >= expiry - renew_before (or, aligned, any kept lease of the zone is)-->
         HELD (renewed: same node and lease_epoch, later expiry)
    HELD --holder left stable--> HELD(other node, lease_epoch + 1)            (at once)
    HELD --due for renewal, preferred primary can take it--> HELD(preferred, lease_epoch + 1)
    HELD --holder's node record gone, or it is not in the ISR, and now >= expiry
         (or the lease simply expired)--> HELD(other node, lease_epoch + 1)

**Who may hold it.** The data plane (design/data-plane.md) acknowledges a write only once every
member of the partition's in-sync set (ISR, ``{p}/isr/{zone}/{partition:05d}``) persisted it, so
only an ISR member is sure to hold every acknowledged write. A *candidate* for a new holder is
therefore a live (registered) member of stable that is in the ISR's ``members`` — or any live
member of stable while no ISR key exists (a brand-new partition: every replica is empty, and the
first primary bootstraps the ISR). A corrupt ISR names nobody: the current holder may keep (and
renew) its lease, but no one else gets it until the ISR is readable again (no guessing who is in
sync). With no candidate a lease is left as it is.

**When it may move.** A holder whose node record is gone (or that is not in the ISR) may still
believe it is primary until its lease expires by its own clock, so its lease goes to someone
else only once ``now_ms >= expiry``. A holder that left stable, or a hand-over to the preferred
primary, moves at once (as before the data plane): stable no longer naming the holder is fenced by
the rebalance itself, and a hand-over happens while both nodes are live and in sync, fenced by
``lease_epoch`` on the replicas.

**Balance.** A new holder is the preferred primary (first member of stable) when it is a
candidate — placement balances preferred primaries ±1 per node, so the leases are ±1 too.
Otherwise it is the candidate with the fewest leases in the zone so far (leases kept, left alone
and granted counted), ties broken by position in stable. A lease held by a live member that is
not the preferred primary (after a join the preferred primaries move to the new node; after an
outage the preferred one is back) is handed to the preferred primary when it comes up for
renewal, instead of being renewed: leases converge to the ±1 balance within one renewal period,
and a lease moves at most once per period. Every move increments ``lease_epoch``, which the data
plane uses to fence the former holder.

**The ISR compare.** Every write that changes the holder carries the ISR key's mod_revision it
was decided on (``isr_mod``, 0 = absent); the driver's transaction compares it, so a lease never
moves on an ISR that has changed since (an ISR shrink and a lease move never interleave). A
renewal of the same holder carries ``isr_mod = None``: no ISR compare.

**The zone renews together (``LeaseConfig.aligned``, the default).** Each renewal is a put of the
lease key, which every agent's and the driver's watch receives. Renewed one by one as each falls
due, a zone's leases drift apart (granted, moved and renewed in different passes) and the driver
renews a few every pass, so at rest it ran a pass (and a write, and the echo pass of its own
write) every tick. Aligned, when one kept lease of a zone is due, every kept lease of the zone is
renewed in the same pass (in a few transactions of ``PRIMARY_BATCH`` keys) if it has less than
``(duration + renew_before) / 2`` left (``LeaseConfig.align_below_ms``; not one renewed in the
last half period): within two rounds they share one expiry, and the zone costs one pass per
``duration - renew_before``. A lease is renewed early (never late: each is still renewed by the
time ``renew_before`` is left), which is safe — a renewal keeps the holder and its
``lease_epoch`` and only extends a lease the rules above let it keep. The hand-over to the
preferred primary happens at that zone renewal.
:func:`next_due_ms` tells the driver when a pass is next needed for the leases alone, so it
does not have to look every tick.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Set
from dataclasses import dataclass

from placement.core.model import Peers
from placement.metastore.codec import Corrupt, InSyncSet, PrimaryLease
from placement.metastore.transitions import LeaseWrite, Versioned


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    """``duration_ms``: lease length; renewed when less than ``renew_before_ms`` is left.

    ``aligned``: when one kept lease of a zone is due, renew every kept lease of the zone (see
    the module docstring); ``False`` renews each lease only when it is due itself."""

    duration_ms: int = 10_000
    renew_before_ms: int = 5_000
    aligned: bool = True

    @property
    def align_below_ms(self) -> int:
        """Aligned, a lease not due itself is renewed with its zone when it has less than this
        left: halfway between a fresh lease and a due one, so a lease renewed within the last
        half period is not renewed again (one written by the pass before, not yet seen, say),
        and any two groups of leases merge within two rounds."""
        return (self.duration_ms + self.renew_before_ms) // 2


#: A partition's ISR key as read: absent from the mapping = no ISR key.
Isrs = Mapping[int, Versioned[InSyncSet | Corrupt]]


def corrupt_isrs(isrs: Isrs) -> list[int]:
    """Partitions whose ISR key does not decode (their leases stay where they are)."""
    return sorted(p for p, entry in isrs.items() if isinstance(entry.value, Corrupt))


def _in_sync(
    peers: Peers, isr: Versioned[InSyncSet | Corrupt] | None, holder: str | None = None
) -> tuple[set[str], int]:
    """(members of stable that may hold the lease as far as the ISR goes, ISR mod_revision).

    No ISR key: all of stable. A corrupt one: only ``holder`` (the current one), if in stable.
    """
    if isr is None:
        return set(peers), 0
    if isinstance(isr.value, InSyncSet):
        return set(peers) & set(isr.value.members), isr.mod_revision
    return {holder} & set(peers) if holder is not None else set(), isr.mod_revision


def plan_primaries(
    stables: Mapping[int, Peers],
    current: Mapping[int, Versioned[PrimaryLease]],
    live: Set[str],
    now_ms: int,
    config: LeaseConfig,
    isrs: Isrs | None = None,
    leaving: Set[str] = frozenset(),
) -> dict[int, LeaseWrite]:
    """Leases to write, by partition; partitions whose lease is fine (or that nobody can take
    over yet) are not in the result.

    ``current``: the partitions' primary keys (a corrupt value counts as no lease); ``isrs``: the
    partitions' ISR keys (``None`` or a missing partition = no ISR key yet); ``leaving``: nodes
    being drained or stopping — a lease they hold is handed over at once to a candidate that is
    not leaving (kept, and renewed, while there is none), and they get no new lease while
    another candidate exists.
    """
    isrs = isrs if isrs is not None else {}
    keep: dict[int, PrimaryLease] = {}
    move: list[int] = []
    counts: Counter[str] = Counter()
    for p, peers in sorted(stables.items()):
        entry = current.get(p)
        lease = entry.value if entry is not None else None
        if not isinstance(lease, PrimaryLease) or lease.node not in peers:
            move.append(p)
            continue
        eligible, _ = _in_sync(peers, isrs.get(p), lease.node)
        if lease.expiry > now_ms and lease.node in live and lease.node in eligible:
            keep[p] = lease
            counts[lease.node] += 1
        elif lease.expiry > now_ms:
            counts[lease.node] += 1  # still held: it may think it is primary until expiry
        else:
            move.append(p)
    writes: dict[int, LeaseWrite] = {}
    renew_all = config.aligned and any(
        lease.expiry - now_ms < config.renew_before_ms for lease in keep.values()
    )
    for p, lease in keep.items():
        expected = current[p].mod_revision
        eligible, isr_mod = _in_sync(stables[p], isrs.get(p))
        if lease.node in leaving:
            takers = [n for n in stables[p] if n in live and n in eligible and n not in leaving]
            if takers:
                taker = min(takers, key=lambda n: (counts[n], stables[p].index(n)))
                counts[lease.node] -= 1
                counts[taker] += 1
                handed = PrimaryLease(taker, lease.lease_epoch + 1, now_ms + config.duration_ms)
                writes[p] = LeaseWrite(handed, expected, isr_mod)
                continue
        if lease.expiry - now_ms >= config.renew_before_ms and not (
            renew_all and lease.expiry - now_ms < config.align_below_ms
        ):
            continue
        preferred = stables[p][0]
        if (
            lease.node != preferred
            and preferred in live
            and preferred in eligible
            and preferred not in leaving
        ):
            counts[lease.node] -= 1
            counts[preferred] += 1
            handed = PrimaryLease(preferred, lease.lease_epoch + 1, now_ms + config.duration_ms)
            writes[p] = LeaseWrite(handed, expected, isr_mod)
            continue
        renewed = PrimaryLease(lease.node, lease.lease_epoch, now_ms + config.duration_ms)
        writes[p] = LeaseWrite(renewed, expected)
    for p in move:
        peers = stables[p]
        entry = current.get(p)
        old = entry.value if entry is not None else None
        isr = isrs.get(p)
        holding = old.node if isinstance(old, PrimaryLease) else None
        eligible, isr_mod = _in_sync(peers, isr, holding)
        candidates = [n for n in peers if n in live and n in eligible]
        staying = [n for n in candidates if n not in leaving]
        candidates = staying or candidates  # a leaving node only when no one else can
        if not candidates:
            continue
        if candidates[0] == peers[0]:
            holder = candidates[0]
        else:
            holder = min(candidates, key=lambda n: (counts[n], peers.index(n)))
        counts[holder] += 1
        lease_epoch = 1
        if isinstance(old, PrimaryLease):
            lease_epoch = old.lease_epoch + 1
        if isr is not None and isinstance(isr.value, InSyncSet):
            # A corrupt lease lost its epoch; the ISR remembers the epoch it was written under.
            lease_epoch = max(lease_epoch, isr.value.lease_epoch + 1)
        writes[p] = LeaseWrite(
            PrimaryLease(holder, lease_epoch, now_ms + config.duration_ms),
            entry.mod_revision if entry is not None else 0,
            isr_mod,
        )
    return writes


def next_due_ms(
    stables: Mapping[int, Peers],
    current: Mapping[int, Versioned[PrimaryLease]],
    now_ms: int,
    config: LeaseConfig,
) -> int | None:
    """The earliest time after ``now_ms`` at which one of these partitions' leases falls due for
    renewal (less than ``renew_before`` left: ``expiry - renew_before + 1``) or expires
    (``expiry``): until then, and while nothing else changes, :func:`plan_primaries` decides
    nothing new. ``None``: no lease to watch.

    Conservative (a time at which nothing turns out to be needed only costs a pass); what is due
    at ``now_ms`` or before was decided by the pass at ``now_ms`` already (written, or waiting
    for a change of the view, such as a candidate coming back)."""
    due: int | None = None
    for p in stables:
        entry = current.get(p)
        lease = entry.value if entry is not None else None
        if not isinstance(lease, PrimaryLease):
            continue
        for at in (lease.expiry - config.renew_before_ms + 1, lease.expiry):
            if at > now_ms and (due is None or at < due):
                due = at
    return due
