"""The address a process advertises (placement.rpc.advertised_address): the bound address by
default, the --advertise one (port 0 = the bound port) when given; a wildcard is never
advertised, and a wildcard --listen needs --advertise."""

from __future__ import annotations

import pytest

from placement.errors import InvalidInput
from placement.rpc import advertised_address, join_host_port


def test_the_bound_address_by_default_and_the_advertised_one_when_given() -> None:
    assert advertised_address("127.0.0.1:0", None, "127.0.0.1:4321") == "127.0.0.1:4321"
    assert advertised_address("127.0.0.1:0", "db-1.example:0", "127.0.0.1:4321") == (
        "db-1.example:4321"
    )
    assert advertised_address("127.0.0.1:0", "10.0.0.7:7000", "127.0.0.1:4321") == ("10.0.0.7:7000")
    assert advertised_address("127.0.0.1:0", "[::1]:0", "127.0.0.1:4321") == "[::1]:4321"
    assert advertised_address("[::1]:0", None, join_host_port("::1", 4321)) == "[::1]:4321"


@pytest.mark.parametrize(
    ("listen", "advertise", "words"),
    [
        ("0.0.0.0:7000", None, "binds every interface"),
        ("[::]:7000", None, "binds every interface"),
        ("127.0.0.1:0", "0.0.0.0:7000", "wildcard"),
        ("0.0.0.0:7000", "[::]:0", "wildcard"),
        ("127.0.0.1:0", "db-1", "is not HOST:PORT"),
    ],
)
def test_a_wildcard_is_never_advertised(listen: str, advertise: str | None, words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        advertised_address(listen, advertise)
    assert caught.value.field == "--advertise"
    assert words in str(caught.value)
