"""What Spark is doing while ``placectl plan --engine spark`` runs: the active stages and their
task counts, read from the SparkContext's status tracker by a thread that polls it.

The tracker is passed in (``spark.sparkContext.statusTracker()``: ``getActiveStageIds()`` and
``getStageInfo(id)`` with ``name``, ``numTasks`` and ``numCompletedTasks``), so this module needs
no Spark to be tested; drawing the stages is the caller's (the CLI's progress bars).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

#: Seconds between two reads of the tracker.
POLL_EVERY = 0.2


class StatusTracker(Protocol):
    """The two methods of ``pyspark.StatusTracker`` this module calls (Spark's names)."""

    def getActiveStageIds(self) -> list[int]: ...

    def getStageInfo(self, stage_id: int, /) -> Any: ...


@dataclass(frozen=True, slots=True)
class StageProgress:
    """One active stage: ``completed`` of ``tasks`` tasks done."""

    stage_id: int
    name: str
    tasks: int
    completed: int


def active_stages(tracker: StatusTracker) -> list[StageProgress]:
    """The stages running now, by id (a stage gone between the two calls is left out)."""
    found = []
    for stage_id in sorted(tracker.getActiveStageIds()):
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            found.append(
                StageProgress(stage_id, str(info.name), info.numTasks, info.numCompletedTasks)
            )
    return found


class StageWatcher:
    """``with StageWatcher(tracker, report):`` — ``report(stages)`` is called from a thread every
    ``interval`` seconds with the active stages, and once more on the way out (usually with none:
    whatever is still shown as running is done). A failing read ends the watching, never the
    job it watches."""

    def __init__(
        self,
        tracker: StatusTracker,
        report: Callable[[Sequence[StageProgress]], None],
        interval: float = POLL_EVERY,
    ) -> None:
        self._tracker = tracker
        self._report = report
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spark-stages", daemon=True)

    def _poll(self) -> bool:
        try:
            self._report(active_stages(self._tracker))
        except Exception:  # the JVM going away, a py4j error: stop watching, let the job report
            return False
        return True

    def _run(self) -> None:
        while self._poll() and not self._stop.wait(self._interval):
            pass

    def __enter__(self) -> StageWatcher:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()
