"""txn_request_bytes (pure, from protobuf's wire format) equals the size of the request etcd.py
sends, for every kind of compare and op, nested transactions, and large or negative values."""

from __future__ import annotations

from typing import get_args

from hypothesis import given
from hypothesis import strategies as st

from placement.metastore.etcd import _txn_pb
from placement.metastore.transitions import plan_owned_txns
from placement.metastore.txn import (
    MAX_TXN_OPS,
    REQUEST_BYTES_BUDGET,
    Compare,
    CompareOp,
    CompareTarget,
    Delete,
    Get,
    Op,
    Put,
    Txn,
    txn_request_bytes,
)

KEYS = st.binary(max_size=300)
INTS = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@st.composite
def compares(draw: st.DrawFn) -> Compare:
    target = draw(st.sampled_from(list(CompareTarget)))
    operand: int | bytes = draw(KEYS if target is CompareTarget.VALUE else INTS)
    range_end = draw(st.none() | KEYS)
    op = draw(st.sampled_from(get_args(CompareOp)))
    return Compare(draw(KEYS), target, op, operand, range_end)


SIMPLE_OPS: st.SearchStrategy[Op] = st.one_of(
    st.builds(Put, KEYS, st.binary(max_size=3000), INTS, st.booleans()),
    st.builds(Delete, KEYS, st.none() | KEYS, st.booleans()),
    st.builds(Get, KEYS, st.none() | KEYS, INTS, st.booleans()),
)


def txns(ops: st.SearchStrategy[Op]) -> st.SearchStrategy[Txn]:
    return st.builds(
        Txn,
        st.lists(compares(), max_size=4).map(tuple),
        st.lists(ops, max_size=4).map(tuple),
        st.lists(ops, max_size=4).map(tuple),
    )


NESTED_OPS: st.SearchStrategy[Op] = st.one_of(SIMPLE_OPS, txns(SIMPLE_OPS))


@given(txns(NESTED_OPS))
def test_size_matches_the_serialized_request(txn: Txn) -> None:
    assert txn_request_bytes(txn) == _txn_pb(txn).ByteSize()


def test_empty_transaction_is_empty() -> None:
    assert txn_request_bytes(Txn(())) == 0 == _txn_pb(Txn(())).ByteSize()


def test_owned_keys_are_packed_by_count_and_by_bytes() -> None:
    small = {f"/p/sizes/z/{i:05d}/n1".encode(): b"{}" for i in range(300)}
    txns = plan_owned_txns(small, 7)
    assert [len(t) for t in txns] == [MAX_TXN_OPS, MAX_TXN_OPS, 300 - 2 * MAX_TXN_OPS]
    assert [p.key for t in txns for p in t] == sorted(small)
    assert all(isinstance(p, Put) and p.lease == 7 for t in txns for p in t)
    big = {f"k{i}".encode(): b"x" * (REQUEST_BYTES_BUDGET // 3) for i in range(4)}
    packed = plan_owned_txns(big, 0)
    assert [len(t) for t in packed] == [2, 2]
    assert all(txn_request_bytes(Txn((), t)) <= REQUEST_BYTES_BUDGET for t in packed)
    assert plan_owned_txns({}, 0) == []
