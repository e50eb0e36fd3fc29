"""The payload check's compiled one-sided fast path (`prism_native.DocPlan.fits`, wired in
app/schema/payload_check.py's `_protobuf_validator`): whenever it says True, the pure-Python
validator (native off) reports no violation AND `json_format.Parse` accepts the document - for
generated schemas and for documents generated around them (valid ones, mutated ones, arbitrary
bytes, hostile edges). It must also say True for most valid documents (else it is only a cost),
and the validator with it wired in must give exactly what the pure-Python one gives.

The native module is optional (a machine without cargo runs pure Python), so locally these tests
skip without it; under CI=true a missing module FAILS them, as tests/envelope/test_wire_native.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest
from google.protobuf import descriptor_pool, json_format, message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import native
from app.schema import payload_check
from app.schema.payload_check import _FAST_DEPTH, _flat_plan, _json_plan
from app.schema.protoparse import compile_proto
from app.schema.resolve import build_resolved
from tests.schema.test_payload_check_fast import DOCS, ORDERS, OTHER, PROTO
from tests.support import require

try:
    import prism_native  # type: ignore[import-not-found, unused-ignore]
except ImportError:
    prism_native = None

PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(autouse=True)
def _native_built() -> None:
    require(prism_native is not None and native.ACTIVE,
            f"prism_native is not built or not in use ({native.reason}; make native: needs cargo)")


@dataclass
class Schema:
    """A schema three ways: the compiled check, the pure-Python validator, the message class."""

    text: str
    root: str
    fits: Callable[[bytes], bool]
    pure: Callable[[bytes, str], list[Any]]
    wired: Callable[[bytes, str], list[Any]]
    cls: Any


@cache
def schema(text: str, root: str) -> Schema:
    compiled = compile_proto(text)
    pool = descriptor_pool.DescriptorPool()
    for fd in compiled.fds.file:
        pool.Add(fd)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(root))
    plan = _json_plan(cls.DESCRIPTOR)
    assert plan is not None, text
    resolved = build_resolved(text, "protobuf", url="u", version="v1", message=root)
    saved = native.module
    native.module = None  # the validator as a machine without the module builds it
    try:
        pure = payload_check._protobuf_validator(resolved)
    finally:
        native.module = saved
    wired = payload_check._protobuf_validator(resolved)
    return Schema(text, root, prism_native.DocPlan(_flat_plan(plan), _FAST_DEPTH).fits, pure, wired, cls)


def parse_accepts(cls: Any, payload: bytes) -> bool:
    try:
        json_format.Parse(payload, cls())
    except Exception:
        return False
    return True


def check(s: Schema, payload: bytes) -> bool:
    """The property: native True => pure validator says [] and Parse accepts. Also: the wired
    validator says what the pure one says (text for text). Returns the native verdict."""
    yes = s.fits(payload)
    assert type(yes) is bool
    pure = [v.message for v in s.pure(payload, "application/json")]
    if yes:
        assert pure == [], (payload, pure)
        assert parse_accepts(s.cls, payload), payload
    assert [v.message for v in s.wired(payload, "application/json")] == pure, payload
    return yes


# --------------------------------------------------------------------------- generated schemas

SCALAR_TYPES = ["string", "bool", "int32", "sint32", "sfixed32", "int64", "sint64", "sfixed64", "uint32",
                "fixed32", "uint64", "fixed64", "double", "float"]
#: field names: some with a json_name of their own (`order_id` -> `orderId`), some not
NAMES = ["a", "qty", "order_id", "customer_id", "tax_amount", "x1", "big_value", "tags", "sub_items", "b_c_d"]


@st.composite
def schemas(draw: st.DrawFn) -> tuple[str, str]:
    """A proto3 file of 1-3 messages (M0 the root) whose every field the fast path understands:
    the scalars, nested and recursive messages, repeated fields, proto3 `optional`."""
    n = draw(st.integers(1, 3))
    bodies = []
    for _ in range(n):
        names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=6, unique=True))
        fields = []
        for number, name in enumerate(names, 1):
            kind = draw(st.sampled_from([*SCALAR_TYPES, "message"]))
            typ = f"M{draw(st.integers(0, n - 1))}" if kind == "message" else kind
            label = draw(st.sampled_from(["", "repeated "] + (["optional "] if kind != "message" else [])))
            fields.append(f"  {label}{typ} {name} = {number};")
        bodies.append(fields)
    text = 'syntax = "proto3";\npackage gen;\n' + "".join(
        f"message M{i} {{\n" + "\n".join(body) + "\n}\n" for i, body in enumerate(bodies))
    return text, "gen.M0"


def value_of(check: tuple[Any, ...], depth: int) -> st.SearchStrategy[Any]:
    """Values of one field that fit it (bounds included), from `_json_plan`'s check tuple."""
    kind, lo, hi, repeated, sub, _alias = check
    if kind == payload_check._STR:
        one: st.SearchStrategy[Any] = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)
    elif kind == payload_check._BOOL:
        one = st.booleans()
    elif kind == payload_check._INT:
        one = st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0]))
    elif kind == payload_check._NUM:
        one = st.one_of(st.floats(lo, hi), st.integers(-2**63, 2**64 - 1), st.sampled_from([0.0, -0.0, lo, hi]))
    else:
        one = documents(sub, depth + 1) if depth < 6 else st.just({})
    return st.lists(one, max_size=3) if repeated else one


