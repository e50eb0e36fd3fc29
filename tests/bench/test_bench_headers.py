"""bench/bench_headers.py: the broker-free comparison runs the chain and the publisher over records
with and without producer headers and reports both figures and their difference.

Run in a child interpreter, as the benchmark is: it sets process-wide state (the bench payload,
the chain's clock - thread CPU time, under which a sleeping stage takes no time - and the garbage
collector's settings) that must not leak into the rest of the test run. In-process it once made
tests/observability/test_runtime_metrics.py see a 20 ms sleep as 0 ms, and the peers test read
the other bench document."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_it_measures_both_kinds_of_record() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.bench_headers", "--headers", "2", "--rounds", "3",
                          "--chunk", "20"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    line = out.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"no headers ([\d.]+) µs/msg, 2 header\(s\) ([\d.]+) µs/msg, difference ([+-][\d.]+) µs/msg", line)
    assert m is not None, line
    bare, with_headers, diff = (float(g) for g in m.groups())
    assert bare > 0 and with_headers > 0 and abs(with_headers - bare - diff) < 0.11
