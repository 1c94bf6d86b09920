"""``--advertise`` on the real agent and driver commands: the agent registers the advertised
address (its port 0 = the bound port) in etcd, not the bind address; a wildcard --listen without
--advertise, or a wildcard --advertise, exits 2 with one line naming --advertise before anything
binds or is created."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from placement.metastore.codec import decode_node
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 30.0
DRIVER = ["placement", "driver", "run", "--etcd", "127.0.0.1:1"]


async def test_an_agent_registers_the_address_it_advertises(etcd: Any, tmp_path: Path) -> None:
    prefix = f"/t{uuid.uuid4().hex[:12]}/placement"
    args = ["--node", "n1", "--listen", "127.0.0.1:0", "--advertise", "127.0.0.2:0"]
    args += ["--data-dir", str(tmp_path / "n1"), "--etcd", etcd.endpoint, "--prefix", prefix]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "replica",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), TIMEOUT)).decode().strip()
        assert line.startswith("agent n1 listening on 127.0.0.2:"), line
        port = int(line.rsplit(":", 1)[1])
        assert port > 0
        async with EtcdClient([etcd.endpoint]) as client:
            kv = (await client.get(KeySpace(prefix).node("n1"))).first()
            assert kv is not None
            assert decode_node(kv.value).address == f"127.0.0.2:{port}"
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), TIMEOUT)


@pytest.mark.parametrize(
    ("command", "words"),
    [
        (["replica", "--node", "n1", "--listen", "0.0.0.0:0"], "binds every interface"),
        (
            ["replica", "--node", "n1", "--listen", "127.0.0.1:0", "--advertise", "[::]:1"],
            "wildcard",
        ),
        ([*DRIVER, "--listen", "0.0.0.0:0"], "binds every interface"),
        (
            [*DRIVER, "--listen", "127.0.0.1:0", "--advertise", "0.0.0.0:0"],
            "wildcard",
        ),
    ],
)
async def test_a_wildcard_is_refused_before_anything_binds(
    tmp_path: Path, command: list[str], words: str
) -> None:
    data_dir = tmp_path / "data"
    extra = ["--data-dir", str(data_dir)] if command[0] == "replica" else []
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        *command,
        *extra,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 2, err.decode()
    assert len(lines) == 1, lines
    assert "--advertise" in lines[0]
    assert words in lines[0]
    assert out == b""
    assert not data_dir.exists()
