"""Whole numbers written as text by someone else: a header, a path segment, an environment
variable, a file name, a field of a received envelope.

Why not ``text.isdigit()`` and then ``int(text)``, as a dozen places did? ``isdigit()`` is true
for "²" and "①", which ``int()`` refuses with ``ValueError`` - a 500 page from the registry or
the console, a traceback from the CLI, an untyped error from the SDK. And ``int()`` refuses
more than 4,300 digits, which a regex like ``\\d+`` lets through. `decimal` reads ASCII digits
only, and at most `most_digits` of them (18 fits a signed 64-bit integer), or says it cannot.
"""

from __future__ import annotations


def decimal(text: str | bytes | None, *, most_digits: int = 18) -> int | None:
    """`text` (surrounding whitespace ignored) as a non-negative whole number, or None when it
    is not 1 to `most_digits` ASCII digits."""
    if text is None:
        return None
    digits = text.strip()
    if not 0 < len(digits) <= most_digits or not digits.isascii() or not digits.isdigit():
        return None
    return int(digits)
