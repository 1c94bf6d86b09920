"""Pure parts of the operator CLI and the API edge: option parsing, validation, JSON shapes."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from placement.api.client import parse_endpoints
from placement.api.service import make_spec
from placement.api.servicer import altered, spec_from_pb, zone_pb
from placement.cli.inspect import decode_entry
from placement.cli.main import cli, main
from placement.cli.reads import assignment_json
from placement.cli.zone import status_json, zone_config, zone_json
from placement.core.layout import Reshard, ReshardPhase, ZoneLayout
from placement.core.model import parse_pairs
from placement.errors import InvalidInput
from placement.metastore.codec import (
    Assignment,
    LayoutValue,
    NodeRecord,
    encode_assignment,
    encode_node,
)
from placement.metastore.transitions import ZoneRecord
from placement.v1 import common_pb2, driver_pb2
from replica.registration import parse_attributes


def test_parse_pairs() -> None:
    assert parse_pairs(["rack=a", "tier=ssd"], "--node-selector") == {"rack": "a", "tier": "ssd"}
    assert parse_pairs(["k=v=w"], "--x") == {"k": "v=w"}
    for bad in (["rack"], ["=a"], ["rack="], ["a=1", "a=2"]):
        with pytest.raises(InvalidInput) as info:
            parse_pairs(bad, "--node-selector")
        assert info.value.field == "--node-selector"
    assert parse_attributes(["rack=r1"]) == {"rack": "r1"}
    with pytest.raises(InvalidInput, match="--attribute"):
        parse_attributes(["rack"])


def test_parse_endpoints() -> None:
    assert parse_endpoints("a:1, b:2,") == ("a:1", "b:2")
    assert parse_endpoints(["127.0.0.1:7400"]) == ("127.0.0.1:7400",)
    for bad in ("", "a", "a:b", "a:0", ":1", "a:70000"):
        with pytest.raises(InvalidInput, match="--endpoint"):
            parse_endpoints(bad)


def test_zone_config_names_given_fields() -> None:
    config, given = zone_config(
        partitions=8,
        replicas=3,
        selector=["tier=ssd"],
        failure_domain="rack",
        scale_up_delay=None,
        scale_down_delay=30.0,
    )
    assert given == [
        "partitions",
        "replicas",
        "node_selector",
        "failure_domain",
        "scale_down_delay",
    ]
    assert config.partitions == 8
    assert dict(config.node_selector) == {"tier": "ssd"}
    assert config.scale_down_delay_seconds == 30.0
    empty, none = zone_config(
        partitions=None,
        replicas=None,
        selector=[],
        failure_domain=None,
        scale_up_delay=None,
        scale_down_delay=None,
    )
    assert none == []
    assert empty == driver_pb2.ZoneConfig()
    with pytest.raises(InvalidInput, match="--replicas"):
        zone_config(
            partitions=1,
            replicas=-1,
            selector=[],
            failure_domain=None,
            scale_up_delay=None,
            scale_down_delay=None,
        )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"replicas": 0}, "replicas"),
        ({"replicas": 65}, "replicas"),
        ({"partitions": 0}, "partitions"),
        ({"partitions": 65_537}, "partitions"),
        ({"node_selector": {"a b": "c"}}, "node_selector"),
        ({"node_selector": {"a": ""}}, "node_selector"),
        ({"failure_domain": "ra ck"}, "failure_domain"),
        ({"scale_up_delay": -1.0}, "scale_up_delay"),
        ({"scale_down_delay": float("nan")}, "scale_down_delay"),
        ({"name": "no/slash"}, "zone"),
        ({"min_in_sync": 0}, "min_in_sync"),
        ({"min_in_sync": 65}, "min_in_sync"),
    ],
)
def test_make_spec_rejects_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {
        "name": "z",
        "partitions": 4,
        "replicas": 3,
        "node_selector": {},
        "failure_domain": None,
        "scale_up_delay": 0.0,
        "scale_down_delay": 0.0,
    }
    args.update(kwargs)
    with pytest.raises(InvalidInput) as info:
        make_spec(**args)  # type: ignore[arg-type]
    assert field in str(info.value)


def test_spec_round_trip_and_alter() -> None:
    config = driver_pb2.ZoneConfig(
        partitions=4, replicas=2, node_selector={"t": "s"}, scale_up_delay_seconds=5
    )
    spec = spec_from_pb("z", config)
    assert (spec.partitions, spec.replicas, spec.scale_up_delay) == (4, 2, 5.0)
    assert spec.failure_domain is None
    zone = zone_pb(ZoneRecord("z", spec, 7, 7))
    assert zone_json(zone) == {
        "name": "z",
        "partitions": 4,
        "replicas": 2,
        "node_selector": {"t": "s"},
        "failure_domain": None,
        "scale_up_delay": 5.0,
        "scale_down_delay": 0.0,
        "min_in_sync": None,
        "effective_min_in_sync": 2,
        "revision": 7,
        "layout": None,
    }
    resharding = Reshard(9, 4, 8, ReshardPhase.COPY)
    with_layout = ZoneRecord("z", spec, 9, 7, LayoutValue(ZoneLayout(7, 4, resharding)), 10)
    assert zone_json(zone_pb(with_layout))["layout"] == {
        "generation": 7,
        "partitions": 4,
        "reshard": {"attempt": 9, "source": 4, "target": 8, "phase": "copy"},
    }
    changed = altered(spec, driver_pb2.ZoneConfig(replicas=3, partitions=99), ["replicas"])
    assert (changed.partitions, changed.replicas, dict(changed.node_selector)) == (4, 3, {"t": "s"})
    with pytest.raises(InvalidInput, match="update_fields"):
        altered(spec, config, ["colour"])
    with pytest.raises(InvalidInput, match="replicas"):
        altered(spec, driver_pb2.ZoneConfig(replicas=0), ["replicas"])


def test_json_shapes() -> None:
    status = driver_pb2.ZoneStatus(
        name="z", state=driver_pb2.HOLDDOWN, partitions_total=4, partitions_done=4
    )
    assert status_json(status)["state"] == "HOLDDOWN"
    a = driver_pb2.PartitionAssignment(
        partition=2,
        stable=common_pb2.Peers(names=["a", "b"]),
        pending=common_pb2.Peers(names=["a", "c"]),
        has_pending=True,
        primary="a",
    )
    assert assignment_json(a) == {
        "partition": 2,
        "stable": ["a", "b"],
        "pending": ["a", "c"],
        "planned": None,
        "primary": "a",
        "primary_lease_expiry_unix_ms": None,
    }


def test_decode_entry() -> None:
    raw = encode_assignment(Assignment(("a", "b"), 3, 1000, 9))
    assert decode_entry("assign", "stable", raw) == {
        "peers": ["a", "b"],
        "epoch": 3,
        "ts": 1000,
        "trigger": 9,
    }
    node = decode_entry("nodes", None, encode_node(NodeRecord("n", "h:1", {"rack": "a"})))
    assert node["address"] == "h:1"
    corrupt = decode_entry("assign", "stable", b"\xffjunk")
    assert "corrupt" in corrupt
    assert decode_entry("leader", None, b'{"id":"d1"}') == {"id": "d1"}


def test_cli_bad_flags_exit_2_one_line() -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["zone", "create", "z", "--partitions", "x", "--replicas", "1"])
    assert result.exit_code == 2
    result = runner.invoke(cli, ["rebalance", "cancel", "z", "-1"])
    assert result.exit_code == 2


def test_decode_entry_of_a_move_report() -> None:
    from placement.metastore.codec import MoveReport, encode_report

    raw = encode_report(MoveReport(9, 2, "DONE", "ok", 5))
    assert decode_entry("progress", None, raw) == {
        "revision": 9,
        "epoch": 2,
        "phase": "DONE",
        "detail": "ok",
        "ts": 5,
    }


def test_min_in_sync_through_the_cli_options_the_api_edge_and_alter() -> None:
    config, given = zone_config(
        partitions=4,
        replicas=3,
        selector=[],
        failure_domain=None,
        scale_up_delay=None,
        scale_down_delay=None,
        min_in_sync=3,
    )
    assert given == ["partitions", "replicas", "min_in_sync"]
    spec = spec_from_pb("z", config)
    assert spec.min_in_sync == 3
    shown = zone_json(zone_pb(ZoneRecord("z", spec, 7, 7)))
    assert (shown["min_in_sync"], shown["effective_min_in_sync"]) == (3, 3)
    # 0 on the wire = the default; alter back to it, or to another value
    assert spec_from_pb("z", driver_pb2.ZoneConfig(partitions=4, replicas=3)).min_in_sync is None
    lowered = altered(spec, driver_pb2.ZoneConfig(min_in_sync=1), ["min_in_sync"])
    assert (lowered.min_in_sync, lowered.replicas) == (1, 3)
    assert altered(spec, driver_pb2.ZoneConfig(), ["min_in_sync"]).min_in_sync is None
    assert altered(spec, driver_pb2.ZoneConfig(replicas=5), ["replicas"]).min_in_sync == 3
    with pytest.raises(InvalidInput, match="min_in_sync"):
        altered(spec, driver_pb2.ZoneConfig(min_in_sync=65), ["min_in_sync"])
    for bad in (0, -1, 65):
        with pytest.raises(InvalidInput) as info:
            zone_config(
                partitions=4,
                replicas=3,
                selector=[],
                failure_domain=None,
                scale_up_delay=None,
                scale_down_delay=None,
                min_in_sync=bad,
            )
        assert info.value.field == "--min-in-sync"


def test_cli_bad_min_in_sync_exits_2_naming_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["zone", "create", "z", "--partitions", "4", "--replicas", "3", "--min-in-sync", "0"]
    with pytest.raises(SystemExit) as info:
        main(["--endpoint", "127.0.0.1:1", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("placectl: error: --min-in-sync")
