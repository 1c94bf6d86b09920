"""Primary leases: which member of stable is each partition's primary. Pure: no I/O, no clock.

Per partition, the lease ``{p}/primary/{zone}/{partition:05d}`` names one node. It lasts while
its holder's *lease term* does (``{p}/primary/@term/{node}``, :class:`LeaseTerm`: renewed once
per node, not once per lease) and, when its own ``expiry`` is set, no later than that
(:meth:`PrimaryLease.until`). States of a partition's lease::

    NONE --grant--> HELD(node, lease_epoch=1)                        (no expiry: the term's)
    HELD --kept--> HELD, not written: the holder's term is renewed (plan_terms)
    HELD --holder left stable, or leaving with another candidate--> HELD(other, lease_epoch + 1)
    HELD --held at least one period, preferred primary can take it--> HELD(preferred, +1)
    HELD --holder live but not in the ISR--> HELD(same, expiry = its end now)   (capped)
    HELD --capped, holder a candidate again--> HELD(same, no expiry)            (uncapped)
    HELD --ended (its term not renewed: node record gone, silent; or its cap passed)-->
         HELD(other node, lease_epoch + 1)

**Who may hold it.** The data plane (design/data-plane.md) acknowledges a write only once every
member of the partition's in-sync set (ISR, ``{p}/isr/{zone}/{partition:05d}``) persisted it, so
only an ISR member is sure to hold every acknowledged write. A *candidate* for a new holder is
therefore a live (registered) member of stable that is in the ISR's ``members`` — or any live
member of stable while no ISR key exists (a brand-new partition: every replica is empty, and the
first primary bootstraps the ISR). A corrupt ISR names nobody: the current holder may keep its
lease, but no one else gets it until the ISR is readable again (no guessing who is in sync).
With no candidate a lease is left as it is.

**When it may move.** A holder whose node record is gone (or that does not answer, or is not in
the ISR) may still believe it is primary until its lease ends by its own clock, so its lease
goes to someone else only once ``now_ms >=`` that end. Its term is not renewed (not live), or —
when the holder is live and its term goes on for its other leases — the lease is capped at the
term's end as it is now. A holder that left stable, or a hand-over to the preferred primary,
moves at once (as before the data plane): stable no longer naming the holder is fenced by the
rebalance itself, and a hand-over happens while both nodes are live and in sync, fenced by
``lease_epoch`` on the replicas.

**Balance.** A new holder is the preferred primary (first member of stable) when it is a
candidate — placement balances preferred primaries ±1 per node, so the leases are ±1 too.
Otherwise it is the candidate with the fewest leases in the zone so far (leases kept, left alone
and granted counted), ties broken by position in stable. A lease held by a live member that is
not the preferred primary (after a join the preferred primaries move to the new node; after an
outage the preferred one is back) is handed to the preferred primary once it was written at
least ``hand_over_after_ms`` (one renewal period) ago: a lease moves at most once per period
that way. Every move increments ``lease_epoch``, which the data plane uses to fence the former
holder.

**The ISR compare.** Every write that changes the holder carries the ISR key's mod_revision it
was decided on (``isr_mod``, 0 = absent); the driver's transaction compares it, so a lease never
moves on an ISR that has changed since (an ISR shrink and a lease move never interleave). A cap
or uncap of the same holder carries ``isr_mod = None``: no ISR compare.

**Terms renew together (``LeaseConfig.aligned``, the default).** :func:`plan_terms` renews the
term of every live node holding a kept or granted lease (:func:`lease_holders`) once less than
``renew_before`` is left; aligned, when one is due every holder with less than
``(duration + renew_before) / 2`` left is renewed with it, so the nodes' terms share one round
per ``duration - renew_before``: a fleet's leases cost one round of a few transactions of
``PRIMARY_BATCH`` terms per period, whatever the number of partitions. A term is renewed early,
never late, and only extended, which is safe: it extends only leases the rules above let their
holders keep. :func:`next_due_ms` and :func:`terms_due_ms` tell the driver when a pass is next
needed for the leases alone, so it does not have to look every tick.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Set
from dataclasses import dataclass

from placement.core.model import Peers
from placement.metastore.codec import Corrupt, InSyncSet, LeaseTerm, PrimaryLease
from placement.metastore.transitions import LeaseWrite, TermWrite, Versioned


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    """``duration_ms``: a lease term's length; renewed when less than ``renew_before_ms`` is
    left.

    ``aligned``: when one holder's term is due, renew every holder's term with less than
    ``align_below_ms`` left (see the module docstring); ``False`` renews each term only when it
    is due itself."""

    duration_ms: int = 10_000
    renew_before_ms: int = 5_000
    aligned: bool = True

    @property
    def hand_over_after_ms(self) -> int:
        """A lease held by a member that is not the preferred primary is handed to the
        preferred one once it was written at least this long ago (one renewal period): a lease
        moves at most once per period that way."""
        return self.duration_ms - self.renew_before_ms

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
    terms: Mapping[str, int] | None = None,
    term_mods: Mapping[str, int] | None = None,
) -> dict[int, LeaseWrite]:
    """Leases to write, by partition; partitions whose lease is fine (or that nobody can take
    over yet) are not in the result.

    ``current``: the partitions' primary keys (a corrupt value counts as no lease); ``isrs``: the
    partitions' ISR keys (``None`` or a missing partition = no ISR key yet); ``leaving``: nodes
    being drained or stopping — a lease they hold is handed over at once to a candidate that is
    not leaving (kept while there is none), and they get no new lease while another candidate
    exists; ``terms``: node -> ``until`` of its lease term (absent = none). A lease lasts while
    its holder's term does (:meth:`PrimaryLease.until`): a kept lease is not written at all —
    :func:`plan_terms` renews the holders' terms — and a new one is written without an expiry.
    ``term_mods``: node -> its term key's mod_revision (absent = no term key), which a cap
    compares (:class:`LeaseWrite`).
    """
    isrs = isrs if isrs is not None else {}
    terms = terms if terms is not None else {}
    term_mods = term_mods if term_mods is not None else {}

    def cap(p: int, lease: PrimaryLease, ends: int) -> LeaseWrite:
        """``lease`` ended at ``ends`` whatever its holder's term does from now on."""
        capped = PrimaryLease(lease.node, lease.lease_epoch, max(ends, 1))
        return LeaseWrite(capped, current[p].mod_revision, None, term_mods.get(lease.node, 0))

    keep: dict[int, PrimaryLease] = {}
    move: list[int] = []
    writes: dict[int, LeaseWrite] = {}
    counts: Counter[str] = Counter()
    for p, peers in sorted(stables.items()):
        entry = current.get(p)
        lease = entry.value if entry is not None else None
        if not isinstance(lease, PrimaryLease) or lease.node not in peers:
            move.append(p)
            continue
        until = lease.until(terms.get(lease.node, 0))
        eligible, _ = _in_sync(peers, isrs.get(p), lease.node)
        if until > now_ms and lease.node in live and lease.node in eligible:
            keep[p] = lease
            counts[lease.node] += 1
        elif until > now_ms:
            counts[lease.node] += 1  # still held: it may think it is primary until then
            if lease.node in live and not lease.expiry:
                # Its term goes on (the node answers): end this lease with the term as it is
                # now, so it moves once that has passed by the holder's own clock.
                writes[p] = cap(p, lease, until)
        else:
            move.append(p)
    for p, lease in keep.items():
        expected = current[p].mod_revision
        eligible, isr_mod = _in_sync(stables[p], isrs.get(p))
        if lease.node in leaving:
            takers = [n for n in stables[p] if n in live and n in eligible and n not in leaving]
            if takers:
                taker = min(takers, key=lambda n: (counts[n], stables[p].index(n)))
                counts[lease.node] -= 1
                counts[taker] += 1
                writes[p] = LeaseWrite(
                    PrimaryLease(taker, lease.lease_epoch + 1, 0), expected, isr_mod
                )
                continue
        preferred = stables[p][0]
        if (
            lease.node != preferred
            and preferred in live
            and preferred in eligible
            and preferred not in leaving
            and now_ms >= lease.ts + config.hand_over_after_ms
        ):
            counts[lease.node] -= 1
            counts[preferred] += 1
            handed = PrimaryLease(preferred, lease.lease_epoch + 1, 0)
            writes[p] = LeaseWrite(handed, expected, isr_mod)
            continue
        if lease.expiry and terms.get(lease.node, 0) > now_ms:
            # capped (or written before terms) and fine to keep: lift the cap once the holder
            # has a term to follow (lease_holders asks for one meanwhile)
            writes[p] = LeaseWrite(PrimaryLease(lease.node, lease.lease_epoch, 0), expected)
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
            if isinstance(old, PrimaryLease) and entry is not None and not old.expiry:
                # Nobody can take it yet. Its holder's term may be renewed for its other leases
                # (it left stable, say; or it comes back): end this one at its end as it is now,
                # so a renewal neither keeps it nor brings it back once ended.
                until = old.until(terms.get(old.node, 0))
                if old.node in live or until <= now_ms:
                    writes[p] = cap(p, old, until)
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
            PrimaryLease(holder, lease_epoch, 0),
            entry.mod_revision if entry is not None else 0,
            isr_mod,
        )
    return writes


