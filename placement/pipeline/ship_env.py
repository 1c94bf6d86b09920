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

import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from placement.errors import InvalidInput
from placement.pipeline.locations import local_path, parse_location
from placement.pipeline.spark_master import Master

# hashlib, tarfile, json and sysconfig are imported where they are used: this module is
# loaded by every ``placectl plan``, the local engine's included (about 10 ms of start-up).

#: What the executors import beyond the product: the plan's and the report's Arrow functions
#: (numpy, pyarrow, pydantic, orjson through the product's modules; scipy when a placement
#: computes its joint bound, ``placement.algo.network.LAZY_IMPORTS``) and PySpark's Arrow
#: serializers (pandas). ``tests/unit/test_ship_env.py`` checks that this covers every
#: distribution the executor-side modules load.
EXECUTOR_ROOTS = ("numpy", "pyarrow", "pandas", "pydantic", "orjson", "scipy")
#: Provided by the cluster's Spark installation, in its own version.
SPARK_PROVIDED = frozenset({"pyspark", "py4j"})
#: The name the archive is unpacked under in each executor's working directory.
ALIAS = "placement-env"
#: The product's package, packed from wherever it is imported from (an editable checkout too).
PRODUCT_PACKAGE = "placement"
_FIX = (
    "use --ship-env auto, none, or the path or URI of an archive from `placectl pipeline pack-env`"
)
_FORMAT = 1  # bump when the archive's layout changes


@dataclass(frozen=True, slots=True)
class ShipEnv:
    """A parsed ``--ship-env``: ``mode`` is ``auto``, ``none`` or ``archive`` (then ``archive``
    is the path or URI to ship)."""

    mode: str
    archive: str = ""


def parse_ship_env(text: str) -> ShipEnv:
    """Validates ``--ship-env`` (a local archive or ``file:`` URI must exist; another URI is
    Spark's to fetch)."""
    value = text.strip()
    if value in ("auto", "none"):
        return ShipEnv(value)
    if not value:
        raise InvalidInput("--ship-env", "is empty", _FIX)
    location = parse_location(value)
    try:
        path = local_path(location, "--ship-env")
    except InvalidInput:  # hdfs:, s3a: ...: the executors fetch it
        return ShipEnv("archive", value)
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
    if dist.files is None:
        raise InvalidInput(
            "--ship-env",
            f"{name} is installed without a file list (RECORD), so it cannot be packed",
            "install it with pip, or pack an environment yourself and pass --ship-env PATH",
        )
    for entry in dist.files:
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

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:  # the product run from a source tree
        return "unknown"


def environment_files() -> tuple[list[tuple[str, Path]], str]:
    """Every file the archive holds (path inside ``site-packages``, source) and the digest of
    what they are: Python version, platform, each distribution's version, the product's files'
    contents."""
    import hashlib
    import sysconfig

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
    import io
    import json
    import tarfile
    import tempfile

    files, digest = environment_files()
    if output is None:
        directory = directory or cache_dir()
        output = directory / f"{ALIAS}-{_version(PRODUCT_PACKAGE)}-{digest}.tar.gz"
        if output.is_file():
            return output, False
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
        os.close(handle)
    except OSError as e:
        raise InvalidInput(
            "--ship-env",
            f"cannot write the executors' environment in {output.parent}: {e.strerror or e}",
            "set XDG_CACHE_HOME to a writable directory, or pack one with"
            " `placectl pipeline pack-env --out FILE` and pass --ship-env FILE",
        ) from e
    try:
        # level 1: the archive is built once per content and unpacked on every executor; the
        # stronger levels cost several times the time for a few percent of size
        with tarfile.open(temporary, "w:gz", compresslevel=1) as tar:
            manifest = json.dumps(_manifest(digest), sort_keys=True).encode()
            entry = tarfile.TarInfo(MANIFEST)
            entry.size, entry.mode = len(manifest), 0o644
            tar.addfile(entry, io.BytesIO(manifest))  # first: read without unpacking the rest
            for relative, path in files:
                tar.add(path, arcname=f"site-packages/{relative}", recursive=False)
        os.chmod(temporary, 0o644)
        os.replace(temporary, output)
    except OSError as e:
        Path(temporary).unlink(missing_ok=True)
        raise InvalidInput(
            "--ship-env",
            f"cannot write the executors' environment {output}: {e.strerror or e}",
            "free space there, or set XDG_CACHE_HOME to another directory",
        ) from e
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
    dated = []
    for path in directory.glob(f"{ALIAS}-*.tar.gz"):
        try:
            if path != packed_now:
                dated.append((path.stat().st_mtime, path))
        except OSError:  # another placectl pruned it meanwhile
            continue
    for _, old in sorted(dated, reverse=True)[KEEP - 1 :]:
        old.unlink(missing_ok=True)


