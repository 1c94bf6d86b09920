"""The one validation of a zone's config (:class:`~placement.core.model.ZoneSpec`), pure.

The value codec holds every stored config to it, and the API every config it is asked to write
(with ``user_input``: names and selectors must also have the syntax the CLI accepts), so what the
API refuses and what etcd may hold are one set of rules (design/metastore.md, values).
"""

from __future__ import annotations

import math
import re
from dataclasses import fields

from placement.core.limits import MAX_PAIRS, MAX_PARTITIONS, MAX_REPLICAS
from placement.core.model import ZoneSpec
from placement.core.names import has_name_form, validate_name
from placement.errors import InvalidInput

#: Selector keys and values, and failure domains: like node attribute names (no ``=``, ``,`` or
#: spaces).
SELECTOR_PATTERN = re.compile(r"^[A-Za-z0-9_.\-/]{1,64}$")
#: Largest scale-up/scale-down delay (seconds): 30 days.
MAX_DELAY = 30 * 24 * 3600.0
#: The fields a zone's config may change after creation: all but its name.
ALTERABLE: tuple[str, ...] = tuple(f.name for f in fields(ZoneSpec) if f.name != "name")


def validate_zone_spec(spec: ZoneSpec, *, user_input: bool = False) -> ZoneSpec:
    """Return ``spec`` if it is within the documented limits, else raise :class:`InvalidInput`
    naming the field. ``user_input``: the name must be a valid zone name (not only have a name's
    form) and selector keys/values and the failure domain must match :data:`SELECTOR_PATTERN`."""
    _check_name(spec.name, user_input)
    check_count(spec.partitions, MAX_PARTITIONS, "partitions")
    check_count(spec.replicas, MAX_REPLICAS, "replicas")
    _check_selector(spec, user_input)
    check_delay(spec.scale_up_delay, "scale_up_delay")
    check_delay(spec.scale_down_delay, "scale_down_delay")
    check_min_in_sync(spec.min_in_sync, "min_in_sync")
    return spec


# One check per field, named by ``what`` (a field, or the CLI option it came from), so that the
# CLI refuses what the API would, in the same words, before anything is sent.


def check_count(value: object, limit: int, what: str) -> int:
    """A partition or replica count: an int in ``1..limit``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise InvalidInput(what, f"{value!r} is out of range", f"use 1..{limit}")
    return value


def check_delay(value: object, what: str) -> float:
    """A scale-up or scale-down delay: finite seconds in ``0..MAX_DELAY``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_DELAY
    ):
        raise InvalidInput(what, f"{value!r} is not a delay in seconds", f"use 0..{MAX_DELAY:g}")
    return float(value)


def check_min_in_sync(value: object, what: str) -> int | None:
    """``min_in_sync``: unset (None) or an int in ``1..MAX_REPLICAS``."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPLICAS
    ):
        raise InvalidInput(
            what,
            f"{value!r} is out of range",
            f"use 1..{MAX_REPLICAS}, or leave it unset for the default (2, at most the replicas)",
        )
    return value


def _check_name(name: str, user_input: bool) -> None:
    if user_input:
        validate_name(name, "zone")
    elif not has_name_form(name):
        raise InvalidInput("name", f"{name!r} is not a valid zone name", "use [A-Za-z0-9_.-]{1,64}")


def _check_selector(spec: ZoneSpec, user_input: bool) -> None:
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in spec.node_selector.items()):
        raise InvalidInput("node_selector", "keys and values must be strings", "use str: str")
    domain = spec.failure_domain
    if domain is not None and not isinstance(domain, str):
        raise InvalidInput("failure_domain", "must be a string or null", "name a node attribute")
    if not user_input:
        return
    if len(spec.node_selector) > MAX_PAIRS:
        raise InvalidInput(
            "node_selector",
            f"has {len(spec.node_selector)} pairs",
            f"select with at most {MAX_PAIRS} KEY=VALUE pairs",
        )
    for key, value in spec.node_selector.items():
        for what, text in (("key", key), ("value", value)):
            if not SELECTOR_PATTERN.match(text):
                raise InvalidInput(
                    "node_selector",
                    f"{what} {text!r} is not valid selector syntax",
                    "use KEY=VALUE with 1..64 of [A-Za-z0-9_./-]",
                )
    if domain is not None and not SELECTOR_PATTERN.match(domain):
        raise InvalidInput("failure_domain", f"{domain!r} is not an attribute name", "e.g. rack")
