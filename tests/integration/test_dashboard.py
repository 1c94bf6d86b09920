"""The web dashboard every driver serves (design/observability.md, "Web dashboard").

One cluster for the module, as ``placectl up`` runs it (mutual TLS, 2 drivers with their
dashboards on free loopback ports, 3 agents) on the session etcd, plus a third driver started by
hand with ``--http-client-cert none`` — the one a browser without the reader bundle can open:

* ``/api/dashboard`` under the default: no client certificate, no handshake; an agent's
  certificate gets 403; the reader's gets the zone, its state (what ``placectl zone status``
  says), the nodes and their replicas; leader and follower agree; writes are refused (405);
* a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by selenium)
  on a follower's page: the zone READY and the nodes; then, with driving paused, a fourth agent
  joins and the page — never reloaded — shows the new node, the zone REBALANCING and the moves
  to it; resumed, READY again with the new node holding replicas in the heat map. A screenshot
  of each is saved under the test's tmp dir;
* a malformed or taken ``--http-listen`` is one line naming the option, exit 2.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from placement.local.cluster import Child, Cluster, UpOptions, free_ports, start_cluster, wait_ready
from placement.security.pki import Role

MULTIPLIER = float(os.environ.get("CI_TIME_MULTIPLIER", "1"))
EVENTUALLY = 60.0 * MULTIPLIER
ZONE = "web"
PARTITIONS = 8
REPLICAS = 2
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
#: What the browser test reads off the page (arguments[0]: the zone), in one script.
PAGE = """
const zone = document.querySelector(`#zones tr[data-zone="${arguments[0]}"]`);
const cell = document.querySelector(
  `#heatmap tr[data-node="node-4"] td[data-zone="${arguments[0]}"]`);
return {
  state: zone ? zone.dataset.state : null,
  zone_text: zone ? zone.innerText : "",
  zone_column: document.querySelector(`#heatmap th[data-zone="${arguments[0]}"]`) !== null,
  nodes: [...document.querySelectorAll("#heatmap tbody tr")].map((r) => r.dataset.node),
  node4: cell ? cell.innerText : "",
  joining: [...document.querySelectorAll("#rebalances tbody tr")].map((r) => r.cells[5].innerText),
  where: document.getElementById("where").innerText,
  history: document.getElementById("history").innerText,
};
"""


def placectl(cluster: Cluster, *args: str, role: str = "admin") -> str:
    result = subprocess.run(
        [sys.executable, "-m", "placement", "--endpoint", ",".join(cluster.driver_apis), *args],
        env={**os.environ, **cluster.env(role)},
        capture_output=True,
        text=True,
        timeout=60 * MULTIPLIER,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _context(cluster: Cluster, name: str | None) -> ssl.SSLContext:
    assert cluster.pki is not None
    context = ssl.create_default_context(cafile=str(cluster.pki.ca))
    if name is not None:
        context.load_cert_chain(str(cluster.pki.cert(name)), str(cluster.pki.key(name)))
    return context


def fetch(url: str, context: ssl.SSLContext, method: str = "GET") -> tuple[int, Any]:
    """``(status, decoded JSON body)`` of one request."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        body = e.read()
        return e.code, json.loads(body) if body.startswith(b"{") else body


def eventually(check: Any, what: str) -> Any:
    deadline = time.monotonic() + EVENTUALLY
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.2)


def _start_like(cluster: Cluster, model: str, name: str, role: Role, *extra: str) -> Child:
    """Process ``name`` started with ``model``'s command line (its own certificate, data dir,
    listen port and dashboard port) plus ``extra``."""
    from placement.local.certs import create_pki

    assert cluster.pki is not None
    create_pki(cluster.pki.directory, {name: role}, dt.datetime.now(dt.UTC))
    (like,) = [c for c in cluster.children if c.name == model]
    argv = [a.replace(model, name) for a in like.argv]
    for option in ("--listen", "--http-listen", "--metrics-listen"):
        if option in argv:  # every listener on a port of its own (agents' too: not port 0)
            (port,) = free_ports(1)
            argv[argv.index(option) + 1] = f"127.0.0.1:{port}"
    child = Child(name, [*argv, *extra], cluster.base / "logs" / f"{name}.log")
    if role is Role.DRIVER:
        child.address = argv[argv.index("--listen") + 1]
    child.start()
    cluster.children.append(child)
    return child


