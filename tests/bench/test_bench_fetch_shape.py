"""bench/bench_fetch_shape.py: bad arguments are refused before a broker is started, and the switch
it measures ("off": the changelogs not paused) is the recovery's own pause step."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import bench_fetch_shape


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--rate", "0"], ["--window", "0"]])
def test_the_command_line_refuses_what_it_cannot_measure(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_fetch_shape.main(argv)
    assert exc.value.code == 2
    assert "--rounds >= 1" in capsys.readouterr().err


def test_the_switch_is_the_recoverys_pause_step() -> None:
    from app.tables.recovery import PrismRecovery

    # "off" replaces this method for one run; renamed or gone, the benchmark would measure nothing
    assert callable(PrismRecovery._pause_changelogs)
    assert "_pause_changelogs" in Path(bench_fetch_shape.__file__).read_text()
