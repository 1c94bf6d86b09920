"""``placectl`` starts fast: ``--help`` and the read commands import none of the heavy modules
(the data pipeline's libraries, numpy, etcd's client, the driver, the placement function), and a
missing ``pipeline`` extra is one line naming it, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "snapshot.json"
HEAVY = (
    "numpy",
    "pandas",
    "pyarrow",
    "pyspark",
    "matplotlib",
    "aetcd",
    "placement.driver",
    "placement.algo",
    "placement.metastore.etcd",
    # server-side gRPC services: a client never needs them
    "grpc_health.v1",
    "grpc_reflection.v1alpha",
)
EXTRA_HINT = "pip install 'placement[pipeline]'"


def python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def refusing_endpoint() -> Iterator[str]:
    """A gRPC server with no services: every call fails at once with UNIMPLEMENTED."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


LOADED_AFTER = """
import json, sys
import click
from placement.cli.main import cli, main

ctx = click.Context(cli)
for path in (["zone", "status"], ["assignments"], ["nodes"], ["data", "get"]):
    command = cli.get_command(ctx, path[0])
    for name in path[1:]:
        command = command.get_command(ctx, name)
    assert command is not None, path
for argv in json.loads(sys.argv[1]):
    try:
        main(argv)
    except SystemExit:
        pass
heavy = tuple(json.loads(sys.argv[2]))
print(json.dumps(sorted(m for m in sys.modules if m in heavy or m.startswith(heavy))))
"""


def heavy_modules_after(*argvs: list[str], heavy: tuple[str, ...] = HEAVY) -> list[str]:
    prefixes = [*heavy, *(f"{m}." for m in heavy)]
    result = python(LOADED_AFTER, json.dumps(list(argvs)), json.dumps(prefixes))
    assert result.returncode == 0, result.stderr
    loaded: list[str] = json.loads(result.stdout.strip().splitlines()[-1])
    return loaded


def test_importing_the_cli_and_resolving_read_commands_loads_nothing_heavy() -> None:
    assert heavy_modules_after() == []


def test_help_loads_nothing_heavy() -> None:
    assert heavy_modules_after(["--help"]) == []


def test_help_loads_no_rpc_stack() -> None:
    """Listing the commands imports no command's runtime: no asyncio, gRPC, protobuf or rich."""
    rpc_stack = ("asyncio", "grpc", "google.protobuf", "rich")
    assert heavy_modules_after(["--help"], heavy=rpc_stack) == []


def test_version_names_the_installed_package_and_loads_no_rpc_stack() -> None:
    from importlib.metadata import version

    result = subprocess.run(
        [sys.executable, "-m", "placement", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"placectl {version('placement')}\n"
    rpc_stack = ("asyncio", "grpc", "google.protobuf", "rich")
    assert heavy_modules_after(["--version"], heavy=rpc_stack) == []


def test_read_commands_load_nothing_heavy(refusing_endpoint: str) -> None:
    endpoint = ["--endpoint", refusing_endpoint]
    loaded = heavy_modules_after(
        [*endpoint, "zone", "status", "X"],
        [*endpoint, "zone", "status", "X", "--json"],
        [*endpoint, "assignments", "X"],
        [*endpoint, "nodes"],
        [*endpoint, "data", "get", "X", "k", "--deadline", "1"],
    )
    assert loaded == []


MISSING = """
import sys
sys.modules[sys.argv[1]] = None
from placement.cli.main import main
main(sys.argv[2:])
"""


@pytest.mark.parametrize(
    ("missing", "argv", "what"),
    [
        ("pyspark", ["plan", "--engine", "spark"], "placectl plan --engine spark"),
        ("pyarrow", ["pipeline", "export", "--etcd", "127.0.0.1:1"], "placectl pipeline export"),
        ("matplotlib", ["pipeline", "report", "--input", "."], "placectl pipeline report"),
    ],
)
def test_missing_pipeline_extra_is_one_line_exit_2(
    tmp_path: Path, missing: str, argv: list[str], what: str
) -> None:
    if argv[0] == "plan":
        argv = [*argv, "--input", str(EXAMPLE), "--output", str(tmp_path / "plan.json")]
    else:
        argv = [*argv, "--out", str(tmp_path / "out")]
    result = python(MISSING, missing, *argv)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"placectl: error: {what} needs the pipeline extra ({missing} is not installed): "
        f"{EXTRA_HINT}"
    ]
    assert not (tmp_path / "plan.json").exists()
    assert not (tmp_path / "out").exists()


WITHOUT_EXTRA = """
import sys
for name in ("pyspark", "pyarrow", "pandas", "matplotlib"):
    sys.modules[name] = None
from placement.cli.main import main
main(sys.argv[1:])
"""


def test_local_plan_of_a_json_snapshot_needs_no_pipeline_extra(tmp_path: Path) -> None:
    """The placement function and snapshot files are core: only Parquet and Spark need the extra."""
    out = tmp_path / "plan.json"
    result = python(WITHOUT_EXTRA, "plan", "--input", str(EXAMPLE), "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert "planned 2 zone(s)" in result.stdout
    assert json.loads(out.read_text())["zones"]
