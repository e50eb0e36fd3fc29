"""The one error printer (app/cli/output.py): every failure is one `error [code] ... fix:` line,
whichever package's command raised it and whatever its text holds."""

from __future__ import annotations

import io

import typer
from rich.console import Console
from typer.testing import CliRunner

from app.cli.output import friendly_everywhere, print_error
from app.errors import PrismError


def test_an_error_whose_text_has_line_breaks_is_printed_on_one_line() -> None:
    """protoc's 33-line message for a bad .proto (`prism schema validate`) was printed as 33
    lines; a grep for `error [` then saw one of them."""
    out = io.StringIO()
    exc = PrismError("invalid schema: a.proto:1:2: first\na.proto:2:1: second\n\n  third", path="a.proto",
                     hint="fix the schema")
    exc.code = "invalid_schema"
    print_error(exc, Console(file=out, width=40, color_system=None))
    assert out.getvalue() == ("error [invalid_schema] invalid schema: a.proto:1:2: first a.proto:2:1: second third "
                              "(at a.proto); fix: fix the schema\n")


def test_every_command_of_every_mounted_sub_app_is_friendly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Sub-apps mounted from other packages (`schema`, `lake`, `console`) were not wrapped: a path
    that was a directory (`prism schema get --output FILE`) was an `OSError` traceback there
    and the one `file_error` line everywhere else."""
    from app.cli.main import build_app

    def callbacks(tree: typer.Typer) -> list:
        found = [c.callback for c in tree.registered_commands]
        for group in tree.registered_groups:
            found += callbacks(group.typer_instance)
        return found

    every = callbacks(build_app())
    names = {cb.__name__ for cb in every}
    assert {"hash_password_cmd", "audit_cmd", "stats", "vacuum"} <= names, names  # schema and lake are in it
    assert all(getattr(cb, "_prism_friendly", False) for cb in every), \
        [cb.__qualname__ for cb in every if not getattr(cb, "_prism_friendly", False)]

    root, sub = typer.Typer(), typer.Typer()

    @sub.command()
    def save() -> None:
        (tmp_path / "exists").write_text("x")
        (tmp_path / "exists").mkdir()  # FileExistsError, with the file name

    @sub.command()
    def refuse() -> None:
        raise typer.Exit(1)  # a command's own exit code passes through

    root.add_typer(sub, name="sub")
    friendly_everywhere(root)
    friendly_everywhere(root)  # idempotent: wrapped once
    res = CliRunner().invoke(root, ["sub", "save"])
    assert res.exit_code == 2 and res.output.startswith("error [file_error] cannot use ") and "fix:" in res.output
    assert CliRunner().invoke(root, ["sub", "refuse"]).exit_code == 1
    assert not hasattr(sub.registered_commands[0].callback.__wrapped__, "__wrapped__")
