"""Our etcd client: the only module of the project that imports ``aetcd``.

We use aetcd 1.0.0 for what it does well — etcd's generated v3 protocol (``aetcd.rpc``: the
``KV``/``Lease``/``Watch`` stubs and request messages, and its re-export of ``grpc.aio``) — and own
here everything its ``Client`` lacks (see ``design/metastore.md``):

* **channels**: one ``grpc.aio`` channel per endpoint with keepalive *and*
  ``grpc.http2.ping_timeout_ms`` (a frozen peer is noticed in ~15 s), a capped reconnect backoff,
  and a **call timeout on every unary call** (gRPC's default waits forever);
* **several endpoints**: calls go to the active endpoint; ``UNAVAILABLE`` moves the client to the
  next one. Read-only calls are retried on the next endpoint at once; writes are not (their outcome
  is unknown), they raise :class:`StoreUnavailable` and the caller re-reads;
* **reads at a revision, with the revision**: every read returns the revision it reflects
  (:class:`Range`), may pin an older one, and :meth:`EtcdClient.list_prefix` paginates a prefix at
  one pinned revision;
* **transactions from our own typed values** (:class:`Compare`, :class:`Put`, :class:`Delete`,
  :class:`Get`, nested :class:`Txn`): no aetcd or protobuf type leaks out;
* **leases kept alive on a thread of their own** (:class:`Lease`, :class:`KeepAliveThread`: its
  own event loop and its own connection), so a busy or blocked caller's loop cannot starve them,
  with loss observable on the caller's loop;
* **watches on the raw bidi stream** (:class:`Watch`) with ``hasleader: true`` metadata (a member
  without quorum fails the watch instead of going silent), resumed after a broken stream from
  ``last seen revision + 1``, raising :class:`Compacted` when the start revision is compacted and
  :class:`StoreUnavailable` when etcd cancels the watch for any other reason.

Every gRPC error is translated in one table, :data:`_BY_STATUS`, into the project's errors. A write
that raised :class:`StoreUnavailable` (unavailable or timed out) has an **unknown outcome**: it may
have been applied. Callers must re-read before retrying a compare-and-swap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from aetcd import rpc

from placement.aio import ByteBudget, cancel_and_wait
from placement.core.closing import AsyncClosing
from placement.core.retry import Backoff, RetryPolicy, Rng, Sleep
from placement.errors import (
    Compacted,
    CredentialError,
    InvalidInput,
    PlacementError,
    StoreFull,
    StoreUnavailable,
)
from placement.metastore.keys import prefix_range_end
from placement.metastore.kv import (
    Alarm,
    DeleteResult,
    EventKind,
    KeyValue,
    OpResult,
    PutResult,
    Range,
    TxnResult,
    WatchBatch,
    WatchEvent,
)
from placement.metastore.txn import (
    MAX_REQUEST_BYTES,
    MAX_TXN_OPS,
    Compare,
    CompareTarget,
    Delete,
    Get,
    Op,
    Put,
    Txn,
    checked_operand,
)
from placement.metrics import ETCD_TXN_SECONDS
from placement.rpc import ChannelProfile, channel
from placement.security.credentials import (
    ETCD_TLS_OPTIONS,
    EtcdCredentials,
    handshake_refused,
)
from placement.security.probe import Prober

log = logging.getLogger(__name__)

#: etcd's channels. etcd rejects client pings more often than every 5 s
#: (``--grpc-keepalive-min-time``), so keepalive runs every 10 s, and only while a call is open
#: (etcd's default enforcement does not permit pings without streams); a request may be as large
#: as etcd accepts, plus framing.
ETCD_PROFILE = ChannelProfile(
    keepalive_ms=10_000,
    ping_timeout_ms=5_000,
    extra=(
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_send_message_length", MAX_REQUEST_BYTES + 1024 * 1024),
    ),
)

#: Backoff between reconnects of keep-alives and watches (and the election's and list-watch's
#: retries): 50 ms doubling to 1 s, each delay drawn from its upper half.
RECONNECT_POLICY = RetryPolicy(initial=0.05, cap=1.0, floor=0.5)


class LeaseExpired(PlacementError):
    """The lease named in a request does not exist (expired or revoked)."""


# -- error translation: the one table ----------------------------------------------------------


def _unavailable(details: str, what: str, revision: int) -> PlacementError:
    if handshake_refused(details):
        return CredentialError(
            f"{what}: the TLS handshake with etcd failed ({details}); check --etcd-cacert "
            "(the CA that signed etcd's certificate), --etcd-cert and --etcd-key, and that "
            "etcd serves TLS"
        )
    return StoreUnavailable(
        f"{what}: etcd unavailable ({details}); the outcome of a write is unknown"
    )


def _timed_out(details: str, what: str, revision: int) -> PlacementError:
    return StoreUnavailable(
        f"{what}: no answer in time ({details}); a write may or may not have been applied, "
        "re-read before retrying"
    )


def _out_of_range(details: str, what: str, revision: int) -> PlacementError:
    if "compacted" in details:
        # etcd does not say up to where for a Range; revision + 1 is a lower bound.
        return Compacted(revision + 1)
    return InvalidInput("revision", f"{what}: {details}", "read at or below the current revision")


def _invalid(details: str, what: str, revision: int) -> PlacementError:
    if "user name is empty" in details:
        return CredentialError(
            f"{what}: etcd has auth on and this client named no user ({details}); pass "
            "--etcd-user with a password, or a client certificate (--etcd-cert) naming one"
        )
    if "authentication failed" in details:
        return CredentialError(
            f"{what}: etcd refused the user name or password ({details}); check --etcd-user "
            "and the password (--etcd-password-file or the environment)"
        )
    return InvalidInput(
        "request",
        f"{what}: {details}",
        f"at most {MAX_TXN_OPS} ops per branch, {MAX_REQUEST_BYTES} bytes per request, "
        "no key twice in one branch",
    )


def _not_found(details: str, what: str, revision: int) -> PlacementError:
    if "lease" in details:
        return LeaseExpired(f"{what}: {details}")
    return StoreUnavailable(f"{what}: {details}")


#: What etcd says when its space quota is exhausted (the NOSPACE alarm is raised).
SPACE_EXCEEDED = "database space exceeded"

#: What an operator does about the NOSPACE alarm (design/deployment.md, "etcd out of space").
NOSPACE_FIX = (
    "free space: delete what is not needed, compact the history (etcdctl compact), defragment "
    "every member (etcdctl defrag, as root) and disarm the alarm (etcdctl alarm disarm), or "
    "raise --quota-backend-bytes"
)


def _no_space(details: str, what: str, revision: int) -> PlacementError:
    if SPACE_EXCEEDED in details:
        return StoreFull(
            f"{what}: etcd refuses writes, its NOSPACE alarm is raised ({details}); {NOSPACE_FIX}"
        )
    return StoreUnavailable(f"{what}: etcd refuses the request for now ({details})")


def _refused(details: str, what: str, revision: int) -> PlacementError:
    return CredentialError(
        f"{what}: etcd refused the request ({details}); the etcd user (--etcd-user, or the "
        "common name of --etcd-cert) needs read-write access to the key prefix, and etcd "
        "needs credentials when its auth is on"
    )


_Translator: TypeAlias = Callable[[str, str, int], PlacementError]

#: gRPC status -> our error. Anything not listed is StoreUnavailable (outcome unknown).
_BY_STATUS: dict[Any, _Translator] = {
    rpc.StatusCode.UNAVAILABLE: _unavailable,  # down, no leader, leader changed, conn reset
    rpc.StatusCode.DEADLINE_EXCEEDED: _timed_out,  # our call timeout, or etcd's request timeout
    rpc.StatusCode.CANCELLED: _unavailable,  # channel closed under the call
    rpc.StatusCode.OUT_OF_RANGE: _out_of_range,  # compacted / future revision
    rpc.StatusCode.INVALID_ARGUMENT: _invalid,  # too many ops, too large, duplicate key
    rpc.StatusCode.NOT_FOUND: _not_found,  # lease not found
    rpc.StatusCode.RESOURCE_EXHAUSTED: _no_space,  # NOSPACE alarm, too many requests
    rpc.StatusCode.UNAUTHENTICATED: _refused,
    rpc.StatusCode.PERMISSION_DENIED: _refused,
}


def translate(error: BaseException, what: str, *, revision: int = 0) -> PlacementError:
    """Our error for ``error`` raised by gRPC or by a timeout while doing ``what``."""
    if isinstance(error, PlacementError):
        return error
    if isinstance(error, rpc.AioRpcError):
        details = error.details() or ""
        return _BY_STATUS.get(error.code(), _unavailable)(details, what, revision)
    if isinstance(error, TimeoutError):
        return _timed_out("client-side timeout", what, revision)
    return StoreUnavailable(f"{what}: {type(error).__name__}: {error}")


#: What etcd says when a token is no longer good: it expired or was lost ("invalid auth
#: token"), or the users and roles changed since it was issued ("revision of auth store is
#: old"). Either way: authenticate again.
_STALE_TOKEN = ("invalid auth token", "auth store is old")


def _token_refused(error: BaseException | str) -> bool:
    """Whether ``error`` (or a watch's cancel reason) says the token is no longer good."""
    if isinstance(error, str):
        return any(text in error for text in _STALE_TOKEN)
    return isinstance(error, rpc.AioRpcError) and any(
        text in (error.details() or "") for text in _STALE_TOKEN
    )


#: What a broken keep-alive or watch stream raises. ``InvalidStateError``: a write to a stream
#: the server already ended (a killed member closes it between two keep-alives).
_STREAM_ERRORS: tuple[type[BaseException], ...] = (
    rpc.AioRpcError,
    rpc.BaseError,
    TimeoutError,
    ConnectionError,
    asyncio.InvalidStateError,
)


def _is_unavailable(error: BaseException) -> bool:
    return isinstance(error, rpc.AioRpcError) and error.code() in (
        rpc.StatusCode.UNAVAILABLE,
        rpc.StatusCode.DEADLINE_EXCEEDED,
        rpc.StatusCode.CANCELLED,
    )


# -- protobuf conversion (private) -------------------------------------------------------------

_CMP_RESULT = {
    "==": rpc.Compare.EQUAL,
    "!=": rpc.Compare.NOT_EQUAL,
    "<": rpc.Compare.LESS,
    ">": rpc.Compare.GREATER,
}


def _ranged(msg: Any, range_end: bytes | None) -> Any:
    """``msg`` with its ``range_end`` set when there is one (none: the one key)."""
    if range_end is not None:
        msg.range_end = range_end
    return msg


def _compare_pb(c: Compare) -> Any:
    msg = _ranged(rpc.Compare(key=c.key, result=_CMP_RESULT[c.op]), c.range_end)
    operand = checked_operand(c)
    if isinstance(operand, bytes):
        msg.target = rpc.Compare.VALUE
        msg.value = operand
        return msg
    if c.target is CompareTarget.VERSION:
        msg.target = rpc.Compare.VERSION
        msg.version = operand
    elif c.target is CompareTarget.CREATE:
        msg.target = rpc.Compare.CREATE
        msg.create_revision = operand
    elif c.target is CompareTarget.MOD:
        msg.target = rpc.Compare.MOD
        msg.mod_revision = operand
    else:
        msg.target = rpc.Compare.LEASE
        msg.lease = operand
    return msg


_SORT_TARGETS = {
    "key": rpc.RangeRequest.KEY,
    "create": rpc.RangeRequest.CREATE,
    "mod": rpc.RangeRequest.MOD,
}


def _op_pb(op: Op) -> Any:
    if isinstance(op, Put):
        return rpc.RequestOp(
            request_put=rpc.PutRequest(
                key=op.key, value=op.value, lease=op.lease, prev_kv=op.prev_kv
            )
        )
    if isinstance(op, Delete):
        req = rpc.DeleteRangeRequest(key=op.key, prev_kv=op.prev_kv)
        return rpc.RequestOp(request_delete_range=_ranged(req, op.range_end))
    if isinstance(op, Get):
        get = rpc.RangeRequest(key=op.key, limit=op.limit, keys_only=op.keys_only)
        return rpc.RequestOp(request_range=_ranged(get, op.range_end))
    return rpc.RequestOp(request_txn=_txn_pb(op))


def _txn_pb(txn: Txn) -> Any:
    return rpc.TxnRequest(
        compare=[_compare_pb(c) for c in txn.compares],
        success=[_op_pb(op) for op in txn.success],
        failure=[_op_pb(op) for op in txn.failure],
    )


def _kv(msg: Any) -> KeyValue:
    return KeyValue(
        key=bytes(msg.key),
        value=bytes(msg.value),
        create_revision=int(msg.create_revision),
        mod_revision=int(msg.mod_revision),
        version=int(msg.version),
        lease=int(msg.lease),
    )


def _range_result(msg: Any, revision: int = 0) -> Range:
    return Range(
        kvs=tuple(_kv(kv) for kv in msg.kvs),
        revision=revision or int(msg.header.revision),
        more=bool(msg.more),
        count=int(msg.count),
    )


def _txn_result(msg: Any) -> TxnResult:
    return TxnResult(
        succeeded=bool(msg.succeeded),
        revision=int(msg.header.revision),
        responses=tuple(_response_op(r) for r in msg.responses),
    )


def _response_op(msg: Any) -> OpResult:
    which = msg.WhichOneof("response")
    if which == "response_range":
        return _range_result(msg.response_range)
    if which == "response_put":
        put = msg.response_put
        return PutResult(
            int(put.header.revision), _kv(put.prev_kv) if put.HasField("prev_kv") else None
        )
    if which == "response_delete_range":
        d = msg.response_delete_range
        return DeleteResult(
            int(d.header.revision), int(d.deleted), tuple(_kv(kv) for kv in d.prev_kvs)
        )
    return _txn_result(msg.response_txn)


def _is_read_only(txn: Txn) -> bool:
    return all(
        isinstance(op, Get) or (isinstance(op, Txn) and _is_read_only(op))
        for op in (*txn.success, *txn.failure)
    )


# -- the client --------------------------------------------------------------------------------


def _parse_endpoint(endpoint: str) -> str:
    target = endpoint.strip()
    for scheme in ("http://", "https://", "dns:///"):
        if target.startswith(scheme):
            target = target[len(scheme) :]
    target = target.rstrip("/")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput("endpoints", f"{endpoint!r} is not host:port", "e.g. 127.0.0.1:2379")
    return target


class _Endpoint:
    """One channel and its stubs."""

    def __init__(self, target: str, credentials: EtcdCredentials) -> None:
        self.target = target
        self.channel: Any = channel(target, ETCD_PROFILE, credentials.tls)
        self.kv: Any = rpc.KVStub(self.channel)
        self.lease: Any = rpc.LeaseStub(self.channel)
        self.watch: Any = rpc.WatchStub(self.channel)
        self.auth: Any = rpc.AuthStub(self.channel)
        self.maintenance: Any = rpc.MaintenanceStub(self.channel)


class EtcdClient(AsyncClosing):
    """An asyncio etcd v3 client over one or several endpoints (one cluster).

    Use as ``async with EtcdClient(["127.0.0.1:2379"]) as client: ...`` or call :meth:`close`.
    Channels are opened lazily on first use, inside the running loop. Every unary call carries
    ``call_timeout``; watches resume for up to ``watch_resume_window`` seconds of outage.

    ``credentials``: TLS with a client certificate, and/or a user and password — exchanged for
    a token on first use, sent with every call and stream, and exchanged again when etcd no
    longer knows it. A refused credential raises :class:`CredentialError` (never retried).
    """

    def __init__(
        self,
        endpoints: Sequence[str] | str,
        *,
        call_timeout: float = 5.0,
        watch_resume_window: float = 30.0,
        sleep: Sleep = asyncio.sleep,
        rng: Rng = random.random,
        credentials: EtcdCredentials | None = None,
        write_window: int | None = None,
    ) -> None:
        """``write_window``: at most this many operations (compares and ops) of write
        transactions in flight at once, first come first served (None: no bound). etcd applies
        writes one after another and a lease renewal waits for every committed write to be
        applied (at most 1 s, then it fails): a writer that queues many large transactions at
        once expires every lease on the cluster, its own included (design/deployment.md, "etcd
        under write bursts")."""
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        if not endpoints:
            raise InvalidInput("endpoints", "no etcd endpoint given", "pass host:port")
        if call_timeout <= 0 or watch_resume_window < 0:
            raise InvalidInput("call_timeout", "timeouts must be positive", "e.g. 5.0")
        self._targets = tuple(_parse_endpoint(e) for e in endpoints)
        self.call_timeout = call_timeout
        self.watch_resume_window = watch_resume_window
        self.sleep = sleep
        self._rng = rng
        self.credentials = credentials or EtcdCredentials()
        self._token: str | None = None
        self._token_lock = asyncio.Lock()
        self._channels: dict[int, _Endpoint] = {}
        self._active = 0
        self._closed = False
        self._leases: set[Lease] = set()
        self._keepalives: KeepAliveThread | None = None
        self._watches: set[Watch] = set()
        self._prober = Prober(self.credentials.tls, ETCD_TLS_OPTIONS)
        self._writes = ByteBudget(write_window) if write_window is not None else None

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._targets

    @property
    def active_endpoint(self) -> str:
        return self._targets[self._active]

    def twin(self) -> EtcdClient:
        """A new client with this one's settings — endpoints (starting at the active one),
        credentials, timeouts — and channels, token and event loop of its own."""
        twin = EtcdClient(
            self._targets,
            call_timeout=self.call_timeout,
            watch_resume_window=self.watch_resume_window,
            rng=self._rng,
            credentials=self.credentials,
            write_window=self._writes.capacity if self._writes is not None else None,
        )
        twin._active = self._active
        return twin

    def _keepalive_thread(self) -> KeepAliveThread:
        """The thread keeping this client's leases alive, started on first use."""
        if self._keepalives is None:
            self._keepalives = KeepAliveThread(self)
        return self._keepalives

    async def close(self) -> None:
        """Stop lease keep-alives (without revoking) and their thread, close watches and
        channels."""
        self._closed = True
        for lease in list(self._leases):
            await lease.stop_keepalive()
        keepalives, self._keepalives = self._keepalives, None
        if keepalives is not None:
            await keepalives.close()
        for watch in list(self._watches):
            await watch.close()
        channels, self._channels = self._channels, {}
        for ep in channels.values():
            await ep.channel.close()

    # -- endpoint selection ------------------------------------------------------------------

    def _at(self, index: int) -> _Endpoint:
        """Endpoint ``index``'s channel and stubs, opened on first use."""
        ep = self._channels.get(index)
        if ep is None:
            ep = self._channels[index] = _Endpoint(self._targets[index], self.credentials)
        return ep

    def _endpoint(self) -> tuple[int, _Endpoint]:
        if self._closed:
            raise StoreUnavailable("etcd client is closed")
        index = self._active
        ep = self._at(index)
        return index, ep

    async def metadata(
        self, ep: _Endpoint, index: int | None = None
    ) -> tuple[tuple[str, str], ...]:
        """The auth token to send with a call (authenticating first when there is none, at
        endpoint ``index``: one that does not answer moves the client on); empty without a
        user."""
        user, password = self.credentials.user, self.credentials.password
        if user is None or password is None:
            return ()
        failure: rpc.AioRpcError | None = None
        async with self._token_lock:
            if self._token is None:
                request = rpc.AuthenticateRequest(name=user, password=password)
                try:
                    reply = await ep.auth.Authenticate(request, timeout=self.call_timeout)
                    self._token = str(reply.token)
                except rpc.AioRpcError as e:
                    if _is_unavailable(e) and index is not None:
                        self._failed(index)
                    failure = e
            token = self._token
        if failure is not None:  # explained outside the lock: it may probe
            what = f"authenticate as etcd user {user!r}"
            raise await self._translated(failure, what, index) from failure
        assert token is not None
        return (("token", token),)

    def forget_token(self, error: BaseException | str) -> bool:
        """Drops the token when ``error`` (or a watch's cancel reason) says etcd no longer
        knows it; whether it did. The next call authenticates again."""
        refused = _token_refused(error)
        if refused:
            self._token = None
        return refused

    def reconnect_backoff(self) -> Backoff:
        """A fresh reconnect backoff on the client's random source."""
        return Backoff(RECONNECT_POLICY, self._rng)

    def _failed(self, index: int) -> None:
        """The endpoint ``index`` answered UNAVAILABLE: the next call goes to the next endpoint."""
        if index == self._active and len(self._targets) > 1:
            self._active = (index + 1) % len(self._targets)
            log.info(
                "etcd endpoint %s unavailable; switching to %s",
                self._targets[index],
                self.active_endpoint,
            )

    async def _unary(
        self,
        what: str,
        stub: str,
        method: str,
        request: Any,
        *,
        idempotent: bool,
        revision: int = 0,
    ) -> Any:
        attempts = len(self._targets) if idempotent else 1
        reauthenticated = False
        attempt = 0
        while True:
            index, ep = self._endpoint()
            try:
                token = await self.metadata(ep, index)
            except StoreUnavailable:
                attempt += 1
                if attempt < attempts:
                    continue  # the next endpoint
                raise
            try:
                return await getattr(getattr(ep, stub), method)(
                    request, timeout=self.call_timeout, metadata=token
                )
            except rpc.AioRpcError as e:
                # A refused token was refused before the request ran: once more, re-authenticated.
                if not reauthenticated and self.forget_token(e):
                    reauthenticated = True
                    continue
                attempt += 1
                if _is_unavailable(e):
                    self._failed(index)
                    if attempt < attempts:
                        continue
                raise await self._translated(e, what, index, revision) from e

    async def _translated(
        self, error: rpc.AioRpcError, what: str, index: int | None, revision: int = 0
    ) -> PlacementError:
        """:func:`translate`, except that a closed connection — which is all gRPC reports when
        etcd refuses our client certificate, or serves TLS to a plaintext client — is probed
        (:mod:`placement.security.probe`): a refusal is a CredentialError."""
        if index is not None and _is_unavailable(error):
            why = await self._prober.refusal(
                self._targets[index], error.details() or "", self.call_timeout
            )
            if why is not None:
                return CredentialError(f"{what}: {why}")
        return translate(error, what, revision=revision)

    async def check_access(self, prefix: str) -> None:
        """One read of the keys under ``prefix/``, at start-up: a refused credential (TLS, user
        and password, permission on the prefix) raises :class:`CredentialError` now, so the
        process ends with one line naming it; an etcd that does not answer is only logged (the
        process's loops keep retrying)."""
        start = prefix.rstrip("/").encode() + b"/"
        try:
            await self.range(start, prefix_range_end(start), limit=1, keys_only=True)
        except StoreUnavailable as e:
            log.warning("etcd does not answer yet (%s); retrying in the background", e)

    # -- access control (placectl up, tests) -----------------------------------------------

    async def enable_auth(self, user: str, password: str | None, prefix: str) -> None:
        """Turns etcd's auth on with one product user allowed only ``prefix/``: user ``root``
        (role ``root``, no password: it authenticates by a client certificate named ``root``)
        and ``user`` (role ``user``, read-write on the prefix; without ``password`` it too
        authenticates only by a certificate of that name). Run once by whoever sets etcd up,
        before auth is on; users and roles that already exist are kept."""
        start = prefix.rstrip("/").encode() + b"/"
        permission = rpc.Permission(
            permType=rpc.Permission.READWRITE, key=start, range_end=prefix_range_end(start)
        )
        no_password = rpc.UserAddOptions(no_password=True)
        steps: list[tuple[str, Any]] = [
            ("UserAdd", rpc.AuthUserAddRequest(name="root", options=no_password)),
            ("UserGrantRole", rpc.AuthUserGrantRoleRequest(user="root", role="root")),
            ("RoleAdd", rpc.AuthRoleAddRequest(name=user)),
            ("RoleGrantPermission", rpc.AuthRoleGrantPermissionRequest(name=user, perm=permission)),
            (
                "UserAdd",
                rpc.AuthUserAddRequest(name=user, password=password)
                if password is not None
                else rpc.AuthUserAddRequest(name=user, options=no_password),
            ),
            ("UserGrantRole", rpc.AuthUserGrantRoleRequest(user=user, role=user)),
            ("AuthEnable", rpc.AuthEnableRequest()),
        ]
        for method, request in steps:
            _, ep = self._endpoint()
            try:
                await getattr(ep.auth, method)(request, timeout=self.call_timeout)
            except rpc.AioRpcError as e:
                if "already exists" not in (e.details() or ""):
                    raise translate(e, f"etcd auth setup ({method})") from e

    # -- reads -------------------------------------------------------------------------------

    async def get(self, key: bytes, *, revision: int = 0, serializable: bool = False) -> Range:
        """One key (``kvs`` has 0 or 1 entries) at ``revision`` (0 = latest)."""
        return await self.range(key, revision=revision, serializable=serializable)

    async def range(
        self,
        key: bytes,
        range_end: bytes | None = None,
        *,
        revision: int = 0,
        limit: int = 0,
        keys_only: bool = False,
        sort_target: Literal["key", "create", "mod"] = "key",
        descending: bool = False,
        max_create_revision: int = 0,
        serializable: bool = False,
    ) -> Range:
        """``[key, range_end)`` (or ``key`` alone) at ``revision`` (0 = latest, linearizable).

        Raises :class:`Compacted` when ``revision`` is compacted, :class:`StoreUnavailable`.
        """
        request = rpc.RangeRequest(
            key=key,
            revision=revision,
            limit=limit,
            keys_only=keys_only,
            serializable=serializable,
            max_create_revision=max_create_revision,
        )
        _ranged(request, range_end)
        if sort_target != "key" or descending:
            request.sort_target = _SORT_TARGETS[sort_target]
            request.sort_order = rpc.RangeRequest.DESCEND if descending else rpc.RangeRequest.ASCEND
        response = await self._unary(
            "range", "kv", "Range", request, idempotent=True, revision=revision
        )
        return _range_result(response, revision)

    async def list_prefix(
        self, prefix: bytes, *, revision: int = 0, page_size: int = 1000
    ) -> Range:
        """Every key under ``prefix`` as of one revision, read in pages of ``page_size``.

        The first page fixes the revision (or uses ``revision``); later pages are pinned to it, so
        the result is one consistent snapshot. Raises :class:`Compacted` if that revision is
        compacted meanwhile (re-list).
        """
        end = prefix_range_end(prefix)
        kvs: list[KeyValue] = []
        start = prefix
        while True:
            page = await self.range(start, end, revision=revision, limit=page_size)
            kvs.extend(page.kvs)
            revision = page.revision
            if not page.more or not page.kvs:
                return Range(tuple(kvs), revision, False, len(kvs))
            start = page.kvs[-1].key + b"\x00"

    async def current_revision(self, key: bytes = b"\x00") -> int:
        """The store's current revision: a linearizable read of ``key`` (with etcd's auth on,
        one the user may read — under its prefix)."""
        return (await self.range(key, limit=1, keys_only=True)).revision

    # -- writes ------------------------------------------------------------------------------

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        """Unconditional put; returns the revision. Only for keys nobody else may own."""
        request = rpc.PutRequest(key=key, value=value, lease=lease)
        response = await self._write(1, "put", "Put", request)
        return int(response.header.revision)

    async def delete(self, key: bytes, range_end: bytes | None = None) -> DeleteResult:
        request = _ranged(rpc.DeleteRangeRequest(key=key), range_end)
        response = await self._write(1, "delete", "DeleteRange", request)
        return DeleteResult(int(response.header.revision), int(response.deleted))

    async def _write(self, size: int, what: str, method: str, request: Any) -> Any:
        """A KV write call of ``size`` operations, within the client's write window."""
        if self._writes is None:
            return await self._unary(what, "kv", method, request, idempotent=False)
        async with self._writes.hold(size):
            return await self._unary(what, "kv", method, request, idempotent=False)

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Op] = (),
        failure: Sequence[Op] = (),
    ) -> TxnResult:
        """One atomic transaction. A read-only one fails over to the next endpoint on UNAVAILABLE;
        one that writes raises :class:`StoreUnavailable` with an unknown outcome."""
        txn = Txn(tuple(compares), tuple(success), tuple(failure))
        read_only = _is_read_only(txn)
        started = time.monotonic()
        try:
            if read_only:
                response = await self._unary("txn", "kv", "Txn", _txn_pb(txn), idempotent=True)
            else:
                size = len(txn.compares) + len(txn.success) + len(txn.failure)
                response = await self._write(size, "txn", "Txn", _txn_pb(txn))
        except StoreUnavailable:
            ETCD_TXN_SECONDS.labels("unavailable").observe(time.monotonic() - started)
            raise
        result = _txn_result(response)
        outcome = "applied" if result.succeeded else "stale"
        ETCD_TXN_SECONDS.labels(outcome).observe(time.monotonic() - started)
        return result

    async def compact(self, revision: int, *, physical: bool = True) -> None:
        """Discard history before ``revision`` (``physical``: wait until it is gone from disk)."""
        request = rpc.CompactionRequest(revision=revision, physical=physical)
        await self._unary("compact", "kv", "Compact", request, idempotent=True, revision=revision)

    # -- maintenance -------------------------------------------------------------------------

    async def alarms(self) -> tuple[Alarm, ...]:
        """The alarms raised in the cluster (etcd lets any authenticated user list them)."""
        request = rpc.AlarmRequest(
            action=rpc.AlarmRequest.GET, memberID=0, alarm=rpc.AlarmType.Value("NONE")
        )
        response = await self._unary("alarm list", "maintenance", "Alarm", request, idempotent=True)
        return tuple(Alarm(int(a.memberID), rpc.AlarmType.Name(a.alarm)) for a in response.alarms)

    async def disarm(self, alarm: Alarm) -> None:
        """Disarm ``alarm`` (etcd raises NOSPACE again at the next write while the database is
        still over its quota: compact and defragment first)."""
        request = rpc.AlarmRequest(
            action=rpc.AlarmRequest.DEACTIVATE,
            memberID=alarm.member_id,
            alarm=rpc.AlarmType.Value(alarm.kind),
        )
        await self._unary("alarm disarm", "maintenance", "Alarm", request, idempotent=True)

    async def defragment(self) -> None:
        """Defragment every endpoint's member in turn (each blocks its member while it runs; etcd
        allows it to its root user only)."""
        for index in range(len(self._targets)):
            ep = self._at(index)
            try:
                await ep.maintenance.Defragment(
                    rpc.DefragmentRequest(),
                    timeout=max(self.call_timeout, 30.0),
                    metadata=await self.metadata(ep, index),
                )
            except rpc.AioRpcError as e:
                raise await self._translated(e, f"defragment {self._targets[index]}", index) from e

    # -- leases ------------------------------------------------------------------------------

    async def grant_lease(self, ttl: int, *, keepalive: bool = True) -> Lease:
        """A new lease of ``ttl`` seconds (etcd raises values below ~2 s), kept alive by this
        client's :class:`KeepAliveThread` unless ``keepalive`` is False."""
        if ttl < 1:
            raise InvalidInput("ttl", f"{ttl} is not a positive number of seconds", "use >= 2")
        asked_at = asyncio.get_running_loop().time()  # etcd's countdown starts after this
        request = rpc.LeaseGrantRequest(TTL=ttl)
        response = await self._unary(
            "lease grant", "lease", "LeaseGrant", request, idempotent=False
        )
        if response.error:
            raise StoreUnavailable(f"lease grant: {response.error}")
        lease = Lease(self, int(response.ID), int(response.TTL), granted_at=asked_at)
        if keepalive:
            lease.start_keepalive()
        return lease

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke ``lease_id`` (its keys are deleted); an already expired lease is not an error."""
        request = rpc.LeaseRevokeRequest(ID=lease_id)
        with contextlib.suppress(LeaseExpired):
            await self._unary("lease revoke", "lease", "LeaseRevoke", request, idempotent=True)

    async def lease_ttl(self, lease_id: int) -> int:
        """Seconds left on ``lease_id``; -1 when it does not exist."""
        request = rpc.LeaseTimeToLiveRequest(ID=lease_id)
        response = await self._unary(
            "lease ttl", "lease", "LeaseTimeToLive", request, idempotent=True
        )
        return int(response.TTL)

    # -- watches -----------------------------------------------------------------------------

    def watch(
        self,
        key: bytes,
        range_end: bytes | None = None,
        *,
        start_revision: int,
        prev_kv: bool = True,
        progress_notify: bool = False,
    ) -> Watch:
        """Watch ``[key, range_end)`` from ``start_revision`` (inclusive; 0 = from now).

        Use ``async with client.watch(...) as w: async for batch in w: ...``.
        """
        watch = Watch(
            self,
            key,
            range_end,
            start_revision=start_revision,
            prev_kv=prev_kv,
            progress_notify=progress_notify,
        )
        self._watches.add(watch)
        return watch


# -- leases ------------------------------------------------------------------------------------


class Losable:
    """A one-shot "lost" signal with its reason, shared by leases and leaderships.

    Loss is final: once :meth:`_mark_lost` ran, :attr:`is_lost` stays true and :meth:`wait_lost`
    returns the first reason given. Subclasses set :attr:`_loss_label` for the log line.
    """

    _loss_label = "resource"

    def __init__(self) -> None:
        self._lost = asyncio.Event()
        self._reason = ""

    @property
    def is_lost(self) -> bool:
        return self._lost.is_set()

    @property
    def lost_reason(self) -> str:
        return self._reason

    async def wait_lost(self) -> str:
        """Return (the reason) once lost."""
        await self._lost.wait()
        return self._reason

    def _mark_lost(self, reason: str) -> None:
        if not self._lost.is_set():
            self._reason = reason
            self._lost.set()
            log.warning("%s lost: %s", self._loss_label, reason)


def expiry_margin(ttl: float) -> float:
    """How long before etcd could expire a lease of ``ttl`` seconds its holder gives it up: an
    eighth of the TTL, at most 1 s — room for the holder to stop its work (a driver cancels
    its term's calls) and for the two clocks to run at slightly different rates, so nothing
    is done under a lease etcd may already have expired (design/metastore.md, "Election")."""
    return min(1.0, ttl / 8)


class Lease(Losable):
    """A granted lease, kept alive by its client's :class:`KeepAliveThread` until revoked,
    stopped or lost.

    Lost means etcd answered the keep-alive with TTL 0 (expired or revoked elsewhere), or no
    keep-alive succeeded until the lease's deadline passed: when the last confirmed refresh was
    sent, plus the TTL, less :func:`expiry_margin` — earlier than etcd can expire it, since etcd
    counts from a moment after the send. Loss is final: :meth:`wait_lost`, on the loop that
    granted the lease, returns the reason. Keys attached to a lost lease are gone or going.
    """

    def __init__(
        self, client: EtcdClient, lease_id: int, ttl: int, *, granted_at: float | None = None
    ) -> None:
        super().__init__()
        self._client = client
        self.id = lease_id
        self.ttl = ttl
        self._loss_label = f"lease {lease_id:#x}"
        self._loop = asyncio.get_running_loop()
        self._kept = False
        # Read and written by the keep-alive only (on its thread), once started.
        start = self._loop.time() if granted_at is None else granted_at
        self._expires_at = start + ttl - expiry_margin(ttl)

    def __repr__(self) -> str:
        return f"Lease(id={self.id:#x}, ttl={self.ttl}, lost={self.is_lost})"

    @property
    def deadline(self) -> float:
        """When (the lease's loop time) it is given up unless a refresh succeeds before: the
        send of the last confirmed refresh (or of the grant) + TTL − :func:`expiry_margin`."""
        return self._expires_at

    def start_keepalive(self) -> None:
        """Start refreshing, on the client's keep-alive thread (returns at once)."""
        if not self._kept and not self.is_lost and not self._client._closed:
            self._kept = True
            self._client._leases.add(self)
            self._client._keepalive_thread().keep(self)

    async def stop_keepalive(self) -> None:
        """Stop refreshing (the lease then expires after its TTL); returns once the keep-alive
        has ended."""
        if not self._kept:
            return
        self._kept = False
        self._client._leases.discard(self)
        keepalives = self._client._keepalives
        if keepalives is not None:
            await keepalives.release(self)

    async def revoke(self) -> None:
        """Stop refreshing and revoke: etcd deletes every key attached to the lease."""
        await self.stop_keepalive()
        try:
            await self._client.revoke_lease(self.id)
        finally:
            self._mark_lost("revoked")

    def _lost_on_thread(self, reason: str) -> None:
        """Called by the keep-alive on its thread: the lease is lost, said on the lease's loop
        (where :meth:`wait_lost` waits)."""
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._mark_lost, reason)

    async def _keepalive(self, client: EtcdClient) -> None:
        """The keep-alive, run on the keep-alive thread with its own ``client``."""
        try:
            await self._keep_alive(client)
        except Exception as e:
            # A keep-alive that stopped without saying so would let the lease expire in etcd
            # while its holder still counts on it: say it is lost (and log the bug).
            log.error("lease %#x keep-alive failed", self.id, exc_info=e)
            self._lost_on_thread(f"keep-alive failed: {e!r}")

    async def _keep_alive(self, client: EtcdClient) -> None:
        loop = asyncio.get_running_loop()
        backoff = client.reconnect_backoff()
        while True:
            try:
                index, ep = client._endpoint()
            except StoreUnavailable:
                return  # the client is closed
            try:
                call = ep.lease.LeaseKeepAlive(metadata=await client.metadata(ep, index))
            except CredentialError as e:
                self._lost_on_thread(str(e))
                return
            except StoreUnavailable:
                call = ep.lease.LeaseKeepAlive()  # fails like an unreachable member, retried
            try:
                while True:
                    sent_at = loop.time()
                    # No answer by the deadline is a lost lease: never wait past it.
                    ends = min(sent_at + client.call_timeout, self._expires_at)
                    async with asyncio.timeout_at(ends):
                        await call.write(rpc.LeaseKeepAliveRequest(ID=self.id))
                        response = await call.read()
                    if not isinstance(response, rpc.LeaseKeepAliveResponse):
                        raise ConnectionError("keep-alive stream closed")
                    if response.TTL <= 0:
                        self._lost_on_thread("expired (etcd answered TTL 0)")
                        return
                    ttl = int(response.TTL)
                    self._expires_at = sent_at + ttl - expiry_margin(ttl)
                    backoff.reset()
                    await client.sleep(max(0.5, int(response.TTL) / 3))
            except _STREAM_ERRORS as e:
                if isinstance(e, rpc.AioRpcError) and _is_unavailable(e):
                    client._failed(index)
                client.forget_token(e)
                if loop.time() >= self._expires_at:
                    self._lost_on_thread(
                        f"no keep-alive before the deadline ({translate(e, 'keepalive')})"
                    )
                    return
                await client.sleep(min(backoff.next(), max(0.0, self._expires_at - loop.time())))
            finally:
                call.cancel()


class KeepAliveThread:
    """A thread with its own event loop and its own :class:`EtcdClient` (the owner's
    :meth:`~EtcdClient.twin`) that runs the keep-alives of the owner's leases.

    The owner's loop may be busy for seconds — a driver pass over 100,000 partitions, thousands
    of calls in flight — or blocked outright; a keep-alive on it would miss the lease's deadline,
    and the lease, and with it a leadership or a node's registration, would be lost while its
    holder works. Here nothing but keep-alives runs, on a connection of their own, so a refresh is
    late only when etcd or the network is. A loss is handed to the lease's loop
    (``call_soon_threadsafe``). Started by the owner's first kept lease; ended by the owner's
    :meth:`~EtcdClient.close`. grpc.aio objects belong to the loop that made them, so the twin
    client is made, used and closed on the thread only.
    """

    #: The name of every keep-alive thread.
    NAME = "etcd-keepalive"

    def __init__(self, owner: EtcdClient) -> None:
        self._owner = owner
        self._loop = asyncio.new_event_loop()
        self._client: EtcdClient | None = None  # on the thread only
        self._tasks: dict[int, asyncio.Task[None]] = {}  # on the thread only
        self.thread = threading.Thread(target=self._run, name=self.NAME, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def keep(self, lease: Lease) -> None:
        """Start refreshing ``lease`` (called on the owner's loop; returns at once)."""
        self._loop.call_soon_threadsafe(self._start, lease)

    async def release(self, lease: Lease) -> None:
        """Stop refreshing ``lease``; returns once its keep-alive has ended."""
        await self._on_thread(self._stop(lease.id))

    async def close(self) -> None:
        """End every keep-alive, close the twin client, end the thread."""
        if not self.thread.is_alive():
            return
        try:
            async with asyncio.timeout(self._owner.call_timeout):
                await self._on_thread(self._close())
        except TimeoutError:
            log.error("etcd keep-alive thread did not stop in time; leaving it (a daemon)")
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self.thread.join(timeout=1.0)  # the loop is stopping: nothing left to wait for

    async def _on_thread(self, work: Coroutine[Any, Any, None]) -> None:
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))

    # -- on the thread -----------------------------------------------------------------------

    def _start(self, lease: Lease) -> None:
        if self._client is None:
            self._client = self._owner.twin()
        task = self._loop.create_task(
            lease._keepalive(self._client), name=f"lease-keepalive-{lease.id:x}"
        )
        self._tasks[lease.id] = task
        task.add_done_callback(lambda done: self._forget(lease.id, done))

    def _forget(self, lease_id: int, task: asyncio.Task[None]) -> None:
        if self._tasks.get(lease_id) is task:
            del self._tasks[lease_id]

    async def _stop(self, lease_id: int) -> None:
        await cancel_and_wait(self._tasks.pop(lease_id, None))

    async def _close(self) -> None:
        for lease_id in list(self._tasks):
            await self._stop(lease_id)
        client, self._client = self._client, None
        if client is not None:
            await client.close()


