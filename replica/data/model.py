"""The data plane's plain vocabulary: its errors and the agent-to-agent replication messages.

No gRPC and no protobuf here (design/data-plane.md): :mod:`replica.data.peers` converts these
messages to and from ``Append``/``Fetch`` on the wire, so the primary, the follower and the
learner work on plain dataclasses only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum

from placement.errors import PlacementError
from replica.data.storage import Entry

#: A partition: (zone, partition).
Key = tuple[str, int]


class NotPrimary(PlacementError):
    """This agent is not the partition's primary; ``primary`` is ``NODE@ADDRESS`` or ""."""

    def __init__(self, zone: str, partition: int, primary: str) -> None:
        self.primary = primary
        where = f"; the primary is {primary}" if primary else "; no primary is known yet"
        super().__init__(f"not the primary of {zone}/{partition}{where}")


class Unavailable(PlacementError):
    """The partition cannot take the request now (in-sync set below minimum, reconciling)."""


class Sealed(Unavailable):
    """A write to a key the partition's re-sharding moves, refused while the partition is
    sealed for the cut-over (design/resharding.md): the flip is a moment away, so the client is
    told to retry after ``retry_after_ms`` rather than back off."""

    def __init__(self, message: str, retry_after_ms: int) -> None:
        self.retry_after_ms = retry_after_ms
        super().__init__(message)


class UnknownZone(PlacementError):
    """No zone of that name (as far as this agent's view of etcd goes)."""


class WrongLayout(PlacementError):
    """The request was routed under another layout generation than the one in force here
    (design/resharding.md); ``layout`` is ``GENERATION/PARTITIONS`` of this agent's view and
    ``primary`` (``NODE@HOST:PORT``, or "") the primary, in that view, of the partition the
    request's key belongs to under it: the client retries there at once."""

    def __init__(
        self, zone: str, asked: int, generation: int, partitions: int, primary: str = ""
    ) -> None:
        self.layout = f"{generation}/{partitions}"
        self.primary = primary
        super().__init__(
            f"zone {zone} is at layout generation {generation} ({partitions} partitions), not"
            f" {asked}; re-read the zone's layout and route again"
        )


class WrongNode(PlacementError):
    """A ``Replicate`` meant for another node reached this agent (an address reused)."""


class PeerUnreachable(PlacementError):
    """An ``Append`` or ``Fetch`` to another agent failed on the wire (no answer, deadline)."""


class Deposed(Exception):
    """Internal: the primary lost its lease (or saw a higher epoch)."""


class AppendOutcome(Enum):
    OK = "ok"
    STALE_EPOCH = "stale epoch"
    MISMATCH = "mismatch"
    NOT_HOSTED = "not hosted"
    UNPROVEN = "unproven"
    #: The member holds an entry it knows is committed that the primary's log lacks.
    AHEAD = "ahead"


@dataclass(frozen=True, slots=True)
class AppendCall:
    """The primary of ``lease_epoch`` asks a member to append ``entries`` after
    ``(prev_index, prev_epoch)``; an empty one is a heartbeat or a reconcile probe. ``tail``:
    the entries end at the primary's last entry, so whatever the member holds after them from
    an older lease epoch is not in the primary's log and is undone."""

    zone: str
    partition: int
    lease_epoch: int
    primary: str
    prev_index: int
    prev_epoch: int
    entries: tuple[Entry, ...]
    commit_index: int
    tail: bool = False


@dataclass(frozen=True, slots=True)
class AppendReply:
    outcome: AppendOutcome
    last_index: int = 0
    last_epoch: int = 0
    lease_epoch: int = 0


class FetchOutcome(Enum):
    OK = "ok"
    NOT_PRIMARY = "not primary"
    SNAPSHOT_NEEDED = "snapshot needed"


@dataclass(frozen=True, slots=True)
class FetchCall:
    """A learner (``node``) asks the primary for a snapshot page after ``snapshot_after``
    (``snapshot``) or for the committed entries after ``after_index``."""

    zone: str
    partition: int
    node: str
    snapshot: bool
    snapshot_after: bytes = b""
    after_index: int = 0
    max_bytes: int = 0
    #: Re-sharding's copy: ``(partitions, partition)`` — only the keys routing there (and the
    #: seal); the caller never joins the in-sync set (design/resharding.md). None = all.
    select: tuple[int, int] | None = None
    #: A draining copy (SEAL of this attempt): answered once the source's seal for it is
    #: committed, or after ``SEAL_FETCH_WAIT`` (0 = at once).
    seal_attempt: int = 0


@dataclass(frozen=True, slots=True)
class FetchReply:
    outcome: FetchOutcome
    items: tuple[tuple[bytes, bytes], ...] = ()
    entries: tuple[Entry, ...] = ()
    snapshot_done: bool = False
    snapshot_index: int = 0
    snapshot_epoch: int = 0
    commit_index: int = 0
    lease_epoch: int = 0
    #: A selected fetch: the last key the snapshot page examined, the last index the entries
    #: covered (filtered-out rows still move the cursor on).
    scanned_after: bytes = b""
    scanned_to: int = 0

    @property
    def size(self) -> int:
        """Bytes of keys and values carried (what the catch-up throttle counts)."""
        return sum(len(k) + len(v) for k, v in self.items) + sum(
            len(e.key) + len(e.value) for e in self.entries
        )


@dataclass(frozen=True, slots=True)
class ReplicaPage:
    """One page of a replica's applied data, for ``ReadReplica``; ``hosted`` = complete."""

    hosted: bool
    items: list[tuple[bytes, bytes]] = field(default_factory=list)
    more: bool = False
    last_index: int = 0
    commit_index: int = 0


#: Sends an ``Append`` to a node at an address (over the pair stream to that node), with a timeout
#: in seconds; raises :class:`PeerUnreachable`.
SendAppend = Callable[[str, str, AppendCall, float], Awaitable[AppendReply]]
#: Sends a ``Fetch`` likewise.
SendFetch = Callable[[str, FetchCall, float], Awaitable[FetchReply]]
