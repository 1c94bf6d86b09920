"""``--ship-env``: the Python environment the Spark engine's executors run (design/pipeline.md,
"Shipping the environment").

Executors of a cluster the product does not control have Python and Java but not the product:
the Spark engine packs what they import — the ``placement`` package and the distributions in
the requirement closure of :data:`EXECUTOR_ROOTS`, taken from the driver's own environment, so
executors run exactly the versions the driver does — into one ``.tar.gz`` (``site-packages/``
inside), once per content: the archive's name carries a digest of the Python version, the
platform, every packed distribution's version and the product's files, and it is kept in a cache
directory. Spark ships it as ``spark.archives`` (unpacked as :data:`ALIAS` in each executor's
working directory) and puts its ``site-packages`` on the Python workers' ``PYTHONPATH``. PySpark
and py4j are not packed: the cluster's Spark provides them, in its own version.

``auto`` (the default) packs for a cluster master and ships nothing for ``local[...]`` (the
executors are this interpreter); ``none`` ships nothing (the executors have the product
installed); a path or URI ships that archive (``placectl pipeline pack-env`` makes one, to be
uploaded where a cluster reads it, e.g. HDFS).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from placement.errors import InvalidInput
from placement.pipeline.spark_master import Master

#: What the executors import beyond the product: the plan's and the report's Arrow functions
#: (numpy, pyarrow, pydantic, orjson through the product's modules) and PySpark's Arrow
#: serializers (pandas). ``tests/unit/test_ship_env.py`` checks that this covers every
#: distribution the executor-side modules load.
EXECUTOR_ROOTS = ("numpy", "pyarrow", "pandas", "pydantic", "orjson")
#: Provided by the cluster's Spark installation, in its own version.
SPARK_PROVIDED = frozenset({"pyspark", "py4j"})
#: The name the archive is unpacked under in each executor's working directory.
ALIAS = "placement-env"
#: The product's package, packed from wherever it is imported from (an editable checkout too).
PRODUCT_PACKAGE = "placement"
_FIX = (
    "use --ship-env auto, none, or the path or URI of an archive from `placectl pipeline pack-env`"
)
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_FORMAT = 1  # bump when the archive's layout changes


@dataclass(frozen=True, slots=True)
class ShipEnv:
    """A parsed ``--ship-env``: ``mode`` is ``auto``, ``none`` or ``archive`` (then ``archive``
    is the path or URI to ship)."""

    mode: str
    archive: str = ""


def parse_ship_env(text: str) -> ShipEnv:
    """Validates ``--ship-env`` (a local archive must exist; a URI is Spark's to fetch)."""
    value = text.strip()
    if value in ("auto", "none"):
        return ShipEnv(value)
    if not value:
        raise InvalidInput("--ship-env", "is empty", _FIX)
    if _URI.match(value) and not value.startswith("file:"):
        return ShipEnv("archive", value)
    path = Path(value.removeprefix("file://") if value.startswith("file://") else value)
    if not path.is_file():
        raise InvalidInput("--ship-env", f"{value!r} is not an archive file", _FIX)
    if not path.name.endswith((".tar.gz", ".tgz", ".tar", ".zip")):
        raise InvalidInput(
            "--ship-env", f"{value!r} is not a .tar.gz, .tgz, .tar or .zip archive", _FIX
        )
    return ShipEnv("archive", path.resolve().as_uri())


# -- which distributions (pure, given how to read a distribution's requirements) ---------------

#: name -> the ``Requires-Dist`` lines of that installed distribution (None: not installed).
Requires = Callable[[str], Sequence[str] | None]


def canonical(name: str) -> str:
    """PEP 503's normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_closure(roots: Iterable[str], requires: Requires) -> list[str]:
    """The installed distributions ``roots`` need, transitively (requirements whose markers
    hold here and that name no extra), without :data:`SPARK_PROVIDED`; sorted, canonical."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [canonical(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen or name in SPARK_PROVIDED:
            continue
        lines = requires(name)
        if lines is None:
            raise InvalidInput(
                "--ship-env",
                f"the executors need {name}, which is not installed here",
                "pip install 'placement[pipeline]' -c constraints.txt",
            )
        seen.add(name)
        for line in lines:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonical(requirement.name))
    return sorted(seen)


def packed(relative: str) -> bool:
    """Whether a distribution's file goes into the archive: not outside site-packages
    (scripts), not bytecode, not test suites."""
    parts = relative.replace("\\", "/").split("/")
    return not (
        parts[0] == ".."
        or "__pycache__" in parts
        or relative.endswith((".pyc", ".pyo"))
        or "tests" in parts[:-1]
    )


# -- the archive ---------------------------------------------------------------------------------


def _requires(name: str) -> Sequence[str] | None:
    from importlib import metadata

    try:
        return metadata.distribution(name).requires or []
    except metadata.PackageNotFoundError:
        return None


def _distribution_files(name: str) -> Iterator[tuple[str, Path]]:
    """(path inside site-packages, file) of one installed distribution's packed files."""
    from importlib import metadata

    dist = metadata.distribution(name)
    for entry in dist.files or ():
        relative = str(entry)
        if packed(relative):
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                yield relative, path