def spark_settings(archive_uri: str, conf: Mapping[str, str]) -> dict[str, str]:
    """The Spark settings that ship ``archive_uri`` to the executors and put its
    ``site-packages`` on their Python workers' path (after PySpark's own); the user's own
    ``spark.archives`` and ``spark.executorEnv.PYTHONPATH`` (from ``conf``) are kept after
    ours."""
    archives = [f"{archive_uri}#{ALIAS}"]
    if conf.get("spark.archives"):
        archives.append(conf["spark.archives"])
    path = [f"{ALIAS}/site-packages"]
    if conf.get("spark.executorEnv.PYTHONPATH"):
        path.append(conf["spark.executorEnv.PYTHONPATH"])
    return {"spark.archives": ",".join(archives), "spark.executorEnv.PYTHONPATH": ":".join(path)}


#: The archive's first member: what it was packed from.
MANIFEST = "placement-env.json"


def _manifest(digest: str) -> dict[str, str]:
    import sysconfig

    return {
        "digest": digest,
        "product": _version(PRODUCT_PACKAGE),
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "platform": sysconfig.get_platform(),
    }


def archive_manifest(path: Path) -> dict[str, str] | None:
    """The manifest of an archive this module packed (its first member, read without
    unpacking the rest); None for another archive or an unreadable one."""
    import json
    import tarfile

    try:
        with tarfile.open(path, "r|*") as tar:
            first = tar.next()
            if first is None or first.name != MANIFEST:
                return None
            handle = tar.extractfile(first)
            found = json.loads(handle.read()) if handle is not None else None
    except (OSError, tarfile.TarError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def check_archive(path: Path) -> None:
    """Refuses (``--ship-env``) an archive packed from another environment — other product
    code or versions would run on the executors and the plan could differ from the local
    engine's. An archive without a manifest (not packed here) is shipped as it is."""
    manifest = archive_manifest(path)
    if manifest is None:
        return
    digest = environment_files()[1]
    if manifest.get("digest") != digest:
        raise InvalidInput(
            "--ship-env",
            f"{path} was packed from another environment (product {manifest.get('product')},"
            f" Python {manifest.get('python')}, digest {manifest.get('digest')}; this one is"
            f" {_version(PRODUCT_PACKAGE)}, Python {_manifest(digest)['python']}, digest {digest})",
            "pack it again here: placectl pipeline pack-env --out FILE (or use --ship-env auto)",
        )


def archive_for(ship: ShipEnv, master: Master) -> tuple[str | None, Path | None]:
    """What to ship for ``ship`` on ``master``: the archive's URI (None: nothing) and the
    archive if it was packed just now (None: given, cached, or nothing shipped). A given local
    archive is checked against this environment first (:func:`check_archive`)."""
    if ship.mode == "archive":
        try:
            given = local_path(parse_location(ship.archive), "--ship-env")
        except InvalidInput:  # a URI the executors fetch (hdfs:, s3a: ...): not read here
            return ship.archive, None
        check_archive(given)
        return ship.archive, None
    if ship.mode == "none" or master.local:
        return None, None
    path, fresh = pack_environment()
    return path.as_uri(), path if fresh else None


_MISSING = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")
_VERSION = re.compile(r"Python in worker has different version: (\S+) than that in driver: (\S+),")
_CANNOT_RUN = re.compile(r'Cannot run program "([^"]+)"')
_NO_PATH = re.compile(r"(?:FileNotFoundException|PATH_NOT_FOUND)\]?:? *(?:File )?(\S+)")
_PYTHON_FIX = (
    "set --spark-conf spark.pyspark.python=PATH (or $PYSPARK_PYTHON) to a Python of the"
    " driver's minor version on the executors"
)


def executor_failure(error: BaseException, ship: ShipEnv, master: Master) -> InvalidInput | None:
    """A Spark job that failed because the executors could not run the product — a module
    their Python could not import, a Python of another minor version or none at all, an input
    they cannot read — as the one-line error naming the option to change (None: another
    failure, left as it is)."""
    text = str(error)
    if found := _MISSING.search(text):
        module = found.group(1)
        if ship.mode == "none":
            why, fix = " with --ship-env none", "use --ship-env auto, or install the product there"
        elif ship.mode == "archive":
            why = f" from {ship.archive}"
            fix = "pack a new one: placectl pipeline pack-env --out FILE"
        else:
            why, fix = "", _PYTHON_FIX
        return InvalidInput(
            "--ship-env", f"the executors' Python could not import {module!r}{why}", fix
        )
    if found := _VERSION.search(text):
        worker, driver = found.groups()
        return InvalidInput(
            "--spark-conf",
            f"the executors' Python is {worker}, the driver's {driver}",
            _PYTHON_FIX,
        )
    if found := _CANNOT_RUN.search(text):
        return InvalidInput(
            "--spark-conf", f"the executors cannot run Python {found.group(1)!r}", _PYTHON_FIX
        )
    if not master.local and (found := _NO_PATH.search(text)):
        return InvalidInput(
            "--input",
            f"the executors cannot read {found.group(1).rstrip('.')}",
            "put the input on storage every executor reads (hdfs:, s3a:, a shared mount)",
        )
    return None
