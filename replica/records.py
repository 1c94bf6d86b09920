"""Durable per-agent state: one sqlite3 database ``agent.db`` in the agent's data directory.

Synchronous on purpose: the async layer runs every call on one thread, in submission order.
Durability: ``journal_mode=WAL`` with ``synchronous=FULL`` fsyncs the WAL on every commit, so a
decision whose ``commit`` returned survives SIGKILL and power loss. Each decision is one
transaction: the partition record, the replica's existence and the effect journal change together.

Invariant enforced inside every ``commit``: ``record.hosted`` ⇔ a *complete* replica row exists.
A *partial* replica row (``complete = 0``) exists only while a catch-up for the partition is
unfinished; it is created by the catch-up (``begin_replica``) and dropped by ``DiscardReplica``.

Tables: ``meta`` (node name), ``partitions`` (one ``PartitionRecord`` each), ``replicas`` (the
replica records; their contents live in ``replica.data.storage``'s tables), ``journal`` (every
effect ever decided, append-only, for inspection and tests).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from placement.core.model import Peers
from placement.errors import PlacementError
from replica.data.storage import DataStore, transaction
from replica.protocol import (
    CreateReplica,
    DiscardReplica,
    Effect,
    Move,
    PartitionRecord,
    Phase,
)

DB_NAME = "agent.db"
LOCK_NAME = "agent.lock"
SCHEMA_VERSION = 1

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS partitions (
    zone TEXT NOT NULL,
    partition INTEGER NOT NULL,
    accepted_revision INTEGER NOT NULL,
    accepted_epoch INTEGER NOT NULL,
    cancelled_revision INTEGER NOT NULL,
    config TEXT NOT NULL,
    move_old TEXT,
    move_new TEXT,
    move_revision INTEGER,
    move_phase TEXT,
    hosted INTEGER NOT NULL,
    PRIMARY KEY (zone, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS replicas (
    zone TEXT NOT NULL,
    partition INTEGER NOT NULL,
    complete INTEGER NOT NULL,
    PRIMARY KEY (zone, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS journal (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    zone TEXT NOT NULL,
    partition INTEGER NOT NULL,
    revision INTEGER NOT NULL,
    effect TEXT NOT NULL
);
"""

_COLUMNS = (
    "zone, partition, accepted_revision, accepted_epoch, cancelled_revision, config,"
    " move_old, move_new, move_revision, move_phase, hosted"
)


class AgentStoreError(PlacementError):
    """The agent's database could not be read or written; ``path`` names it."""

    def __init__(self, path: Path, problem: str) -> None:
        self.path = path
        super().__init__(f"agent store {path}: {problem}")


class CorruptAgentStore(AgentStoreError):
    """The database is not a readable agent store (corrupt, foreign or a newer schema)."""


class DataDirInUse(AgentStoreError):
    """Another agent process holds this data directory."""


class NotHosted(PlacementError):
    """The replica was retired or discarded (or never created) here."""


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    zone: str
    partition: int
    complete: bool


@dataclass(frozen=True, slots=True)
class JournalEntry:
    seq: int
    zone: str
    partition: int
    revision: int
    effect: str


