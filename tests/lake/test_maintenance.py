"""`prism lake optimize` / `vacuum` on what a user types: every number ends in a run or a
`LakeError` with its option and a fix, never delta-rs's OverflowError or math.ceil's ValueError
(`--retention-hours nan` and `--target-size -1` were tracebacks). The table is written by
delta-rs directly, so these need no Spark."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from app.errors import LakeError, RetentionError
from app.lake import maintenance
from app.lake.cli import lake_app


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = str(tmp_path_factory.mktemp("maint") / "t")
    for rows in ([1, 2, 3], [4], [5]):  # three small files for optimize to merge
        write_deltalake(uri, pa.table({"a": rows}), mode="append")
    return uri


@pytest.mark.parametrize("hours", [math.nan, math.inf, -math.inf, -1.0, 1e300, maintenance.MAX_RETENTION_HOURS + 1])
def test_a_retention_that_is_not_a_number_of_hours_is_refused_before_the_table_is_read(hours: float) -> None:
    with pytest.raises(LakeError) as exc:
        maintenance.vacuum("/nonexistent/not-a-table", retention_hours=hours, force=True, dry_run=True)
    assert exc.value.path == "--retention-hours" and "168" in exc.value.hint
    assert not isinstance(exc.value, RetentionError)  # not "too short": not a retention at all


@pytest.mark.parametrize("hours", [0.0, 0.5, maintenance.MAX_RETENTION_HOURS])
def test_the_edges_of_the_retention_range_run(table: str, hours: float) -> None:
    out = maintenance.vacuum(table, retention_hours=hours, force=True, dry_run=True)
    assert out["dry_run"] is True and out["retention_hours"] == hours


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hours=st.floats(allow_nan=True, allow_infinity=True))
def test_any_retention_ends_in_a_vacuum_or_a_lake_error(table: str, hours: float) -> None:
    try:
        out = maintenance.vacuum(table, retention_hours=hours, force=True, dry_run=True)
    except LakeError:
        assert not (math.isfinite(hours) and 0 <= hours <= maintenance.MAX_RETENTION_HOURS)
        return
    assert out["files"] == 0  # nothing was ever removed from this table


@pytest.mark.parametrize("size", [-1, 0, maintenance.MAX_TARGET_SIZE + 1, 10**23])
def test_a_target_size_out_of_range_is_refused_with_its_option(size: int) -> None:
    with pytest.raises(LakeError) as exc:
        maintenance.optimize("/nonexistent/not-a-table", target_size=size)
    assert exc.value.path == "--target-size" and "256 MiB" in exc.value.hint


def test_optimize_runs_at_the_smallest_target_size(table: str) -> None:
    before = maintenance.stats(table)
    out = maintenance.optimize(table, target_size=1)
    assert maintenance.stats(table).rows == before.rows and out["version"] >= before.version


@pytest.mark.parametrize(("args", "expected"), [
    (["vacuum", "{t}", "--retention-hours", "nan"], "error [lake_error] retention of nan hours is not a number"),
    (["optimize", "{t}", "--target-size", "-1"], "error [lake_error] target size of -1 bytes is out of range"),
])
def test_the_cli_answers_with_one_error_line(table: str, args: list[str], expected: str) -> None:
    res = CliRunner().invoke(lake_app, [a.format(t=table) for a in args])
    assert res.exit_code == 1, res.output
    line = " ".join(res.output.split())
    assert line.startswith(expected) and "fix:" in line, line


def test_the_cli_refuses_no_archive_files_per_commit(tmp_path: Path) -> None:
    res = CliRunner().invoke(lake_app, ["compact", str(tmp_path / "a"), str(tmp_path / "t"), "--max-files", "0"])
    assert res.exit_code == 2 and "--max-files" in res.output
