"""The Spark engine on a Spark standalone cluster it does not control (design/pipeline.md,
"Shipping the environment", "Storage"): a real master and worker from the pyspark package on
loopback, the worker run as ``nobody`` in a mount namespace where this checkout — the product
and its virtual environment — is an empty tmpfs. Its executors have Spark, Java and the system's
Python only; ``placectl plan`` (a subprocess, as a user runs it) ships them the packed
environment and plans byte-identically to the local engine, with every what-if option, from a
JSON snapshot and from an export directory at a ``file:`` URI; without the environment
(``--ship-env none``) the plan fails with one line naming the option.

Needs root (``unshare``, ``mount``, ``setpriv``): skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_pipeline_report_spark import _generated_export, _same_report
from test_pipeline_spark import EXAMPLE, _fleet_dir

from placement.local.spark_standalone import StandaloneSpark

ROOT = Path(__file__).resolve().parents[2]
PLACECTL = ROOT / ".venv" / "bin" / "placectl"
#: The driver's side of a loopback cluster: executors connect back to 127.0.0.1.
LOOPBACK = ("--spark-conf", "spark.driver.host=127.0.0.1",
            "--spark-conf", "spark.driver.bindAddress=127.0.0.1")  # fmt: skip
WHAT_IF = (
    "--remove-node", "node-a2",
    "--add-node", "node-d1,rack=d,tier=ssd", "--add-node", "node-d2,rack=d,tier=hdd",
    "--set-replicas", "orders=2", "--set-replicas", "sessions=3",
    "--set-partitions", "orders=20",
)  # fmt: skip

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "setpriv", "nsenter")),
    reason="a worker as another user in its own mount namespace needs root, unshare, setpriv"
    " and nsenter",
)

#: ``XDG_CACHE_HOME`` of this module's placectl runs: its packed environments, not the user's.
ENV = {"XDG_CACHE_HOME": ""}


@pytest.fixture(scope="module")
def cluster() -> Iterator[StandaloneSpark]:
    ENV["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="placement-spark-env-")
    try:
        with StandaloneSpark(cores=2, memory="2g", user="nobody", hide=[ROOT]) as spark:
            yield spark
    finally:
        shutil.rmtree(ENV["XDG_CACHE_HOME"], ignore_errors=True)


def placectl(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """As a user runs it: no Spark settings inherited from this process's environment (a
    ``PYSPARK_PYTHON`` naming this virtual environment would be taken by the executors), the
    packed environment cached in this module's own directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    env.update(ENV)
    return subprocess.run(
        [str(PLACECTL), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )


def plan(cluster: StandaloneSpark, *args: str) -> subprocess.CompletedProcess[str]:
    return placectl("plan", "--engine", "spark", "--master", cluster.master_url, *LOOPBACK, *args)


def local_plan(source: Path, out: Path, *args: str) -> str:
    done = placectl("plan", "--input", str(source), "--output", str(out), *args)
    assert done.returncode == 0, done.stderr
    return out.read_text()


def test_the_worker_sees_neither_the_product_nor_its_environment(
    cluster: StandaloneSpark,
) -> None:
    """The running worker's own mount namespace, as its user: the checkout (the product and its
    virtual environment) is empty, and Spark is there — the premise of the tests below."""
    look = (
        f"ls -A {ROOT}; test -e {PLACECTL} && echo VISIBLE;"
        f" test -x {cluster.directory}/worker/spark-home/bin/spark-class && echo SPARK;"
        # nor does the executors' Python have what the product needs (it comes shipped)
        " for m in numpy pyarrow pandas pydantic orjson placement; do"
        ' python3 -c "import $m" 2>/dev/null && echo HAS-$m; done; true'
    )
    seen = subprocess.run(
        ["nsenter", f"--target={cluster.worker_pid}", "--mount",
         "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
         "env", "PATH=/usr/local/bin:/usr/bin:/bin", "sh", "-c", look],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert seen.stdout.split() == ["SPARK"], (seen.stdout, seen.stderr)


def test_without_the_environment_the_executors_fail_with_one_line(
    cluster: StandaloneSpark,
) -> None:
    out = cluster.shared / "none.json"
    done = plan(cluster, "--input", str(EXAMPLE), "--output", str(out), "--ship-env", "none")
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]  # nothing after it (no Java stack trace)
    assert last.startswith(
        "placectl: error: --ship-env: the executors' Python could not import 'placement'"
        " with --ship-env none"
    ), done.stderr[-3000:]
    assert not out.exists()


def test_a_cluster_plans_json_input_with_every_what_if_like_the_local_engine(
    cluster: StandaloneSpark, tmp_path: Path
) -> None:
    expected = local_plan(EXAMPLE, tmp_path / "local.json", *WHAT_IF)
    out = tmp_path / "cluster.json"
    done = plan(cluster, "--input", str(EXAMPLE), "--output", str(out), *WHAT_IF)
    assert done.returncode == 0, done.stderr[-3000:] + cluster.worker_log()
    assert out.read_text() == expected
    assert "planned 2 zone(s)" in done.stdout


def test_a_cluster_plans_an_export_at_a_uri_like_the_local_engine(
    cluster: StandaloneSpark, tmp_path: Path
) -> None:
    """An export directory the executors read (a ``file:`` URI on storage they share), the plan
    written back to a URI through Spark's Hadoop file system."""
    fleet = _fleet_dir(cluster.shared / "fleet")
    # as written (readable by the executors' user: outputs get the umask's permissions)
    options = ("--remove-node", "n03", "--set-partitions", "z1=24", "--set-replicas", "z2=2")
    expected = local_plan(fleet, tmp_path / "local.json", *options)
    out = cluster.shared / "out" / "plan.json"
    out.parent.mkdir()
    done = plan(cluster, "--input", fleet.as_uri(), "--output", out.as_uri(), *options)
    assert done.returncode == 0, done.stderr[-3000:] + cluster.worker_log()
    assert out.read_text() == expected
    assert sorted(p.name for p in out.parent.iterdir()) == ["plan.json"]  # no temporaries


def test_a_cluster_reports_an_export_at_a_uri_like_the_local_engine(
    cluster: StandaloneSpark, tmp_path: Path
) -> None:
    """``pipeline report --engine spark``: the history's analytics on the cluster's executors
    (the shipped environment, cached by the plans before), read from a ``file:`` URI and the
    report written to one; report.json and rebalances.csv identical to the local engine's."""
    export_dir = _generated_export(cluster.shared / "history")
    # as written (readable by the executors' user: outputs get the umask's permissions)
    local = tmp_path / "local"
    done = placectl("pipeline", "report", "--input", str(export_dir), "--out", str(local))
    assert done.returncode == 0, done.stderr
    out = cluster.shared / "report"
    done = placectl(
        "pipeline", "report", "--engine", "spark", "--master", cluster.master_url, *LOOPBACK,
        "--input", export_dir.as_uri(), "--out", out.as_uri(), "-o", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:] + cluster.worker_log()
    numbers = _same_report(local, out)
    assert numbers["totals"]["rebalances"] > 300
    assert json.loads(done.stdout)["report"] == f"{out.as_uri()}/report.html"
    assert sorted(p.name for p in cluster.shared.iterdir() if p.name.startswith(".")) == []


def test_an_archive_packed_once_and_given_by_uri_is_what_the_executors_run(
    cluster: StandaloneSpark, tmp_path: Path
) -> None:
    """``placectl pipeline pack-env --out FILE``, then ``--ship-env file:///FILE`` (how an
    archive uploaded to HDFS is given): the same plan as the local engine."""
    archive = cluster.shared / "env.tar.gz"
    packed = placectl("pipeline", "pack-env", "--out", str(archive), "-o", "json")
    assert packed.returncode == 0, packed.stderr
    assert json.loads(packed.stdout) == {
        "archive": str(archive),
        "bytes": archive.stat().st_size,
        "packed": True,
    }
    expected = local_plan(EXAMPLE, tmp_path / "local.json", "--set-replicas", "orders=2")
    out = tmp_path / "cluster.json"
    done = plan(cluster, "--input", str(EXAMPLE), "--output", str(out),
                "--set-replicas", "orders=2", "--ship-env", archive.as_uri())  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:] + cluster.worker_log()
    assert out.read_text() == expected
    assert "packed the executors' environment" not in done.stderr  # given, not packed