class AgentStore:
    """The agent's durable state. Not thread-safe: call from one thread at a time."""

    def __init__(self, path: Path, conn: sqlite3.Connection, lock_fd: int | None) -> None:
        self.path = path
        self._conn = conn
        self._lock_fd = lock_fd
        #: The replicas' data (key-values, replication log), on the same connection.
        self.data = DataStore(conn)

    @classmethod
    def open(cls, data_dir: Path, node: str) -> AgentStore:
        """Lock ``data_dir`` for this process, open (or create) its database for ``node``.

        Raises ``DataDirInUse`` if another live agent holds it (the lock dies with its process,
        so a SIGKILLed agent does not block its restart) and ``CorruptAgentStore`` if the database
        is unreadable or belongs to another node.
        """
        path = data_dir / DB_NAME
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            lock_fd = os.open(data_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise AgentStoreError(path, f"cannot use the data directory: {e}") from e
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(lock_fd)
            raise DataDirInUse(path, "another agent uses this data directory") from e
        try:
            conn = _connect(path, readonly=False)
            store = cls(path, conn, lock_fd)
            store._init_schema(node)
        except BaseException:
            os.close(lock_fd)
            raise
        return store

    @classmethod
    def inspect(cls, data_dir: Path) -> AgentStore:
        """Open read-only, without the lock, beside a running agent (WAL allows it)."""
        path = data_dir / DB_NAME
        if not path.exists():
            raise AgentStoreError(path, "does not exist")
        store = cls(path, _connect(path, readonly=True), None)
        with store._errors():
            store._check_version(store._conn.execute("PRAGMA user_version").fetchone()[0])
        return store

    def close(self) -> None:
        self._conn.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def load(self, zone: str, partition: int) -> PartitionRecord | None:
        with self._errors():
            row = self._conn.execute(
                f"SELECT {_COLUMNS} FROM partitions WHERE zone = ? AND partition = ?",
                (zone, partition),
            ).fetchone()
            return None if row is None else self._decode(row)

    def records(self) -> list[PartitionRecord]:
        with self._errors():
            rows = self._conn.execute(
                f"SELECT {_COLUMNS} FROM partitions ORDER BY zone, partition"
            ).fetchall()
            return [self._decode(row) for row in rows]

    def commit(self, record: PartitionRecord, effects: Iterable[Effect]) -> None:
        """Persist one decision atomically: the record, its replica effects and the journal."""
        effects = tuple(effects)
        with self._errors(), self._transaction():
            self._conn.execute(
                f"INSERT OR REPLACE INTO partitions ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                _encode(record),
            )
            key = (record.zone, record.partition)
            for effect in effects:
                if isinstance(effect, CreateReplica):
                    self._conn.execute(
                        "INSERT INTO replicas (zone, partition, complete) VALUES (?, ?, 1)"
                        " ON CONFLICT (zone, partition) DO UPDATE SET complete = 1",
                        key,
                    )
                elif isinstance(effect, DiscardReplica):
                    self._conn.execute("DELETE FROM replicas WHERE zone = ? AND partition = ?", key)
                    self.data.drop(*key)
                self._conn.execute(
                    "INSERT INTO journal (zone, partition, revision, effect) VALUES (?, ?, ?, ?)",
                    (*key, record.accepted_revision, type(effect).__name__),
                )
            complete = self._replica(*key)
            if record.hosted != (complete is not None and complete.complete):
                raise AssertionError(
                    f"{key}: hosted={record.hosted} but replica row is {complete}; rolled back"
                )

    def begin_replica(self, zone: str, partition: int) -> None:
        """Create a partial replica record (idempotent): where a catch-up writes its copy."""
        with self._errors(), self._transaction():
            self._conn.execute(
                "INSERT OR IGNORE INTO replicas (zone, partition, complete) VALUES (?, ?, 0)",
                (zone, partition),
            )

    def replica(self, zone: str, partition: int) -> ReplicaRow | None:
        with self._errors():
            return self._replica(zone, partition)

    def hosted(self, fn: Callable[..., T], zone: str, partition: int, *args: object) -> T:
        """``fn(zone, partition, *args)`` only while the replica record exists (NotHosted
        otherwise): no follower, learner or primary writes into (or recreates the data state
        of) a replica retired or discarded under it. A part of the caller's transaction."""
        if self.replica(zone, partition) is None:
            raise NotHosted(f"{zone}/{partition} is no longer hosted here")
        return fn(zone, partition, *args)

    def replicas(self) -> list[ReplicaRow]:
        """Every replica record (complete or partial), in (zone, partition) order."""
        with self._errors():
            rows = self._conn.execute(
                "SELECT zone, partition, complete FROM replicas ORDER BY zone, partition"
            ).fetchall()
            return [ReplicaRow(str(z), int(p), bool(c)) for z, p, c in rows]

    def journal(self, zone: str, partition: int) -> list[JournalEntry]:
        with self._errors():
            rows = self._conn.execute(
                "SELECT seq, zone, partition, revision, effect FROM journal"
                " WHERE zone = ? AND partition = ? ORDER BY seq",
                (zone, partition),
            ).fetchall()
            return [JournalEntry(*row) for row in rows]

    def _replica(self, zone: str, partition: int) -> ReplicaRow | None:
        row = self._conn.execute(
            "SELECT complete FROM replicas WHERE zone = ? AND partition = ?", (zone, partition)
        ).fetchone()
        return None if row is None else ReplicaRow(zone, partition, bool(row[0]))

    def _init_schema(self, node: str) -> None:
        with self._errors():
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = FULL")
            self._conn.execute("PRAGMA cache_size = -65536")
            self._conn.execute("PRAGMA mmap_size = 1073741824")
            self._conn.execute("PRAGMA secure_delete = FAST")
            check = self._conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise CorruptAgentStore(self.path, f"integrity check failed: {check}")
            with self._transaction():
                version = self._conn.execute("PRAGMA user_version").fetchone()[0]
                self._check_version(version)
                if version == 0:
                    for statement in _SCHEMA.split(";"):
                        if statement.strip():
                            self._conn.execute(statement)
                    self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                    self._conn.execute("INSERT INTO meta (key, value) VALUES ('node', ?)", (node,))
                self.data.create_schema()
                owner = self._conn.execute("SELECT value FROM meta WHERE key = 'node'").fetchone()
            if owner is None or owner[0] != node:
                found = None if owner is None else owner[0]
                raise CorruptAgentStore(
                    self.path, f"belongs to node {found!r}, not {node!r}; use that node's name"
                )

    def _check_version(self, version: int) -> None:
        if version not in (0, SCHEMA_VERSION):
            raise CorruptAgentStore(self.path, f"schema version {version} is not {SCHEMA_VERSION}")

    def _transaction(self) -> AbstractContextManager[None]:
        return transaction(self._conn)

    def group_transaction(self) -> AbstractContextManager[None]:
        """A transaction (a savepoint inside one) for :meth:`StoreThread.group`."""
        return transaction(self._conn)

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Translate sqlite errors at the store's edge: corruption vs. an I/O failure."""
        try:
            yield
        except (sqlite3.DatabaseError, ValueError, KeyError, TypeError) as e:
            if isinstance(e, sqlite3.OperationalError) and not _looks_corrupt(e):
                raise AgentStoreError(self.path, str(e)) from e
            raise CorruptAgentStore(self.path, f"unreadable: {e}") from e

    def _decode(self, row: tuple[object, ...]) -> PartitionRecord:
        (zone, partition, acc_r, acc_e, can_r, config, m_old, m_new, m_rev, m_phase, hosted) = row
        move = None
        if m_phase is not None:
            move = Move(_peers(m_old), _peers(m_new), _int(m_rev), Phase(m_phase))
        return PartitionRecord(
            zone=str(zone),
            partition=_int(partition),
            accepted_revision=_int(acc_r),
            accepted_epoch=_int(acc_e),
            cancelled_revision=_int(can_r),
            config=_peers(config),
            move=move,
            hosted=bool(hosted),
        )


def _connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    uri = f"file:{path}?mode=ro" if readonly else f"file:{path}?mode=rwc"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 5000")
    except sqlite3.DatabaseError as e:
        raise CorruptAgentStore(path, f"cannot open: {e}") from e
    return conn


def _looks_corrupt(e: sqlite3.Error) -> bool:
    text = str(e).lower()
    return "not a database" in text or "malformed" in text or "corrupt" in text


def _encode(record: PartitionRecord) -> tuple[object, ...]:
    move = record.move
    return (
        record.zone,
        record.partition,
        record.accepted_revision,
        record.accepted_epoch,
        record.cancelled_revision,
        json.dumps(list(record.config)),
        None if move is None else json.dumps(list(move.old)),
        None if move is None else json.dumps(list(move.new)),
        None if move is None else move.revision,
        None if move is None else move.phase.value,
        int(record.hosted),
    )


def _peers(value: object) -> Peers:
    peers = json.loads(str(value))
    if not isinstance(peers, list) or not all(isinstance(p, str) for p in peers):
        raise ValueError(f"peers {value!r} is not a list of names")
    return tuple(peers)


def _int(value: object) -> int:
    if not isinstance(value, int):
        raise TypeError(f"{value!r} is not an integer")
    return value


@dataclass(slots=True)
class _Part:
    """One call of a group commit and where its outcome goes."""

    fn: Callable[..., object]
    args: tuple[object, ...]
    future: asyncio.Future[object]
    #: The event loop of the caller (every part of an agent's groups comes from its one loop).
    loop: asyncio.AbstractEventLoop


class StoreThread:
    """The one thread that runs every ``AgentStore`` call, first submitted first executed.

    :meth:`group` is the agent's **group commit** (design/data-plane.md, "Group commit"): calls
    submitted in the same event-loop round, or while the thread is busy, run together in one
    transaction — each in its own savepoint — so every partition's appends of one moment cost
    one fsync, not one each.
    """

    def __init__(self, store: AgentStore, executor: ThreadPoolExecutor | None = None) -> None:
        """``executor``: a one-worker executor shared with other stores (the fleet simulator's
        nodes of one process share one, so that hundreds of stores are not hundreds of threads
        contending for one interpreter lock); it stays open when this store closes. None: a
        thread of its own."""
        self.store = store
        self._owns_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="agent-store"
        )
        self._parts: list[_Part] = []
        self._parts_lock = threading.Lock()
        self._group_queued = False
        #: Group transactions run and the calls they carried (for benchmarks and tests).
        self.groups = 0
        self.grouped = 0

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def group(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` inside the next group transaction; returns once that transaction is
        durable (committed with ``synchronous=FULL``). An exception of ``fn`` undoes only its own
        part and is raised here; a failed commit fails every part of the group."""
        (future,) = self._enqueue(fn, [args])
        return await future  # type: ignore[return-value]

    async def group_each(
        self, fn: Callable[..., T], calls: Sequence[tuple[object, ...]]
    ) -> list[T | Exception]:
        """``fn(*args)`` for every ``args`` of ``calls``, all in the same group transaction;
        each result, or the exception of its part."""
        futures = self._enqueue(fn, calls)
        return await asyncio.gather(*futures, return_exceptions=True)  # type: ignore[return-value]

    def _enqueue(
        self, fn: Callable[..., object], calls: Sequence[tuple[object, ...]]
    ) -> list[asyncio.Future[object]]:
        loop = asyncio.get_running_loop()
        parts = [_Part(fn, args, loop.create_future(), loop) for args in calls]
        if not parts:
            return []
        with self._parts_lock:
            self._parts.extend(parts)
            start = not self._group_queued
            self._group_queued = True
        if start:
            # Corked until the callbacks of this event-loop round have run: every part submitted
            # in the round (each primary a write woke, say) joins the same group.
            loop.call_soon(self._start_group)
        return [part.future for part in parts]

    def _start_group(self) -> None:
        try:
            self._executor.submit(self._run_group)
        except RuntimeError as e:  # shut down meanwhile: nothing runs any more
            with self._parts_lock:
                parts, self._parts = self._parts, []
                self._group_queued = False
            _settle_all(parts, [(False, e)] * len(parts))

    def _run_group(self) -> None:
        with self._parts_lock:
            parts, self._parts = self._parts, []
            self._group_queued = False
        outcomes: list[tuple[bool, object]] = []
        try:
            with self.store.group_transaction():
                for part in parts:
                    try:
                        with self.store.group_transaction():  # a savepoint per part
                            outcomes.append((True, part.fn(*part.args)))
                    except Exception as e:  # handed to the part's caller
                        outcomes.append((False, e))
        except BaseException as e:  # the commit failed: nothing of the group is durable
            outcomes = [(False, e)] * len(parts)
        self.groups += 1
        self.grouped += len(parts)
        if parts:  # one wake-up of the event loop for the whole group
            parts[0].loop.call_soon_threadsafe(_settle_all, parts, outcomes)

    async def close(self) -> None:
        await self.call(self.store.close)
        if self._owns_executor:
            self._executor.shutdown(wait=True)


def _settle_all(parts: list[_Part], outcomes: list[tuple[bool, object]]) -> None:
    for part, (ok, value) in zip(parts, outcomes, strict=True):
        if part.future.done():  # its caller gave up waiting
            continue
        if ok:
            part.future.set_result(value)
        else:
            assert isinstance(value, BaseException)
            part.future.set_exception(value)
