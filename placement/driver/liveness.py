"""Which agents answer: the leader's probe before it renews or grants a primary lease.

A killed agent's node record outlives it by up to its registration TTL, and a lease renewed
in that time kept its partitions without a primary for a whole lease more (measured: a SIGKILLed
primary's partitions took 12 s to take writes again with 10 s leases, of which 1.9 s went to
the renewal the dead holder got after it died). So before a pass's lease writes go out, the
holders they name that have not answered within ``fresh`` seconds (the driver: a quarter of
the renewal period, at most 0.5 s) get one health check each
(concurrently, at most ``timeout`` seconds); the writes for a node that does not answer are
dropped — a lease is never shortened, only not extended or not granted — and the node is
*silent* for ``hold`` seconds: passes neither renew its leases nor grant it one, so they expire
and move to an in-sync member that answers. Design: design/control-plane.md, "Primary leases".

Cost: a probe per lease holder per renewal round, only for nodes that have not answered within
``fresh`` — nothing at rest between rounds, nothing per partition.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

from placement.core.retry import Clock

#: ``answers(address, timeout)``: whether the agent at ``address`` answered.
Probe = Callable[[str, float], Awaitable[bool]]


class Liveness:
    """Recent answers of agents, by node name; ``clock`` is monotonic seconds."""

    def __init__(
        self,
        probe: Probe,
        *,
        fresh: float = 1.0,
        timeout: float = 1.0,
        hold: float = 1.0,
        open_after: float = 15.0,
        clock: Clock = time.monotonic,
    ) -> None:
        self._probe = probe
        self.fresh, self.timeout, self.hold = fresh, timeout, hold
        self.open_after = open_after
        self._clock = clock
        self._answered: dict[str, float] = {}
        self._silent_until: dict[str, float] = {}
        self._silent: frozenset[str] = frozenset()
        self._probing: dict[str, asyncio.Future[bool]] = {}
        #: probes sent, nodes found silent and rounds in which none answered (for tests and
        #: metrics)
        self.probes = 0
        self.found_silent = 0
        self.failed_open = 0

    def silence_ends_in(self) -> float | None:
        """Seconds until the first silent node may be planned for again (None: none silent):
        the pass loop wakes then, so a node that missed one probe gets its renewals in time."""
        if not self._silent_until:
            return None
        return max(0.0, min(self._silent_until.values()) - self._clock())

    def silent(self) -> frozenset[str]:
        """Nodes that did not answer within the last ``hold`` seconds (the same object while it
        does not change, so plans kept by ``PlanMemo`` stay valid)."""
        now = self._clock()
        current = frozenset(n for n, until in self._silent_until.items() if until > now)
        if current != self._silent:
            self._silent = current
            for node in [n for n, until in self._silent_until.items() if until <= now]:
                del self._silent_until[node]
        return self._silent

    async def check(self, addresses: Mapping[str, str]) -> frozenset[str]:
        """Probe the nodes of ``addresses`` (node -> address; "" = unknown, silent) that have
        not answered within ``fresh`` seconds; returns those that do not answer now.

        **Fails open**: when no agent at all has answered within ``open_after`` seconds, the
        fault is far likelier on this side — the driver's certificate refused, its network —
        than every agent dead at once, so nothing is withheld (the node records alone decide,
        as without the check) and ``failed_open`` counts it. Concurrent checks share the probe
        of a node already in flight."""
        now = self._clock()
        due = {
            node: address
            for node, address in addresses.items()
            if now - self._answered.get(node, -1e18) >= self.fresh
        }
        if not due:
            return frozenset()
        results = await asyncio.gather(
            *(self._probe_once(n, a) for n, a in due.items()), return_exceptions=True
        )
        silent = frozenset(n for n, answer in zip(due, results, strict=True) if answer is not True)
        now = self._clock()
        if silent and not any(now - t < self.open_after for t in self._answered.values()):
            self.failed_open += 1
            for node in silent:  # and passes plan for them as before
                self._silent_until.pop(node, None)
            return frozenset()
        self.found_silent += len(silent)
        return silent

    def _probe_once(self, node: str, address: str) -> asyncio.Future[bool]:
        """The probe of ``node`` in flight, or a new one; its answer is recorded once."""
        running = self._probing.get(node)
        if running is not None:
            return running
        self.probes += 1
        probe = asyncio.ensure_future(self._probe(address, self.timeout) if address else _false())
        self._probing[node] = probe

        def record(done: asyncio.Future[bool]) -> None:
            self._probing.pop(node, None)
            if done.cancelled() or done.exception() is not None or not done.result():
                self._answered.pop(node, None)
                self._silent_until[node] = self._clock() + self.hold
            else:
                self._answered[node] = self._clock()
                self._silent_until.pop(node, None)

        probe.add_done_callback(record)
        return probe

    def forget(self, registered: Mapping[str, object]) -> None:
        """Drop what is known of nodes no longer registered."""
        for known in (self._answered, self._silent_until):
            for node in [n for n in known if n not in registered]:
                del known[node]


async def _false() -> bool:
    return False
