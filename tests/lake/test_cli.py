"""`prism lake optimize|vacuum|stats` (app/lake/cli.py) on locations delta-rs cannot read: the
one error line and exit 1, never delta-rs's exception as a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.lake.cli import lake_app


@pytest.mark.parametrize("command", [["stats"], ["vacuum", "--dry-run"], ["optimize"]])
def test_a_table_delta_rs_cannot_read_is_one_error_line(tmp_path: Path, command: list[str]) -> None:
    """A `_delta_log` whose first commit is not JSON (DeltaError) and a file where the table
    should be (OSError) passed `is_deltatable` and then escaped as tracebacks."""
    corrupt = tmp_path / "corrupt"
    (corrupt / "_delta_log").mkdir(parents=True)
    (corrupt / "_delta_log" / "00000000000000000000.json").write_text("{garbage\n")
    a_file = tmp_path / "table.txt"
    a_file.write_text("not a table")
    for location, cause in ((corrupt, "DeltaError"), (a_file, "OSError")):
        res = CliRunner().invoke(lake_app, [*command[:1], str(location), *command[1:]], catch_exceptions=False)
        lines = res.output.strip().splitlines()
        assert res.exit_code == 1 and len(lines) == 1, res.output
        assert lines[0].startswith(f"error [lake_error] {command[0]} {location} failed: {cause}") and "; fix: " in lines[0]


def test_compacting_an_archive_that_is_not_there_is_an_error_not_nothing_new(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`prism lake compact /typo/archive TABLE` created that directory (and `_quarantine` in it),
    said "nothing new to compact" and exited 0 - after starting Spark. Now it is the one error
    line, before Spark, and nothing is created."""
    import app.lake.spark

    def no_spark(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("Spark started for an archive that does not exist")

    monkeypatch.setattr(app.lake.spark, "get_spark", no_spark)
    a_file = tmp_path / "rolls.txt"
    a_file.write_text("x")
    for archive, what in ((tmp_path / "typo" / "archive", "does not exist"), (a_file, "is not a directory")):
        res = CliRunner().invoke(lake_app, ["compact", str(archive), str(tmp_path / "table")], catch_exceptions=False)
        lines = res.output.strip().splitlines()
        assert res.exit_code == 1 and len(lines) == 1, res.output
        assert lines[0].startswith(f"error [lake_error] archive {archive} {what} (at ARCHIVE); fix: "), lines[0]
    assert not (tmp_path / "typo").exists() and not (tmp_path / "table").exists()
