"""The one validation of a zone's config (:class:`~placement.core.model.ZoneSpec`), pure.

The value codec holds every stored config to it, and the API every config it is asked to write
(with ``user_input``: names and selectors must also have the syntax the CLI accepts), so what the
API refuses and what etcd may hold are one set of rules (design/metastore.md, values).
"""

from __future__ import annotations

import math
import re
from dataclasses import fields

from placement.core.limits import MAX_PARTITIONS, MAX_REPLICAS
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
    for key, limit in (("partitions", MAX_PARTITIONS), ("replicas", MAX_REPLICAS)):
        value = getattr(spec, key)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise InvalidInput(key, f"{value!r} is out of range", f"use 1..{limit}")
    _check_selector(spec, user_input)
    for key in ("scale_up_delay", "scale_down_delay"):
        delay = getattr(spec, key)
        if (
            isinstance(delay, bool)
            or not isinstance(delay, int | float)
            or not math.isfinite(delay)
            or not 0 <= delay <= MAX_DELAY
        ):
            raise InvalidInput(key, f"{delay!r} is not a delay in seconds", f"use 0..{MAX_DELAY:g}")
    wanted = spec.min_in_sync
    if wanted is not None and (
        isinstance(wanted, bool) or not isinstance(wanted, int) or not 1 <= wanted <= MAX_REPLICAS
    ):
        raise InvalidInput(
            "min_in_sync",
            f"{wanted!r} is out of range",
            f"use 1..{MAX_REPLICAS}, or 0/unset for the default (2, at most replicas)",
        )
    return spec


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
