"""The services' collector settings (placement/runtime.py), in a process of their own."""

from __future__ import annotations

import subprocess
import sys

from placement.runtime import YOUNG_THRESHOLD


def test_tune_gc_freezes_start_up_objects_and_collects_young_garbage_less_often() -> None:
    code = (
        "import gc\n"
        "assert gc.get_freeze_count() == 0 and gc.get_threshold()[0] == 700\n"
        "from placement.runtime import tune_gc\n"
        "tune_gc()\n"
        "print(gc.get_freeze_count(), *gc.get_threshold())\n"
        "class Cycle:\n"
        "    pass\n"
        "a = Cycle(); a.me = a; del a\n"
        "print(gc.collect())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    frozen, young, middle, old = map(int, out[0].split())
    assert frozen > 1000  # the modules, classes and functions of start-up
    assert (young, middle, old) == (YOUNG_THRESHOLD, 10, 10)
    assert int(out[1]) >= 1  # a cycle made after start-up is still collected
