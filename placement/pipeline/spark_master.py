"""``--master``: which Spark master URLs we accept and how we check one is up before starting Spark.

Starting a SparkSession against a master nobody listens on retries for minutes; a TCP connect
with a short timeout to the master's ``host:port`` first turns that into a one-line error.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from placement.errors import InvalidInput

DEFAULT_MASTER = "local[*]"
PROBE_TIMEOUT = 2.0
_LOCAL_RE = re.compile(r"^local(\[(\*|[1-9][0-9]*)(,[0-9]+)?\])?$")
_FIX = "use local[*], local[N], spark://HOST:PORT[,HOST:PORT], k8s://https://HOST:PORT or yarn"


@dataclass(frozen=True, slots=True)
class Master:
    """A parsed master URL: ``probe`` are the ``(host, port)`` pairs of which one must accept a
    connection (empty for local and yarn: nothing to probe)."""

    url: str
    probe: tuple[tuple[str, int], ...] = ()

    @property
    def local(self) -> bool:
        """``local[...]``: the executors are threads of this process's JVM, and their Python
        workers this interpreter."""
        return self.url.startswith("local")


def _host_port(text: str, default_port: int, url: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = text, str(default_port)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput("--master", f"{url!r} has no valid HOST:PORT", _FIX)
    return host.strip("[]"), int(port)


def parse_master(url: str) -> Master:
    """Validates a master URL (pure)."""
    url = url.strip()
    if _LOCAL_RE.match(url) or url == "yarn":
        return Master(url)
    if url.startswith("spark://"):
        hosts = url.removeprefix("spark://").rstrip("/").split(",")
        return Master(url, tuple(_host_port(h, 7077, url) for h in hosts))
    if url.startswith("k8s://"):
        parts = urlsplit(url.removeprefix("k8s://"))
        if not parts.hostname:
            raise InvalidInput("--master", f"{url!r} has no API server host", _FIX)
        default = 80 if parts.scheme == "http" else 443
        return Master(url, ((parts.hostname, parts.port or default),))
    raise InvalidInput("--master", f"{url!r} is not a Spark master URL", _FIX)


Connect = Callable[[tuple[str, int], float], object]


def _connect(address: tuple[str, int], timeout: float) -> object:
    with socket.create_connection(address, timeout=timeout):
        return None


def probe_master(
    master: Master, timeout: float = PROBE_TIMEOUT, connect: Connect = _connect
) -> None:
    """Raises InvalidInput unless one of the master's addresses accepts a TCP connection."""
    if not master.probe:
        return
    errors = []
    for address in master.probe:
        try:
            connect(address, timeout)
            return
        except OSError as e:
            errors.append(f"{address[0]}:{address[1]}: {e.strerror or e}")
    raise InvalidInput(
        "--master",
        f"Spark master {master.url} is unreachable ({'; '.join(errors)})",
        "start the master, fix the URL, or omit --master to run locally (local[*])",
    )
