"""Deterministic 64-bit hashing used only as a tie-breaker by the placement function.

Python's ``hash()`` of a string is salted per process, so every key here comes from BLAKE2b
(names) or SplitMix64 (integers): the same input gives the same keys on every machine and run.
"""

from __future__ import annotations

import hashlib

import numpy as np
from numpy.typing import NDArray

U64 = NDArray[np.uint64]

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)


def name_key(*parts: str) -> int:
    """A stable 64-bit key for a tuple of names (NUL-separated: ``("a", "bc") != ("ab", "c")``)."""
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def mix64(values: NDArray[np.uint64] | NDArray[np.int64], seed: int = 0) -> U64:
    """SplitMix64 finaliser of ``values ^ seed``, element-wise; a bijection on 64-bit integers."""
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) ^ np.uint64(seed & 0xFFFF_FFFF_FFFF_FFFF)
        z = z + _GAMMA
        z = (z ^ (z >> np.uint64(30))) * _MUL1
        z = (z ^ (z >> np.uint64(27))) * _MUL2
        return z ^ (z >> np.uint64(31))