@pytest.fixture(scope="module")
def cluster(etcd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    prefix = f"/t{uuid.uuid4().hex[:12]}/placement"
    opts = UpOptions(
        nodes=3, drivers=2, etcd=etcd.endpoint, api_port=0, prefix=prefix, metrics=False
    )
    c = start_cluster(opts, tmp_path_factory.mktemp("dashboard"), Console(quiet=True))
    try:
        asyncio.run(wait_ready(c, opts, demo_zone=False))
        placectl(
            c, "zone", "create", ZONE, "--partitions", str(PARTITIONS),
            "--replicas", str(REPLICAS), "--failure-domain", "rack",
        )  # fmt: skip
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def open_dashboard(cluster: Cluster) -> str:
    """The URL of a third driver (a follower) whose dashboard asks browsers for no certificate."""
    child = _start_like(cluster, "driver-2", "driver-3", Role.DRIVER, "--http-client-cert", "none")
    url = child.argv[child.argv.index("--http-listen") + 1]
    url = f"https://{url}/"

    def serving() -> bool:
        assert child.alive, (child.log.read_text(), "driver-3 exited")
        try:
            return fetch(url + "api/dashboard", _context(cluster, None))[0] == 200
        except (OSError, ssl.SSLError):
            return False

    eventually(serving, "driver-3 serves its dashboard")
    return url


def _zone_ready(cluster: Cluster, url: str, name: str = "reader") -> dict[str, Any]:
    """The document once the zone is READY and every partition has a primary lease."""

    def ready() -> dict[str, Any] | None:
        status, document = fetch(url + "api/dashboard", _context(cluster, name))
        assert status == 200, document
        zones = {z["name"]: z for z in document["zones"]}
        zone = zones.get(ZONE)
        leases = sum(n["primaries"] for n in document["nodes"])
        ready = zone is not None and zone["state"] == "READY" and leases == PARTITIONS
        return document if ready else None

    found: dict[str, Any] = eventually(ready, f"zone {ZONE} READY on {url}")
    return found


def test_the_json_document_needs_a_reader_and_says_what_the_api_says(cluster: Cluster) -> None:
    url = cluster.dashboards["driver-1"]
    assert url.startswith("https://127.0.0.1:")
    endpoint = url + "api/dashboard"
    # Mutual TLS: no client certificate, no handshake.
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        fetch(endpoint, _context(cluster, None))
    # A certificate of the CA whose role the read RPCs do not admit: refused by name.
    status, body = fetch(endpoint, _context(cluster, "node-1"))
    assert status == 403, body
    assert "role agent" in body["error"], body

    document = _zone_ready(cluster, url)
    assert document["driver"] == "driver-1"
    assert document["leader"] in {"driver-1", "driver-2"}
    assert document["leading"] == (document["leader"] == "driver-1")
    (zone,) = [z for z in document["zones"] if z["name"] == ZONE]
    assert (zone["partitions"], zone["replicas"]) == (PARTITIONS, REPLICAS)
    assert zone["partitions_done"] == zone["partitions_total"] == PARTITIONS
    assert zone["eligible_nodes"] == 3
    nodes = {n["name"]: n for n in document["nodes"]}
    assert set(nodes) == {"node-1", "node-2", "node-3"}
    assert all(n["registered"] and n["address"] for n in nodes.values())
    assert sum(n["zones"][ZONE]["replicas"] for n in nodes.values()) == PARTITIONS * REPLICAS
    assert sum(n["primaries"] for n in nodes.values()) == PARTITIONS
    assert document["rebalances"] == []
    kinds = {c["kind"] for c in document["history"]}
    assert {"zone:created", "datanodes", "leader", "node"} <= kinds, kinds
    revisions = [c["revision"] for c in document["history"]]
    assert revisions == sorted(revisions, reverse=True)

    # The API says the same (same rules, GetZoneStatus), and so does the other driver.
    status_json = json.loads(placectl(cluster, "zone", "status", ZONE, "--json", role="reader"))
    assert status_json["state"] == zone["state"] == "READY"
    other = _zone_ready(cluster, cluster.dashboards["driver-2"])
    assert other["driver"] == "driver-2"
    assert other["leader"] == document["leader"]
    assert other["leading"] != document["leading"]

    # Read-only: a write method is refused; the page and its files are served with a strict CSP.
    status, _ = fetch(endpoint, _context(cluster, "reader"), method="POST")
    assert status == 405
    for path, kind in (("", "text/html"), ("dashboard.js", "text/javascript")):
        with urllib.request.urlopen(url + path, context=_context(cluster, "reader")) as answer:
            assert answer.headers["Content-Type"].startswith(kind)
            assert "default-src 'self'" in answer.headers["Content-Security-Policy"]


@pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="no chromium/chromedriver: bash scripts/setup.sh --browser installs them",
)
def test_a_browser_sees_the_zone_and_a_node_join_without_reloading(
    cluster: Cluster, open_dashboard: str, tmp_path: Path
) -> None:
    from selenium import webdriver
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    _zone_ready(cluster, open_dashboard, name="reader")
    options = webdriver.ChromeOptions()
    assert CHROMIUM is not None
    assert CHROMEDRIVER is not None
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
        "--window-size=1440,1200", "--no-first-run", "--disable-extensions",
    ):  # fmt: skip
        options.add_argument(argument)
    options.accept_insecure_certs = True  # the cluster's private CA is not the browser's
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    wait = WebDriverWait(browser, EVENTUALLY, poll_frequency=0.1)

    def page() -> dict[str, Any]:
        """What the page shows now, read in one script (the page redraws every 2 s: elements
        found in one call may be gone by the next)."""
        found: dict[str, Any] = browser.execute_script(PAGE, ZONE)
        return found

    def until(check: Any, what: str) -> dict[str, Any]:
        def shows(_: Any) -> dict[str, Any] | None:
            now = page()
            return now if check(now) else None

        try:
            shown: dict[str, Any] = wait.until(shows)
        except TimeoutException:
            raise AssertionError(f"the page never showed {what}; it shows {page()}") from None
        return shown

    try:
        browser.get(open_dashboard)
        shown = until(
            lambda s: s["state"] == "READY" and s["nodes"] == ["node-1", "node-2", "node-3"],
            f"{ZONE} READY on 3 nodes",
        )
        assert shown["zone_column"], shown
        assert f"{PARTITIONS} / {PARTITIONS} stable" in shown["zone_text"], shown
        assert "follower" in shown["where"], shown
        browser.execute_script("window.notReloaded = true")
        browser.save_screenshot(str(tmp_path / "dashboard-ready.png"))

        # Driving paused, a fourth node joins: the zone's moves to it wait, pending, on the page.
        placectl(cluster, "rebalance", "pause")
        try:
            _start_like(cluster, "node-3", "node-4", Role.AGENT)
            shown = until(
                lambda s: "node-4" in s["nodes"] and s["state"] == "REBALANCING" and s["joining"],
                "node-4 and the moves to it",
            )
            # Moves to node-4, and some that only reorder a set (a new preferred primary).
            assert "node-4" in shown["joining"], shown
            assert set(shown["joining"]) <= {"node-4", ""}, shown
            assert "PAUSED" in shown["where"], shown
            browser.save_screenshot(str(tmp_path / "dashboard-rebalancing.png"))
        finally:
            placectl(cluster, "rebalance", "resume")

        shown = until(
            lambda s: s["state"] == "READY" and s["node4"].split("★")[0].strip().isdigit(),
            "READY again with node-4 holding replicas",
        )
        assert shown["joining"] == [], shown
        assert "rebalance done" in shown["history"], shown
        assert browser.execute_script("return window.notReloaded") is True
        browser.save_screenshot(str(tmp_path / "dashboard-joined.png"))
    finally:
        browser.quit()


def test_a_bad_http_listen_is_one_line_naming_the_option(cluster: Cluster) -> None:
    (taken,) = free_ports(1)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        for value, words in (
            ("nonsense", "is not HOST:PORT"),
            (f"127.0.0.1:{taken}", "cannot listen on"),
        ):
            result = subprocess.run(
                [
                    sys.executable, "-m", "placement", "driver", "run",
                    "--etcd", cluster.etcd_endpoint, "--listen", "127.0.0.1:0",
                    "--prefix", cluster.prefix, "--id", "bad-listen",
                    "--http-listen", value,
                    *(cluster.pki.flags("driver-1") if cluster.pki else []),
                    *cluster.etcd_flags(),
                ],
                capture_output=True,
                text=True,
                timeout=60 * MULTIPLIER,
                check=False,
            )  # fmt: skip
            assert result.returncode == 2, (result.stdout, result.stderr)
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1, result.stderr
            assert "--http-listen" in lines[0], lines[0]
            assert words in lines[0], lines[0]
            assert "serving on" not in result.stdout
