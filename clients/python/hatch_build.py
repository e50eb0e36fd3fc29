"""Hatch build hook of the prism-client wheel: puts the listed files of the worker's tree
(``../../app/``) into the wheel under ``prism_client/``.

Why a hook and not a copy: the envelope core and the SDK must exist once in the repository
(issue 22 item 6). The worker imports them as ``app.*``; the client gets the same files under
its own import name, so a service whose own package is called ``app`` can install it.

The hook stops the build, with the reason, when

* a listed glob matches nothing (a typo, or a build from an sdist, which has no ``../../app``);
* a listed module imports ``app`` absolutely: in the wheel there is no ``app``, so such an
  import would fail at run time in the team's service, or worse, import the team's own ``app``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGE = "prism_client"


def absolute_app_imports(path: Path) -> list[str]:
    """``file:line`` of every ``import app...`` / ``from app... import`` in a Python file,
    also inside functions (the SDK imports optional backends lazily)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        if any(name == "app" or name.startswith("app.") for name in names):
            found.append(f"{path}:{node.lineno}")
    return found


def source_files(app_dir: Path, patterns: list[str]) -> dict[Path, str]:
    """source file -> path inside the wheel, for the globs (relative to ``app_dir``)."""
    if not app_dir.is_dir():
        raise RuntimeError(f"{app_dir} not found: build the prism-client wheel from a checkout of the "
                           "repository (pip wheel ./clients/python, or make client-wheel), not from an sdist")
    files: dict[Path, str] = {}
    for pattern in patterns:
        matched = sorted(p for p in app_dir.glob(pattern) if p.is_file() and "__pycache__" not in p.parts)
        if not matched:
            raise RuntimeError(f"prism-client: the source pattern {pattern!r} matches no file under {app_dir}")
        for p in matched:
            files[p] = f"{PACKAGE}/{p.relative_to(app_dir).as_posix()}"
    return files


class CustomBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        app_dir = (Path(self.root) / ".." / ".." / "app").resolve()
        files = source_files(app_dir, list(self.config.get("sources", [])))
        own = {p.relative_to(self.root).as_posix()  # prism_client/__init__.py, prism_client/py.typed
               for p in (Path(self.root) / PACKAGE).rglob("*") if p.is_file() and "__pycache__" not in p.parts}
        clash = sorted(set(files.values()) & own)
        if clash:
            raise RuntimeError(f"prism-client: {clash} would replace the client's own file(s)")
        bad = [hit for src in files if src.suffix == ".py" for hit in absolute_app_imports(src)]
        if bad:
            raise RuntimeError("prism-client: these modules import `app` absolutely, which the wheel does not "
                               "contain; use a relative import:\n  " + "\n  ".join(bad))
        for src, dest in files.items():
            build_data["force_include"][str(src)] = dest
