"""The key → partition function of the data plane: stable, documented, language-neutral.

``partition_of(key, partitions)``:

1. ``h = blake2b(key, digest_size=8)`` read as a big-endian unsigned 64-bit integer;
2. Lamping & Veach's *jump consistent hash* of ``h`` into ``partitions`` buckets.

Both steps are fully specified (RFC 7693 and the paper's 64-bit LCG), so a client in any language
computes the same partition. Jump hashing moves only ``1/(P+1)`` of the keys when a zone grows
from ``P`` to ``P+1`` partitions, instead of nearly all of them as ``h mod P`` would.

Pure code: no I/O.
"""

from __future__ import annotations

import hashlib

from placement.core.layout import check_partitions
from placement.errors import InvalidInput

#: Largest key and value the data API accepts (bytes).
MAX_KEY_BYTES = 4096
MAX_VALUE_BYTES = 1 << 20
#: Keys starting with this are the agents' own (design/resharding.md, "Control keys"): clients
#: may not write or read them, and scans never show them.
CONTROL_PREFIX = b"\xff\xffplacement-control/"

_MASK = (1 << 64) - 1


def key_hash(key: bytes) -> int:
    """The 64-bit hash of ``key`` (BLAKE2b, 8-byte digest, big-endian)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def jump_hash(h: int, buckets: int) -> int:
    """Lamping & Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm" (2014)."""
    b, j = -1, 0
    while j < buckets:
        b = j
        h = (h * 2862933555777941757 + 1) & _MASK
        j = int((b + 1) * ((1 << 31) / ((h >> 33) + 1)))
    return b


def partition_of(key: bytes, partitions: int) -> int:
    """The partition of ``key`` in a zone of ``partitions`` partitions."""
    return jump_hash(key_hash(validate_key(key)), check_partitions(partitions))


def key_moves(key: bytes, old: int, new: int) -> tuple[int, int] | None:
    """``(from, to)`` partitions when a zone going from ``old`` to ``new`` partitions moves
    ``key``, else None (design/resharding.md: a key moves iff its partition differs, and always
    from one of :class:`~placement.core.layout.Moves`' sources to one of its destinations)."""
    h = key_hash(validate_key(key))
    before, after = (
        jump_hash(h, check_partitions(old, "old")),
        jump_hash(h, check_partitions(new, "new")),
    )
    return None if before == after else (before, after)


def validate_key(key: bytes, field: str = "key") -> bytes:
    """``key`` if it is 1..MAX_KEY_BYTES bytes and not a control key, else
    :class:`InvalidInput` naming ``field``."""
    if not isinstance(key, bytes):
        raise InvalidInput(field, f"{key!r} is not bytes", "pass bytes (UTF-8 encode text)")
    if not 1 <= len(key) <= MAX_KEY_BYTES:
        raise InvalidInput(field, f"is {len(key)} bytes long", f"use 1..{MAX_KEY_BYTES} bytes")
    if key.startswith(CONTROL_PREFIX):
        raise InvalidInput(
            field, f"starts with the reserved prefix {CONTROL_PREFIX!r}", "use another key"
        )
    return key


def control_key(purpose: str, *parts: int | str) -> bytes:
    """The control key of ``purpose`` (e.g. ``"seal"``) and ``parts`` (design/resharding.md,
    "Control keys"): written by an agent through a partition's log like data, never by a
    client (:func:`validate_key` refuses the prefix)."""
    return CONTROL_PREFIX + "/".join([purpose, *map(str, parts)]).encode()


#: The control key of a source partition's seal (design/resharding.md, "SEAL").
SEAL_KEY = CONTROL_PREFIX + b"seal"


def selected(key: bytes, select: tuple[int, int]) -> bool:
    """Whether re-sharding's copy to partition ``select[1]`` of a layout of ``select[0]``
    partitions takes ``key``: the keys that route there, and the source's seal."""
    partitions, partition = select
    return key == SEAL_KEY or routes_to(key, partition, partitions)


def routes_to(key: bytes, partition: int, partitions: int) -> bool:
    """Whether a stored ``key`` is ``partition``'s under a layout of ``partitions``: a control
    key is nobody's (reads never show it)."""
    if key.startswith(CONTROL_PREFIX):
        return False
    return jump_hash(key_hash(key), partitions) == partition


def validate_value(value: bytes, field: str = "value") -> bytes:
    """``value`` if it is at most MAX_VALUE_BYTES bytes, else :class:`InvalidInput`."""
    if not isinstance(value, bytes):
        raise InvalidInput(field, f"{value!r} is not bytes", "pass bytes (UTF-8 encode text)")
    if len(value) > MAX_VALUE_BYTES:
        raise InvalidInput(field, f"is {len(value)} bytes long", f"use at most {MAX_VALUE_BYTES}")
    return value
