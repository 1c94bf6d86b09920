"""``placectl up`` from the repository: a working cluster, and nothing left after Ctrl-C/SIGTERM.

``up`` runs as a subprocess in its own session (like a shell job): it prints ``started NAME pid
N`` for every child; after the signal the test checks by PID and process group that none of them
(and nothing else mentioning its data dir) remains.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from placement.local.certs import LocalPki
from placement.local.cluster import STOP_DEADLINE, STOP_GRACE, Child, stop_together

EVENTUALLY = 60.0 * float(os.environ.get("CI_TIME_MULTIPLIER", "1"))


def _ignore_sigint() -> None:
    """In the child before exec: what a non-interactive shell does for a ``&`` job."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Up:
    def __init__(self, data_dir: Path, *extra: str, sigint_ignored: bool = False) -> None:
        self.data_dir = data_dir
        self.extra = extra
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "placement",
                "up",
                "--api-port",
                "0",
                "--data-dir",
                str(data_dir),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=_ignore_sigint if sigint_ignored else None,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.pids: dict[str, int] = {}
        self.endpoint = ""

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_up(self) -> None:
        deadline = time.monotonic() + EVENTUALLY
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1.0)
            except queue.Empty:
                assert self.proc.poll() is None, "".join(self.output)
                continue
            self.output.append(line)
            words = line.split()
            if words[:1] == ["started"] and "pid" in words:
                self.pids[words[1]] = int(words[-1])
            if words[:1] == ["drivers"]:
                self.endpoint = words[1]
            if line.startswith("cluster up"):
                return
        pytest.fail("placectl up did not come up:\n" + "".join(self.output))

    @property
    def secure(self) -> bool:
        return "--insecure" not in self.extra

    def env(self, role: str) -> dict[str, str]:
        """``PLACECTL_*`` of operator ``role`` from the CA ``up`` created (none when insecure)."""
        return LocalPki(self.data_dir / "tls").env(role) if self.secure else {}

    def placectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Data and workload commands as the client operator, the rest as admin."""
        role = "client" if args[0] in ("data", "workload") else "admin"
        return subprocess.run(
            [sys.executable, "-m", "placement", "--endpoint", self.endpoint, *args],
            env={**os.environ, **self.env(role)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def wait_ready(self, zone: str) -> dict[str, object]:
        deadline = time.monotonic() + EVENTUALLY
        status: dict[str, object] = {}
        while time.monotonic() < deadline:
            result = self.placectl("zone", "status", zone, "--json")
            if result.returncode == 0:
                status = json.loads(result.stdout)
                if status["state"] == "READY" and status["partitions_done"] == 16:
                    return status
            time.sleep(0.3)
        pytest.fail(f"zone {zone} not READY: {status}")

    def stop(self, sig: signal.Signals, *, group: bool) -> int:
        if group:
            os.killpg(self.proc.pid, sig)  # what a terminal does on Ctrl-C
        else:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        while not self.lines.empty():
            self.output.append(self.lines.get())
        return code

    def kill_leftovers(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in self.pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie would still answer; it is someone's unreaped child, which counts as left over too
    return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


def _check_secure(up: Up) -> None:
    """A secure ``up``: every operator role's certificate exists, the commands it printed name
    them, a plaintext ``placectl`` is refused, and etcd is TLS with auth on (a client without
    etcd credentials is refused; the product's certificate reads only its prefix)."""
    pki = LocalPki(up.data_dir / "tls")
    text = "".join(up.output)
    for role in ("admin", "reader", "client"):
        assert pki.cert(role).exists()
        assert pki.key(role).stat().st_mode & 0o077 == 0, "a key readable by others"
    assert f"export PLACECTL_CERT={pki.cert('admin')}" in text
    env_file = up.data_dir / "placectl.env"
    assert f"source {env_file}" in text
    exported = dict(
        line.removeprefix("export ").split("=", 1) for line in env_file.read_text().splitlines()
    )
    sourced = _run(
        [sys.executable, "-m", "placement", "zone", "list", "--json"], {**os.environ, **exported}
    )
    assert sourced.returncode == 0, sourced.stderr
    assert "demo" in sourced.stdout
    plain = _run(
        [sys.executable, "-m", "placement", "--endpoint", up.endpoint, "zone", "list"],
        {k: v for k, v in os.environ.items() if not k.startswith("PLACECTL_")},
    )
    assert plain.returncode == 2, plain  # a credential, named at once: not an outage
    assert "serves TLS: pass --cacert, --cert and --key" in plain.stderr
    etcd = next(line.split()[1] for line in up.output if line.startswith("etcd "))
    assert "TLS, auth on" in text
    inspect = [sys.executable, "-m", "placement", "inspect", "--etcd", etcd]
    no_creds = _run(inspect)
    assert no_creds.returncode == 2, no_creds
    assert "serves TLS: pass --etcd-cacert, --etcd-cert and --etcd-key" in no_creds.stderr
    as_product = [*inspect, *pki.etcd_flags(), "--json"]
    listed = _run(as_product)
    assert listed.returncode == 0, listed.stderr
    outside = _run([*as_product, "--prefix", "/elsewhere"])
    assert outside.returncode == 2, outside
    assert "permission denied" in outside.stderr


def _mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize(
    ("sig", "group", "extra"),
    [
        (signal.SIGINT, True, ("--no-status",)),
        (signal.SIGTERM, False, ()),
        (signal.SIGTERM, False, ("--insecure", "--no-status")),
    ],
    ids=["ctrl-c", "sigterm", "insecure"],
)
def test_up_brings_up_a_cluster_and_leaves_nothing(
    tmp_path: Path, sig: signal.Signals, group: bool, extra: tuple[str, ...]
) -> None:
    up = Up(tmp_path / "cluster", *extra)
    try:
        up.wait_up()
        assert set(up.pids) == {"etcd", "driver-1", "driver-2", "node-1", "node-2", "node-3"}
        assert up.endpoint.count(",") == 1
        status = up.wait_ready("demo")
        assert status["partitions_total"] == 16
        nodes = json.loads(up.placectl("nodes", "--json").stdout)["nodes"]
        assert len(nodes) == 3
        assignments = json.loads(up.placectl("assignments", "demo", "--json").stdout)
        assert all(len(p["stable"]) == 3 for p in assignments["partitions"])
        put = up.placectl("data", "put", "demo", "hello", "world")
        assert put.returncode == 0, put.stderr
        got = up.placectl("data", "get", "demo", "hello")
        assert got.returncode == 0, got.stderr
        assert got.stdout.strip() == "world"
        if up.secure:
            _check_secure(up)
        assert up.stop(sig, group=group) == 0
        assert "stopped" in "".join(up.output)
        for name, pid in up.pids.items():
            assert not _alive(pid), f"{name} (pid {pid}) still running"
            assert not _group_alive(pid), f"process group of {name} still has members"
        assert _mentioning(str(tmp_path / "cluster")) == []
    finally:
        up.kill_leftovers()


def test_sigint_to_up_alone_stops_everything_even_when_started_with_sigint_ignored(
    tmp_path: Path,
) -> None:
    """``placectl up &`` from a script inherits SIGINT = SIG_IGN; ``kill -INT`` to that one
    process (not its group) must still stop every process it started."""
    up = Up(
        tmp_path / "cluster", "--no-status", "--nodes", "1", "--drivers", "1", sigint_ignored=True
    )
    try:
        up.wait_up()
        assert set(up.pids) == {"etcd", "driver-1", "node-1"}
        status = Path(f"/proc/{up.proc.pid}/status").read_text()
        ignored = int(
            next(ln for ln in status.splitlines() if ln.startswith("SigIgn:")).split()[1], 16
        )
        assert not ignored & (1 << (signal.SIGINT - 1)), "up must install its own SIGINT handler"
        assert up.stop(signal.SIGINT, group=False) == 0
        assert "stopped" in "".join(up.output)
        for name, pid in up.pids.items():
            assert not _alive(pid), f"{name} (pid {pid}) still running"
            assert not _group_alive(pid), f"process group of {name} still has members"
        assert _mentioning(str(tmp_path / "cluster")) == []
    finally:
        up.kill_leftovers()


# -- a bounded stop: signals while busy, a frozen child, a second signal, during start-up -------

STOP_BOUND = 30.0 * float(os.environ.get("CI_TIME_MULTIPLIER", "1"))


def _stop_within(up: Up, bound: float, *signals: signal.Signals) -> float:
    """Sends ``signals`` to ``up`` alone (one second apart), expects exit code 0 within ``bound``
    seconds of the first; returns the seconds it took. Records every ``started`` line."""
    start = time.monotonic()
    for i, sig in enumerate(signals):
        if i:
            time.sleep(1.0)
        up.proc.send_signal(sig)
    try:
        code = up.proc.wait(timeout=max(0.0, bound - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        _drain(up)
        pytest.fail(
            f"placectl up still running {bound:.0f}s after {signals}:\n{''.join(up.output)}"
        )
    took = time.monotonic() - start
    time.sleep(0.2)  # the reader thread takes the last lines
    _drain(up)
    assert code == 0, "".join(up.output)
    return took


def _record(up: Up, line: str) -> None:
    up.output.append(line)
    words = line.split()
    if words[:1] == ["started"] and "pid" in words:
        up.pids[words[1]] = int(words[-1])


def _drain(up: Up) -> None:
    while not up.lines.empty():
        _record(up, up.lines.get())


def _read_until_started(up: Up, name: str) -> None:
    deadline = time.monotonic() + EVENTUALLY
    while name not in up.pids:
        assert time.monotonic() < deadline, "".join(up.output)
        try:
            _record(up, up.lines.get(timeout=1.0))
        except queue.Empty:
            assert up.proc.poll() is None, "".join(up.output)


def _assert_nothing_left(up: Up) -> None:
    for name, pid in up.pids.items():
        assert not _alive(pid), f"{name} (pid {pid}) still running"
        assert not _group_alive(pid), f"process group of {name} still has members"
    assert _mentioning(str(up.data_dir)) == []


def test_sigterm_while_rebalancing_and_writing_stops_within_a_bound(tmp_path: Path) -> None:
    """Writers in flight (``workload run``) and a rebalance in flight (replicas 3 -> 2) while the
    live table polls: one SIGTERM, and ``up`` exits 0 within the bound, leaving nothing."""
    up = Up(tmp_path / "cluster")
    record = tmp_path / "run.jsonl"
    writers: subprocess.Popen[bytes] | None = None
    try:
        up.wait_up()
        up.wait_ready("demo")
        writers = subprocess.Popen(
            [
                *(sys.executable, "-m", "placement", "--endpoint", up.endpoint, "workload", "run"),
                *("--zone", "demo", "--writers", "4", "--duration", "120", "--record", str(record)),
            ],
            env={**os.environ, **up.env("client")},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + EVENTUALLY
        while not record.exists() or len(record.read_text().splitlines()) < 50:
            assert time.monotonic() < deadline, "no writes recorded"
            assert writers.poll() is None, "workload run exited early"
            time.sleep(0.1)
        altered = up.placectl("zone", "alter", "demo", "--replicas", "2")
        assert altered.returncode == 0, altered.stderr
        assert writers.poll() is None
        _stop_within(up, STOP_BOUND, signal.SIGTERM)
        assert "stopped" in "".join(up.output)
        _assert_nothing_left(up)
    finally:
        if writers is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(writers.pid, signal.SIGKILL)
            writers.wait()
        up.kill_leftovers()


@pytest.mark.parametrize("frozen", ["driver-1", "node-1", "etcd"])
def test_sigterm_with_a_frozen_child_kills_it_and_exits(tmp_path: Path, frozen: str) -> None:
    """A child SIGSTOPped (it cannot act on SIGTERM; for driver-1 the live table also polls a
    frozen endpoint): ``up`` still exits 0 within its deadline, having SIGKILLed it."""
    up = Up(tmp_path / "cluster")
    try:
        up.wait_up()
        os.kill(up.pids[frozen], signal.SIGSTOP)
        time.sleep(1.5)  # the live table meets the frozen process
        _stop_within(up, STOP_DEADLINE, signal.SIGTERM)
        assert "stopped" in "".join(up.output)
        _assert_nothing_left(up)
    finally:
        up.kill_leftovers()


def test_a_second_signal_skips_the_grace(tmp_path: Path) -> None:
    """With etcd frozen every child's own shutdown stalls; a second signal SIGKILLs them at once,
    well before the SIGTERM grace is over."""
    up = Up(tmp_path / "cluster", "--no-status")
    try:
        up.wait_up()
        os.kill(up.pids["etcd"], signal.SIGSTOP)
        took = _stop_within(up, STOP_BOUND, signal.SIGTERM, signal.SIGINT)
        assert took < STOP_GRACE, f"took {took:.1f}s:\n{''.join(up.output)}"
        _assert_nothing_left(up)
    finally:
        up.kill_leftovers()


@pytest.mark.parametrize("after", ["etcd", "driver-1", "node-3"])
def test_sigterm_during_start_up_leaves_nothing(tmp_path: Path, after: str) -> None:
    """SIGTERM while etcd comes up, while drivers and agents are being started, or while ``up``
    waits for registrations and creates the demo zone."""
    up = Up(tmp_path / "cluster")
    try:
        _read_until_started(up, after)
        _stop_within(up, STOP_BOUND, signal.SIGTERM)
        _assert_nothing_left(up)
    finally:
        up.kill_leftovers()


# -- the stop's mechanisms on plain processes (no cluster) --------------------------------------

_IGNORES_SIGTERM = (
    "import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "subprocess.Popen(['sleep', '60']); print('ready', flush=True); time.sleep(60)"
)


def _stubborn(tmp_path: Path) -> Child:
    """A child that ignores SIGTERM, with a grandchild in its process group."""
    child = Child("stubborn", [sys.executable, "-c", _IGNORES_SIGTERM], tmp_path / "stubborn.log")
    child.start()
    deadline = time.monotonic() + EVENTUALLY
    while "ready" not in child.log.read_text():
        assert time.monotonic() < deadline
        assert child.alive
        time.sleep(0.05)
    return child


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for a reaper that is not us."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("forced", [False, True], ids=["grace", "forced"])
def test_stop_together_kills_what_ignores_sigterm(tmp_path: Path, forced: bool) -> None:
    child = _stubborn(tmp_path)
    assert child.proc is not None
    grace = 60.0 if forced else 0.5
    start = time.monotonic()
    assert stop_together([child], grace, lambda: forced) == []
    assert time.monotonic() - start < 5.0
    assert child.proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 5.0
    while _group_alive(child.proc.pid) and not all(_dead(p) for p in _group(child.proc.pid)):
        assert time.monotonic() < deadline, "the grandchild survived"
        time.sleep(0.05)


def _group(pgid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    found.append(int(entry.name))
    return found


_HANGS_WHILE_STOPPING = """
import sys, time
from pathlib import Path
from placement.local.cluster import Child, Cluster, StopRequest
base = Path(sys.argv[1])
cluster = Cluster(base, "", [])
child = Child("sleeper", ["sleep", "60"], base / "sleeper.log")
cluster.children.append(child)
child.start()
print(child.proc.pid, flush=True)
with StopRequest(cluster, deadline=0.5).installed() as stop:
    stop.begin()
    time.sleep(60)  # a teardown step that never ends
"""


def test_the_watchdog_kills_every_group_and_exits_when_the_stop_hangs(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HANGS_WHILE_STOPPING, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        sleeper = int(proc.stdout.readline())
        assert proc.wait(timeout=STOP_BOUND) == 1
        assert proc.stderr is not None
        assert "killed every process" in proc.stderr.read()
        deadline = time.monotonic() + 5.0
        while not _dead(sleeper):
            assert time.monotonic() < deadline, "the watchdog left the child running"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