def lease_holders(
    stables: Mapping[int, Peers],
    current: Mapping[int, Versioned[PrimaryLease]],
    writes: Mapping[int, LeaseWrite],
    live: Set[str],
    now_ms: int,
    terms: Mapping[str, int],
) -> frozenset[str]:
    """The nodes whose terms these partitions' leases need renewed once ``writes`` (from
    :func:`plan_primaries`) are applied: the holders of the leases written without an expiry
    and, if live, of the unwritten ones that have not ended — a capped one too (its cap bounds
    it whatever the term does, and a lease written before terms gets the term it will follow
    once uncapped). A lease being capped needs no term: it is on its way out."""
    holders = {w.lease.node for w in writes.values() if not w.lease.expiry}
    for p in stables:
        entry = current.get(p)
        lease = entry.value if entry is not None else None
        if (
            p not in writes
            and isinstance(lease, PrimaryLease)
            and lease.node in live
            and lease.until(terms.get(lease.node, 0)) > now_ms
        ):
            holders.add(lease.node)
    return frozenset(holders)


def next_due_ms(
    stables: Mapping[int, Peers],
    current: Mapping[int, Versioned[PrimaryLease]],
    now_ms: int,
    config: LeaseConfig,
) -> int | None:
    """The earliest time after ``now_ms`` at which one of these partitions' leases reaches its
    cap (``expiry``) or may be handed to the preferred primary (``ts + hand_over_after_ms``):
    until then, and while nothing else changes — no lease term ends or is renewed from ended,
    which the pass watches for every zone at once (:func:`terms_due_ms`, the terms' ends) —
    :func:`plan_primaries` decides nothing new. ``None``: no lease to watch.

    Conservative (a time at which nothing turns out to be needed only costs a pass); what is due
    at ``now_ms`` or before was decided by the pass at ``now_ms`` already (written, or waiting
    for a change of the view, such as a candidate coming back)."""
    due: int | None = None
    for p, peers in stables.items():
        entry = current.get(p)
        lease = entry.value if entry is not None else None
        if not isinstance(lease, PrimaryLease):
            continue
        times = [lease.expiry] if lease.expiry else []
        if lease.node != peers[0]:
            times.append(lease.ts + config.hand_over_after_ms)
        for at in times:
            if at > now_ms and (due is None or at < due):
                due = at
    return due


