"""``placectl``'s output conventions (design/control-plane.md, "placectl output"): ``-o
json|yaml|table|wide`` after every command that prints an answer (``--json`` = ``-o json``), one
``Output.emit`` for all of them, progress bars on stderr only on a terminal, shell completion.

The read and write commands run against an in-process gRPC server answering canned messages, so
every output is deterministic: JSON and YAML must be the very same data.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import click
import grpc
import pytest
import yaml
from click.testing import CliRunner
from rich.console import Console

from placement.cli.common import NoBars, Output, output_option
from placement.cli.main import cli
from placement.cli.reads import lease_text
from placement.cli.spark_run import stage_bars
from placement.cli.workload import workload_progress
from placement.data.workload import WorkloadStats
from placement.pipeline.spark_progress import StageProgress, StageWatcher
from placement.v1 import common_pb2, driver_pb2, driver_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]

# -- the canned driver ---------------------------------------------------------------------------

LEASE_MS = 4_102_444_800_000  # 2100-01-01: "in ...s" whenever the test runs


def _zone() -> driver_pb2.Zone:
    return driver_pb2.Zone(
        name="orders",
        config=driver_pb2.ZoneConfig(
            partitions=4,
            replicas=2,
            node_selector={"tier": "ssd"},
            failure_domain="rack",
            scale_up_delay_seconds=5,
            scale_down_delay_seconds=300,
        ),
        revision=41,
        layout=driver_pb2.ZoneLayout(
            generation=2,
            partitions=4,
            reshard=driver_pb2.Reshard(attempt=40, source=4, target=8, phase="copy"),
        ),
    )


def _node_status(name: str) -> driver_pb2.NodeStatus:
    return driver_pb2.NodeStatus(
        node=name,
        registered=True,
        draining=name == "node-2",
        replicas=3,
        primaries=1,
        revision=77,
    )


class CannedDriver(driver_pb2_grpc.PlacementServiceServicer):
    """Answers every call the CLI makes with the same messages."""

    def GetZone(self, request: Any, context: Any) -> driver_pb2.Zone:
        return _zone()

    def ListZones(self, request: Any, context: Any) -> driver_pb2.ListZonesResponse:
        second = _zone()
        second.name = "sessions"
        second.ClearField("layout")
        return driver_pb2.ListZonesResponse(zones=[_zone(), second])

    def CreateZone(self, request: Any, context: Any) -> driver_pb2.Zone:
        return _zone()

    def AlterZone(self, request: Any, context: Any) -> driver_pb2.Zone:
        return _zone()

    def DropZone(self, request: Any, context: Any) -> driver_pb2.DropZoneResponse:
        return driver_pb2.DropZoneResponse()

    def GetZoneStatus(self, request: Any, context: Any) -> driver_pb2.ZoneStatus:
        return driver_pb2.ZoneStatus(
            name="orders",
            state=driver_pb2.READY,
            partitions_total=4,
            partitions_done=4,
            revision=90,
            eligible_nodes=3,
            under_replicated=True,
            partitions_off_target=2,
            details=["node-3 joined", "é ünïcode: yes"],
        )

    def ListNodes(self, request: Any, context: Any) -> driver_pb2.ListNodesResponse:
        return driver_pb2.ListNodesResponse(
            nodes=[
                driver_pb2.Node(
                    name=f"node-{i}",
                    address=f"10.0.0.{i}:7500",
                    attributes={"rack": f"r{i}"},
                    weight=1.0,
                )
                for i in (1, 2)
            ]
        )

    def GetNodeStatus(self, request: Any, context: Any) -> driver_pb2.NodeStatus:
        return _node_status(request.node)

    def DrainNode(self, request: Any, context: Any) -> driver_pb2.NodeStatus:
        status = _node_status(request.node)
        status.draining = request.drain
        status.safe_to_stop = request.drain
        return status

    def CordonNode(self, request: Any, context: Any) -> driver_pb2.NodeStatus:
        status = _node_status(request.node)
        status.cordoned = request.cordon
        return status

    def GetAssignments(self, request: Any, context: Any) -> driver_pb2.GetAssignmentsResponse:
        return driver_pb2.GetAssignmentsResponse(
            revision=99,
            assignments=[
                driver_pb2.PartitionAssignment(
                    partition=0,
                    stable=common_pb2.Peers(names=["node-1", "node-2"]),
                    pending=common_pb2.Peers(names=["node-2", "node-3"]),
                    has_pending=True,
                    primary="node-1",
                    primary_lease_expiry_unix_ms=LEASE_MS,
                ),
                driver_pb2.PartitionAssignment(
                    partition=1, stable=common_pb2.Peers(names=["node-3", "node-1"])
                ),
            ],
        )

    def CancelRebalance(self, request: Any, context: Any) -> driver_pb2.CancelRebalanceReply:
        return driver_pb2.CancelRebalanceReply(accepted=True, detail="partition 3 cancelled")

    def CancelReshard(self, request: Any, context: Any) -> driver_pb2.CancelRebalanceReply:
        return driver_pb2.CancelRebalanceReply(accepted=False, detail="not re-sharding")

    def PauseRebalancing(self, request: Any, context: Any) -> driver_pb2.PauseReply:
        return driver_pb2.PauseReply(paused=True)

    def ResumeRebalancing(self, request: Any, context: Any) -> driver_pb2.PauseReply:
        return driver_pb2.PauseReply(paused=False)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    driver_pb2_grpc.add_PlacementServiceServicer_to_server(CannedDriver(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def placectl(endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``placectl`` as a process with its output piped (wide enough for every column)."""
    return subprocess.run(
        [sys.executable, "-m", "placement", "--endpoint", endpoint, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
    )


# -- every command that prints an answer ---------------------------------------------------------

READS = [
    ("zone", "get", "orders"),
    ("zone", "list"),
    ("zone", "status", "orders"),
    ("zone", "status", "orders", "--watch", "--interval", "0.1"),
    ("assignments", "orders"),
    ("assignments", "orders", "--partition", "0"),
    ("nodes",),
    ("node", "status", "node-1"),
]
WRITES = [
    ("zone", "create", "orders", "--partitions", "4", "--replicas", "2"),
    ("zone", "alter", "orders", "--replicas", "2"),
    ("zone", "drop", "orders"),
    ("rebalance", "cancel", "orders", "3"),
    ("rebalance", "pause"),
    ("rebalance", "resume"),
    ("node", "drain", "node-1"),
    ("node", "undrain", "node-1"),
    ("node", "cordon", "node-1"),
    ("node", "uncordon", "node-1"),
]


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert result.stderr == ""  # no bar, no warning: stderr is a pipe here
    return result.stdout


@pytest.mark.parametrize("args", READS + WRITES, ids=lambda a: " ".join(a))
def test_json_and_yaml_are_the_same_data_and_json_is_the_alias(
    endpoint: str, args: Sequence[str]
) -> None:
    as_json = json.loads(_ok(placectl(endpoint, *args, "-o", "json")))
    assert isinstance(as_json, dict)
    assert as_json
    assert yaml.safe_load(_ok(placectl(endpoint, *args, "--output", "yaml"))) == as_json
    assert json.loads(_ok(placectl(endpoint, *args, "--json"))) == as_json
    assert json.loads(_ok(placectl(endpoint, *args, "-o", "JSON"))) == as_json
    human = _ok(placectl(endpoint, *args))
    assert human.strip()
    with pytest.raises(json.JSONDecodeError):
        json.loads(human)


def test_what_writes_print_as_data(endpoint: str) -> None:
    created = json.loads(_ok(placectl(endpoint, *WRITES[0], "-o", "json")))
    assert (created["name"], created["replicas"], created["revision"]) == ("orders", 2, 41)
    dropped = json.loads(_ok(placectl(endpoint, "zone", "drop", "orders", "-o", "json")))
    assert dropped == {"name": "orders", "dropped": True}
    assert json.loads(_ok(placectl(endpoint, "rebalance", "pause", "-o", "json"))) == {
        "paused": True
    }
    cancelled = json.loads(_ok(placectl(endpoint, "rebalance", "cancel", "orders", "3", "--json")))
    assert cancelled == {
        "zone": "orders",
        "partition": 3,
        "accepted": True,
        "detail": "partition 3 cancelled",
    }
    refused = placectl(endpoint, "rebalance", "cancel", "orders", "-o", "yaml")
    assert refused.returncode == 1  # not accepted: exit 1 as before, the answer still printed
    assert yaml.safe_load(refused.stdout) == {
        "zone": "orders",
        "partition": None,
        "accepted": False,
        "detail": "not re-sharding",
    }


def test_wide_adds_columns(endpoint: str) -> None:
    cases = {
        ("zone", "get", "orders"): ["revision", "reshard attempt", "41", "40"],
        ("zone", "list"): ["revision", "reshard attempt"],
        ("zone", "status", "orders"): ["eligible nodes 3", "under-replicated yes", "off target 2"],
        ("assignments", "orders"): ["lease expires", "in "],
        ("nodes",): ["state", "replicas", "primaries", "draining", "active"],
        ("node", "status", "node-1"): ["(revision 77)"],
    }
    for args, words in cases.items():
        table = _ok(placectl(endpoint, *args))
        wide = _ok(placectl(endpoint, *args, "-o", "wide"))
        for word in words:
            assert word in wide, (args, word, wide)
            assert word not in table, (args, word, table)


def test_a_stream_is_one_json_object_per_line_or_one_yaml_document_each(endpoint: str) -> None:
    lines = _ok(placectl(endpoint, "node", "drain", "node-1", "--no-wait", "-o", "json"))
    assert len(lines.splitlines()) == 1
    watched = _ok(placectl(endpoint, "zone", "status", "orders", "--watch", "-o", "yaml"))
    documents = list(yaml.safe_load_all(watched))
    assert watched.startswith("---\n")
    assert [d["state"] for d in documents] == ["READY"]


def test_bad_output_value_is_a_usage_error_naming_the_option(endpoint: str) -> None:
    for args in (("zone", "get", "orders"), ("nodes",), ("rebalance", "pause")):
        result = placectl(endpoint, *args, "-o", "xml")
        assert result.returncode == 2
        assert result.stdout == ""
        assert "Invalid value for '-o' / '--output': 'xml' is not one of" in result.stderr
    both = placectl(endpoint, "nodes", "--json", "-o", "yaml")
    assert both.returncode == 2
    assert "--json is -o json; it cannot go with -o yaml" in both.stderr


NOT_PRINTING_AN_ANSWER = {
    ("agent", "run"),  # processes and files: a log, or the file written
    ("driver", "run"),
    ("up",),
    ("certs", "init"),
    ("certs", "issue"),
    ("completion",),
    ("plan",),  # its --output is the plan file; the summary is in it
}


def _commands(group: click.Group, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name), command


def test_every_command_that_prints_an_answer_takes_o() -> None:
    with_o = []
    for path, command in _commands(cli, ()):
        options = {o for p in command.params if isinstance(p, click.Option) for o in p.opts}
        if path in NOT_PRINTING_AN_ANSWER:
            assert "-o" not in options, path
            continue
        assert {"-o", "--output", "--json"} <= options, path
        with_o.append(" ".join(path))
    assert len(with_o) == 26, with_o  # a new command is in one list or the other


# -- the pieces ----------------------------------------------------------------------------------


def _command() -> click.Command:
    @click.command()
    @output_option
    def show(output: Output) -> None:
        output.emit(
            {"n": 1, "none": None, "text": "yes", "number": "1.0", "list": ["a", "é"]},
            lambda wide: f"human wide={wide}",
        )

    return show


def test_output_option_and_emit() -> None:
    runner = CliRunner()
    show = _command()
    assert runner.invoke(show, []).output == "human wide=False\n"
    assert runner.invoke(show, ["-o", "wide"]).output == "human wide=True\n"
    assert runner.invoke(show, ["-o", "table"]).output == "human wide=False\n"
    as_json = json.loads(runner.invoke(show, ["--json"]).output)
    # strings that look like YAML booleans or numbers stay strings
    assert yaml.safe_load(runner.invoke(show, ["-o", "yaml"]).output) == as_json
    assert as_json == {"n": 1, "none": None, "text": "yes", "number": "1.0", "list": ["a", "é"]}
    assert runner.invoke(show, ["--json", "-o", "json"]).exit_code == 0
    assert runner.invoke(show, ["--json", "-o", "table"]).exit_code == 2


def test_rich_renderables_go_through_the_console(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.table import Table

    def human(wide: bool) -> Table:
        table = Table("a", *(["b"] if wide else []))
        table.add_row("1", *(["2"] if wide else []))
        return table

    Output("wide").emit({}, human)
    assert " b " in capsys.readouterr().out
    Output("table").emit({}, human)
    assert " b " not in capsys.readouterr().out


def test_lease_text() -> None:
    assert lease_text(None) == "-"
    assert lease_text(0) == "-"
    assert lease_text(10_500, now=6.0) == "in 4.5s"
    assert lease_text(5_000, now=6.0) == "expired 1.0s ago"


def _terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=120), out


def test_bars_only_on_a_terminal_and_never_with_data_output() -> None:
    terminal, out = _terminal()
    for fmt in ("json", "yaml"):
        with Output(fmt).progress(terminal) as bars:
            assert isinstance(bars, NoBars)
    piped = Console(file=io.StringIO(), force_terminal=False)
    with Output("table").progress(piped) as bars:
        assert isinstance(bars, NoBars)
    assert out.getvalue() == ""
    with Output("wide").progress(terminal) as bars:
        assert not isinstance(bars, NoBars)
        task = bars.add_task("copying", total=10)
        bars.update(task, completed=4, detail="4 things")
    drawn = out.getvalue()
    assert "copying" in drawn
    assert "4/10" in drawn
    assert "4 things" in drawn


def test_workload_bar_shows_seconds_and_writes() -> None:
    terminal, out = _terminal()
    with Output().progress(terminal) as bars:
        report = workload_progress(bars, duration=30.0)
        stats = WorkloadStats("r1", "r1-", attempted=12, acked=10, failures={"X": 1, "Y": 1})
        report(stats, 12.4)
        report(stats, 99.0)  # a write let finish after the end: the bar stops full
    drawn = out.getvalue()
    assert "writing" in drawn
    assert "10/12 acknowledged, 2 failed" in drawn
    assert "30/30" in drawn


class FakeTracker:
    """``pyspark.StatusTracker``'s two methods over a scripted list of polls."""

    def __init__(self, polls: list[dict[int, tuple[str, int, int]]]) -> None:
        self.polls = polls
        self.now: dict[int, tuple[str, int, int]] = {}

    def getActiveStageIds(self) -> list[int]:
        self.now = self.polls.pop(0) if self.polls else {}
        return list(self.now)

    def getStageInfo(self, stage_id: int, /) -> Any:
        if stage_id not in self.now:
            return None
        name, tasks, done = self.now[stage_id]

        class Info:
            numTasks = tasks
            numCompletedTasks = done

        Info.name = name  # type: ignore[attr-defined]
        return Info


def test_spark_stage_bars() -> None:
    terminal, out = _terminal()
    seen: list[list[StageProgress]] = []
    with Output().progress(terminal) as bars:
        draw = stage_bars(bars)

        def report(stages: Sequence[StageProgress]) -> None:
            seen.append(list(stages))
            draw(stages)

        tracker = FakeTracker(
            [
                {3: ("applyInPandas at planning.py:1", 8, 2)},
                {3: ("applyInPandas at planning.py:1", 8, 5), 4: ("collect at x" * 10, 2, 0)},
            ]
        )
        with StageWatcher(tracker, report, interval=0.01):
            while tracker.polls:
                time.sleep(0.005)
    assert seen[0] == [StageProgress(3, "applyInPandas at planning.py:1", 8, 2)]
    assert seen[-1] == []  # the last poll on the way out: nothing runs
    drawn = out.getvalue()
    assert "spark stage 3" in drawn
    assert "8/8" in drawn  # shown complete once it left the active stages
    assert "spark stage 4" in drawn
    assert "2/2" in drawn
    assert "collect at xcollect" in drawn
    assert "…" in drawn  # a long stage name is cut


def test_a_failing_tracker_stops_the_watching_not_the_job() -> None:
    class Broken:
        def getActiveStageIds(self) -> list[int]:
            raise RuntimeError("py4j: the JVM went away")

        def getStageInfo(self, stage_id: int, /) -> Any:
            raise AssertionError

    calls: list[object] = []
    with StageWatcher(Broken(), calls.append, interval=0.01):
        pass
    assert calls == []


# -- shell completion ----------------------------------------------------------------------------


def _complete(words: str, cword: int) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "placement"],
        env={
            "PATH": "/usr/bin:/bin",
            "_PLACECTL_COMPLETE": "bash_complete",
            "COMP_WORDS": words,
            "COMP_CWORD": str(cword),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    return [line.split(",", 1)[1] for line in result.stdout.splitlines()]


def test_completion_protocol_completes_commands_and_output_formats() -> None:
    assert _complete("placectl zo", 1) == ["zone"]
    assert _complete("placectl zone st", 2) == ["status"]
    assert _complete("placectl nodes -o ", 3) == ["table", "wide", "json", "yaml"]


def test_completion_script_completes_in_bash(tmp_path: Path) -> None:
    """The script ``placectl completion bash`` prints, sourced by bash, completes ``placectl``
    (here: a ``placectl`` on PATH that is this checkout)."""
    shim = tmp_path / "placectl"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m placement "$@"\n')
    shim.chmod(0o755)
    script = subprocess.run(
        [str(shim), "completion", "bash"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert "_PLACECTL_COMPLETE=bash_complete" in script
    probe = (
        f"{script}\n"
        "COMP_WORDS=(placectl rebalance pa); COMP_CWORD=2\n"
        "_placectl_completion placectl\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    result = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["pause"]
    for shell, marker in (("zsh", "#compdef placectl"), ("fish", "complete --no-files")):
        out = subprocess.run(
            [str(shim), "completion", shell], capture_output=True, text=True, check=True
        ).stdout
        assert marker in out, shell
    bad = subprocess.run([str(shim), "completion", "tcsh"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "SHELL" in bad.stderr
