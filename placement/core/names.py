"""The one validator of zone, node and member names, and of partition ids (pure).

Keys, codecs, the API, the CLI and the agents all check names here, so every layer accepts and
refuses exactly the same strings (design/metastore.md, key layout).
"""

from __future__ import annotations

import re

from placement.core.limits import MAX_PARTITIONS, NAME_PATTERN
from placement.errors import InvalidInput

_NAME_RE = re.compile(NAME_PATTERN)
NAME_HINT = "use 1..64 characters of letters, digits, '_', '.', '-' (not '.' or '..')"


def has_name_form(text: object) -> bool:
    """True if ``text`` has a name's characters and length (what the value codec checks of the
    names inside stored values; names entering through keys, the API, the CLI and the agents are
    held to :func:`is_name`)."""
    return isinstance(text, str) and bool(_NAME_RE.match(text))


def is_name(text: object) -> bool:
    """True if ``text`` is a valid zone/node/member name (never ``.`` or ``..``)."""
    return has_name_form(text) and text not in {".", ".."}


def validate_name(name: str, what: str = "zone") -> str:
    """Return ``name`` if it is a valid zone/node/member name, else raise :class:`InvalidInput`
    naming ``what`` (a kind of name or the option/field it came from)."""
    if not is_name(name):
        raise InvalidInput(what, f"{name!r} is not a valid {what} name", NAME_HINT)
    return name


def validate_partition(partition: int, what: str = "partition") -> int:
    """Return ``partition`` if it is an int in ``0..MAX_PARTITIONS-1``, else raise InvalidInput."""
    if isinstance(partition, bool) or not isinstance(partition, int):
        raise InvalidInput(what, f"{partition!r} is not an integer", "pass an int")
    if not 0 <= partition < MAX_PARTITIONS:
        raise InvalidInput(what, f"{partition} is out of range", f"use 0..{MAX_PARTITIONS - 1}")
    return partition
