"""The one exception root of the project and its domain-named subclasses.

Edges (CLI, gRPC servicers) translate these into exit codes and status codes in one table each;
library code raises them ``from`` the underlying error so the cause is kept.
"""

from __future__ import annotations


class PlacementError(Exception):
    """Root of every error this project raises on purpose."""


class InvalidInput(PlacementError):
    """Input (a snapshot, a zone config, a request, a CLI argument) is malformed.

    ``field`` names the offending field as a path (``zones[1].replicas``); ``fix`` says what to do.
    Raising this must happen before anything is written.
    """

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        text = f"{field}: {problem}" if field else problem
        if fix:
            text = f"{text} ({fix})"
        super().__init__(text)


class StoreUnavailable(PlacementError):
    """The metastore could not be reached or did not answer in time; the outcome is unknown."""


class StoreFull(StoreUnavailable):
    """etcd refuses writes: its space quota is exhausted and the NOSPACE alarm is raised. Reads
    and deletes still work; writes fail until an operator compacts, defragments and disarms
    the alarm (design/deployment.md, "etcd out of space"). Retried like any unavailable store,
    but said for what it is."""


class Conflict(PlacementError):
    """A compare-and-swap lost the race: the state changed since it was read."""


class NotLeader(PlacementError):
    """The writer's leadership epoch no longer holds (fenced off)."""


class Compacted(PlacementError):
    """A watch or read asked for history that etcd has compacted; re-list and watch again."""

    def __init__(self, compact_revision: int) -> None:
        self.compact_revision = compact_revision
        super().__init__(f"revision compacted up to {compact_revision}; re-list and re-watch")


class CredentialError(PlacementError):
    """A credential is missing, wrong or refused: a certificate a peer or etcd rejects, a wrong
    etcd password, a role or etcd user without permission. Not an outage — retrying cannot help,
    so commands exit 2 and processes stop at once; the message names the credential to fix."""
