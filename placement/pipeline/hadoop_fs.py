"""Reading and writing URIs through the Hadoop FileSystem of a running Spark's JVM — the
storage layer Spark itself uses, so every scheme Spark is configured for (``file:``, ``hdfs:``,
``s3a:`` with ``hadoop-aws`` on the classpath, ...) works the same, with the same ``--spark-conf
spark.hadoop.*`` settings (design/pipeline.md, "Storage").

Writes are made whole under a temporary name in the target's directory; at the end an existing
output is renamed aside, the new one renamed in and the old one deleted (put back if the new one
could not be renamed in), as the local outputs are (:mod:`placement.pipeline.outputs`): each
rename atomic where the file system's is (HDFS, local), a copy on object stores. Every failure of
the store is one InvalidInput line naming the option.
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
        with _storage_error(option, "look at", uri):
            if not fs.exists(path):
                return None
            return "dir" if fs.getFileStatus(path).isDirectory() else "file"

    def read_bytes(self, uri: str, option: str) -> bytes:
        fs, path = self._fs(uri, option)
        with _storage_error(option, "read", uri):
            stream = fs.open(path)
            try:
                return bytes(stream.readAllBytes())
            finally:
                stream.close()

    def check_target(self, uri: str, option: str, *, directory: bool) -> None:
        """Raises InvalidInput unless ``uri`` can be written (its parent exists; a file is not
        written over a directory, nor a directory over a file)."""
        fs, path = self._fs(uri, option)
        parent = path.getParent()
        if parent is None:
            raise InvalidInput(option, f"{uri} has no parent directory", "name a path inside one")
        with _storage_error(option, "look at", uri):
            if not fs.exists(parent):
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
        """A temporary path beside ``uri`` that replaces it if the block ends without error,
        as :func:`placement.pipeline.outputs.atomic_directory` does locally: an existing output
        is renamed aside first, the new one renamed in, then the old one deleted — and put
        back if the new one could not be renamed in."""
        self.check_target(uri, option, directory=directory)
        fs, path = self._fs(uri, option)
        tag = uuid.uuid4().hex[:12]
        Path_ = self._jvm.org.apache.hadoop.fs.Path
        temporary = Path_(path.getParent(), f".{name_of(uri)}.{tag}")
        aside = Path_(path.getParent(), f".{name_of(uri)}.old.{tag}")
        try:
            yield temporary
            with _storage_error(option, "replace", uri):
                moved = bool(fs.exists(path))
                if moved and not fs.rename(path, aside):
                    raise InvalidInput(option, f"could not move {uri} aside", _FIX_WRITE)
                try:
                    if not fs.rename(temporary, path):
                        raise InvalidInput(
                            option, f"could not rename the output to {uri}", _FIX_WRITE
                        )
                except BaseException:
                    if moved:  # the old output back where it was
                        with contextlib.suppress(Exception):
                            fs.rename(aside, path)
                    raise
                if moved:
                    fs.delete(aside, True)
        except BaseException:
            with contextlib.suppress(Exception):
                fs.delete(temporary, True)
            raise

    def write_text_parts(self, uri: str, option: str, parts: Iterable[str]) -> None:
        """Writes the concatenation of ``parts`` (UTF-8) as the file ``uri``."""
        fs, _ = self._fs(uri, option)
        with self._replacing(uri, option, directory=False) as temporary:
            with _storage_error(option, "write", uri):
                out = fs.create(temporary, True)
            try:
                pending: list[bytes] = []
                size = 0
                for part in parts:
                    data = part.encode()
                    pending.append(data)
                    size += len(data)
                    if size >= CHUNK:
                        with _storage_error(option, "write", uri):
                            out.write(bytearray(b"".join(pending)))
                        pending, size = [], 0
                with _storage_error(option, "write", uri):
                    if pending:
                        out.write(bytearray(b"".join(pending)))
            finally:
                with contextlib.suppress(Exception):
                    out.close()

    def put_directory(self, local: Path, uri: str, option: str) -> None:
        """Copies the local directory ``local`` to ``uri`` (replacing what is there)."""
        fs, _ = self._fs(uri, option)
        source = self._jvm.org.apache.hadoop.fs.Path(local.resolve().as_uri())
        with (
            self._replacing(uri, option, directory=True) as temporary,
            _storage_error(option, "write", uri),
        ):
            fs.copyFromLocalFile(False, True, source, temporary)


_FIX_WRITE = "check the permissions and the store's --spark-conf spark.hadoop.* settings"


@contextlib.contextmanager
def _storage_error(option: str, what: str, uri: str) -> Iterator[None]:
    """A failure of the JVM's file system (permission, connection, a store's refusal) as the
    one-line InvalidInput naming ``option``."""
    try:
        yield
    except InvalidInput:
        raise
    except Exception as e:  # py4j's Py4JJavaError, or a network error talking to the JVM
        raise InvalidInput(option, f"cannot {what} {uri}: {first_line(e)}", _FIX_WRITE) from e


def first_line(error: BaseException) -> str:
    """The line of a (py4j) error worth showing: the Java exception's, else the first."""
    text = str(error).strip()
    # py4j errors carry the Java exception's message after a header line
    for line in text.splitlines():
        if "Exception:" in line:
            return line.strip()
    return text.splitlines()[0] if text else repr(error)
