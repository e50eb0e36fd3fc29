"""tune_gc: the worker process's garbage-collector settings (measured in BENCHMARKS.md).

Run in a child interpreter: the settings are process-wide and must not leak into the test run.
"""

from __future__ import annotations

import json
import subprocess
import sys

from app.worker.faust_app import GC_GEN0_THRESHOLD

PROBE = """
import gc, json
import faust  # a realistic start-up heap to freeze
from app.worker.faust_app import tune_gc
before = {"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}
tune_gc()
cycle = []
cycle.append(cycle)  # cyclic garbage made after tuning is still collectable
del cycle
after = {"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count(), "collected": gc.collect()}
print(json.dumps({"before": before, "after": after}))
"""


def test_tune_gc_freezes_the_start_up_heap_and_raises_only_the_young_threshold() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    state = json.loads(out.stdout)
    before, after = state["before"], state["after"]
    assert before["frozen"] == 0 and after["frozen"] > 10_000  # faust, aiokafka, protobuf ... frozen
    assert after["threshold"] == [GC_GEN0_THRESHOLD, *before["threshold"][1:]]
    assert after["collected"] >= 1  # collection still works for what comes after
