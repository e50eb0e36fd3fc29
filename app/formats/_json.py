"""Strict JSON reading that remembers where each top-level member's value was.

Why not `json.loads`? Two input shapes (Redis `{"meta":…,"payload":…}` and CloudEvents
structured mode) embed the user's payload as one member of a JSON object. `json.loads` would
hand back a Python value whose re-serialization differs from what the producer sent
(whitespace, key order, number spelling, escapes), and Prism promises never to change payload
bytes. Walking the top-level object ourselves with the stdlib scanner gives each member's exact
text span, so the payload is the producer's bytes, not a re-encoding of them.

Strictness beyond the stdlib: duplicate top-level keys are refused (which one wins is
implementation-defined in JSON, so two readers could see different payloads), `NaN`/`Infinity`
are refused (not JSON), and nesting deeper than `app.untrusted_json.DEFAULT_MAX_DEPTH` is
refused before parsing (`JsonTooDeepError`, a `ValueError`), so neither this reader nor anything
that walks the payload later (a DLQ viewer, `payload()`) meets a `RecursionError`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from json.decoder import scanstring
from typing import Any

from ..envelope.compression import DEFAULT_MAX_DECOMPRESSED
from ..untrusted_json import DEFAULT_MAX_DEPTH, json_depth, loads_untrusted

_WS = re.compile(r"[ \t\n\r]*")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constants)


@dataclass(frozen=True, slots=True)
class Member:
    """One top-level member: its parsed value and the exact text of that value."""

    value: Any
    start: int
    end: int


class JsonShapeError(ValueError):
    """The text is not one strict JSON object (message says what and where)."""


def loads(text: str) -> Any:
    """`app.untrusted_json.loads_untrusted` at message size: its errors are ValueErrors too."""
    return loads_untrusted(text, what="JSON", max_bytes=DEFAULT_MAX_DECOMPRESSED)


def scan_object(text: str) -> dict[str, Member]:
    """Parse `text` as exactly one JSON object; map each key to its value and text span.

    Raises `JsonShapeError` (a ValueError) for anything else, with the character offset.
    """
    if text.count("[") + text.count("{") > DEFAULT_MAX_DEPTH and (depth := json_depth(text)) > DEFAULT_MAX_DEPTH:
        raise JsonShapeError(f"JSON is nested too deeply: {depth} levels, over the limit of {DEFAULT_MAX_DEPTH}")
    pos = _WS.match(text, 0).end()  # type: ignore[union-attr]
    if text[pos : pos + 1] != "{":
        raise JsonShapeError(f"expected a JSON object at char {pos}")
    pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
    members: dict[str, Member] = {}
    if text[pos : pos + 1] == "}":
        pos += 1
    else:
        while True:
            if text[pos : pos + 1] != '"':
                raise JsonShapeError(f"expected a member name at char {pos}")
            try:
                key, pos = scanstring(text, pos + 1, True)
            except json.JSONDecodeError as exc:
                raise JsonShapeError(f"bad member name: {exc.msg} at char {exc.pos}") from None
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if text[pos : pos + 1] != ":":
                raise JsonShapeError(f"expected ':' after member {key!r} at char {pos}")
            pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
            try:
                value, end = _DECODER.raw_decode(text, pos)
            except json.JSONDecodeError as exc:
                raise JsonShapeError(f"bad value of member {key!r}: {exc.msg} at char {exc.pos}") from None
            except RecursionError:
                raise JsonShapeError(f"value of member {key!r} is nested too deeply") from None
            except ValueError as exc:  # NaN / Infinity
                raise JsonShapeError(f"bad value of member {key!r}: {exc}") from None
            if key in members:
                raise JsonShapeError(f"member {key!r} appears twice")
            members[key] = Member(value, pos, end)
            pos = _WS.match(text, end).end()  # type: ignore[union-attr]
            sep = text[pos : pos + 1]
            if sep == ",":
                pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
                continue
            if sep == "}":
                pos += 1
                break
            raise JsonShapeError(f"expected ',' or '}}' at char {pos}")
    tail = _WS.match(text, pos).end()  # type: ignore[union-attr]
    if tail != len(text):
        raise JsonShapeError(f"unexpected data after the object at char {tail}")
    return members


def is_exact_json(data: bytes) -> bool:
    """True when `data` is UTF-8 JSON text with no surrounding whitespace, i.e. bytes that can be
    embedded verbatim as a JSON member value and recovered byte for byte by `scan_object`."""
    if not data or data != data.strip(b" \t\r\n"):
        return False
    try:
        loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return True


def dumps_compact(value: Any) -> bytes:
    """Compact, deterministic JSON bytes (sorted keys) for values Prism itself produces."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True).encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from a \ud800 escape: keep them escaped
        return json.dumps(value, separators=(",", ":"), ensure_ascii=True, sort_keys=True).encode("ascii")
