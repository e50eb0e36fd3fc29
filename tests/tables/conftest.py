"""Fixtures for the table tests (the `broker` fixture is in tests/conftest.py)."""

from __future__ import annotations

from typing import Any


class FakeTable(dict[Any, Any]):
    """A dict that is also its own store (`table.data`, where direct writes go)."""

    @property
    def data(self) -> FakeTable:
        return self


class FakeApp:
    """Just enough of faust.App for the table bindings' constructors: dict tables, timers recorded."""

    def __init__(self) -> None:
        self.timers: list[tuple[float, Any]] = []

    def Table(self, name: str, **kwargs: Any) -> FakeTable:
        return FakeTable()

    def timer(self, interval: float, name: str | None = None) -> Any:
        def register(fun: Any) -> Any:
            self.timers.append((interval, fun))
            return fun
        return register
