"""One zone-config validation: the codec's rules, and the API's stricter syntax on top."""

from __future__ import annotations

import pytest

from placement.core.model import ZoneSpec
from placement.core.zonespec import ALTERABLE, validate_zone_spec
from placement.errors import InvalidInput


def test_every_field_but_the_name_is_alterable() -> None:
    assert ALTERABLE == (
        "partitions",
        "replicas",
        "node_selector",
        "failure_domain",
        "scale_up_delay",
        "scale_down_delay",
        "min_in_sync",
    )


def test_user_input_adds_selector_and_name_syntax() -> None:
    loose = ZoneSpec("z", 1, 1, node_selector={"a b": "c"}, failure_domain="ra ck")
    assert validate_zone_spec(loose) is loose
    with pytest.raises(InvalidInput) as info:
        validate_zone_spec(loose, user_input=True)
    assert info.value.field == "node_selector"
    with pytest.raises(InvalidInput) as info:
        validate_zone_spec(ZoneSpec("..", 1, 1), user_input=True)
    assert info.value.field == "zone"
    with pytest.raises(InvalidInput) as info:
        validate_zone_spec(ZoneSpec("z", 1, 1, scale_up_delay=-1.0), user_input=True)
    assert info.value.field == "scale_up_delay"
