"""`prism lake ...`: compact the archive into Delta, and maintain the table.

Mounted by the main CLI as `prism lake`; also runnable alone (`python -m app.lake.cli`) and as the
spark-submit entry (`app/lake/compact.py`). Every command takes `--json` for machine-readable
output. Exit codes: 0 ok, 1 failed, 2 usage error, 3 (compact) committed with quarantined input.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from app.cli.output import CliTable as Table  # headers break between words, ids fold
from app.errors import LakeError, PrismError

lake_app = typer.Typer(help="Archive -> Delta Lake compaction and table maintenance.", no_args_is_help=True,
                       add_completion=False)
_err = Console(stderr=True, soft_wrap=True, emoji=False)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]
StorageOpt = Annotated[list[str] | None, typer.Option(
    "--storage-option", "-o", help="delta-rs storage option KEY=VALUE (e.g. AWS_ENDPOINT_URL=...); repeatable.")]


def _storage_options(pairs: list[str] | None) -> dict[str, str] | None:
    """`--storage-option KEY=VALUE` pairs as delta-rs takes them. Raises `LakeError` naming
    the first pair that is not KEY=VALUE (it was a click usage error raised from inside the
    command - for `compact` after Spark had started)."""
    if not pairs:
        return None
    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key.strip():
            raise LakeError(f"{p!r} is not KEY=VALUE", path="--storage-option",
                            hint="write e.g. --storage-option AWS_ENDPOINT_URL=http://127.0.0.1:9000 (one per option)")
        out[key.strip()] = value
    return out


def _fail(exc: PrismError) -> NoReturn:
    """The one error line every `prism` command prints (`error [code] what (at where); fix: how`)."""
    from app.cli.output import print_error
    from app.lake.compact import EXIT_FAILED

    print_error(exc, _err)
    raise typer.Exit(EXIT_FAILED)


def _spark_failure(exc: Exception, what: str) -> LakeError:
    """A Spark / JVM / delta-rs failure as one line: its first line, not its 59-line traceback."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return LakeError(f"{what} failed: {type(exc).__name__}: {first[:400]}",
                     hint="check the archive and table locations (local paths, or s3://... with --storage-option) "
                          "and that Java 17+ runs (Spark's own log above this line says more)")


def _maintain(what: str, action: Callable[[Any], Any]) -> Any:
    """Run a delta-rs maintenance `action(maintenance module)`; every failure is the one error
    line. delta-rs raises its own `DeltaError`, `OSError` (a file where the table should be, an
    object store without credentials) and more for a table it cannot read; `optimize`, `vacuum`
    and `stats` caught only `PrismError`, so a corrupt `_delta_log` was a Python traceback. Its
    Rust side logs warnings (the AWS credential chain's, five lines for an `s3://` table without
    credentials) unless RUST_LOG says otherwise: errors only, so the error line stays the one."""
    os.environ.setdefault("RUST_LOG", "error")
    try:
        from app.lake import maintenance  # pyarrow, deltalake: loaded by the commands that use them

        return action(maintenance)
    except PrismError as exc:
        _fail(exc)
    except Exception as exc:  # DeltaError, OSError, TableNotFoundError, pyarrow's errors
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        _fail(LakeError(f"{what} failed: {type(exc).__name__}: {first[:400]}",
                        hint="check that the location is a Delta table this user can read (a local directory "
                             "holding _delta_log, or s3://... with --storage-option for its endpoint and "
                             "credentials)"))


def _fail_all(problems: list[PrismError]) -> NoReturn:
    """Every problem the checks found, one error line each (then how many), and exit 1."""
    from app.cli.output import Problems, print_problems
    from app.lake.compact import EXIT_FAILED

    print_problems(problems[0] if len(problems) == 1 else Problems(problems), _err)
    raise typer.Exit(EXIT_FAILED)


def _check_local_archive(archive: str) -> None:
    """A local archive must be a directory that exists. Why: the archive's store creates its root,
    so `prism lake compact /typo/archive TABLE` made that directory (and `_quarantine` in it),
    reported "nothing new to compact" and exited 0 - a compaction job pointed at the wrong path
    succeeded every night. The worker creates the archive directory when it starts."""
    from app.lake.storage import absolute_url, is_local_url

    try:
        local = is_local_url(archive)
    except ValueError as exc:
        raise LakeError(f"archive {archive!r} is not a usable URL: {exc}", path="ARCHIVE",
                        hint="a local directory, file:///dir or s3://bucket/prefix") from None
    if not local:
        return
    path = absolute_url(archive)
    if not os.path.isdir(path):
        raise LakeError(f"archive {path} {'is not a directory' if os.path.exists(path) else 'does not exist'}",
                        path="ARCHIVE", hint="give the topology's archive.path (the worker creates it when it starts "
                                             "and writes rolls there); check the path for a typo")