# -- watches -----------------------------------------------------------------------------------


class _StreamBroken(Exception):
    """Internal: the watch stream ended without an error status."""


_WATCH_ERRORS: tuple[type[BaseException], ...] = (*_STREAM_ERRORS, _StreamBroken)


class Watch(AsyncClosing):
    """An ordered, resumable stream of :class:`WatchBatch` for one key range.

    * Opened on the raw ``Watch`` bidi stream with ``hasleader: true`` metadata, so a member without
      quorum fails the stream instead of keeping it silently open.
    * After a broken stream it re-opens from ``last delivered revision + 1`` on the next endpoint,
      with backoff, for up to the client's ``watch_resume_window`` seconds of continuous failure;
      then it raises :class:`StoreUnavailable`. Nothing is lost or repeated across a resume.
    * Raises :class:`Compacted` when the revision it must start from is compacted (re-list).
    * Raises :class:`StoreUnavailable` when etcd cancels the watch for another reason (watch id -1,
      permission, ...): a cancelled watch is a failure, never a silent end.
    """

    def __init__(
        self,
        client: EtcdClient,
        key: bytes,
        range_end: bytes | None,
        *,
        start_revision: int,
        prev_kv: bool,
        progress_notify: bool,
    ) -> None:
        if start_revision < 0:
            raise InvalidInput("start_revision", "must be >= 0", "0 means 'from now'")
        self._client = client
        self._key = key
        self._range_end = range_end
        self._prev_kv = prev_kv
        self._progress_notify = progress_notify
        self._next_revision = start_revision
        self._call: Any = None
        self._call_index = 0
        self._created = False
        self._closed = False
        self.resumes = 0

    @property
    def next_revision(self) -> int:
        """The revision the watch continues from (0 before the first open of a 'from now' watch)."""
        return self._next_revision

    async def close(self) -> None:
        self._closed = True
        self._drop()
        self._client._watches.discard(self)

    def __aiter__(self) -> Watch:
        return self

    @property
    def connected(self) -> bool:
        """The stream is open and etcd confirmed the watch; false from the first break until
        it is open again (the watch then resumes where it left off)."""
        return self._created

    def _drop(self) -> None:
        self._created = False
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    async def _open(self) -> None:
        index, ep = self._client._endpoint()
        self._call_index = index
        token = await self._client.metadata(ep, index)
        self._call = ep.watch.Watch(metadata=(("hasleader", "true"), *token))
        create = rpc.WatchCreateRequest(
            key=self._key,
            start_revision=self._next_revision,
            prev_kv=self._prev_kv,
            progress_notify=self._progress_notify,
        )
        _ranged(create, self._range_end)
        async with asyncio.timeout(self._client.call_timeout):
            await self._call.write(rpc.WatchRequest(create_request=create))
            response = await self._call.read()
        if not isinstance(response, rpc.WatchResponse):
            raise _StreamBroken("watch stream closed before the watch was created")
        self._check_cancelled(response)
        if not response.created:
            raise _StreamBroken("first watch response is not 'created'")
        if self._next_revision == 0:
            self._next_revision = int(response.header.revision) + 1
        self._created = True

    def _check_cancelled(self, response: Any) -> None:
        if response.compact_revision:
            self._drop()
            raise Compacted(int(response.compact_revision))
        # watch id -1 without ``canceled`` and ``created`` is a progress notification for every
        # watch of the stream (etcd 3.4's answer to a progress request), not a refusal.
        if response.canceled or (response.watch_id == -1 and response.created):
            self._drop()
            reason = response.cancel_reason or "no reason given"
            if self._client.forget_token(reason):
                raise _StreamBroken(f"watch refused an expired auth token: {reason}")
            if "permission denied" in reason:
                raise _refused(reason, f"watch {self._key!r}", 0)
            raise StoreUnavailable(f"watch cancelled by etcd: {reason}")

    async def __anext__(self) -> WatchBatch:
        loop = asyncio.get_running_loop()
        backoff = self._client.reconnect_backoff()
        down_since: float | None = None
        while True:
            if self._closed:
                raise StopAsyncIteration
            try:
                if self._call is None:
                    await self._open()
                    if down_since is not None:
                        self.resumes += 1
                    down_since = None
                    backoff.reset()
                response = await self._call.read()
                if not isinstance(response, rpc.WatchResponse):
                    raise _StreamBroken("watch stream ended")
            except _WATCH_ERRORS as e:
                self._drop()
                if self._closed:
                    raise StopAsyncIteration from None
                if _is_unavailable(e):
                    self._client._failed(self._call_index)
                if self._client.forget_token(e):
                    pass  # opened again after the backoff, with a fresh token
                elif isinstance(e, rpc.AioRpcError) and isinstance(
                    translate(e, "watch"), CredentialError
                ):
                    raise translate(e, f"watch {self._key!r}") from e
                now = loop.time()
                if down_since is None:
                    down_since = now
                    log.info(
                        "watch on %r broken (%s); resuming from %d",
                        self._key,
                        e,
                        self._next_revision,
                    )
                elif now - down_since >= self._client.watch_resume_window:
                    raise translate(e, f"watch {self._key!r}") from e
                await self._client.sleep(backoff.next())
                continue
            try:
                self._check_cancelled(response)
            except _StreamBroken as e:  # an expired token: opened again, authenticated again
                log.info("watch on %r: %s; resuming from %d", self._key, e, self._next_revision)
                self._drop()
                await self._client.sleep(backoff.next())
                continue
            if response.created:
                continue
            events = tuple(_event(ev) for ev in response.events)
            if events:
                revision = events[-1].kv.mod_revision
            else:
                revision = int(response.header.revision)  # progress notification
                if revision < self._next_revision - 1:
                    continue
            self._next_revision = max(self._next_revision, revision + 1)
            return WatchBatch(revision, events)


