"""The one bounded decoder for JSON that Prism did not write.

Why not ``json.loads``? It has no size limit and no depth limit: a CloudEvent whose ``data`` is
nested 200,000 arrays deep raises ``RecursionError`` (not a ``PrismError``), and text nested a
few hundred levels parses but then breaks whatever walks the value afterwards (a renderer, a
schema compiler, ``json.dumps`` in a deeper stack). So every place that parses JSON from the
outside - message payloads, DLQ records, request bodies, schema texts, ledger and audit files -
calls :func:`loads_untrusted`, which

* refuses text over ``max_bytes`` before looking at it (:class:`~app.errors.JsonTooLargeError`);
* measures the nesting depth with a linear scan that recurses nowhere, and refuses text deeper
  than ``max_depth`` before parsing it (:class:`~app.errors.JsonTooDeepError`);
* parses strictly: UTF-8 only, no ``NaN``/``Infinity``, no number that overflows a float,
  optionally no key twice in one object (:class:`~app.errors.JsonSyntaxError`).

All three errors are :class:`~app.errors.JsonInputError`, a ``PrismError`` (and a ``ValueError``,
so callers that caught ``json.loads``' ``ValueError`` keep working). Nothing else escapes:
tests/test_untrusted_json.py checks that for arbitrary bytes with hypothesis.

:func:`dumps_checked` is the other direction for values a caller hands Prism (``publish()`` of
a Python object): ``json.dumps`` of a list nested 100,000 deep raises ``RecursionError``; this
raises :class:`~app.errors.JsonTooDeepError` instead, and so it does for any value deeper than
the readers' limit, which every consumer would refuse.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from itertools import accumulate
from typing import Any

from .errors import JsonSyntaxError, JsonTooDeepError, JsonTooLargeError

#: Default size limit: the registry's request-body limit, and far above any message payload.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
#: Default depth limit. Real documents (payloads, Avro and JSON schemas) stay well under 32
#: levels; 64 leaves room for them and keeps every recursive walker of the value far from the
#: interpreter's recursion limit of 1000: jsonschema spends about 7 frames a level checking a
#: JSON Schema, so 128 levels already overflowed it inside the registry's server stack.
DEFAULT_MAX_DEPTH = 64

# A JSON string (escapes included) - removed before the brackets are counted, so brackets
# inside strings do not count. Unrolled-loop form: linear, no nested backtracking.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in `text` (0 for a scalar). Exact for valid
    JSON; for invalid text it may be anything, but the parser then refuses the text anyway.
    Linear time, constant stack: regexes and ``accumulate`` run in C and recurse nowhere."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key[:100]!r} (it appears twice in one object)")
        out[key] = value
    return out


_DECODER = json.JSONDecoder(parse_constant=_no_constants, parse_float=_finite_float)
_STRICT_DECODER = json.JSONDecoder(parse_constant=_no_constants, parse_float=_finite_float,
                                   object_pairs_hook=_no_duplicates)


def loads_untrusted(data: bytes | bytearray | memoryview | str, *, what: str,
                    max_bytes: int = DEFAULT_MAX_BYTES, max_depth: int = DEFAULT_MAX_DEPTH,
                    reject_duplicate_keys: bool = False) -> Any:
    """Parse JSON that came from outside Prism, within limits; return the value.

    `what` names the input in the error (``"CloudEvent data"``, ``"DLQ record"``, ``"schema
    text"``); it is the error's ``path``. `max_bytes` counts bytes (characters for ``str``).
    Raises :class:`~app.errors.JsonTooLargeError`, :class:`~app.errors.JsonTooDeepError` or
    :class:`~app.errors.JsonSyntaxError` - never ``RecursionError`` or ``UnicodeDecodeError``.
    """
    if len(data) > max_bytes:
        raise JsonTooLargeError(f"JSON of {len(data)} bytes is over the {max_bytes}-byte limit", path=what,
                                hint="send a smaller document")
    if isinstance(data, str):
        text = data
    else:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonSyntaxError(f"JSON is not valid UTF-8 (byte {exc.start})", path=what,
                                  hint="encode the document as UTF-8") from None
    # Fewer opening brackets than the limit cannot nest deeper than it: skip the scan (str.count is C).
    depth = json_depth(text) if text.count("[") + text.count("{") > max_depth else 0
    if depth > max_depth:
        raise JsonTooDeepError(f"JSON is nested too deeply: {depth} levels, over the limit of {max_depth}", path=what,
                               hint=f"flatten the document to at most {max_depth} levels of arrays and objects")
    decoder = _STRICT_DECODER if reject_duplicate_keys else _DECODER
    try:
        return decoder.decode(text)
    except json.JSONDecodeError as exc:
        raise JsonSyntaxError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", path=what,
                              hint="send strict JSON (RFC 8259)") from None
    except RecursionError:  # a caller already deep in its own stack; the depth limit keeps this rare
        raise JsonTooDeepError("JSON is nested too deeply to parse here", path=what,
                               hint="flatten the document") from None
    except ValueError as exc:  # NaN/Infinity, a float out of range, an int of > 4300 digits, a duplicate key
        raise JsonSyntaxError(f"not valid JSON: {exc}", path=what, hint="send strict JSON (RFC 8259)") from None


def read_json_response(response: Any, *, what: str, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """The JSON body of an HTTP response (anything with ``read(n)``) from a server Prism talks
    to - the schema registry, a worker - read no further than `max_bytes` + 1 and decoded by
    `loads_untrusted`: a misconfigured or hostile address cannot make a CLI command or the
    console hold an unbounded body, or meet a ``RecursionError``. An empty body is ``None``."""
    data = response.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise JsonTooLargeError(f"{what} answered with more than {max_bytes} bytes", path=what,
                                hint="check that the address is the Prism server you meant")
    return loads_untrusted(data, what=what, max_bytes=max_bytes) if data.strip() else None


def dumps_checked(value: Any, *, what: str, encode: Callable[[Any], str] | None = None,
                  max_depth: int = DEFAULT_MAX_DEPTH) -> str:
    """``json.dumps(value)`` (or ``encode(value)``) for a value a caller hands Prism to send,
    refused with :class:`~app.errors.JsonTooDeepError` - instead of ``RecursionError`` or
    ``ValueError`` - when it is nested deeper than `max_depth` (what every Prism reader accepts:
    sending it would only make every consumer refuse it) or contains itself. The depth is
    scanned only when the text has more brackets than `max_depth` (``str.count``, in C)."""
    try:
        text = (encode or json.dumps)(value)
    except RecursionError:
        raise JsonTooDeepError("the value is nested too deeply to encode as JSON", path=what,
                               hint=f"flatten it to at most {max_depth} levels of lists and dicts") from None
    except ValueError as exc:
        if "circular" not in str(exc).lower():
            raise
        raise JsonTooDeepError("the value contains itself (a circular reference)", path=what,
                               hint="pass a tree of dicts and lists, not a graph") from None
    if text.count("[") + text.count("{") > max_depth and (depth := json_depth(text)) > max_depth:
        raise JsonTooDeepError(f"the value is nested too deeply: {depth} levels, over the limit of {max_depth} that "
                               "Prism's readers accept", path=what,
                               hint=f"flatten it to at most {max_depth} levels of lists and dicts")
    return text
