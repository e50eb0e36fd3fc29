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
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from app.errors import PrismError

F = TypeVar("F", bound=Callable[..., Any])
#: Errors go to stderr, so `--json` output on stdout stays parseable.
err_console = Console(stderr=True)


def error_line(exc: PrismError) -> str:
    """The one-line error as markup: a red `error` tag, then the code and text escaped."""
    return f"[bold red]error[/] {escape(f'[{exc.code}] {exc}')}"


def print_error(exc: PrismError, console: Console | None = None) -> None:
    """Print `exc` as the documented one-line error (never wrapped: scripts and people grep it)."""
    (console or err_console).print(error_line(exc), soft_wrap=True, highlight=False)


def friendly(fn: F) -> F:
    """Turn Prism's typed errors into one readable line and exit code 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PrismError as exc:
            print_error(exc)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]
