"""Direction-aware change record shared by the three format checkers.

Each checker diffs an OLD and a NEW schema once and says, per change, whether it breaks
BACKWARD reading (new reader, old data) and/or FORWARD reading (old reader, new data).
The mode logic in ``__init__`` then turns a change into a breaking finding or a warning.
That keeps the format rules free of mode plumbing and makes FULL exactly "both".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Change:
    rule: str
    path: str
    reason: str
    hint: str = ""
    breaks_backward: bool = False
    breaks_forward: bool = False
