"""The repository stands alone: no tracked file cites material outside it.

Development notes once lived next to the checkout, in a sibling folder, and code, docs and
tests cited that notes file; a fresh clone has neither. The facts
now live in docs/platform-notes.md. This test keeps it that way, and checks that the relative
links in the docs point at files that exist.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from tests.support import require

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()
# Built from pieces so that this file does not match its own patterns when others grep.
FORBIDDEN = re.compile(r"\.\./" + "shared/|" + r"shared/" + r"ENGINEERING|ENGINEERING" + r"\.md")
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _tracked() -> list[str]:
    require(shutil.which("git") is not None and (ROOT / ".git").exists(), "a git checkout with the git command")
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], check=True, capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p]


def test_no_tracked_file_cites_material_outside_the_repository() -> None:
    notes = "ENGINEERING" + ".md"
    for cited in ("../" + "shared/seeds/spec.md", "shared/" + notes, f"see {notes}", f"(``{notes}``)"):
        assert FORBIDDEN.search(cited), cited  # the patterns catch every form that was in the tree
    assert not FORBIDDEN.search("docs/platform-notes.md")
    files = _tracked()
    assert len(files) > 100  # really the repository's file list
    hits = []
    for rel in files:
        if rel == SELF:
            continue
        path = ROOT / rel
        if not path.is_file():  # deleted in the working tree but still tracked
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary
            continue
        for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if FORBIDDEN.search(line):
                hits.append(f"{rel}:{n}: {line.strip()[:120]}")
    assert not hits, "cite docs/platform-notes.md (or another page in docs/) instead:\n" + "\n".join(hits)


def test_relative_links_in_the_docs_resolve() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        # code is not a link: `JSONPayload[Order](got)` in a Go snippet looks like one
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        text = re.sub(r"`[^`\n]*`", "", text)
        for target in MD_LINK.findall(text):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, "\n".join(broken)
