"""The key → partition function: pinned values, range, and jump hashing's minimal movement."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.data.partitioning import (
    CONTROL_PREFIX,
    control_key,
    jump_hash,
    key_hash,
    partition_of,
    routes_to,
    validate_key,
)
from placement.errors import InvalidInput


def test_pinned_values_never_change() -> None:
    # A contract: changing any of these re-homes the keys of every zone.
    assert key_hash(b"hello") == 12085107955937391741
    assert [partition_of(f"k{i}".encode(), 64) for i in range(8)] == [
        36,
        36,
        56,
        26,
        15,
        16,
        57,
        44,
    ]
    assert partition_of(b"x", 1) == 0
    assert jump_hash(0, 10) == 0
    assert jump_hash(1, 10) == 6


#: Keys a client may use: any 1..4096 bytes but the agents' control keys.
client_keys = st.binary(min_size=1, max_size=64).filter(lambda k: not k.startswith(CONTROL_PREFIX))


@given(client_keys, st.integers(1, 65536))
def test_partition_is_in_range(key: bytes, partitions: int) -> None:
    assert 0 <= partition_of(key, partitions) < partitions


@given(client_keys, st.integers(1, 4096))
def test_growing_by_one_moves_a_key_only_to_the_new_partition(key: bytes, p: int) -> None:
    before, after = partition_of(key, p), partition_of(key, p + 1)
    assert after in (before, p)


@pytest.mark.parametrize(
    ("key", "partitions", "field"),
    [
        (b"", 4, "key"),
        (b"k", 0, "partitions"),
        (b"k" * 5000, 4, "key"),
        (b"k", 70000, "partitions"),
    ],
)
def test_bad_input_names_the_field(key: bytes, partitions: int, field: str) -> None:
    with pytest.raises(InvalidInput) as e:
        partition_of(key, partitions)
    assert e.value.field == field


def test_keys_spread_evenly() -> None:
    counts = [0] * 16
    for i in range(16_000):
        counts[partition_of(f"key-{i}".encode(), 16)] += 1
    assert max(counts) - min(counts) < 200


def test_control_keys_are_refused_to_clients_and_never_routed() -> None:
    seal = control_key("seal", 7, 12)
    assert seal == CONTROL_PREFIX + b"seal/7/12"
    with pytest.raises(InvalidInput) as e:
        validate_key(seal)
    assert e.value.field == "key"
    assert "reserved prefix" in str(e.value)
    with pytest.raises(InvalidInput):
        partition_of(CONTROL_PREFIX + b"anything", 4)
    assert not any(routes_to(seal, p, 4) for p in range(4))


@given(client_keys, st.integers(1, 512))
def test_a_client_key_routes_to_exactly_its_partition(key: bytes, partitions: int) -> None:
    owner = partition_of(key, partitions)
    assert [p for p in range(partitions) if routes_to(key, p, partitions)] == [owner]