def _event(msg: Any) -> WatchEvent:
    kind = EventKind.DELETE if msg.type == rpc.Event.DELETE else EventKind.PUT
    prev = _kv(msg.prev_kv) if msg.HasField("prev_kv") else None
    return WatchEvent(kind, _kv(msg.kv), prev)


# -- history of a key range (appended for the data pipeline's export) --------------------------


@dataclass(frozen=True, slots=True)
class History:
    """Every change to a key range between two revisions, as etcd still holds it.

    ``events`` are the changes with ``from_revision <= mod_revision <= to_revision`` in revision
    order, each with its previous value (``prev_kv``) when etcd still had it. ``from_revision`` is
    the first revision asked for, or ``compact_revision + 1`` when etcd had compacted past it.
    """

    from_revision: int
    to_revision: int
    events: tuple[WatchEvent, ...]


async def read_history(
    client: EtcdClient,
    key: bytes,
    range_end: bytes | None,
    *,
    from_revision: int = 1,
    quiet: float = 0.2,
    catch_up_within: float = 60.0,
    page_size: int = 1000,
) -> History:
    """Every event on ``[key, range_end)`` from ``from_revision`` (raised past compaction) up to
    the current revision, read with a watch (with ``prev_kv``) that is closed once it caught up.

    A watch never says "you have seen everything up to R", so the end is found by reconstruction:
    the keys and ``mod_revision``\\ s of the range at ``from_revision - 1``, with every event
    received applied, must equal those read at R (read first), and the stream must have been quiet
    for ``quiet`` seconds (an event after R ends it at once). Raises :class:`StoreUnavailable` if
    that does not happen within ``catch_up_within`` seconds.
    """
    if from_revision < 1:
        raise InvalidInput("from_revision", "must be >= 1", "1 reads all retained history")
    target_revision, target = await _mod_revisions(client, key, range_end, 0, page_size)
    start = from_revision
    while True:
        try:
            base: dict[bytes, int] = {}
            if start > 1:
                _, base = await _mod_revisions(client, key, range_end, start - 1, page_size)
            events = await _events_until(
                client, key, range_end, start, target_revision, base, target, quiet, catch_up_within
            )
            return History(start, target_revision, events)
        except Compacted as e:
            start = max(start + 1, e.compact_revision + 1)
            if start > target_revision + 1:
                raise StoreUnavailable(
                    f"history of {key!r}: compacted past revision {target_revision}"
                ) from e


