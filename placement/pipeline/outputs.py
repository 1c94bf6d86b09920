"""Writing outputs so that a failed run leaves nothing behind and an existing output untouched.

Files: a temporary file in the target's directory, renamed over the target at the end. Directories:
a temporary sibling directory, swapped in at the end (the old one is removed only after the new
one is in place). Both get the permissions a plain ``open``/``mkdir`` would give under the
process's umask — not the temporary's private 0600/0700 — so that an export can be read by the
Spark executors of a cluster that run as another user (design/pipeline.md, "Storage").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from placement.errors import InvalidInput


def check_target(path: Path, option: str, *, directory: bool) -> None:
    """Raises InvalidInput (naming ``option``) unless ``path`` can be written as planned."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InvalidInput(option, f"directory {parent} does not exist", "create it first")
    if directory and path.exists() and not path.is_dir():
        raise InvalidInput(option, f"{path} is a file", "name a directory (it is replaced)")
    if not directory and path.is_dir():
        raise InvalidInput(option, f"{path} is a directory", "name a file")


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it (``os.umask`` can
    only be read by setting it, for a moment, for every thread)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _as_created(path: Path, mode: int) -> None:
    """``path`` gets ``mode`` under the umask (a new file 0666, a directory 0777)."""
    os.chmod(path, mode & ~_umask())


@contextlib.contextmanager
def atomic_text_file(path: Path, option: str) -> Iterator[Any]:
    """A text handle whose content replaces ``path`` only if the block ends without error."""
    check_target(path, option, directory=False)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.", dir=path.parent if str(path.parent) else "."
    )
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
        _as_created(Path(tmp), 0o666)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_parts(path: Path, option: str, parts: Iterable[str]) -> None:
    with atomic_text_file(path, option) as f:
        for part in parts:
            f.write(part)


@contextlib.contextmanager
def atomic_directory(path: Path, option: str) -> Iterator[Path]:
    """A fresh directory that replaces ``path`` only if the block ends without error."""
    check_target(path, option, directory=True)
    parent = path.parent if str(path.parent) else Path(".")
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=parent))
    try:
        yield tmp
        _as_created(tmp, 0o777)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=parent))
            os.replace(path, old / "x")
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
