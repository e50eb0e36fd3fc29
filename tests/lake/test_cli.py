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


def _no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    import app.lake.spark

    def no_spark(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("Spark started although an option was wrong")

    monkeypatch.setattr(app.lake.spark, "get_spark", no_spark)


def test_compact_checks_every_option_before_spark_and_reports_them_all(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`prism lake compact --writer bogus` was refused after Spark's ~8 s start (the writer was
    checked by the Compactor), a bad --storage-option was a click usage error raised after it
    too, and a bad --master printed Spark's JVM stack trace. Now every option is checked first,
    and every problem is its own error line, all in one run."""
    _no_spark(monkeypatch)
    monkeypatch.delenv("PRISM_SPARK_MASTER", raising=False)
    a_file = tmp_path / "table.txt"
    a_file.write_text("x")
    res = CliRunner().invoke(lake_app, ["compact", str(tmp_path / "missing"), str(a_file), "--writer", "bogus",
                                        "--master", "bogus", "--quarantine", "http://[::1", "-o", "nokv"],
                             catch_exceptions=False)
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1, res.output
    assert lines[:-1] == [
        "error [lake_error] unknown Delta writer 'bogus' (at --writer); fix: use auto, delta-spark or delta-rs",
        "error [lake_error] 'bogus' is not a Spark master URL (at --master); fix: use local[*], local[N], "
        "spark://HOST:PORT, yarn or k8s://HOST:PORT",
        f"error [lake_error] archive {tmp_path / 'missing'} does not exist (at ARCHIVE); fix: give the topology's "
        "archive.path (the worker creates it when it starts and writes rolls there); check the path for a typo",
        f"error [lake_error] table {a_file} is a file, not a directory (at TABLE); fix: name a directory (it is "
        "created if missing) for the table",
        "error [lake_error] quarantine 'http://[::1' is not a usable URL: Invalid IPv6 URL (at --quarantine); fix: a "
        "local directory, file:///dir or s3://bucket/prefix",
        "error [lake_error] 'nokv' is not KEY=VALUE (at --storage-option); fix: write e.g. --storage-option "
        "AWS_ENDPOINT_URL=http://127.0.0.1:9000 (one per option)",
    ], res.output
    assert lines[-1] == "6 configuration problems; nothing was started"
    monkeypatch.setenv("PRISM_SPARK_MASTER", "nope")
    (tmp_path / "archive").mkdir()
    res = CliRunner().invoke(lake_app, ["compact", str(tmp_path / "archive"), str(tmp_path / "t")],
                             catch_exceptions=False)
    assert res.exit_code == 1 and res.output.startswith(
        "error [lake_error] 'nope' is not a Spark master URL (at PRISM_SPARK_MASTER)"), res.output


@pytest.mark.parametrize("master", ["local", "local[*]", "local[4]", "local[2,3]", "local-cluster[2, 1, 1024]",
                                    "spark://h:7077", "spark://a:7077,b:7077", "yarn", "k8s://https://h:443"])
def test_spark_master_urls_spark_takes_are_accepted(master: str) -> None:
    from app.lake.cli import _check_master

    _check_master(master)


def test_maintenance_commands_report_every_bad_option_before_opening_the_table(tmp_path: Path) -> None:
    """optimize and vacuum stopped at the first bad option (the storage option as a usage error);
    now each is one line, all at once, and the table is not opened."""
    missing = str(tmp_path / "no-table")
    res = CliRunner().invoke(lake_app, ["vacuum", missing, "--retention-hours", "nan", "-o", "=x"],
                             catch_exceptions=False)
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1 and len(lines) == 3, res.output
    assert lines[0].startswith("error [lake_error] retention of nan hours") and "(at --retention-hours)" in lines[0]
    assert lines[1].startswith("error [lake_error] '=x' is not KEY=VALUE (at --storage-option)")
    res = CliRunner().invoke(lake_app, ["optimize", missing, "--target-size", "0", "--zorder", "topic", "-o", "k"],
                             catch_exceptions=False)
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1 and [line.split(" (at ")[1].split(")")[0] for line in lines[:-1]] == [
        "--target-size", "--zorder", "--storage-option"], res.output
    res = CliRunner().invoke(lake_app, ["stats", missing, "-o", "novalue"], catch_exceptions=False)
    assert res.exit_code == 1 and res.output.startswith("error [lake_error] 'novalue' is not KEY=VALUE"), res.output