def _product_files() -> Iterator[tuple[str, Path]]:
    import placement

    root = Path(placement.__file__).resolve().parent
    for path in sorted(root.rglob("*")):
        relative = f"{PRODUCT_PACKAGE}/{path.relative_to(root).as_posix()}"
        if path.is_file() and packed(relative):
            yield relative, path


def _version(name: str) -> str:
    from importlib import metadata

    return metadata.version(name)


def environment_files() -> tuple[list[tuple[str, Path]], str]:
    """Every file the archive holds (path inside ``site-packages``, source) and the digest of
    what they are: Python version, platform, each distribution's version, the product's files'
    contents."""
    digest = hashlib.sha256(f"{_FORMAT} {sys.version_info[:2]} {sysconfig.get_platform()}".encode())
    files: list[tuple[str, Path]] = []
    for name in requirement_closure(EXECUTOR_ROOTS, _requires):
        digest.update(f"\n{name}=={_version(name)}".encode())
        files.extend(_distribution_files(name))
    for relative, path in _product_files():
        digest.update(f"\n{relative}\0".encode() + path.read_bytes())
        files.append((relative, path))
    return files, digest.hexdigest()[:16]


def cache_dir() -> Path:
    """Where packed environments are kept: ``$XDG_CACHE_HOME/placement/spark-env`` (default
    ``~/.cache/...``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "placement" / "spark-env"


def pack_environment(
    directory: Path | None = None, output: Path | None = None
) -> tuple[Path, bool]:
    """The archive of this environment: the cached one when its content is unchanged, else
    packed now (written to a temporary file and renamed, so a cache never holds half an
    archive). ``output``: write exactly there instead (always packed). Returns the archive and
    whether it was packed now."""
    files, digest = environment_files()
    if output is None:
        directory = directory or cache_dir()
        output = directory / f"{ALIAS}-{_version(PRODUCT_PACKAGE)}-{digest}.tar.gz"
        if output.is_file():
            return output, False
    output.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    os.close(handle)
    try:
        # level 1: the archive is built once per content and unpacked on every executor; the
        # stronger levels cost several times the time for a few percent of size
        with tarfile.open(temporary, "w:gz", compresslevel=1) as tar:
            for relative, path in files:
                tar.add(path, arcname=f"site-packages/{relative}", recursive=False)
        os.chmod(temporary, 0o644)
        os.replace(temporary, output)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    if directory is not None:
        _prune(directory, output)
    return output, True


#: Archives kept in the cache: the one just packed and the newest before it (a run of the
#: previous version may still be shipping it); each is about 90 MiB.
KEEP = 2


def _prune(directory: Path, packed_now: Path) -> None:
    """Removes all but the :data:`KEEP` newest archives of the cache."""
    archives = sorted(
        (p for p in directory.glob(f"{ALIAS}-*.tar.gz") if p != packed_now),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in archives[KEEP - 1 :]:
        old.unlink(missing_ok=True)


def spark_settings(archive_uri: str, conf: Mapping[str, str]) -> dict[str, str]:
    """The Spark settings that ship ``archive_uri`` to the executors and put its
    ``site-packages`` first on their Python workers' path; the user's own ``spark.archives``
    and ``spark.executorEnv.PYTHONPATH`` (from ``conf``) are kept after ours."""
    archives = [f"{archive_uri}#{ALIAS}"]
    if conf.get("spark.archives"):
        archives.append(conf["spark.archives"])
    path = [f"{ALIAS}/site-packages"]
    if conf.get("spark.executorEnv.PYTHONPATH"):
        path.append(conf["spark.executorEnv.PYTHONPATH"])
    return {"spark.archives": ",".join(archives), "spark.executorEnv.PYTHONPATH": ":".join(path)}


def archive_for(ship: ShipEnv, master: Master) -> tuple[str | None, Path | None]:
    """What to ship for ``ship`` on ``master``: the archive's URI (None: nothing) and the
    archive if it was packed just now (None: given, cached, or nothing shipped)."""
    if ship.mode == "archive":
        return ship.archive, None
    if ship.mode == "none" or master.local:
        return None, None
    path, fresh = pack_environment()
    return path.as_uri(), path if fresh else None


_MISSING = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")


def missing_on_executors(error: BaseException, ship: ShipEnv) -> InvalidInput | None:
    """A Spark job that failed because the executors' Python could not import a module, as
    the one-line error naming ``--ship-env`` (None: another failure)."""
    found = _MISSING.search(str(error))
    if found is None:
        return None
    module = found.group(1)
    if ship.mode == "none":
        why, fix = "with --ship-env none", "use --ship-env auto, or install the product there"
    elif ship.mode == "archive":
        why, fix = f"from {ship.archive}", "pack a new one: placectl pipeline pack-env --out FILE"
    else:
        why, fix = "", "set spark.pyspark.python to a Python of this version on the executors"
    return InvalidInput(
        "--ship-env",
        f"the executors' Python could not import {module!r}{' ' + why if why else ''}",
        fix,
    )
