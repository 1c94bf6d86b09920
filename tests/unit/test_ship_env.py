"""``--ship-env`` (placement/pipeline/ship_env.py) and the pipeline's locations: what is packed,
how the archive is cached, the settings Spark gets, and the errors."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from placement.errors import InvalidInput
from placement.pipeline import ship_env
from placement.pipeline.locations import join, local_path, name_of, parse_location, spark_uri
from placement.pipeline.ship_env import (
    ShipEnv,
    archive_for,
    canonical,
    executor_failure,
    pack_environment,
    packed,
    parse_ship_env,
    requirement_closure,
    spark_settings,
)
from placement.pipeline.spark_master import Master, parse_master

FAKE = {
    "app": ["Lib-One>=1", "two; python_version >= '3.0'", "never; python_version < '3.0'"],
    "lib-one": ["three[extra]", "docs-only; extra == 'docs'", "pyspark"],
    "two": [],
    "three": ["two"],
}


def test_the_closure_follows_requirements_whose_markers_hold_and_leaves_spark_out() -> None:
    assert requirement_closure(["App"], FAKE.get) == ["app", "lib-one", "three", "two"]


def test_a_requirement_that_is_not_installed_is_one_error_naming_it() -> None:
    with pytest.raises(InvalidInput, match="--ship-env: the executors need missing"):
        requirement_closure(["app", "missing"], FAKE.get)


def test_names_are_normalised() -> None:
    assert canonical("Typing_Extensions") == canonical("typing.extensions") == "typing-extensions"


@pytest.mark.parametrize(
    ("relative", "kept"),
    [
        ("numpy/core/multiarray.py", True),
        ("numpy-2.0.dist-info/METADATA", True),
        ("pyarrow/libarrow.so.2000", True),
        ("../../bin/f2py", False),
        ("numpy/__pycache__/x.cpython-311.pyc", False),
        ("pandas/tests/frame/test_api.py", False),
        ("numpy/_core/tests/data/x.csv", False),
        ("pkg/tests.py", True),  # a module named tests, not a test suite directory
    ],
)
def test_what_is_packed(relative: str, kept: bool) -> None:
    assert packed(relative) is kept


def test_parse_ship_env(tmp_path: Path) -> None:
    assert parse_ship_env("auto") == ShipEnv("auto")
    assert parse_ship_env(" none ") == ShipEnv("none")
    assert parse_ship_env("hdfs:///envs/p.tar.gz") == ShipEnv("archive", "hdfs:///envs/p.tar.gz")
    archive = tmp_path / "env.tar.gz"
    archive.write_bytes(b"x")
    assert parse_ship_env(str(archive)) == ShipEnv("archive", archive.as_uri())
    assert parse_ship_env(archive.as_uri()) == ShipEnv("archive", archive.as_uri())
    for uri in (f"file:{archive}", f"file://localhost{archive}"):
        assert parse_ship_env(uri) == ShipEnv("archive", archive.as_uri()), uri
    spaced = tmp_path / "a b.tgz"
    spaced.write_bytes(b"x")
    assert parse_ship_env(spaced.as_uri()) == ShipEnv("archive", spaced.as_uri())
    for bad, why in [
        ("", "is empty"),
        (str(tmp_path / "absent.tar.gz"), "is not an archive file"),
        (str(tmp_path), "is not an archive file"),
    ]:
        with pytest.raises(InvalidInput, match=f"--ship-env: .*{why}"):
            parse_ship_env(bad)
    other = tmp_path / "env.txt"
    other.write_text("x")
    with pytest.raises(InvalidInput, match=r"not a \.tar\.gz, \.tgz, \.tar or \.zip"):
        parse_ship_env(str(other))


def test_auto_ships_nothing_to_a_local_master_and_a_given_archive_as_it_is() -> None:
    local = parse_master("local[2]")
    assert archive_for(ShipEnv("auto"), local) == (None, None)
    assert archive_for(ShipEnv("none"), parse_master("spark://h:7077")) == (None, None)
    given = ShipEnv("archive", "hdfs:///e.tar.gz")
    assert archive_for(given, parse_master("yarn")) == ("hdfs:///e.tar.gz", None)


def test_spark_settings_put_ours_first_and_keep_the_users() -> None:
    assert spark_settings("file:///a.tar.gz", {}) == {
        "spark.archives": "file:///a.tar.gz#placement-env",
        "spark.executorEnv.PYTHONPATH": "placement-env/site-packages",
    }
    user = {"spark.archives": "hdfs:///x.zip#x", "spark.executorEnv.PYTHONPATH": "x"}
    assert spark_settings("file:///a.tar.gz", user) == {
        "spark.archives": "file:///a.tar.gz#placement-env,hdfs:///x.zip#x",
        "spark.executorEnv.PYTHONPATH": "placement-env/site-packages:x",
    }


CLUSTER, LOCAL = parse_master("spark://h:7077"), parse_master("local[2]")


def test_an_executor_import_failure_is_one_line_naming_the_option() -> None:
    error = RuntimeError("PythonException: ...\nModuleNotFoundError: No module named 'placement'")
    none = executor_failure(error, ShipEnv("none"), CLUSTER)
    assert none is not None
    assert str(none).startswith(
        "--ship-env: the executors' Python could not import 'placement' with --ship-env none"
    )
    given = executor_failure(error, ShipEnv("archive", "hdfs:///e.tgz"), CLUSTER)
    assert given is not None
    assert "from hdfs:///e.tgz" in str(given)
    assert executor_failure(RuntimeError("Java heap space"), ShipEnv("auto"), CLUSTER) is None


@pytest.mark.parametrize(
    ("text", "master", "expected"),
    [
        (
            "[PYTHON_VERSION_MISMATCH] Python in worker has different version: 3.12 than that"
            " in driver: 3.11, PySpark cannot run with different minor versions.",
            CLUSTER,
            "--spark-conf: the executors' Python is 3.12, the driver's 3.11 (set --spark-conf"
            " spark.pyspark.python=PATH",
        ),
        (
            'java.io.IOException: Cannot run program "/work/.venv/bin/python": error=2, No'
            " such file or directory",
            CLUSTER,
            "--spark-conf: the executors cannot run Python '/work/.venv/bin/python' (set",
        ),
        (
            "java.io.FileNotFoundException: File file:/home/me/export/assignments.parquet does"
            " not exist",
            CLUSTER,
            "--input: the executors cannot read file:/home/me/export/assignments.parquet (put",
        ),
    ],
)
def test_the_executors_failing_to_run_the_product_is_one_line(
    text: str, master: Master, expected: str
) -> None:
    failure = executor_failure(RuntimeError(text), ShipEnv("auto"), master)
    assert failure is not None
    assert str(failure).startswith(expected), str(failure)


def test_a_missing_file_on_a_local_master_is_left_as_it_is() -> None:
    error = RuntimeError("java.io.FileNotFoundException: File file:/x does not exist")
    assert executor_failure(error, ShipEnv("auto"), LOCAL) is None


def test_the_roots_cover_every_distribution_the_executor_side_modules_load() -> None:
    """What an executor unpickles imports the product's Spark modules: every distribution
    they load (in a fresh interpreter), and those placement imports only when it needs them,
    must be packed, or provided by Spark."""
    code = (
        "import sys, json, importlib.metadata as md\n"
        "before = set(sys.modules)\n"
        "import placement.pipeline.spark_plan, placement.pipeline.spark_report, pandas, pyarrow\n"
        "import importlib, placement.algo.network\n"
        "for lazy in placement.algo.network.LAZY_IMPORTS: importlib.import_module(lazy)\n"
        "top = {m.split('.')[0] for m in sys.modules if m not in before}\n"
        "found = md.packages_distributions()\n"
        "print(json.dumps(sorted({d for t in top for d in found.get(t, [])})))\n"
    )
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                       text=True, check=True).stdout)  # fmt: skip
    closure = set(requirement_closure(ship_env.EXECUTOR_ROOTS, ship_env._requires))
    provided = ship_env.SPARK_PROVIDED | {ship_env.PRODUCT_PACKAGE}
    assert {canonical(d) for d in loaded} - closure - provided == set()
    assert {"numpy", "pyarrow", "pandas", "pydantic", "scipy"} <= closure


def test_the_archive_is_packed_once_per_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ship_env, "EXECUTOR_ROOTS", ("typing-extensions",))
    first, fresh = pack_environment(tmp_path)
    assert fresh
    assert first.parent == tmp_path
    assert first.name.startswith("placement-env-")
    again, fresh_again = pack_environment(tmp_path)
    assert (again, fresh_again) == (first, False)
    with tarfile.open(first) as tar:
        names = set(tar.getnames())
    assert "site-packages/placement/__init__.py" in names
    assert "site-packages/placement/pipeline/ship_env.py" in names
    assert "site-packages/typing_extensions.py" in names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary left
    # another content (another root) is another archive
    monkeypatch.setattr(ship_env, "EXECUTOR_ROOTS", ("typing-extensions", "annotated-types"))
    other, fresh_other = pack_environment(tmp_path)
    assert fresh_other
    assert other != first
    # a third content: the cache keeps the newest two
    monkeypatch.setattr(ship_env, "EXECUTOR_ROOTS", ("typing-extensions", "typing-inspection"))
    third, _ = pack_environment(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([other.name, third.name])
    out = tmp_path / "given" / "env.tar.gz"
    assert pack_environment(output=out) == (out, True)
    assert out.is_file()


def test_locations() -> None:
    assert parse_location("plan.json") == Path("plan.json")
    assert parse_location("/tmp/x") == Path("/tmp/x")
    assert parse_location("hdfs://nn:8020/a/b") == "hdfs://nn:8020/a/b"
    assert parse_location("file:///tmp/x") == "file:///tmp/x"
    assert local_path("file:///tmp/a%20b", "--input") == Path("/tmp/a b")
    assert local_path(Path("x"), "--input") == Path("x")
    with pytest.raises(InvalidInput, match="--output: s3a://b/k is read and written through"):
        local_path("s3a://b/k", "--output")
    assert join("s3a://b/dir/", "nodes.parquet") == "s3a://b/dir/nodes.parquet"
    assert join(Path("/d"), "nodes.parquet") == Path("/d/nodes.parquet")
    assert spark_uri(Path("/d/x")) == "file:///d/x"
    assert name_of("hdfs://nn/a/plan.json") == name_of(Path("/a/plan.json")) == "plan.json"


def test_a_given_archive_of_another_environment_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--ship-env PATH``: an archive packed here carries its manifest (the first member);
    one packed from other code or versions is refused before anything runs; an archive not
    packed here (no manifest) and a URI the executors fetch are shipped as they are."""
    monkeypatch.setattr(ship_env, "EXECUTOR_ROOTS", ("typing-extensions",))
    archive, _ = pack_environment(output=tmp_path / "env.tar.gz")
    manifest = ship_env.archive_manifest(archive)
    assert manifest is not None
    assert manifest["digest"] == ship_env.environment_files()[1]
    with tarfile.open(archive) as tar:
        assert tar.getnames()[0] == ship_env.MANIFEST
    cluster = parse_master("spark://h:7077")
    given = ShipEnv("archive", archive.as_uri())
    assert archive_for(given, cluster) == (archive.as_uri(), None)
    # the environment changes (another root: another content) — the archive is stale
    monkeypatch.setattr(ship_env, "EXECUTOR_ROOTS", ("typing-extensions", "annotated-types"))
    with pytest.raises(InvalidInput, match=r"^--ship-env: .*env\.tar\.gz was packed from another"):
        archive_for(given, cluster)
    foreign = tmp_path / "own.tar.gz"
    with tarfile.open(foreign, "w:gz") as tar:
        tar.add(archive, arcname="site-packages/x.bin")
    assert ship_env.archive_manifest(foreign) is None
    assert archive_for(ShipEnv("archive", foreign.as_uri()), cluster)[0] == foreign.as_uri()
    remote = ShipEnv("archive", "hdfs:///envs/env.tar.gz")
    assert archive_for(remote, cluster) == ("hdfs:///envs/env.tar.gz", None)