def _check_output_location(location: str, where: str, what: str) -> None:
    """A location this command creates (the table, the quarantine): a usable URL and, when local,
    not an existing file - Spark or delta-rs found that out only after the JVM start."""
    from app.lake.storage import absolute_url, is_local_url

    try:
        local = is_local_url(location)
    except ValueError as exc:
        raise LakeError(f"{what} {location!r} is not a usable URL: {exc}", path=where,
                        hint="a local directory, file:///dir or s3://bucket/prefix") from None
    if local and os.path.exists(absolute_url(location)) and not os.path.isdir(absolute_url(location)):
        raise LakeError(f"{what} {absolute_url(location)} is a file, not a directory", path=where,
                        hint=f"name a directory (it is created if missing) for the {what}")


WRITERS = ("auto", "delta-spark", "delta-rs")
#: Spark's master URLs (https://spark.apache.org/docs/latest/submitting-applications.html#master-urls)
_MASTER = re.compile(r"local(\[(\d+|\*)(,\d+)?\])?|local-cluster\[\d+, ?\d+, ?\d+\]|yarn|spark://\S+|k8s://\S+")


def _check_writer(writer: str) -> None:
    if writer not in WRITERS:
        raise LakeError(f"unknown Delta writer {writer!r}", path="--writer", hint="use auto, delta-spark or delta-rs")


def _check_master(master: str | None) -> None:
    """A Spark master URL Spark can parse: anything else made Spark print its JVM stack trace
    (dozens of lines) before the error line, seconds into the start."""
    # PRISM_SPARK_MASTER is read only when Prism starts Spark itself (not under spark-submit)
    env = None if master or "PYSPARK_GATEWAY_PORT" in os.environ else os.environ.get("PRISM_SPARK_MASTER")
    for value, where in ((master, "--master"), (env, "PRISM_SPARK_MASTER")):
        if value is not None and not _MASTER.fullmatch(value.strip()):
            raise LakeError(f"{value!r} is not a Spark master URL", path=where,
                            hint="use local[*], local[N], spark://HOST:PORT, yarn or k8s://HOST:PORT")


def _check_all(*checks: tuple[Callable[..., Any], tuple[Any, ...]]) -> list[Any]:
    """Run every check; exit with all their problems at once, or return their results."""
    from app.cli.output import ProblemCollector

    found = ProblemCollector()
    results = [found.attempt(check, *args) for check, args in checks]
    if found.problems:
        _fail_all(found.problems)
    return results


def _emit(doc: dict[str, Any], as_json: bool, title: str) -> None:
    if as_json:
        typer.echo(json.dumps(doc, indent=2, default=str))
        return
    table = Table(title=title, show_header=False)
    for key, value in doc.items():
        if isinstance(value, list | dict):
            value = json.dumps(value, default=str) if len(json.dumps(value, default=str)) < 200 else f"({len(value)} items)"
        table.add_row(key, str(value))
    Console(emoji=False).print(table)


def _delta_jars(writer: str) -> tuple[dict[str, str] | None, str]:
    """Spark settings that put the Delta jars on the classpath of the session this command starts,
    and a note for the writer line: where the jars came from, or why there are none (then `auto`
    writes with delta-rs; `delta-spark` fails with that reason)."""
    from app.lake.delta_jars import DeltaJarsUnavailable, resolve

    if writer == "delta-rs":
        return None, ""
    try:
        jars = resolve()
    except DeltaJarsUnavailable as exc:
        if writer == "delta-spark":
            _fail(exc)
        return None, str(exc)
    return jars.spark_conf(), jars.describe()


