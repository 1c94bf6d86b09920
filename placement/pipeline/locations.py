"""Where the pipeline reads and writes: a local path, or a Hadoop/Spark URI (``file:``,
``hdfs:``, ``s3a:``, ``gs:``, ``abfs:`` ...) that only the Spark engine reads and writes, through
the Hadoop FileSystem of Spark's JVM (design/pipeline.md, "Storage").

Pure: parsing and joining; the I/O is :mod:`placement.pipeline.hadoop_fs`.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from placement.errors import InvalidInput

#: ``scheme:`` followed by ``//`` or ``/``: a URI (a Windows drive letter is never one here).
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")

#: A local path, or a URI kept as text.
Location = Path | str


def parse_location(text: str) -> Location:
    """A URI stays text; anything else is a local path."""
    return text if _URI.match(text) else Path(text)


def is_uri(location: Location) -> bool:
    return isinstance(location, str)


def local_path(location: Location, option: str) -> Path:
    """The local path of ``location`` for code that reads or writes local files (the local
    engine, the report's renderer): a path as it is, a ``file:`` URI as its path; any other URI
    is InvalidInput naming ``option``."""
    if isinstance(location, Path):
        return location
    parts = urlsplit(location)
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return Path(unquote(parts.path))
    raise InvalidInput(
        option,
        f"{location} is read and written through Spark",
        "add --engine spark (the local engine uses local paths and file: URIs)",
    )


def join(base: Location, name: str) -> Location:
    """``name`` inside the directory ``base``."""
    return base / name if isinstance(base, Path) else f"{base.rstrip('/')}/{name}"


def spark_uri(location: Location) -> str:
    """What Spark reads: a URI as it is, a local path as an absolute ``file:`` URI."""
    return location if isinstance(location, str) else location.resolve().as_uri()


def name_of(location: Location) -> str:
    """The last component (an output's file or directory name)."""
    if isinstance(location, Path):
        return location.name
    return urlsplit(location).path.rstrip("/").rpartition("/")[2]


def as_location(value: Path | str) -> Location:
    """A path as it is; text parsed (:func:`parse_location`)."""
    return value if isinstance(value, Path) else parse_location(value)
