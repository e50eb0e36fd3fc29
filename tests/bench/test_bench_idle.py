"""bench/bench_idle.py: the idle worker's long poll comes from the benchmark, and bad arguments
are refused before a broker is started."""

from __future__ import annotations

import pytest

from app.worker import offsets
from bench import _idle_worker, bench_idle


def test_the_idle_worker_takes_its_long_poll_from_the_benchmark(monkeypatch) -> None:
    built = object()
    monkeypatch.setattr(offsets, "KAFKA_FETCH_MAX_WAIT_MS", offsets.KAFKA_FETCH_MAX_WAIT_MS)  # restored after
    monkeypatch.setattr("app.worker.pipeline.app_from_env", lambda: built)
    monkeypatch.setenv("BENCH_FETCH_MAX_WAIT_MS", "1500")
    assert _idle_worker.app_from_env() is built
    assert offsets.KAFKA_FETCH_MAX_WAIT_MS == 1500
    # the worker consumer reads the module's value when it is created (`fetch_max_wait_ms`)
    assert bench_idle.WAITS_MS == (50, 1500)


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--window", "0"], ["--settle", "-1"]])
def test_the_command_line_refuses_what_it_cannot_measure(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_idle.main(argv)
    assert exc.value.code == 2
    assert "--rounds >= 1" in capsys.readouterr().err