@lake_app.command()
def compact(
    archive: Annotated[str, typer.Argument(help="Archive root: a directory or s3://bucket/prefix[?endpoint_override=...].")],
    table: Annotated[str, typer.Argument(help="Delta table location.")],
    quarantine: Annotated[str | None, typer.Option(help="Where bad input goes (default: <archive>/_quarantine).")] = None,
    master: Annotated[str | None, typer.Option(help="Spark master when Prism starts Spark (default local[*]; "
                                                    "ignored under spark-submit).")] = None,
    writer: Annotated[str, typer.Option(help="auto | delta-spark | delta-rs.")] = "auto",
    max_files: Annotated[int, typer.Option(min=1, help="Archive files per Delta commit.")] = 2000,
    storage_option: StorageOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Decode new archive rolls, dedup by message id, and commit them to the Delta table."""
    from app.lake.compact import Compactor
    from app.lake.spark import existing_session, get_spark

    # Every option before Spark (seconds, not a JVM start, for a typo), every problem at once
    _, _, _, _, _, options = _check_all(
        (_check_writer, (writer,)), (_check_master, (master,)), (_check_local_archive, (archive,)),
        (_check_output_location, (table, "TABLE", "table")),
        (_check_output_location, (quarantine, "--quarantine", "quarantine")) if quarantine else (lambda: None, ()),
        (_storage_options, (storage_option,)))

    # Stop Spark at the end only if this command started it (not under spark-submit or a caller's session).
    owned = existing_session() is None and "PYSPARK_GATEWAY_PORT" not in os.environ
    extra_conf, jars_note = _delta_jars(writer) if owned else (None, "")
    try:
        spark = get_spark(master, extra_conf=extra_conf)
    except PrismError as exc:
        _fail(exc)
    except Exception as exc:  # no JVM, bad master: one line, not a traceback
        logging.getLogger("prism.lake").debug("starting Spark failed", exc_info=True)
        _fail(_spark_failure(exc, "starting Spark"))
    try:
        comp = Compactor(spark, archive, table, quarantine_url=quarantine, writer=writer, max_files=max_files,
                         storage_options=options, jars_note=jars_note)
        # Which writer, and why: a run that silently fell back to delta-rs must say so.
        _err.print(f"writer: {comp.table.name} - {escape(comp.table.reason)}", highlight=False)
        plan = comp.pending()
        n = sum(len(b) for _, b in plan)
        show = not as_json and _err.is_terminal
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=_err, disable=not show) as progress:
            task = progress.add_task(f"compacting {n} batch(es) with {comp.table.name}", total=n)

            def advance(b: Any) -> None:
                progress.update(task, advance=1, description=f"{b.archive_writer} rolls {b.first_seq}-{b.last_seq}: "
                                                             f"{b.rows_written} rows")

            summary = comp.run(on_batch=advance, plan=plan)
    except PrismError as exc:
        _fail(exc)
    except Exception as exc:  # Spark's AnalysisException, Py4JJavaError, delta-rs errors
        logging.getLogger("prism.lake").debug("compaction failed", exc_info=True)
        _fail(_spark_failure(exc, "compaction"))
    finally:
        if owned:
            spark.stop()
    doc = summary.to_dict()
    if as_json:
        typer.echo(json.dumps(doc, indent=2, default=str))
    else:
        t = Table(title=f"prism lake compact -> {table} ({doc['writer']})")
        for col in ("writer", "rolls", "files", "rows in", "written", "duplicates", "quarantined", "tokens dropped",
                    "version", "s"):
            t.add_column(col)
        for b in summary.batches:
            t.add_row(b.archive_writer, f"{b.first_seq}-{b.last_seq}", str(b.files), str(b.rows_in),
                      str(b.rows_written), str(b.duplicates), f"{b.quarantined_records} rec / {b.quarantined_files} files",
                      str(b.tokens_dropped), str(b.table_version), f"{b.seconds:.1f}")
        Console(emoji=False).print(t if summary.batches else "nothing new to compact")
        if summary.exit_code:
            _err.print(f"[yellow]some input was quarantined under {summary.quarantine}[/]")
    raise typer.Exit(summary.exit_code)


@lake_app.command()
def optimize(
    table: Annotated[str, typer.Argument(help="Delta table location.")],
    zorder: Annotated[list[str] | None, typer.Option("--zorder", help="Z-order by this column; repeatable.")] = None,
    target_size: Annotated[int | None, typer.Option(help="Target file size in bytes.")] = None,
    storage_option: StorageOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Compact small files (and optionally Z-order them)."""
    from app.lake.maintenance import check_target_size, check_zorder_columns

    _, _, options = _check_all((check_target_size, (target_size,)), (check_zorder_columns, (zorder,)),
                               (_storage_options, (storage_option,)))
    doc = _maintain(f"optimize {table}", lambda m: m.optimize(table, zorder=zorder, target_size=target_size,
                                                                storage_options=options))
    _emit(doc, as_json, "prism lake optimize")


@lake_app.command()
def vacuum(
    table: Annotated[str, typer.Argument(help="Delta table location.")],
    retention_hours: Annotated[float, typer.Option(help="Keep files needed by versions newer than this.")] = 168.0,
    force: Annotated[bool, typer.Option(help="Allow a retention under the table's minimum (7 days).")] = False,
    dry_run: Annotated[bool, typer.Option(help="List what would be deleted.")] = False,
    lite: Annotated[bool, typer.Option(help="Only files removed by commits (not never-committed leftovers).")] = False,
    storage_option: StorageOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete files no longer needed (refuses a retention under 7 days unless --force)."""
    from app.lake.maintenance import check_retention_hours

    _, options = _check_all((check_retention_hours, (retention_hours,)), (_storage_options, (storage_option,)))
    doc = _maintain(f"vacuum {table}", lambda m: m.vacuum(table, retention_hours=retention_hours, force=force,
                                                            dry_run=dry_run, full=not lite, storage_options=options))
    _emit(doc, as_json, "prism lake vacuum")


@lake_app.command()
def stats(
    table: Annotated[str, typer.Argument(help="Delta table location.")],
    storage_option: StorageOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Rows, files, partitions and versions of the table."""
    (options,) = _check_all((_storage_options, (storage_option,)))
    doc = _maintain(f"stats {table}", lambda m: m.stats(table, storage_options=options).to_dict())
    _emit(doc, as_json, "prism lake stats")


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    lake_app()


if __name__ == "__main__":
    main()
