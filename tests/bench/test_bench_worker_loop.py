"""bench/bench_worker_loop.py: every piece is measured (a positive ns figure), the fitter really
ran over the outputs, and `send_batched` is restored after the measurement."""

from __future__ import annotations

import asyncio
import json

from app.worker import delivery
from bench.bench_worker_loop import OUTPUTS, SOURCE, main, measure, pending


def test_each_piece_is_measured_and_send_batched_is_put_back() -> None:
    real = delivery.send_batched
    result = asyncio.run(measure(20, 2))
    assert set(result) == {"input_limit_for", "fit", "send_all_records", "total"}
    assert all(v > 0 for v in result.values())
    assert result["total"] == result["input_limit_for"] + result["fit"] + result["send_all_records"]
    assert delivery.send_batched is real


def test_the_batch_is_what_the_worker_writes() -> None:
    [(msg, outputs)] = pending(1)
    assert msg.topic == SOURCE and [e.topic for e in outputs] == list(OUTPUTS)
    assert all(len(e.record.headers) == 8 and e.record.timestamp_ms for e in outputs)


def test_the_command_line_prints_one_json_line(capsys) -> None:
    assert main(["--n", "10", "--repeat", "1"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"fit", "input_limit_for", "send_all_records", "total"}
