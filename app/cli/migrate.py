"""`prism envelope migrate` and `prism envelope check-compat` (RFC-031 "Migration Path").

Wired into the `envelope` sub-app by `app.cli.main` through `register(envelope_app)`; this
module does not import `app.cli.main`, so either can be imported first.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from app.cli.output import print_error
from app.errors import PrismError

console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)
F = TypeVar("F", bound=Callable[..., Any])


def _friendly(fn: F) -> F:
    """Prism errors become one readable line and exit code 2 (as everywhere in `prism`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PrismError as exc:
            print_error(exc, err_console)  # the code and text escaped: `[bad_config]` is no markup tag
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def register(envelope_app: typer.Typer) -> None:
    """Add `migrate` and `check-compat` to the `prism envelope` command group."""

    @envelope_app.command("migrate")
    @_friendly
    def migrate_cmd(
        from_url: Annotated[str, typer.Option("--from", help="source Redis URL, e.g. redis://127.0.0.1:6379/0")],
        to_url: Annotated[str, typer.Option("--to", help="target URL, e.g. kafka://127.0.0.1:9092")],
        topic: Annotated[str, typer.Option("--topic", "-t", help="stream key (and default target topic)")],
        to_topic: Annotated[str | None, typer.Option(help="target topic (default: same as --topic)")] = None,
        group: Annotated[str, typer.Option(help="source consumer group; also names the checkpoint")] = "prism-migrate",
        namespace: Annotated[str, typer.Option(help="namespace given to legacy entries that carry none")] = "migrated",
        batch_size: Annotated[int, typer.Option(min=1)] = 500,
        idle_seconds: Annotated[float, typer.Option(min=0, help="drain ends after the source was quiet this long")] = 10.0,
        follow: Annotated[bool, typer.Option(help="keep mirroring until Ctrl-C instead of draining")] = False,
        json_out: Annotated[bool, typer.Option("--json", help="print the final report as JSON")] = False,
    ) -> None:
        """Move a LIVE Redis stream to Kafka (or NATS/PostgreSQL) with no loss and no duplicates.

        Catches up with the stream, tells you to switch producers to the target, then drains
        what is still arriving on Redis and exits once the stream was quiet for --idle-seconds.
        Safe to interrupt and re-run: it resumes from its checkpoint without duplicating."""
        from app.sdk.migration import Migration

        migration = Migration(from_url, to_url, topic, to_topic=to_topic, group=group, namespace=namespace,
                              batch_size=batch_size)

        def caught_up() -> None:
            r = migration.report
            err_console.print(f"[bold green]caught up[/]: {r.copied} copied, {r.duplicates_skipped} duplicates "
                              f"skipped. [bold]Switch producers to {r.target} now[/]; "
                              + ("mirroring until Ctrl-C." if follow else
                                 f"draining until the source is quiet for {idle_seconds:g}s."))

        try:
            report = asyncio.run(migration.run(caught_up, idle_seconds=idle_seconds, follow=follow))
        except KeyboardInterrupt:
            err_console.print("interrupted: progress is checkpointed; run the same command to resume")
            raise typer.Exit(130) from None
        if json_out:
            console.print_json(json.dumps(report.to_dict()))
        else:
            console.print(f"migrated {report.source} {report.topic} -> {report.target} {report.to_topic}: "
                          f"{report.copied} copied ({report.legacy_converted} converted from legacy), "
                          f"{report.duplicates_skipped} duplicates skipped, {report.source_pending} left pending, "
                          f"{report.elapsed_s:.1f}s" + (" (resumed)" if report.resumed else ""))

    @envelope_app.command("check-compat")
    @_friendly
    def check_compat_cmd(
        topic: Annotated[str, typer.Option("--topic", "-t", help="topic / stream key / subject")],
        url: Annotated[str, typer.Option("--url", help="backend URL (kafka://, redis://, nats://, postgresql://)")],
        sample: Annotated[int, typer.Option(min=1, help="how many stored messages to read")] = 100,
        layout: Annotated[str, typer.Option(help="layout the consumer parses: draft, reviewed, any")] = "any",
        schema_version: Annotated[str | None, typer.Option(help="schema version the consumer asserts")] = None,
        dual_read: Annotated[bool, typer.Option(help="the consumer also reads legacy shapes (read_any)")] = False,
        json_out: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    ) -> None:
        """Tell whether a consumer expecting LAYOUT / SCHEMA_VERSION can read TOPIC's messages.

        Exit code 0: every sampled message is readable; 1: some are not (problems listed);
        2: the check itself failed; 3: the topic has no messages to judge."""
        from app.errors import ConfigError
        from app.sdk.compat import check_compat

        if layout not in ("draft", "reviewed", "any"):
            raise ConfigError(f"--layout must be draft, reviewed or any, got {layout!r}", path="--layout")
        report = asyncio.run(check_compat(url, topic, sample=sample, expect_layout=layout,
                                          expect_version=schema_version, dual_read=dual_read))
        if json_out:
            console.print_json(json.dumps(report.to_dict()))
        else:
            verdict = {True: "[bold green]compatible[/]", False: "[bold red]NOT compatible[/]",
                       None: "[yellow]no messages to judge[/]"}[report.compatible]
            console.print(f"{verdict}: {report.readable}/{report.sampled} sampled messages of {topic!r} readable by "
                          f"a consumer expecting layout={layout}, schema_version={schema_version or 'any'}, "
                          f"dual_read={dual_read}")
            for name, counts in (("shapes", report.shapes), ("layouts", report.layouts),
                                 ("schema versions", report.schema_versions)):
                if counts:
                    console.print(f"  {name}: " + ", ".join(f"{k}={v}" for k, v in counts.most_common()))
            for p in report.problems:
                console.print(f"  [red]problem[/] {p}")
            if report.problem_count > len(report.problems):
                console.print(f"  ... and {report.problem_count - len(report.problems)} more")
        if report.compatible is None:
            raise typer.Exit(3)
        if not report.compatible:
            raise typer.Exit(1)
