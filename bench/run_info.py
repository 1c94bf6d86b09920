"""The "## Run" section the placement benchmarks end their results with, and their load probe."""

from __future__ import annotations

import datetime
import platform
import subprocess
import sys
import time


def uptime() -> str:
    """``uptime``'s line: the machine's load when it is called."""
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def run_section(started: float, load: list[str], when: str) -> list[str]:
    """Markdown lines: date, wall time since ``started``, machine, and the ``load`` lines taken
    at ``when`` (e.g. "start / after the comparison / end")."""
    return [
        "## Run",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC;"
        f" wall time {time.time() - started:.0f} s",
        f"- machine: {platform.processor() or platform.machine()}, Python"
        f" {platform.python_version()}, {sys.platform}",
        f"- load (`uptime`) at {when}:",
        *(f"  - `{line}`" for line in load),
        "",
    ]