def documents(plan: dict[str, Any], depth: int = 1) -> st.SearchStrategy[dict[str, Any]]:
    """Objects that fit `plan`: each field at most once, under one of its spellings."""
    fields: dict[str, list[str]] = {}
    for key, check in plan.items():
        names = sorted({key} | ({check[5]} if check[5] else set()))
        fields.setdefault(names[0], names)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for names in fields.values():
            if draw(st.booleans()):
                key = draw(st.sampled_from(names))
                out[key] = draw(value_of(plan[key], depth))
        return out

    return build()


def render(doc: Any, draw: st.DrawFn) -> bytes:
    """JSON text of `doc` with varied whitespace and escaping."""
    indent = draw(st.sampled_from([None, 0, 2, "\t"]))
    seps = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\r\n", " :\t")]))
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()), indent=indent,
                      separators=None if indent is not None else seps)
    return text.encode("utf-8")


@st.composite
def schema_and_valid(draw: st.DrawFn) -> tuple[Schema, bytes]:
    s = schema(*draw(schemas()))
    plan = _json_plan(s.cls.DESCRIPTOR)
    return s, render(draw(documents(plan)), draw)


#: edits that make a document uncertain or wrong (each an edge named in issue 29)
HOSTILE_VALUES = [None, 1.5, 1e400, -1e400, -0.0, 2**64, -2**63 - 1, 2**31, -2**31 - 1, 10**30, "\u0000", "\ud800",
                  "a\udfffb", [], {}, [None], True, "1", 3.4028235e38, 1.7976931348623157e308, math.nan, math.inf]