async def _mod_revisions(
    client: EtcdClient, key: bytes, range_end: bytes | None, revision: int, page_size: int
) -> tuple[int, dict[bytes, int]]:
    """``(revision, key -> mod_revision)`` of the range at one revision (0 = now), paginated."""
    found: dict[bytes, int] = {}
    start = key
    while True:
        page = await client.range(
            start, range_end, revision=revision, limit=page_size, keys_only=True
        )
        revision = page.revision
        found.update((kv.key, kv.mod_revision) for kv in page.kvs)
        if not page.more or not page.kvs or range_end is None:
            return revision, found
        start = page.kvs[-1].key + b"\x00"


async def _events_until(
    client: EtcdClient,
    key: bytes,
    range_end: bytes | None,
    start: int,
    end: int,
    state: dict[bytes, int],
    target: Mapping[bytes, int],
    quiet: float,
    catch_up_within: float,
) -> tuple[WatchEvent, ...]:
    events: list[WatchEvent] = []
    queue: asyncio.Queue[WatchBatch | Exception] = asyncio.Queue()

    async def pump(watch: Watch) -> None:
        try:
            async for batch in watch:
                await queue.put(batch)
        except Exception as e:  # handed to the reader, which raises it
            await queue.put(e)

    loop = asyncio.get_running_loop()
    deadline = loop.time() + catch_up_within
    async with client.watch(key, range_end, start_revision=start, prev_kv=True) as watch:
        task = asyncio.create_task(pump(watch))
        try:
            while True:
                if loop.time() > deadline:
                    raise StoreUnavailable(
                        f"history of {key!r}: not caught up in {catch_up_within}s"
                    )
                try:
                    item = await asyncio.wait_for(queue.get(), quiet)
                except TimeoutError:
                    if state == target:
                        return tuple(events)
                    continue
                if isinstance(item, Exception):
                    raise item
                for event in item.events:
                    if event.kv.mod_revision > end:
                        return tuple(events)
                    events.append(event)
                    if event.kind is EventKind.PUT:
                        state[event.kv.key] = event.kv.mod_revision
                    else:
                        state.pop(event.kv.key, None)
        finally:
            await cancel_and_wait(task)
