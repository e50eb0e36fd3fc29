"""The worker's modules import each other one way only (issue 29: `pipeline`, `observe` and
`management` used to import each other in a circle, held apart by function-local and
TYPE_CHECKING imports). Every import counts here - top-level, inside a function, under
TYPE_CHECKING - because a circle hidden in a function is still a circle a reader has to hold
in their head. And the observer and the management API load without the pipeline."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).resolve().parents[2] / "app" / "worker"


def _worker_imports(path: Path) -> set[str]:
    """The `app.worker.*` modules `path` imports anywhere in its body."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["app", "worker"] and len(parts) >= 3 and (WORKER / f"{parts[2]}.py").exists():
                out.add(parts[2])
    out.discard(path.stem)
    return out


def _graph() -> dict[str, set[str]]:
    return {p.stem: _worker_imports(p) for p in WORKER.glob("*.py") if p.stem != "__init__"}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (a list of modules, first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_import_circle_in_the_worker() -> None:
    assert _cycle(_graph()) is None, f"import circle: {' -> '.join(_cycle(_graph()) or [])}"


def test_the_circle_check_finds_a_circle() -> None:
    # the check itself: a circle through three modules, and one through a module and itself
    assert _cycle({"pipeline": {"observe"}, "observe": {"management"}, "management": {"pipeline"}}) == [
        "management", "pipeline", "observe", "management"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("module", ["observe", "management", "interfaces", "worker_state", "delivery",
                                    "at_least_once", "exactly_once", "batch_runner", "size_fit"])
def test_no_worker_part_imports_the_pipeline(module: str) -> None:
    """The composition root depends on its parts, never the other way round."""
    assert "pipeline" not in _worker_imports(WORKER / f"{module}.py")


def test_observer_and_management_load_without_the_pipeline() -> None:
    code = ("import sys, app.worker.observe, app.worker.management; "
            "print('app.worker.pipeline' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(WORKER.parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