def plan_terms(
    terms: Mapping[str, Versioned[LeaseTerm | Corrupt]],
    holders: Set[str],
    live: Set[str],
    now_ms: int,
    config: LeaseConfig,
) -> dict[str, TermWrite]:
    """Terms to write, by node: of the live ``holders`` (nodes whose leases are kept or
    granted), those with less than ``renew_before_ms`` left (or none, or a corrupt one) get
    ``now + duration`` — and, aligned, when one is due, every holder's with less than
    ``align_below_ms`` left, so the nodes' terms share one renewal round."""
    left = {
        n: (t.value.until - now_ms if t is not None and isinstance(t.value, LeaseTerm) else -1)
        for n in holders & live
        for t in (terms.get(n),)
    }
    due = {n for n, ms in left.items() if ms < config.renew_before_ms}
    if not due:
        return {}
    if config.aligned:
        due |= {n for n, ms in left.items() if ms < config.align_below_ms}
    return {
        n: TermWrite(
            LeaseTerm(now_ms + config.duration_ms),
            found.mod_revision if (found := terms.get(n)) is not None else 0,
        )
        for n in sorted(due)
    }


def terms_due_ms(
    terms: Mapping[str, int], holders: Set[str], now_ms: int, config: LeaseConfig
) -> int | None:
    """The earliest time after ``now_ms`` at which a holder's term falls due for renewal
    (``until - renew_before + 1``) or ends; ``None``: no holder has one."""
    times = [
        at
        for n in holders
        if n in terms
        for at in (terms[n] - config.renew_before_ms + 1, terms[n])
        if at > now_ms
    ]
    return min(times, default=None)
