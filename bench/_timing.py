"""Small timing helpers shared by the benchmarks: best-of-N medians, no external harness."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def per_call_us(fn: Callable[[], object], *, number: int | None = None, repeat: int = 7, budget_s: float = 0.25) -> float:
    """Median over `repeat` runs of the mean time per call, in microseconds.

    `number` is calibrated so one run takes about `budget_s`, which keeps timer noise
    well below the measured cost for both 1 µs and 10 ms operations.
    """
    if number is None:
        number, elapsed = 1, 0.0
        while elapsed < budget_s / 5:
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            elapsed = time.perf_counter() - t0
            if elapsed < budget_s / 5:
                number *= 4
        number = max(1, int(number * budget_s / max(elapsed, 1e-9)))
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t0) / number * 1e6)
    return statistics.median(runs)


def compare_us(fns: dict[str, Callable[[], object]], *, repeat: int = 9, budget_s: float = 0.15) -> dict[str, float]:
    """Per-call µs for several functions, measured in interleaved rounds.

    The machine is shared (other processes, CPU frequency changes), so measuring A fully
    and then B lets load drift bias the A/B ratio. Round-robin rounds expose every
    function to the same conditions; the median per function is reported.
    """
    numbers = {}
    for name, fn in fns.items():
        n, elapsed = 1, 0.0
        while elapsed < budget_s / 5:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            elapsed = time.perf_counter() - t0
            if elapsed < budget_s / 5:
                n *= 4
        numbers[name] = max(1, int(n * budget_s / max(elapsed, 1e-9)))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            n = numbers[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - t0) / n * 1e6)
    return {name: statistics.median(v) for name, v in samples.items()}
