"""``placement.logs`` (formats, the log context across tasks) and ``placement.metrics``' inputs
(design/observability.md)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import pytest

from placement.errors import InvalidInput
from placement.logs import configure_logging, context, log_context, set_log_context
from placement.metrics import REGISTRY as METRICS
from placement.metrics import GaugeFamily, parse_listen, register_collector


@pytest.fixture
def root_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)


def test_json_lines_carry_the_context_of_the_work_and_of_its_tasks(
    root_restored: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("INFO", "json", {"component": "agent", "node": "n1"})
    log = logging.getLogger("placement.test")

    async def work() -> None:
        log.info("outside")
        with log_context(zone="orders", partition=3):
            log.info("inside %s", "the zone")

            async def child() -> None:
                set_log_context(epoch=7)  # the child's own copy
                log.info("in a task")

            await asyncio.create_task(child())
            log.info("after the task")  # the child's epoch stays in the child
        log.info("outside again")
        log.debug("below the level")

    asyncio.run(work())
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [r["message"] for r in lines] == [
        "outside",
        "inside the zone",
        "in a task",
        "after the task",
        "outside again",
    ]
    for record in lines:
        assert record["component"] == "agent"
        assert record["node"] == "n1"
        assert record["level"] == "INFO"
        assert record["logger"] == "placement.test"
        assert "ts" in record
        assert "context_text" not in record
    assert "zone" not in lines[0]
    assert (lines[1]["zone"], lines[1]["partition"]) == ("orders", 3)
    assert (lines[2]["zone"], lines[2]["partition"], lines[2]["epoch"]) == ("orders", 3, 7)
    assert "epoch" not in lines[3]
    assert "zone" not in lines[4]
    assert context() == {}


def test_text_lines_append_the_context(
    root_restored: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("info", "text", {"component": "driver"})
    with log_context(zone="z", revision=12, partition=None):
        logging.getLogger("x").warning("moved")
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(" WARNING x moved [zone=z revision=12]"), line


def test_an_answer_the_client_no_longer_waited_for_is_one_line_not_a_traceback(
    root_restored: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """gRPC's asyncio server logs ERROR with a traceback when a unary answer cannot be sent
    because the client's call already ended (a chaos test's driver log had two); other gRPC
    errors pass unchanged."""
    configure_logging("INFO", "text", {"component": "driver"})
    configure_logging("INFO", "text", {"component": "driver"})  # the filter is added once
    grpc_core = logging.getLogger("grpc._cython.cygrpc")
    try:
        raise RuntimeError('Failed "execute_batch": (<SendMessageOperation>,)')
    except RuntimeError:
        grpc_core.exception(
            "ExecuteBatchError raised in core by servicer method [%s]",
            "/placement.v1.PlacementService/GetZone",
        )
        grpc_core.exception("Unexpected [RuntimeError] raised by servicer method [/x/Y]")
    err = capsys.readouterr().err
    first, *rest = err.splitlines()
    assert first.endswith(
        " INFO grpc._cython.cygrpc the answer to /placement.v1.PlacementService/GetZone was"
        " not sent: the client's call had ended (it gave up)"
    ), first
    assert rest[0].endswith("ERROR grpc._cython.cygrpc Unexpected [RuntimeError] raised by"
                            " servicer method [/x/Y]")  # fmt: skip
    assert err.count("Traceback") == 1  # the other error keeps its own


@pytest.mark.parametrize(
    ("level", "fmt", "field"),
    [("LOUD", "text", "--log-level"), ("INFO", "xml", "--log-format")],
)
def test_bad_log_options_name_the_option(level: str, fmt: str, field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        configure_logging(level, fmt)
    assert caught.value.field == field


@pytest.mark.parametrize("value", ["", "9100", "host:", ":9100", "h:port", "h:70000"])
def test_a_bad_metrics_listen_names_the_option(value: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_listen(value)
    assert caught.value.field == "--metrics-listen"


def test_listen_addresses_parse() -> None:
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("[::1]:9100") == ("::1", 9100)


def test_scrape_time_gauges_come_and_go_with_their_collector() -> None:
    calls = []

    def families() -> list[GaugeFamily]:
        calls.append(1)
        return [GaugeFamily("placement_test_gauge", "a test", ("zone",), {("a",): 2.0})]

    unregister = register_collector(families)
    try:
        assert METRICS.get_sample_value("placement_test_gauge", {"zone": "a"}) == 2.0
        assert calls, "computed at scrape time"
    finally:
        unregister()
    assert METRICS.get_sample_value("placement_test_gauge", {"zone": "a"}) is None
