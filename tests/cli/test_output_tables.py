"""CLI tables (app/cli/output.py CliTable): headers break between words, never inside one, and
ids fold onto the next line instead of being cut with an ellipsis at 80 columns."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from app.cli.output import CliTable

HEADERS = ("worker", "topic", "partition", "committed", "high water", "lag", "state", "message id")
MESSAGE_ID = "0190a6f0-3b1e-7c8e-9d2a-5f4e3c2b1a00"


def render(width: int, table: CliTable) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, legacy_windows=False).print(table)
    return out.getvalue()


def status_table() -> CliTable:
    t = CliTable(title="source partitions")
    for h in HEADERS:
        t.add_column(h)
    t.add_row("worker-7f3c", "orders.created.eu-west-1", "3", "123456789", "123456999", "210", "ok", MESSAGE_ID)
    return t


def cells(text: str) -> list[list[str]]:
    """The table's lines split into cells (box characters removed)."""
    return [[c.strip() for c in re.split(r"[┃│]", line)[1:-1]] for line in text.splitlines() if line[:1] in "┃│"]


@pytest.mark.parametrize("width", [76, 80, 100])
def test_headers_never_break_inside_a_word(width: int) -> None:
    """Whenever the header words fit side by side at all (here from 74 columns)."""
    text = render(width, status_table())
    assert max(len(line) for line in text.splitlines()) <= width
    header_lines = [line for line in text.splitlines() if line.startswith("┃")]
    words = {w for line in header_lines for w in re.split(r"[┃\s]+", line) if w}
    assert words == {w for h in HEADERS for w in h.split()}, words  # every header word whole (no PARTITIO/N)


@pytest.mark.parametrize("width", [60, 80, 100, 200])
def test_ids_fold_whole_instead_of_being_cut(width: int) -> None:
    text = render(width, status_table())
    assert "…" not in text
    column = HEADERS.index("message id")
    body = [row[column] for row in cells(text.split("┡", 1)[1])]
    assert "".join(body) == MESSAGE_ID  # every character, in order, over as many lines as needed


def test_too_narrow_for_the_headers_is_still_within_the_width() -> None:
    text = render(40, status_table())  # rich's own narrowing: words break, nothing is cropped
    assert max(len(line) for line in text.splitlines()) <= 40 and "└" in text


def test_explicit_column_settings_win() -> None:
    t = CliTable()
    t.add_column("id", overflow="ellipsis", no_wrap=True, max_width=8)
    t.add_row(MESSAGE_ID)
    assert "…" in render(80, t)
