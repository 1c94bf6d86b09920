"""A partition replica's data: key-values, the replication log and its positions (sqlite).

Lives in the agent's ``agent.db`` beside the rebalance records (``replica.records``), on the same
connection and the same single store thread, so ``DiscardReplica`` deletes a replica's data in the
transaction that drops its record. Every method that writes is one transaction; the connection
runs ``synchronous=FULL`` in WAL mode, so a returned write survives SIGKILL.

Tables (design/data-plane.md):

* ``dstate`` — per partition: ``seen_epoch`` (the fence), ``base_index``/``base_epoch`` (the log
  starts after this point: a snapshot or a trim), ``last_index``/``last_epoch``, ``commit_index``,
  and ``snap_after`` while a snapshot is being loaded (the last key loaded; NULL otherwise);
* ``kv`` — the applied data;
* ``rlog`` — entries ``(index, epoch, key, value, del)`` with the value each replaced
  (``prev``/``prev_exists``), so a suffix above the commit index can be undone exactly.

Not thread-safe: called from the agent's one store thread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from placement.data.partitioning import CONTROL_PREFIX, routes_to, selected

#: Rows a snapshot page examines at most (a selected page may skip most of them).
SNAPSHOT_SCAN = 10_000

DATA_SCHEMA = """
CREATE TABLE IF NOT EXISTS dstate (
    zone TEXT NOT NULL,
    partition INTEGER NOT NULL,
    seen_epoch INTEGER NOT NULL,
    base_index INTEGER NOT NULL,
    base_epoch INTEGER NOT NULL,
    last_index INTEGER NOT NULL,
    last_epoch INTEGER NOT NULL,
    commit_index INTEGER NOT NULL,
    snap_after BLOB,
    PRIMARY KEY (zone, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS kv (
    zone TEXT NOT NULL,
    partition INTEGER NOT NULL,
    key BLOB NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (zone, partition, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rlog (
    zone TEXT NOT NULL,
    partition INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    key BLOB NOT NULL,
    value BLOB NOT NULL,
    del INTEGER NOT NULL,
    prev BLOB,
    PRIMARY KEY (zone, partition, idx)
) WITHOUT ROWID;
"""

_STATE_COLUMNS = (
    "seen_epoch, base_index, base_epoch, last_index, last_epoch, commit_index, snap_after"
)


class AppendResult(Enum):
    OK = "ok"
    STALE_EPOCH = "stale epoch"
    MISMATCH = "mismatch"
    #: The primary's log lacks an entry this replica knows is committed (:meth:`follow`).
    AHEAD = "ahead"


@dataclass(frozen=True, slots=True)
class Entry:
    """One replicated write: put ``key`` = ``value``, or delete ``key`` when ``delete``."""

    index: int
    epoch: int
    key: bytes
    value: bytes = b""
    delete: bool = False

    @property
    def size(self) -> int:
        return len(self.key) + len(self.value) + 16


@dataclass(frozen=True, slots=True)
class DataState:
    """Where a replica's log stands; see the module docstring."""

    seen_epoch: int = 0
    base_index: int = 0
    base_epoch: int = 0
    last_index: int = 0
    last_epoch: int = 0
    commit_index: int = 0
    snap_after: bytes | None = None

    @property
    def loading_snapshot(self) -> bool:
        return self.snap_after is not None


class DataStore:
    """Data operations on the agent database connection (see the module docstring)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def create_schema(self) -> None:
        """Create the data tables if missing (idempotent; databases of schema 1 gain them)."""
        for statement in DATA_SCHEMA.split(";"):
            if statement.strip():
                self._conn.execute(statement)

    # -- reads --------------------------------------------------------------------------------

    def state(self, zone: str, partition: int) -> DataState | None:
        row = self._conn.execute(
            f"SELECT {_STATE_COLUMNS} FROM dstate WHERE zone = ? AND partition = ?",
            (zone, partition),
        ).fetchone()
        return None if row is None else _state(row)

    def get(self, zone: str, partition: int, key: bytes) -> bytes | None:
        row = self._conn.execute(
            "SELECT value FROM kv WHERE zone = ? AND partition = ? AND key = ?",
            (zone, partition, key),
        ).fetchone()
        return None if row is None else bytes(row[0])

    def scan(
        self,
        zone: str,
        partition: int,
        prefix: bytes,
        start_after: bytes,
        limit: int,
        max_bytes: int = 1 << 20,
        routed: int = 0,
    ) -> tuple[list[tuple[bytes, bytes]], bool]:
        """Up to ``limit`` items with ``prefix`` after ``start_after``, in key order, and no more
        than about ``max_bytes`` of keys plus values (at least one item, so a page always moves
        on); and whether more follow. ``routed``: only keys that route to the partition under a
        layout of that many partitions (0 = every client key); control keys never."""
        items: list[tuple[bytes, bytes]] = []
        size = 0
        after, inclusive = max(prefix, start_after), not (start_after and start_after >= prefix)
        end = _prefix_end(prefix)
        while True:
            sql = "SELECT key, value FROM kv WHERE zone = ? AND partition = ? AND key "
            sql += ">= ?" if inclusive else "> ?"
            params: list[object] = [zone, partition, after]
            if end is not None:
                sql += " AND key < ?"
                params.append(end)
            sql += " ORDER BY key LIMIT ?"
            params.append(limit + 1)
            rows = self._conn.execute(sql, params).fetchall()
            for k, v in rows:
                key, value = bytes(k), bytes(v)
                after, inclusive = key, False
                if key.startswith(CONTROL_PREFIX) or (
                    routed and not routes_to(key, partition, routed)
                ):
                    continue
                if len(items) == limit or (items and size + len(key) + len(value) > max_bytes):
                    return items, True
                items.append((key, value))
                size += len(key) + len(value)
            if len(rows) <= limit:
                return items, False

    def snapshot_page(
        self,
        zone: str,
        partition: int,
        after: bytes,
        max_bytes: int,
        select: tuple[int, int] | None = None,
    ) -> tuple[list[tuple[bytes, bytes]], bool, bytes]:
        """Keys strictly after ``after`` (b"" = from the start) up to about ``max_bytes``; whether
        the page reached the last key; and the last key it examined (resume after it). With
        ``select`` only the keys :func:`~placement.data.partitioning.selected` takes.

        Rows are read lazily and the page stops at ``max_bytes``: values past the page (and,
        with ``select``, the values of keys not selected) are never read — a re-sharding copy
        pages through every source for each destination, and reading the whole rest of the
        partition per page made that quadratic."""
        where = "zone = ? AND partition = ? AND key > ? ORDER BY key LIMIT ?"
        args = (zone, partition, after, SNAPSHOT_SCAN)
        items: list[tuple[bytes, bytes]] = []
        size = examined = 0
        last = after
        if select is None:
            for k, v in self._conn.execute(f"SELECT key, value FROM kv WHERE {where}", args):
                examined += 1
                last = bytes(k)
                items.append((last, bytes(v)))
                size += len(k) + len(v)
                if size >= max_bytes:
                    return items, False, last
            return items, examined < SNAPSHOT_SCAN, last
        for (k,) in self._conn.execute(f"SELECT key FROM kv WHERE {where}", args).fetchall():
            examined += 1
            last = bytes(k)
            if not selected(last, select):
                continue
            (v,) = self._conn.execute(
                "SELECT value FROM kv WHERE zone = ? AND partition = ? AND key = ?",
                (zone, partition, last),
            ).fetchone()
            items.append((last, bytes(v)))
            size += len(k) + len(v)
            if size >= max_bytes:
                return items, False, last
        return items, examined < SNAPSHOT_SCAN, last

    def key_page(
        self, zone: str, partition: int, after: bytes, limit: int
    ) -> tuple[list[bytes], bool]:
        """Up to ``limit`` keys strictly after ``after``, in order, without their values; whether
        that reached the last key."""
        rows = self._conn.execute(
            "SELECT key FROM kv WHERE zone = ? AND partition = ? AND key > ? ORDER BY key LIMIT ?",
            (zone, partition, after, limit),
        ).fetchall()
        return [bytes(k) for (k,) in rows], len(rows) < limit

    def entries(
        self, zone: str, partition: int, after: int, upto: int, max_bytes: int
    ) -> list[Entry]:
        """Log entries ``after < index <= upto`` (at least one if any, then up to ``max_bytes``).
        The caller checks ``after >= base_index`` first."""
        rows = self._conn.execute(
            "SELECT idx, epoch, key, value, del FROM rlog WHERE zone = ? AND partition = ?"
            " AND idx > ? AND idx <= ? ORDER BY idx LIMIT 5000",
            (zone, partition, after, upto),
        ).fetchall()
        out: list[Entry] = []
        size = 0
        for idx, epoch, key, value, dele in rows:
            entry = Entry(idx, epoch, bytes(key), bytes(value), bool(dele))
            out.append(entry)
            size += entry.size
            if size >= max_bytes:
                break
        return out

    def committed_entries(
        self, zone: str, partition: int, after: int, upto: int, max_bytes: int
    ) -> list[Entry] | None:
        """:meth:`entries` with the base check in the same read: None when ``after`` is below
        the log's base (a snapshot is needed; a trim may have run since the caller looked)."""
        state = self.state(zone, partition)
        if state is None:
            return []
        if after < state.base_index:
            return None
        return self.entries(zone, partition, after, upto, max_bytes)

    def epoch_at(self, zone: str, partition: int, index: int, state: DataState) -> int | None:
        """The epoch of the entry at ``index`` (``base_epoch`` at the base); None if unknown."""
        if index == state.base_index:
            return state.base_epoch
        if index < state.base_index or index > state.last_index:
            return None
        row = self._conn.execute(
            "SELECT epoch FROM rlog WHERE zone = ? AND partition = ? AND idx = ?",
            (zone, partition, index),
        ).fetchone()
        return None if row is None else int(row[0])

    def size(self, zone: str, partition: int) -> tuple[int, int]:
        """(bytes of keys plus values, number of keys) of a replica."""
        row = self._conn.execute(
            "SELECT COALESCE(SUM(LENGTH(key) + LENGTH(value)), 0), COUNT(*) FROM kv"
            " WHERE zone = ? AND partition = ?",
            (zone, partition),
        ).fetchone()
        return int(row[0]), int(row[1])

    def sizes(self) -> dict[tuple[str, int], tuple[int, int]]:
        """:meth:`size` of every replica with a data state, in one query:
        ``{(zone, partition): (bytes of keys plus values, number of keys)}``."""
        rows = self._conn.execute(
            "SELECT d.zone, d.partition, COALESCE(k.bytes, 0), COALESCE(k.keys, 0)"
            " FROM dstate AS d LEFT JOIN ("
            "  SELECT zone, partition, SUM(LENGTH(key) + LENGTH(value)) AS bytes, COUNT(*) AS keys"
            "  FROM kv GROUP BY zone, partition"
            " ) AS k ON k.zone = d.zone AND k.partition = d.partition"
        ).fetchall()
        return {(str(z), int(p)): (int(b), int(n)) for z, p, b, n in rows}

    # -- writes (one transaction each) ---------------------------------------------------------

    def ensure(self, zone: str, partition: int) -> DataState:
        """The partition's state, created empty (index 0, epoch 0) if absent."""
        with self._transaction():
            return self._ensure(zone, partition)

    def raise_fence(self, zone: str, partition: int, epoch: int) -> DataState:
        """A new primary's own fence: ``seen_epoch`` rises to ``epoch``, nothing is undone (the
        primary holds every acknowledged entry and re-commits its whole log)."""
        with self._transaction():
            state = self._ensure(zone, partition)
            if epoch > state.seen_epoch:
                state = replace(state, seen_epoch=epoch)
                self._put_state(zone, partition, state)
            return state

    def truncate(self, zone: str, partition: int, index: int) -> DataState:
        """Undo every entry above ``index`` (never below the commit index or the base)."""
        with self._transaction():
            state = self._ensure(zone, partition)
            state = self._undo_to(zone, partition, state, max(index, state.commit_index))
            self._put_state(zone, partition, state)
            return state

    def append(
        self, zone: str, partition: int, entries: Sequence[Entry], commit_index: int
    ) -> DataState:
        """Apply ``entries`` (they must follow ``last_index`` without a gap; entries at or below
        both ``last_index`` and ``commit_index`` are already here and skipped) and raise the
        commit index to ``min(commit_index, last_index)``."""
        return self.append_writes(zone, partition, entries, commit_index)[0]

    def append_writes(
        self, zone: str, partition: int, entries: Sequence[Entry], commit_index: int
    ) -> tuple[DataState, tuple[bool, ...]]:
        """:meth:`append`, also telling for each applied entry whether its key held a value
        before (a primary's answer to a delete)."""
        existed: list[bool] = []
        with self._transaction():
            state = self._ensure(zone, partition)
            for entry in entries:
                if entry.index <= state.last_index and entry.index <= commit_index:
                    continue  # a committed entry that arrived meanwhile another way (an Append)
                if entry.index != state.last_index + 1:
                    raise ValueError(f"entry {entry.index} does not follow {state.last_index}")
                state, had = self._append_one(zone, partition, state, entry)
                existed.append(had)
            commit = max(state.commit_index, min(commit_index, state.last_index))
            state = replace(state, commit_index=commit)
            self._put_state(zone, partition, state)
            return state, tuple(existed)

    def follow(
        self,
        zone: str,
        partition: int,
        epoch: int,
        prev_index: int,
        prev_epoch: int,
        entries: Sequence[Entry],
        commit_index: int,
        tail: bool = False,
    ) -> tuple[AppendResult, DataState]:
        """A follower's whole handling of one ``Append`` from the primary of lease ``epoch``, in
        one transaction (design/data-plane.md, "A new primary"):

        * ``epoch`` below the fence → STALE_EPOCH, nothing changes;
        * ``epoch`` above it → the fence rises; nothing is undone for it (the commit index on
          disk lags what was acknowledged, and an acknowledged entry undone here would rest on
          the new primary alone until it re-sent it);
        * the log must hold ``(prev_index, prev_epoch)``, else MISMATCH with where to resume
          (``last_index``, or the commit index when the suffix above it may be foreign);
        * entries the log already holds with the same epoch are skipped; from the first that
          differs, the uncommitted suffix is undone and the rest appended;
        * with ``tail`` (the entries end at the primary's last entry), a suffix after them from
          an older epoch is undone: the primary does not hold it, so it was never acknowledged
          (entries of this epoch after them are the primary's own, overtaken by this append);
        * the commit index rises to ``min(commit_index, the end of these entries)`` — never over
          a suffix this append did not match;
        * AHEAD, nothing undone, when the append shows that the primary's log lacks an entry
          this replica knows is committed — which no primary that is an in-sync member can: its
          log ends (``tail``) below the commit index, before an older primary's entry (the
          primary's own entries past a late append are not missing from its log); or its entry
          at a committed index (at or above the base, where the epoch is known) has another
          epoch (design/data-plane.md, "A primary that lacks committed entries").
        """
        with self._transaction():
            state = self._ensure(zone, partition)
            if state.loading_snapshot:
                return AppendResult.MISMATCH, replace(state, last_index=state.base_index)
            if epoch < state.seen_epoch:
                return AppendResult.STALE_EPOCH, state
            if epoch > state.seen_epoch:
                state = replace(state, seen_epoch=epoch)
                self._put_state(zone, partition, state)
            end = prev_index + len(entries)
            # The primary's log lacks an entry this replica knows is committed: it ends below
            # the commit index, before an older primary's entry (``AHEAD``, below).
            at_commit = replace(state, last_index=state.commit_index)
            if tail and end < state.commit_index:
                after = self.epoch_at(zone, partition, end + 1, state)
                if after is None and end + 1 < state.base_index:
                    after = state.base_epoch  # trimmed: epochs only grow along the log
                if after is not None and after < epoch:
                    return AppendResult.AHEAD, at_commit
            if prev_index > state.last_index:
                return AppendResult.MISMATCH, state
            mine = self.epoch_at(zone, partition, prev_index, state)
            if mine != prev_epoch:
                if mine is not None and prev_index <= state.commit_index:
                    return AppendResult.AHEAD, at_commit  # ... or differs at a committed entry
                return AppendResult.MISMATCH, at_commit
            todo = list(entries)
            while todo and todo[0].index <= state.last_index:
                mine = self.epoch_at(zone, partition, todo[0].index, state)
                if mine != todo[0].epoch:
                    if todo[0].index <= state.commit_index:
                        if mine is not None:
                            return AppendResult.AHEAD, at_commit
                        return AppendResult.MISMATCH, at_commit
                    state = self._undo_to(zone, partition, state, todo[0].index - 1)
                    break
                todo.pop(0)
            for entry in todo:
                if entry.index != state.last_index + 1:
                    return AppendResult.MISMATCH, state
                state, _ = self._append_one(zone, partition, state, entry)
            if tail and state.last_index > end:
                after = self.epoch_at(zone, partition, end + 1, state)
                if after is not None and after < epoch and end >= state.commit_index:
                    state = self._undo_to(zone, partition, state, end)
            commit = max(state.commit_index, min(commit_index, end))
            state = replace(state, commit_index=commit)
            self._put_state(zone, partition, state)
            return AppendResult.OK, state

    def learn(
        self,
        zone: str,
        partition: int,
        epoch: int,
        after_index: int,
        entries: Sequence[Entry],
        commit_index: int,
    ) -> tuple[AppendResult, DataState]:
        """A learner's handling of one ``Fetch`` answer of the primary of lease ``epoch``: the
        committed entries after ``after_index`` — the learner's own commit index when it asked,
        so the entry there is the primary's as well (an acknowledged entry is in every later
        primary's log at its index and epoch) — up to ``commit_index``, the primary's last entry
        when it answered. Applied by the one rule of :meth:`follow`: entries the log holds are
        skipped, from the first that differs the suffix is undone, and when they reach the
        primary's last entry a suffix after them from an older epoch is undone. Nothing the
        primary holds is ever undone, so a node that runs a learner while it is an in-sync
        member (its view of etcd lagging) keeps every acknowledged entry."""
        with self._transaction():
            state = self._ensure(zone, partition)
            prev_epoch = self.epoch_at(zone, partition, after_index, state)
            if prev_epoch is None:
                return AppendResult.MISMATCH, state
            tail = after_index + len(entries) >= commit_index
            return self.follow(
                zone, partition, epoch, after_index, prev_epoch, entries, commit_index, tail
            )

    def set_commit(self, zone: str, partition: int, commit_index: int) -> DataState:
        with self._transaction():
            state = self._ensure(zone, partition)
            commit = max(state.commit_index, min(commit_index, state.last_index))
            if commit != state.commit_index:
                state = replace(state, commit_index=commit)
                self._put_state(zone, partition, state)
            return state

    def begin_snapshot(
        self, zone: str, partition: int, index: int, epoch: int, expect: DataState | None = None
    ) -> DataState:
        """Start loading a snapshot taken at log ``index``/``epoch``: drop the data and the log;
        the log now starts after ``index``. With ``expect``, only if the replica's state is still
        exactly that (else ValueError): a learner never wipes a replica that a primary has
        fenced or appended to meanwhile (it is in the in-sync set by then)."""
        with self._transaction():
            current = self._ensure(zone, partition)
            if expect is not None and current != expect:
                raise ValueError(
                    f"{zone}/{partition} changed under its learner ({expect} -> {current});"
                    " it is in the in-sync set now, no snapshot"
                )
            seen = current.seen_epoch
            self._drop_data(zone, partition)
            state = DataState(seen, index, epoch, index, epoch, index, b"")
            self._put_state(zone, partition, state)
            return state

    def load_page(
        self, zone: str, partition: int, items: Sequence[tuple[bytes, bytes]], done: bool
    ) -> DataState:
        """Write one snapshot page; ``done`` ends the snapshot."""
        with self._transaction():
            state = self._ensure(zone, partition)
            if state.snap_after is None:
                raise ValueError("no snapshot is being loaded")
            self._conn.executemany(
                "INSERT OR REPLACE INTO kv (zone, partition, key, value) VALUES (?,?,?,?)",
                [(zone, partition, k, v) for k, v in items],
            )
            after = items[-1][0] if items else state.snap_after
            state = replace(state, snap_after=None if done else after)
            self._put_state(zone, partition, state)
            return state

    def trim(self, zone: str, partition: int, keep: int) -> DataState:
        """Forget log entries older than the newest ``keep`` (only committed ones)."""
        with self._transaction():
            state = self._ensure(zone, partition)
            upto = min(state.commit_index, state.last_index - keep)
            if upto <= state.base_index:
                return state
            epoch = self.epoch_at(zone, partition, upto, state)
            self._conn.execute(
                "DELETE FROM rlog WHERE zone = ? AND partition = ? AND idx <= ?",
                (zone, partition, upto),
            )
            state = replace(state, base_index=upto, base_epoch=epoch or 0)
            self._put_state(zone, partition, state)
            return state

    def drop(self, zone: str, partition: int) -> None:
        """Delete the replica's data, log and state (inside the caller's transaction)."""
        self._drop_data(zone, partition)
        self._conn.execute("DELETE FROM dstate WHERE zone = ? AND partition = ?", (zone, partition))

    # -- internals -----------------------------------------------------------------------------

    def _drop_data(self, zone: str, partition: int) -> None:
        for table in ("kv", "rlog"):
            self._conn.execute(
                f"DELETE FROM {table} WHERE zone = ? AND partition = ?", (zone, partition)
            )

    def _ensure(self, zone: str, partition: int) -> DataState:
        state = self.state(zone, partition)
        if state is None:
            state = DataState()
            self._put_state(zone, partition, state)
        return state

    def _put_state(self, zone: str, partition: int, s: DataState) -> None:
        self._conn.execute(
            f"INSERT OR REPLACE INTO dstate (zone, partition, {_STATE_COLUMNS})"
            " VALUES (?,?,?,?,?,?,?,?,?)",
            (
                zone,
                partition,
                s.seen_epoch,
                s.base_index,
                s.base_epoch,
                s.last_index,
                s.last_epoch,
                s.commit_index,
                s.snap_after,
            ),
        )

    def _append_one(
        self, zone: str, partition: int, state: DataState, entry: Entry
    ) -> tuple[DataState, bool]:
        """Log and apply one entry; also whether its key held a value before."""
        prev = self.get(zone, partition, entry.key)
        self._conn.execute(
            "INSERT INTO rlog (zone, partition, idx, epoch, key, value, del, prev)"
            " VALUES (?,?,?,?,?,?,?,?)",
            (
                zone,
                partition,
                entry.index,
                entry.epoch,
                entry.key,
                entry.value,
                int(entry.delete),
                prev,
            ),
        )
        self._apply(zone, partition, entry.key, None if entry.delete else entry.value)
        return replace(state, last_index=entry.index, last_epoch=entry.epoch), prev is not None

    def _apply(self, zone: str, partition: int, key: bytes, value: bytes | None) -> None:
        if value is None:
            self._conn.execute(
                "DELETE FROM kv WHERE zone = ? AND partition = ? AND key = ?",
                (zone, partition, key),
            )
        else:
            self._conn.execute(
                "INSERT OR REPLACE INTO kv (zone, partition, key, value) VALUES (?,?,?,?)",
                (zone, partition, key, value),
            )

    def _undo_to(self, zone: str, partition: int, state: DataState, index: int) -> DataState:
        """Undo entries above ``index``, newest first (each restores the value it replaced)."""
        index = max(index, state.base_index)
        if state.last_index <= index:
            return state
        rows = self._conn.execute(
            "SELECT idx, key, prev FROM rlog WHERE zone = ? AND partition = ? AND idx > ?"
            " ORDER BY idx DESC",
            (zone, partition, index),
        ).fetchall()
        for _, key, prev in rows:
            self._apply(zone, partition, bytes(key), None if prev is None else bytes(prev))
        self._conn.execute(
            "DELETE FROM rlog WHERE zone = ? AND partition = ? AND idx > ?",
            (zone, partition, index),
        )
        epoch = self.epoch_at(zone, partition, index, replace(state, last_index=index))
        return replace(
            state,
            last_index=index,
            last_epoch=epoch or 0,
            commit_index=min(state.commit_index, index),
        )

    def _transaction(self) -> AbstractContextManager[None]:
        return transaction(self._conn)


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction on ``conn`` (autocommit mode): committed on exit, rolled back on
    any exception. Shared by the agent's stores (``replica.records`` too).

    Inside an open transaction (a group commit, :meth:`replica.records.StoreThread.group`) it is
    a savepoint instead: an exception undoes only this part, and the whole group becomes durable
    with the outer ``COMMIT`` (one fsync for every part)."""
    if conn.in_transaction:
        conn.execute("SAVEPOINT part")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK TO part")
            conn.execute("RELEASE part")
            raise
        conn.execute("RELEASE part")
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _state(row: Sequence[Any]) -> DataState:
    seen, base, base_epoch, last, last_epoch, commit, snap = row
    return DataState(
        int(seen),
        int(base),
        int(base_epoch),
        int(last),
        int(last_epoch),
        int(commit),
        None if snap is None else bytes(snap),
    )


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no bound)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return None
