"""``placectl agent run``: one replica agent process — the very command ``python -m replica``
runs (``replica.cli.run``), so the two entry points cannot drift apart. Loaded lazily, like every
command group (design/architecture.md)."""

from __future__ import annotations

from placement.cli.common import LazyGroup

agent = LazyGroup(name="agent", lazy={"run": "replica.cli:run"}, help="Replica agents.")
