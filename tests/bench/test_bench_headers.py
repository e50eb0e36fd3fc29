"""bench/bench_headers.py: the broker-free comparison runs the chain and the publisher over records
with and without producer headers and reports both figures and their difference."""

from __future__ import annotations

import re

from bench import bench_pipeline
from bench.bench_headers import main


def test_it_measures_both_kinds_of_record(capsys, monkeypatch) -> None:
    # main() swaps the process's bench payload (bench_pipeline.use_payload("valid")): put it back
    # afterwards, or the peers test after this one reads the other document
    monkeypatch.setattr(bench_pipeline, "payload_1kb", bench_pipeline.payload_1kb)
    assert main(["--headers", "2", "--rounds", "3", "--chunk", "20"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    m = re.fullmatch(r"no headers ([\d.]+) µs/msg, 2 header\(s\) ([\d.]+) µs/msg, difference ([+-][\d.]+) µs/msg", line)
    assert m is not None, line
    bare, with_headers, diff = (float(g) for g in m.groups())
    assert bare > 0 and with_headers > 0 and abs(with_headers - bare - diff) < 0.11