@st.composite
def mutated(draw: st.DrawFn) -> tuple[Schema, bytes]:
    """A valid document changed structurally (a key or value swapped, a key repeated or spelt
    both ways, keys escaped) or byte by byte (a BOM, a trailing comma, invalid UTF-8 ...)."""
    s = schema(*draw(schemas()))
    plan = _json_plan(s.cls.DESCRIPTOR)
    doc = draw(documents(plan))
    keys = sorted(plan)
    how = draw(st.integers(0, 8))
    numeric = [k for k in keys if plan[k][0] in (payload_check._INT, payload_check._NUM)]
    if how == 8 and numeric:  # a number just past the field's bounds, or a float for an integer
        key = draw(st.sampled_from(numeric))
        kind, lo, hi = plan[key][:3]
        past = [lo - 1, hi + 1, float(hi), 0.5] if kind == payload_check._INT else [
            math.nextafter(hi, math.inf), math.nextafter(lo, -math.inf), hi * 1.0000001, 2**64, -2**63 - 1]
        value = draw(st.sampled_from(past))
        doc[key] = [value] if plan[key][3] else value
        payload = json.dumps(doc).encode()
    elif how == 0 and keys:  # a value of a wrong or hostile kind
        doc[draw(st.sampled_from(keys))] = draw(st.sampled_from(HOSTILE_VALUES))
        payload = json.dumps(doc).encode("utf-8", "surrogatepass")
    elif how == 1 and doc:  # a key repeated (the text of an object with both members)
        key = draw(st.sampled_from(sorted(doc)))
        body = render(doc, draw)[:-1].rstrip()
        payload = body + b', "' + key.encode() + b'": ' + json.dumps(doc[key]).encode() + b"}"
    elif how == 2 and doc:  # a key written with escapes (the same key, or one equal to another's)
        key = draw(st.sampled_from(sorted(doc)))
        escaped = "".join(f"\\u{ord(c):04x}" if draw(st.booleans()) else c for c in key)
        other = draw(st.sampled_from(keys))
        payload = json.dumps({**doc, other: doc[key]}).encode()[:-1] + f', "{escaped}": 1}}'.encode()
        payload = payload.replace(b"{, ", b"{")
    elif how == 3:  # both spellings of one field
        spelt = [(k, c[5]) for k, c in plan.items() if c[5]]
        if spelt:
            a, b = draw(st.sampled_from(spelt))
            doc[a] = doc[b] = draw(value_of(plan[a], 1))
        payload = json.dumps(doc).encode()
    elif how == 4:  # an unknown key, at the top or in a nested object
        payload = json.dumps({**doc, draw(st.sampled_from(["unknown", "[ext]", "Qty", ""])): 1}).encode()
    elif how == 5:  # nesting as deep as the fast depth and past it
        msg = [(k, c) for k, c in plan.items() if c[0] == payload_check._MSG]
        if msg:
            key, c = msg[0]
            levels = draw(st.integers(_FAST_DEPTH - 3, _FAST_DEPTH + 3))
            inner: Any = {}
            for _ in range(levels):
                inner = {key: [inner] if c[3] else inner} if key in c[4] else inner
            doc[key] = [inner] if c[3] else inner
        payload = json.dumps(doc).encode()
    else:  # byte edits
        payload = bytearray(render(doc, draw))
        for _ in range(draw(st.integers(1, 3))):
            edit = draw(st.integers(0, 4))
            i = draw(st.integers(0, max(len(payload) - 1, 0)))
            if edit == 0:
                payload[0:0] = b"\xef\xbb\xbf"
            elif edit == 1:
                payload[-1:-1] = b","
            elif edit == 2 and payload:
                payload[i] = draw(st.sampled_from(b' \t\n\r\x0c\x00"\\/:,[]{}0123456789.eE+-tfnaul\x7f\xc3\xff\xed'))
            elif edit == 3:
                payload[i:i] = draw(st.sampled_from([b"\xff", b"\xed\xa0\x80", b"\xc3", b" ", b"\r\n", b"\\u0000"]))
            else:
                payload += draw(st.sampled_from([b"x", b" ", b"{}", b"\x00", b"]"]))
        payload = bytes(payload)
    return s, payload


@PROPERTY
@given(schema_and_valid())
def test_valid_documents_of_generated_schemas(case: tuple[Schema, bytes]) -> None:
    check(*case)


@PROPERTY
@given(mutated())
def test_mutated_documents_of_generated_schemas(case: tuple[Schema, bytes]) -> None:
    check(*case)


@PROPERTY
@given(schemas(), st.binary(max_size=64))
def test_arbitrary_bytes(text_root: tuple[str, str], payload: bytes) -> None:
    check(schema(*text_root), payload)


def test_most_valid_documents_are_decided_natively() -> None:
    """The check is only worth its call if valid documents pass it: of a few hundred valid
    documents of generated schemas, nearly all (only values within a hair of a float bound, and
    `-0` in integer fields, are left to Python - neither is generated often)."""
    verdicts: list[bool] = []

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(schema_and_valid())
    def run(case: tuple[Schema, bytes]) -> None:
        verdicts.append(check(*case))

    run()
    assert len(verdicts) >= 200 and sum(verdicts) >= 0.9 * len(verdicts), (sum(verdicts), len(verdicts))


# --------------------------------------------------------------------------- the shared fast-path schemas

@PROPERTY
@given(DOCS)
def test_the_fast_path_documents(doc: dict[str, Any]) -> None:
    payload = json.dumps(doc).encode()
    check(schema(PROTO, "fast.Order"), payload)


@PROPERTY
@given(ORDERS)
def test_well_typed_orders(doc: dict[str, Any]) -> None:
    check(schema(PROTO, "fast.Order"), json.dumps(doc).encode())


def test_schemas_the_fast_path_stands_aside_from_get_no_compiled_check() -> None:
    """Enums, maps, well-known types, bytes, oneofs: no plan, so nothing compiled either."""
    compiled = compile_proto(OTHER)
    pool = descriptor_pool.DescriptorPool()
    for fd in compiled.fds.file:
        pool.Add(fd)
    desc = pool.FindMessageTypeByName("other.Doc")
    assert _json_plan(desc) is None and payload_check._compiled_fits(None) is None


ORDER = schema(PROTO, "fast.Order") if prism_native is not None else None


