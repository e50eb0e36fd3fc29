"""The one bounded decoder of untrusted JSON (app.untrusted_json): any input gives a value or a
JsonInputError (a PrismError), never RecursionError, UnicodeDecodeError or another exception."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import JsonInputError, JsonSyntaxError, JsonTooDeepError, JsonTooLargeError, PrismError
from app.untrusted_json import DEFAULT_MAX_DEPTH, dumps_checked, json_depth, loads_untrusted, read_json_response

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=25)


def _value_or_typed_error(data: bytes | str, **limits: int) -> None:
    try:
        loads_untrusted(data, what="test input", **limits)
    except JsonInputError as exc:
        assert isinstance(exc, PrismError) and exc.path == "test input" and exc.hint


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_give_a_value_or_a_json_input_error(data: bytes) -> None:
    _value_or_typed_error(data)


# Bytes drawn from JSON's own alphabet reach the parser (arbitrary bytes mostly stop at UTF-8).
@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet='[]{}",:\\ 0123456789.eE+-truefalsnNIinfyx\u00e9\ud800', max_size=80),
       st.integers(min_value=0, max_value=8))
def test_any_json_like_text_gives_a_value_or_a_json_input_error(text: str, max_depth: int) -> None:
    _value_or_typed_error(text, max_depth=max_depth)


@settings(max_examples=500, deadline=None)
@given(json_values, st.sampled_from([None, 1]))
def test_any_json_document_round_trips_and_its_depth_is_exact(value: object, indent: int | None) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    assert loads_untrusted(text, what="doc") == value
    assert loads_untrusted(text.encode(), what="doc") == value  # st.text() draws no lone surrogates

    def depth(v: object) -> int:
        if isinstance(v, list):
            return 1 + max(map(depth, v), default=0)
        if isinstance(v, dict):
            return 1 + max(map(depth, v.values()), default=0)
        return 0

    assert json_depth(text) == depth(value)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=12), st.integers(min_value=0, max_value=12), st.sampled_from("[{"))
def test_depth_limit_is_exact(depth: int, max_depth: int, opener: str) -> None:
    text = ('{"k":' * depth + "1" + "}" * depth) if opener == "{" else ("[" * depth + "]" * depth)
    if depth <= max_depth:
        loads_untrusted(text, what="doc", max_depth=max_depth)
    else:
        with pytest.raises(JsonTooDeepError):
            loads_untrusted(text, what="doc", max_depth=max_depth)


@pytest.mark.parametrize("levels", [DEFAULT_MAX_DEPTH + 1, 3_000, 100_000, 200_000])
@pytest.mark.parametrize("opener,closer", [("[", "]"), ('{"a":', "}")])
def test_deep_nesting_is_a_typed_error_not_recursion_error(levels: int, opener: str, closer: str) -> None:
    with pytest.raises(JsonTooDeepError, match="nested too deeply"):
        loads_untrusted(opener * levels + closer * levels, what="CloudEvent data")


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps(["[" * 10_000, {"k": '{{{\\"[[['}])
    assert loads_untrusted(text, what="doc", max_depth=2) == ["[" * 10_000, {"k": '{{{\\"[[['}]


def test_deep_nesting_inside_a_caller_that_is_already_deep_is_a_typed_error() -> None:
    """The depth scan keeps `max_depth` levels from the parser, but a caller near the recursion
    limit could still overflow at fewer: that too is the typed error."""
    def at_depth(n: int) -> None:
        if n:
            at_depth(n - 1)
        else:
            loads_untrusted("[" * 100 + "]" * 100, what="doc")

    with pytest.raises(JsonTooDeepError):
        at_depth(sys.getrecursionlimit() - 60)


def test_size_limit_is_checked_before_parsing() -> None:
    with pytest.raises(JsonTooLargeError, match="over the 10-byte limit"):
        loads_untrusted(b"[" * 11, what="doc", max_bytes=10)
    assert loads_untrusted(b"[1,2,3,40]", what="doc", max_bytes=10) == [1, 2, 3, 40]


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", "-Infinity", "1e999", "[-1e400]", "1" * 5000,
                                  "\ufeff{}", "{'a': 1}", "[1,]", "", "   ", "[1] [2]"])
def test_not_strict_json_is_a_syntax_error(text: str) -> None:
    with pytest.raises(JsonSyntaxError):
        loads_untrusted(text, what="doc")


def test_invalid_utf8_is_a_syntax_error_with_the_byte() -> None:
    with pytest.raises(JsonSyntaxError, match="not valid UTF-8 \\(byte 2\\)"):
        loads_untrusted(b'["\xff"]', what="doc")


def test_duplicate_keys_at_any_depth_are_refused_when_asked() -> None:
    assert loads_untrusted('{"a":1,"a":2}', what="doc") == {"a": 2}
    with pytest.raises(JsonSyntaxError, match="duplicate key 'a'"):
        loads_untrusted('{"x":[{"a":1,"a":2}]}', what="doc", reject_duplicate_keys=True)


def test_the_errors_are_value_errors_too() -> None:
    """Callers that caught json.loads' ValueError keep catching the decoder's errors."""
    with pytest.raises(ValueError):
        loads_untrusted("[" * 1000, what="doc")


def test_dumps_checked_turns_deep_and_circular_values_into_typed_errors() -> None:
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(JsonTooDeepError, match="nested too deeply to encode"):
        dumps_checked(deep, what="payload")
    loop: dict = {}
    loop["self"] = loop
    with pytest.raises(JsonTooDeepError, match="circular"):
        dumps_checked(loop, what="payload")
    assert dumps_checked({"a": [1]}, what="payload") == '{"a": [1]}'


@pytest.mark.parametrize("levels", [DEFAULT_MAX_DEPTH, DEFAULT_MAX_DEPTH + 1, 500])
def test_dumps_checked_refuses_what_no_reader_would_accept(levels: int) -> None:
    """What is sent is what every reader accepts: one depth limit on both sides."""
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    if levels <= DEFAULT_MAX_DEPTH:
        assert loads_untrusted(dumps_checked(value, what="payload"), what="payload") == value
    else:
        with pytest.raises(JsonTooDeepError, match=f"{levels} levels, over the limit"):
            dumps_checked(value, what="payload")


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_whatever_dumps_checked_sends_loads_untrusted_reads(value: object) -> None:
    assert loads_untrusted(dumps_checked(value, what="payload"), what="payload") == value


class _Body:
    """A response body that counts what is read from it."""

    def __init__(self, data: bytes) -> None:
        self.data, self.taken = data, 0

    def read(self, n: int = -1) -> bytes:
        out = self.data[self.taken:] if n < 0 else self.data[self.taken:self.taken + n]
        self.taken += len(out)
        return out


def test_a_response_body_is_read_no_further_than_its_limit() -> None:
    body = _Body(b"[" + b"1," * 1_000_000 + b"1]")
    with pytest.raises(JsonTooLargeError, match="answered with more than 1000 bytes"):
        read_json_response(body, what="GET http://x/", max_bytes=1000)
    assert body.taken == 1001  # not the 2 MB behind it


@pytest.mark.parametrize(("data", "value"), [(b"", None), (b"  \n", None), (b'{"a": [1]}', {"a": [1]})])
def test_a_response_body_decodes_like_any_untrusted_json(data: bytes, value: object) -> None:
    assert read_json_response(_Body(data), what="GET http://x/") == value


@pytest.mark.parametrize("data", [b"[" * 100_000 + b"]" * 100_000, b"{", b"\xff", b"NaN"])
def test_a_hostile_response_body_is_a_json_input_error(data: bytes) -> None:
    with pytest.raises(JsonInputError):
        read_json_response(_Body(data), what="GET http://x/")
