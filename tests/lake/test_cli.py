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
