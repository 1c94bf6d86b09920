"""Typed etcd transaction values: what a read returns, what a transaction compares and does.

Pure data (no ``aetcd``, gRPC or asyncio): the store builds and inspects transactions with these,
and :mod:`placement.metastore.etcd` alone turns them into etcd's protocol (design/metastore.md).
:func:`txn_request_bytes` is the size of the serialized ``TxnRequest``, computed from protobuf's
wire format so that batchers can stay within etcd's ``--max-request-bytes`` without protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal, TypeAlias

from placement.errors import InvalidInput

#: etcd's default ``--max-txn-ops``: the most compares, or ops in one branch, of a transaction.
MAX_TXN_OPS = 128
#: etcd's default ``--max-request-bytes`` (1.5 MiB).
MAX_REQUEST_BYTES = 1_572_864
#: What our batchers allow per request: the limit minus headroom for framing and the fence.
REQUEST_BYTES_BUDGET = MAX_REQUEST_BYTES - 64 * 1024


# -- typed transaction building blocks ---------------------------------------------------------


class CompareTarget(Enum):
    VERSION = "version"
    CREATE = "create_revision"
    MOD = "mod_revision"
    VALUE = "value"
    LEASE = "lease"


CompareOp = Literal["==", "!=", "<", ">"]


@dataclass(frozen=True, slots=True)
class Compare:
    """One etcd compare: ``target(key) op operand``, optionally over ``[key, range_end)``.

    etcd's semantics to keep in mind: compares are AND-ed; on a missing key VERSION, CREATE, MOD
    and LEASE compare as 0, but a VALUE compare is always **false**. A compare over a range holds
    when it holds for every key in it (for non-VALUE targets: as 0 when the range is empty).
    """

    key: bytes
    target: CompareTarget
    op: CompareOp
    operand: int | bytes
    range_end: bytes | None = None

    @classmethod
    def version(
        cls, key: bytes, op: CompareOp, version: int, *, range_end: bytes | None = None
    ) -> Compare:
        return cls(key, CompareTarget.VERSION, op, version, range_end)

    @classmethod
    def create(cls, key: bytes, op: CompareOp, revision: int) -> Compare:
        return cls(key, CompareTarget.CREATE, op, revision)

    @classmethod
    def mod(cls, key: bytes, op: CompareOp, revision: int) -> Compare:
        return cls(key, CompareTarget.MOD, op, revision)

    @classmethod
    def value(cls, key: bytes, op: CompareOp, value: bytes) -> Compare:
        return cls(key, CompareTarget.VALUE, op, value)

    @classmethod
    def lease(cls, key: bytes, op: CompareOp, lease_id: int) -> Compare:
        return cls(key, CompareTarget.LEASE, op, lease_id)


@dataclass(frozen=True, slots=True)
class Put:
    key: bytes
    value: bytes
    lease: int = 0
    prev_kv: bool = False


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete ``key``, or every key in ``[key, range_end)``."""

    key: bytes
    range_end: bytes | None = None
    prev_kv: bool = False


@dataclass(frozen=True, slots=True)
class Get:
    """A read inside a transaction, at the transaction's revision."""

    key: bytes
    range_end: bytes | None = None
    limit: int = 0
    keys_only: bool = False


@dataclass(frozen=True, slots=True)
class Txn:
    """A (possibly nested) transaction: all ``compares`` hold ? ``success`` : ``failure``."""

    compares: tuple[Compare, ...]
    success: tuple[Op, ...] = ()
    failure: tuple[Op, ...] = ()


Op: TypeAlias = Put | Delete | Get | Txn


def txn_ops(txn: Txn) -> int:
    """What etcd counts against ``--max-txn-ops``: the most of compares/success/failure, nested."""

    def branch(ops: tuple[Op, ...]) -> int:
        return len(ops) + sum(txn_ops(op) for op in ops if isinstance(op, Txn))

    return max(len(txn.compares), branch(txn.success), branch(txn.failure))


def txn_request_bytes(txn: Txn) -> int:
    """Serialized size of the transaction request (compare with :data:`REQUEST_BYTES_BUDGET`)."""
    return sum(_field(1, _compare_bytes(c)) for c in txn.compares) + _branches_bytes(txn)


def checked_operand(c: Compare) -> int | bytes:
    """The operand of ``c``, checked against its target: bytes for VALUE, an int otherwise."""
    if c.target is CompareTarget.VALUE:
        if not isinstance(c.operand, bytes):
            raise InvalidInput("compare.value", "a VALUE compare needs bytes", "pass bytes")
        return c.operand
    if isinstance(c.operand, bytes | bool):
        raise InvalidInput("compare", f"{c.target.value} compares an int", "pass an int")
    return c.operand


# -- protobuf wire sizes (proto3: fields at their default are not sent, a oneof member always is)

#: Field numbers of etcd's ``Compare`` oneof ``target_union``, and its enum values.
_TARGET_FIELD = {
    CompareTarget.VERSION: 4,
    CompareTarget.CREATE: 5,
    CompareTarget.MOD: 6,
    CompareTarget.VALUE: 7,
    CompareTarget.LEASE: 8,
}
_TARGET_ENUM = {
    CompareTarget.VERSION: 0,
    CompareTarget.CREATE: 1,
    CompareTarget.MOD: 2,
    CompareTarget.VALUE: 3,
    CompareTarget.LEASE: 4,
}
_RESULT_ENUM = {"==": 0, ">": 1, "<": 2, "!=": 3}


def _varint(value: int) -> int:
    """Bytes of a varint; negative int64 values take ten."""
    if value < 0:
        return 10
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


def _field(number: int, payload: int) -> int:
    """A length-delimited field (bytes or a message) of ``payload`` bytes."""
    return _varint(number << 3) + _varint(payload) + payload


def _int_field(number: int, value: int, *, always: bool = False) -> int:
    if not value and not always:
        return 0
    return _varint(number << 3) + _varint(value)


def _bytes_field(number: int, value: bytes | None, *, always: bool = False) -> int:
    if not value and not always:
        return 0
    return _field(number, len(value or b""))


def _compare_bytes(c: Compare) -> int:
    operand = checked_operand(c)
    number = _TARGET_FIELD[c.target]
    union = (
        _bytes_field(number, operand, always=True)
        if isinstance(operand, bytes)
        else _int_field(number, operand, always=True)
    )
    return (
        _int_field(1, _RESULT_ENUM[c.op])
        + _int_field(2, _TARGET_ENUM[c.target])
        + _bytes_field(3, c.key)
        + union
        + _bytes_field(64, c.range_end)
    )


def _op_bytes(op: Op) -> int:
    if isinstance(op, Put):
        put = (
            _bytes_field(1, op.key)
            + _bytes_field(2, op.value)
            + _int_field(3, op.lease)
            + _int_field(4, int(op.prev_kv))
        )
        return _field(2, put)
    if isinstance(op, Delete):
        delete = (
            _bytes_field(1, op.key) + _bytes_field(2, op.range_end) + _int_field(3, int(op.prev_kv))
        )
        return _field(3, delete)
    if isinstance(op, Get):
        get = (
            _bytes_field(1, op.key)
            + _bytes_field(2, op.range_end)
            + _int_field(3, op.limit)
            + _int_field(8, int(op.keys_only))
        )
        return _field(1, get)
    return _field(4, txn_request_bytes(op))


def _branches_bytes(txn: Txn) -> int:
    return sum(_field(2, _op_bytes(op)) for op in txn.success) + sum(
        _field(3, _op_bytes(op)) for op in txn.failure
    )
