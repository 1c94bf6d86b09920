"""The key → partition function: pinned values, range, and jump hashing's minimal movement."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.data.partitioning import jump_hash, key_hash, partition_of
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


@given(st.binary(min_size=1, max_size=64), st.integers(1, 65536))
def test_partition_is_in_range(key: bytes, partitions: int) -> None:
    assert 0 <= partition_of(key, partitions) < partitions


@given(st.binary(min_size=1, max_size=64), st.integers(1, 4096))
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
