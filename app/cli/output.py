"""How every `prism` command prints: one error line format and markup-safe text.

Why a module of its own: the error line (`error [code] what (at where); fix: how`) was printed
by three copies of the same wrapper, and one of them turned markup off while still writing
`[bold red]error[/]`, so users saw the tags literally. There is now one printer. The rule it
follows, and that every command here follows:

* rich markup only in literals written for it, rendered by a console with markup on;
* anything that comes from data (error text, topic names, headers, record values) is passed
  through `escape` or as a `rich.text.Text`, so a `[` in it is shown, never interpreted (and a
  stray `[/x]` cannot crash the command with a MarkupError);
* machine output (`--json`) goes through `typer.echo`, never through markup at all.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from app.errors import ConfigProblems, PrismError

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
#: Errors go to stderr, so `--json` output on stdout stays parseable.
err_console = Console(stderr=True, emoji=False)


class CliTable(Table):
    """A `rich.table.Table` whose headers break between words only (when the table fits at
    all) and whose cells fold instead of being cut.

    Why: in a narrow or non-terminal output (80 columns) rich shrank columns below their
    header's longest word, so headers broke mid-word (`PARTITIO/N`), and it cut ids with an
    ellipsis - an id that cannot be copied whole is useless. A column may still ask for other
    settings explicitly."""

    def add_column(self, header: RenderableType = "", *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("overflow", "fold")
        super().add_column(header, *args, **kwargs)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        """When the table is too wide for the console, rich narrows the widest columns and then
        all of them evenly, down through the words of their headers. Here each column keeps at
        least its header's longest word, and the rest of the width goes to the columns in
        proportion to what they would need - when that fits at all; otherwise rich decides."""
        n = len(self.columns)
        pad = self.padding[1] + self.padding[3]
        borders = 0 if self.box is None else (n + 1 if self.show_edge else max(n - 1, 0))
        available = options.max_width - borders - n * pad
        words = [_longest_word(c.header) for c in self.columns]
        natural = [max(self._measure_column(console, options, c).maximum - pad, w) for c, w in zip(self.columns, words,
                                                                                              strict=True)]
        if self.expand or not n or sum(natural) <= available or sum(words) > available \
                or any(c.width is not None for c in self.columns):
            yield from super().__rich_console__(console, options)
            return
        spare, wants = available - sum(words), [nat - w for nat, w in zip(natural, words, strict=True)]
        widths = [w + (spare * want) // sum(wants) for w, want in zip(words, wants, strict=True)]
        try:
            for column, width in zip(self.columns, widths, strict=True):
                column.width = width
            yield from super().__rich_console__(console, options)
        finally:
            for column in self.columns:
                column.width = None


def _longest_word(header: RenderableType) -> int:
    plain = header.plain if isinstance(header, Text) else Text.from_markup(header).plain \
        if isinstance(header, str) else ""
    return max((len(word) for word in plain.split()), default=0)


def error_line(exc: PrismError) -> str:
    """The one-line error as markup: a red `error` tag, then the code and text escaped. Line
    breaks in the text (a compiler's or a server's multi-line message, a header's value) are
    folded into spaces here, where every error is printed: `prism schema validate` of a bad
    .proto printed protoc's 33 lines as one error before."""
    text = " ".join(f"[{exc.code}] {exc}".split())
    return f"[bold red]error[/] {escape(text)}"


def print_error(exc: PrismError, console: Console | None = None) -> None:
    """Print `exc` as the documented one-line error (never wrapped: scripts and people grep it)."""
    (console or err_console).print(error_line(exc), soft_wrap=True, highlight=False)


class Problems(PrismError):
    """Several independent configuration problems, found in one pass and reported together.

    Why: `prism run` checked the topology, the broker variables, the keys and the web settings
    one after the other and stopped at the first, so an operator fixed one problem per start.
    Each problem keeps its own code and is printed as its own error line."""

    code = "bad_config"

    def __init__(self, problems: list[PrismError]) -> None:
        self.problems = problems
        super().__init__(f"{len(problems)} configuration problems; nothing was started")


class ProblemCollector:
    """Run independent checks, keep every `PrismError` they raise, then raise them all at once."""

    def __init__(self) -> None:
        self.problems: list[PrismError] = []

    def attempt(self, check: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """`check(*args, **kwargs)`, or None after recording the problem it raised."""
        try:
            return check(*args, **kwargs)
        except (Problems, ConfigProblems) as exc:
            self.problems.extend(exc.problems)
        except PrismError as exc:
            self.problems.append(exc)
        return None

    def raise_if_any(self) -> None:
        if len(self.problems) == 1:
            raise self.problems[0]
        if self.problems:
            raise Problems(self.problems)


def print_problems(exc: PrismError, console: Console | None = None) -> None:
    """One error line per problem (a `Problems` lists each), then how many there were."""
    if isinstance(exc, Problems | ConfigProblems):
        for p in exc.problems:
            print_error(p, console)
        summary = exc.summary if isinstance(exc, ConfigProblems) else str(exc)
        (console or err_console).print(escape(summary), soft_wrap=True, highlight=False, markup=True)
        return
    print_error(exc, console)


def fail(exc: PrismError, exit_code: int = 2) -> NoReturn:
    """Print `exc` as the one error line and exit with `exit_code` (for commands whose errors
    are not raised through `friendly`, e.g. the registry CLI's exit-1 refusals)."""
    print_error(exc)
    raise typer.Exit(exit_code)


def as_prism_error(exc: BaseException) -> PrismError | None:
    """A broker or network failure that escaped a command's own checks (the broker went away
    mid-command, a timeout), or a file the command could not read or write, as the typed error
    it is; None for anything else (a bug: its traceback is the report). Authentication and TLS
    failures keep their own codes."""
    from aiokafka.errors import KafkaError

    from app.errors import BrokerError

    if not isinstance(exc, KafkaError | OSError | TimeoutError):
        return None
    if isinstance(exc, OSError) and exc.filename is not None:
        # a file the command reads or writes (`-o`, `--dir`, `--export`): not the broker's
        # failure, which is what this reported before; sockets carry no file name
        from app.errors import FileAccessError

        return FileAccessError(f"cannot use {exc.filename}: {exc.strerror or type(exc).__name__}",
                               path=str(exc.filename),
                               hint="check that the path exists, is the kind of file asked for and is writable "
                                    "(or readable) by this user")
    from app.broker.admin import BrokerSettings
    from app.broker.preflight import _translate

    try:
        settings = BrokerSettings.from_env()
        decisive = _translate(settings, settings.bootstrap or "PRISM_BROKER_URL", exc)
    except PrismError:
        decisive = None
    if decisive is not None:
        return decisive
    what = str(exc) or type(exc).__name__
    return BrokerError(f"the broker connection failed during the command ({type(exc).__name__}: {what[:300]})",
                       path="PRISM_BROKER_URL",
                       hint="check that the broker is up and reachable (PRISM_BROKER_URL, or `prism broker status`), "
                            "then run the command again")


def friendly(fn: F) -> F:
    """Turn Prism's typed errors into one readable line and exit code 2, never a traceback. A
    broker or network failure that was not checked up front becomes one too (`as_prism_error`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PrismError as exc:
            print_problems(exc)
            raise typer.Exit(2) from None
        except Exception as exc:
            typed = as_prism_error(exc)
            if typed is None:
                raise
            print_problems(typed)
            raise typer.Exit(2) from None

    wrapper._prism_friendly = True  # type: ignore[attr-defined]  # `friendly_everywhere` wraps once
    return wrapper  # type: ignore[return-value]


def friendly_everywhere(tree: typer.Typer) -> None:
    """Every command of `tree` and of its sub-apps under `friendly`, once.

    Why here and not per command: the sub-apps other packages own (`prism schema`, `prism lake`,
    `prism console`) were mounted without it, so a file that was a directory (`schema audit`,
    `schema get --output`) or a broker failure there was a Python traceback while the same
    failure elsewhere was the one error line. A command's own `typer.Exit` (the registry
    commands' exit 1) passes through unchanged."""
    for info in tree.registered_commands:
        if info.callback is not None and not getattr(info.callback, "_prism_friendly", False):
            info.callback = friendly(info.callback)
    for group in tree.registered_groups:
        if isinstance(group.typer_instance, typer.Typer):
            friendly_everywhere(group.typer_instance)
