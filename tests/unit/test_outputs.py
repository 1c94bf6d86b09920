"""``placement.pipeline.outputs``: outputs appear whole, with the permissions of a plain
``open``/``mkdir`` under the umask (an export must be readable by executors running as another
user; the temporaries are private)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from placement.pipeline.outputs import atomic_directory, atomic_text_file


@pytest.fixture
def umask_022() -> Iterator[None]:
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_outputs_get_the_umask_permissions_not_the_temporaries(
    tmp_path: Path, umask_022: None
) -> None:
    with atomic_text_file(tmp_path / "plan.json", "--output") as f:
        f.write("{}")
    assert mode(tmp_path / "plan.json") == 0o644
    with atomic_directory(tmp_path / "export", "--out") as directory:
        (directory / "nodes.parquet").write_bytes(b"x")
    assert mode(tmp_path / "export") == 0o755
    with atomic_directory(tmp_path / "export", "--out") as directory:  # replacing the old one
        (directory / "zones.parquet").write_bytes(b"x")
    assert mode(tmp_path / "export") == 0o755
    assert [p.name for p in (tmp_path / "export").iterdir()] == ["zones.parquet"]
    os.umask(0o077)
    with atomic_text_file(tmp_path / "private.json", "--output") as f:
        f.write("{}")
    assert mode(tmp_path / "private.json") == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "plan.json", "private.json"]
