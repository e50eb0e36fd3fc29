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
from rich.console import Console
from rich.markup import escape

from app.errors import ConfigProblems, PrismError

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
#: Errors go to stderr, so `--json` output on stdout stays parseable.
err_console = Console(stderr=True)


def error_line(exc: PrismError) -> str:
    """The one-line error as markup: a red `error` tag, then the code and text escaped."""
    return f"[bold red]error[/] {escape(f'[{exc.code}] {exc}')}"


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
    mid-command, a timeout) as the typed error it is; None for anything else (a bug: its
    traceback is the report). Authentication and TLS failures keep their own codes."""
    from aiokafka.errors import KafkaError

    from app.errors import BrokerError

    if not isinstance(exc, KafkaError | OSError | TimeoutError):
        return None
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

    return wrapper  # type: ignore[return-value]
