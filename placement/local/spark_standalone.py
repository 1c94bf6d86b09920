"""A Spark standalone cluster on loopback — one master, one worker — from the Spark that ships
inside the ``pyspark`` package, for the pipeline's tests and benchmarks (design/pipeline.md,
"Shipping the environment").

The worker can be made a stranger to this machine's Python: run as another user, in a mount
namespace of its own where ``hide`` paths (this checkout, its virtual environment) are covered
by an empty tmpfs. Spark itself is bind-mounted into the worker's directory first, so the worker
sees Spark, Java and the system's Python and nothing of the product — what a cluster the product
does not control looks like. Both need root (``unshare``, ``mount``, ``setpriv``).
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from placement.errors import PlacementError
from placement.local.cluster import free_ports

START_TIMEOUT = 60.0


class SparkClusterError(PlacementError):
    """The standalone cluster did not come up (the message carries its log's tail)."""


def spark_home() -> Path:
    """The Spark distribution inside the installed ``pyspark`` package."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class StandaloneSpark:
    """``with StandaloneSpark(...) as cluster:`` — ``cluster.master_url`` once the worker is
    registered; every process is stopped (and its directory removed) on exit.

    ``user``: run the worker as this user (root only); ``hide``: paths the worker must not
    see (root only). ``directory`` is created world-readable so that inputs put under
    ``cluster.shared`` can be read by the worker's user.
    """

    def __init__(
        self,
        *,
        cores: int = 2,
        memory: str = "2g",
        user: str | None = None,
        hide: Sequence[Path] = (),
    ) -> None:
        self.cores, self.memory, self.user, self.hide = cores, memory, user, tuple(hide)
        self.directory = Path(tempfile.mkdtemp(prefix="placement-spark-"))
        self.directory.chmod(0o755)
        self.shared = self.directory / "shared"
        self.master_url = ""
        self._processes: list[subprocess.Popen[bytes]] = []
        self._logs: list[Path] = []

    def __enter__(self) -> StandaloneSpark:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _spawn(self, name: str, argv: Sequence[str], env: dict[str, str]) -> None:
        log = self.directory / f"{name}.log"
        self._logs.append(log)
        with log.open("wb") as out:
            self._processes.append(
                subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            )

    def start(self) -> None:
        master_port, master_ui, worker_port, worker_ui = free_ports(4)
        home = spark_home()
        base_env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "SPARK_NO_DAEMONIZE": "1",
            "LANG": "C.UTF-8",
        }
        if os.environ.get("JAVA_HOME"):
            base_env["JAVA_HOME"] = os.environ["JAVA_HOME"]
        self._spawn(
            "master",
            [
                str(home / "bin" / "spark-class"),
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(master_port),
                "--webui-port",
                str(master_ui),
            ],
            {**base_env, "SPARK_HOME": str(home), "HOME": str(self.directory)},
        )
        self._wait_port(master_port, "master")
        self.master_url = f"spark://127.0.0.1:{master_port}"
        self.shared.mkdir(mode=0o755)
        worker_dir = self.directory / "worker"
        for sub in ("", "work", "local", "home"):
            (worker_dir / sub).mkdir(parents=True, exist_ok=True)
        mounted_home = worker_dir / "spark-home"
        mounted_home.mkdir()
        uid = gid = None
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            uid, gid = entry.pw_uid, entry.pw_gid
            for path in (worker_dir, *worker_dir.iterdir()):
                os.chown(path, uid, gid)
        worker = [
            str(mounted_home / "bin" / "spark-class"),
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--port",
            str(worker_port),
            "--webui-port",
            str(worker_ui),
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--work-dir",
            str(worker_dir / "work"),
            self.master_url,
        ]
        env = {
            **base_env,
            "SPARK_HOME": str(mounted_home),
            "HOME": str(worker_dir / "home"),
            "SPARK_LOCAL_DIRS": str(worker_dir / "local"),
        }
        steps = [f"mount --bind {shlex.quote(str(home))} {shlex.quote(str(mounted_home))}"]
        steps += [
            f"mount -t tmpfs -o size=1m,mode=755 tmpfs {shlex.quote(str(p))}" for p in self.hide
        ]
        run = shlex.join(worker)
        if uid is not None:
            run = f"setpriv --reuid={uid} --regid={gid} --clear-groups {run}"
        steps.append(f"exec {run}")
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-ec", "; ".join(steps)]
        if not shutil.which("unshare"):
            raise SparkClusterError("unshare (util-linux) is needed to start the worker")
        self._spawn("worker", argv, env)
        self._wait_worker(master_ui)

    def _wait_port(self, port: int, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.2)
        raise SparkClusterError(
            f"the Spark {what} did not listen in {START_TIMEOUT:.0f} s" + self._tail()
        )

    def _wait_worker(self, master_ui: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{master_ui}/json/", timeout=2) as r:
                    state = json.loads(r.read())
                if int(state.get("aliveworkers", 0)) >= 1:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.3)
        raise SparkClusterError(
            f"no Spark worker registered in {START_TIMEOUT:.0f} s" + self._tail()
        )

    def _check_alive(self) -> None:
        for process, log in zip(self._processes, self._logs, strict=True):
            if process.poll() is not None:
                raise SparkClusterError(
                    f"Spark's {log.stem} exited with {process.returncode}" + self._tail()
                )

    def _tail(self) -> str:
        tails = []
        for log in self._logs:
            text = log.read_text(errors="replace") if log.exists() else ""
            tails.append(f"\n--- {log.stem} ---\n" + "\n".join(text.splitlines()[-25:]))
        return "".join(tails)

    @property
    def worker_pid(self) -> int:
        """The worker's process (in its own mount namespace when ``hide`` was given)."""
        return self._processes[1].pid

    def worker_log(self) -> str:
        """Everything the worker and its executors wrote (their stderr files included)."""
        parts = [self._tail()]
        for stderr in sorted((self.directory / "worker" / "work").rglob("stderr")):
            parts.append(f"\n--- {stderr} ---\n{stderr.read_text(errors='replace')[-4000:]}")
        return "".join(parts)

    def stop(self) -> None:
        for process in reversed(self._processes):
            if process.poll() is None:
                try:
                    os.killpg(process.pid, 15)
                except ProcessLookupError:
                    continue
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, 9)
                    process.wait(10)
        self._processes.clear()
        shutil.rmtree(self.directory, ignore_errors=True)
