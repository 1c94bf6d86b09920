"""Reading and writing URIs through the Hadoop FileSystem of a running Spark's JVM — the
storage layer Spark itself uses, so every scheme Spark is configured for (``file:``, ``hdfs:``,
``s3a:`` with ``hadoop-aws`` on the classpath, ...) works the same, with the same ``--spark-conf
spark.hadoop.*`` settings (design/pipeline.md, "Storage").

Writes are made whole under a temporary name in the target's directory and renamed over the
target at the end, as the local outputs are (:mod:`placement.pipeline.outputs`): atomic where
the file system's rename is (HDFS, local), a copy on object stores.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from placement.errors import InvalidInput
from placement.pipeline.locations import name_of

#: Text is sent to the JVM in chunks of about this many bytes (one py4j call each).
CHUNK = 4 << 20


class HadoopFs:
    """The JVM's Hadoop FileSystem for URIs, with the session's Hadoop configuration."""

    def __init__(self, spark: SparkSession) -> None:
        self._jvm: Any = spark.sparkContext._jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()

    def _fs(self, uri: str, option: str) -> tuple[Any, Any]:
        path = self._jvm.org.apache.hadoop.fs.Path(uri)
        try:
            fs = path.getFileSystem(self._conf)
            fs.setWriteChecksum(False)  # no ``.NAME.crc`` beside local files (file: URIs)
            return fs, path
        except Exception as e:  # no file system for the scheme, bad authority, ...
            raise InvalidInput(
                option,
                f"cannot open {uri}: {first_line(e)}",
                "check the URI's scheme and its --spark-conf spark.hadoop.* settings",
            ) from e

    def kind(self, uri: str, option: str) -> str | None:
        """``"dir"``, ``"file"``, or None when nothing is there."""
        fs, path = self._fs(uri, option)
        if not fs.exists(path):
            return None
        return "dir" if fs.getFileStatus(path).isDirectory() else "file"

    def read_bytes(self, uri: str, option: str) -> bytes:
        fs, path = self._fs(uri, option)
        try:
            stream = fs.open(path)
            try:
                return bytes(stream.readAllBytes())
            finally:
                stream.close()
        except Exception as e:
            raise InvalidInput(
                option, f"cannot read {uri}: {first_line(e)}", "pass a readable file"
            ) from e

    def check_target(self, uri: str, option: str, *, directory: bool) -> None:
        """Raises InvalidInput unless ``uri`` can be written (its parent exists; a file is not
        written over a directory, nor a directory over a file)."""
        fs, path = self._fs(uri, option)
        parent = path.getParent()
        if parent is not None and not fs.exists(parent):
            raise InvalidInput(
                option, f"directory {parent.toString()} does not exist", "create it first"
            )
        kind = self.kind(uri, option)
        if kind == "dir" and not directory:
            raise InvalidInput(option, f"{uri} is a directory", "name a file")
        if kind == "file" and directory:
            raise InvalidInput(option, f"{uri} is a file", "name a directory (it is replaced)")

    @contextlib.contextmanager
    def _replacing(self, uri: str, option: str, *, directory: bool) -> Iterator[Any]:
        """A temporary path beside ``uri``, renamed over it if the block ends without error."""
        self.check_target(uri, option, directory=directory)
        fs, path = self._fs(uri, option)
        temporary = self._jvm.org.apache.hadoop.fs.Path(
            path.getParent(), f".{name_of(uri)}.{uuid.uuid4().hex[:12]}"
        )
        try:
            yield temporary
            if fs.exists(path):
                fs.delete(path, True)
            if not fs.rename(temporary, path):
                raise InvalidInput(
                    option, f"could not rename the new output to {uri}", "check permissions"
                )
        except BaseException:
            with contextlib.suppress(Exception):
                fs.delete(temporary, True)
            raise

    def write_text_parts(self, uri: str, option: str, parts: Iterable[str]) -> None:
        """Writes the concatenation of ``parts`` (UTF-8) as the file ``uri``."""
        fs, _ = self._fs(uri, option)
        with self._replacing(uri, option, directory=False) as temporary:
            out = fs.create(temporary, True)
            try:
                pending: list[bytes] = []
                size = 0
                for part in parts:
                    data = part.encode()
                    pending.append(data)
                    size += len(data)
                    if size >= CHUNK:
                        out.write(bytearray(b"".join(pending)))
                        pending, size = [], 0
                if pending:
                    out.write(bytearray(b"".join(pending)))
            finally:
                out.close()

    def put_directory(self, local: Path, uri: str, option: str) -> None:
        """Copies the local directory ``local`` to ``uri`` (replacing what is there)."""
        fs, _ = self._fs(uri, option)
        source = self._jvm.org.apache.hadoop.fs.Path(local.resolve().as_uri())
        with self._replacing(uri, option, directory=True) as temporary:
            fs.copyFromLocalFile(False, True, source, temporary)


def first_line(error: BaseException) -> str:
    """The line of a (py4j) error worth showing: the Java exception's, else the first."""
    text = str(error).strip()
    # py4j errors carry the Java exception's message after a header line
    for line in text.splitlines():
        if "Exception:" in line:
            return line.strip()
    return text.splitlines()[0] if text else repr(error)