@pytest.mark.parametrize("payload", [
    b'{"order_id": "a", "order_id": "b"}', b'{"order_id": "a", "orderId": "b"}', b'{"order\\u005fid": "a", "order_id": "b"}',
    b'{"orderId": "\\ud800"}', b'{"orderId": "a\\udfffb"}', b'{"orderId": null}', b'{"small": -1}', b'{"small": 4294967296}',
    b'{"big": 9223372036854775808}', b'{"huge": 18446744073709551616}', b'{"delta": 1.0}', b'{"delta": 1e2}',
    b'{"total": 1e400}', b'{"total": NaN}', b'{"total": -Infinity}', b'{"weight": 3.4028235e38}', b'{"weight": 3.5e38}',
    b'{"total": 1.7976931348623157e308}', b'\xef\xbb\xbf{}', b"{},",
    b'{"tags": ["a",]}', b'{"tags": ["a"],}', b"[]", b'"x"', b"", b"{} x", b'{"orderId": "\xff"}',
    b'{"orderId": "\xed\xa0\x80"}', b'{"items": [{"sku": "a", "sku": "b"}]}', b'{"items": [{"colour": "red"}]}',
    b'{"unknown": 1}', b'{"[fast.ext]": 1}',
])
def test_hostile_edges_are_left_to_python(payload: bytes) -> None:
    assert ORDER is not None
    assert check(ORDER, payload) is False


@pytest.mark.parametrize("payload", [
    b"{}", b' \t\r\n{ "orderId" : "\\u0000", "tags" : [ ] }\r\n', b'{"order\\u005fid": "\\ud83d\\ude00"}',
    b'{"total": -0.0, "weight": 3.4e38, "big": -9223372036854775808, "huge": 18446744073709551615}',
    b'{"items": [{"sku": "s", "qty": -2147483648, "parts": [{"sku": "p:q"}]}], "taxAmount": 0, "gift": false}',
    b'{"total": 123456789012345678901234567890}',  # an integer beyond 64 bits is a double's value (float(int))
])
def test_certain_documents_are_decided_natively(payload: bytes) -> None:
    assert ORDER is not None
    assert check(ORDER, payload) is True


def test_the_bench_order_is_decided_natively(monkeypatch: pytest.MonkeyPatch) -> None:
    """The valid ~1 KB order of the benchmarks (`bench_pipeline.payload_valid_1kb`) against the
    shipped topology's schema: decided by the compiled check, no Python decode at all."""
    from app.envelope import new_envelope
    from app.schema.resolve import resolve_schema_config
    from bench.bench_pipeline import payload_valid_1kb
    from tests.agents.test_enrich_schema import PROTO as ORDERS_SCHEMA

    resolved = resolve_schema_config(ORDERS_SCHEMA)
    validate = payload_check.validator_for(resolved)

    def no_decode(*_: Any) -> Any:
        raise AssertionError("the Python decode ran")

    monkeypatch.setattr(payload_check, "_load_json_plain", no_decode)
    for i in range(50):
        env = new_envelope("orders.created", payload_valid_1kb(i), namespace="order-events")
        payload = env.payload_bytes()  # the bytes the worker validates (compact JSON)
        assert validate(payload, "application/json") == []
    bad = json.dumps({**payload_valid_1kb(1), "total": "x"}).encode()
    with pytest.raises(AssertionError, match="the Python decode ran"):
        validate(bad, "application/json")


def nested_parts(levels: int) -> bytes:
    """An order whose item nests `levels` levels of `parts`: the innermost object is at depth
    levels + 2 (the document is 1, the item 2)."""
    return b'{"items": [' + b'{"parts": [' * levels + b"{}" + b"]}" * levels + b"]}"


def test_nesting_is_followed_to_the_python_fast_depth_and_no_further() -> None:
    assert ORDER is not None
    assert check(ORDER, nested_parts(_FAST_DEPTH - 2)) is True
    assert check(ORDER, nested_parts(_FAST_DEPTH - 1)) is False  # Parse accepts it, but decides it
    assert check(ORDER, nested_parts(200)) is False


RECURSIVE = 'syntax = "proto3";\npackage deep;\nmessage N { N next = 1; string s = 2; }\n'


@pytest.mark.parametrize("levels", [_FAST_DEPTH - 1, _FAST_DEPTH, 99, 100, 101, 127, 128, 2000])
def test_deep_documents_past_parses_own_limit(levels: int) -> None:
    """Singular nested messages: Parse refuses more than 100 levels, serde_json more than 128;
    the compiled check follows none past the fast depth."""
    s = schema(RECURSIVE, "deep.N")
    payload = b'{"next": ' * levels + b'{"s": "x"}' + b"}" * levels
    assert check(s, payload) is (levels + 1 <= _FAST_DEPTH)
