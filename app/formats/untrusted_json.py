"""The one place Prism's operator tools parse JSON they did not write: DLQ record values,
replay-ledger entries, audit records.

Why one place: these bytes come from whoever could write a topic. `json.loads` on them raised
`RecursionError` for a deeply nested value (a crash, not a `ValueError`), and a huge or deep
document then broke every page and command that showed it (the console's pretty printer recurses
too). Every such read goes through :func:`loads_untrusted`, which returns a value or raises a
`ValueError` naming the limit - nothing else - so a bounded decoder written elsewhere can replace
its body in one line.
"""

from __future__ import annotations

import re
from typing import Any

from ._json import loads as _strict_loads

#: Deepest nesting accepted: far beyond any record Prism writes (ledger and audit entries are
#: flat), shallow enough that printing it never nears the interpreter's recursion limit.
MAX_DEPTH = 64
#: Largest document parsed: a DLQ value is at most the DLQ topic's message size.
MAX_BYTES = 8 * 1024 * 1024

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def nesting_depth(text: str) -> int:
    """The deepest `[`/`{` nesting of `text`, brackets inside strings not counted."""
    depth = deepest = 0
    for m in _BRACKET.finditer(_STRING.sub('""', text)):
        if m.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def loads_untrusted(data: bytes | str, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES) -> Any:
    """`data` as JSON, or `ValueError` (not UTF-8, not JSON, NaN/Infinity, larger than
    `max_bytes`, nested deeper than `max_depth`) - never another exception."""
    if len(data) > max_bytes:
        raise ValueError(f"JSON of {len(data)} bytes is larger than the {max_bytes}-byte limit")
    text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
    if nesting_depth(text) > max_depth:
        raise ValueError(f"JSON is nested deeper than {max_depth} levels")
    return _strict_loads(text)
