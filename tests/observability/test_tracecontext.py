"""W3C Trace Context: the spec's valid/invalid cases one by one.

Cases come from the W3C conformance suite (w3c/trace-context test/test.py, strict level 2)
and the spec prose (Level 1 REC + Level 2). IDs name the suite test they mirror.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.envelope import decode, encode, new_envelope
from app.errors import TraceContextError
from app.observability import tracecontext as tc

TID = "12345678901234567890123456789012"
PID = "1234567890123456"
VALID = f"00-{TID}-{PID}-01"

# --------------------------------------------------------------------------- traceparent table

TRACEPARENT_CASES = [
    # (id, value, expected (version, trace_id, parent_id, flags) or None = restart)
    ("spec_example_sampled", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
     ("00", "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1)),
    ("spec_example_not_sampled", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
     ("00", "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 0)),
    ("included", VALID, ("00", TID, PID, 1)),
    ("bytes_value", VALID.encode(), ("00", TID, PID, 1)),
    ("all_flags_parsed", f"00-{TID}-{PID}-ff", ("00", TID, PID, 0xFF)),
    ("version_0x00_trailing_dot", f"00-{TID}-{PID}-01.", None),
    ("version_0x00_future_fields", f"00-{TID}-{PID}-01-what-the-future-will-be-like", None),
    ("version_0x00_trailing_dash", f"00-{TID}-{PID}-01-", None),
    ("version_0xcc", f"cc-{TID}-{PID}-01", ("cc", TID, PID, 1)),
    ("version_0xcc_future_fields", f"cc-{TID}-{PID}-01-what-the-future-will-be-like", ("cc", TID, PID, 1)),
    ("version_0xcc_dot_after_flags", f"cc-{TID}-{PID}-01.what-the-future-will-be-like", None),
    ("version_0xcc_shorter_than_55", f"cc-{TID}-{PID}-1", None),
    ("version_0xcc_uppercase_trace_id", f"cc-4BF92F3577B34DA6A3CE929D0E0E4736-{PID}-01", None),
    ("version_0xff", f"ff-{TID}-{PID}-01", None),
    ("version_illegal_char_first", f".0-{TID}-{PID}-01", None),
    ("version_illegal_char_second", f"0.-{TID}-{PID}-01", None),
    ("version_uppercase", f"CC-{TID}-{PID}-01", None),
    ("version_too_long_3", f"000-{TID}-{PID}-01", None),
    ("version_too_long_4", f"0000-{TID}-{PID}-01", None),
    ("version_too_short", f"0-{TID}-{PID}-01", None),
    ("trace_id_all_zero", f"00-{'0' * 32}-{PID}-01", None),
    ("trace_id_illegal_first", f"00-.{TID[1:]}-{PID}-01", None),
    ("trace_id_illegal_last", f"00-{TID[:-1]}.-{PID}-01", None),
    ("trace_id_too_long", f"00-{TID}3-{PID}-01", None),
    ("trace_id_too_short", f"00-{TID[:-1]}-{PID}-01", None),
    ("trace_id_uppercase", f"00-4BF92F3577B34DA6A3CE929D0E0E4736-{PID}-01", None),
    ("parent_id_all_zero", f"00-{TID}-{'0' * 16}-01", None),
    ("parent_id_illegal_first", f"00-{TID}-.{PID[1:]}-01", None),
    ("parent_id_illegal_last", f"00-{TID}-{PID[:-1]}.-01", None),
    ("parent_id_too_long", f"00-{TID}-{PID}7-01", None),
    ("parent_id_too_short", f"00-{TID}-{PID[:-1]}-01", None),
    ("parent_id_uppercase", f"00-{TID}-00F067AA0BA902B7-01", None),
    ("trace_flags_illegal_first", f"00-{TID}-{PID}-.0", None),
    ("trace_flags_illegal_second", f"00-{TID}-{PID}-0.", None),
    ("trace_flags_too_long", f"00-{TID}-{PID}-001", None),
    ("trace_flags_too_short", f"00-{TID}-{PID}-1", None),
    ("trace_flags_uppercase", f"00-{TID}-{PID}-0A", None),
    ("ows_leading_space", f" {VALID}", ("00", TID, PID, 1)),
    ("ows_leading_tab", f"\t{VALID}", ("00", TID, PID, 1)),
    ("ows_trailing_space", f"{VALID} ", ("00", TID, PID, 1)),
    ("ows_trailing_tab", f"{VALID}\t", ("00", TID, PID, 1)),
    ("ows_both", f"\t {VALID} \t", ("00", TID, PID, 1)),
    ("inner_space", f"00-{TID} -{PID}-01", None),
    ("wrong_delimiter", f"00_{TID}_{PID}_01", None),
    ("empty", "", None),
    ("none", None, None),
    ("non_ascii_bytes", VALID.encode()[:-1] + b"\xff", None),
    ("non_ascii_text", VALID[:-1] + "\u00e9", None),
    ("prohibitively_large_future", f"cc-{TID}-{PID}-01-" + "x" * 600, None),
]


@pytest.mark.parametrize(("value", "expected"), [c[1:] for c in TRACEPARENT_CASES], ids=[c[0] for c in TRACEPARENT_CASES])
def test_parse_traceparent(value, expected):
    got = tc.parse_traceparent(value)
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert (got.version, got.trace_id, got.parent_id, got.flags) == expected


def test_future_version_is_downgraded_and_keeps_only_sampled_bit():
    tp = tc.parse_traceparent(f"cc-{TID}-{PID}-03-extra")
    assert tp is not None
    assert tp.to_header() == f"00-{TID}-{PID}-01"
    assert tp.random is False


def test_version_00_propagates_known_flags_only():
    tp = tc.parse_traceparent(f"00-{TID}-{PID}-ff")
    assert tp is not None and tp.sampled and tp.random
    assert tp.propagated_flags() == 0x03
    assert tp.to_header() == f"00-{TID}-{PID}-03"


def test_format_traceparent_roundtrip_and_flag_masking():
    assert tc.format_traceparent(TID, PID, 1) == VALID
    assert tc.format_traceparent(TID, PID, 0x0B) == f"00-{TID}-{PID}-03"
    assert tc.parse_traceparent(tc.format_traceparent(TID, PID, 2)).flags == 2


@pytest.mark.parametrize(
    ("trace_id", "parent_id", "flags"),
    [("0" * 32, PID, 1), (TID, "0" * 16, 1), ("4BF92F3577B34DA6A3CE929D0E0E4736", PID, 1), (TID[:-1], PID, 1), (TID, PID, 256),
     (TID, PID, -1), (TID, PID + "0", 1)],
    ids=["zero_trace", "zero_parent", "upper", "short", "flags_256", "flags_negative", "long_parent"],
)
def test_format_traceparent_refuses_garbage(trace_id, parent_id, flags):
    with pytest.raises(TraceContextError) as ei:
        tc.format_traceparent(trace_id, parent_id, flags)
    assert ei.value.code == "bad_trace_context"


def test_new_ids_are_valid_and_distinct():
    tids = {tc.new_trace_id() for _ in range(200)}
    sids = {tc.new_span_id() for _ in range(200)}
    assert len(tids) == 200 and len(sids) == 200
    assert all(tc.is_valid_trace_id(t) for t in tids)
    assert all(tc.is_valid_span_id(s) for s in sids)



def _reference_ids(getrandbits) -> tuple[str, str]:
    """The restart's ids as continue_or_start drew them before `new_trace_and_span_id`: a
    128-bit trace id, then a 64-bit span id, each formatted and redrawn while all zero."""
    while True:
        tid = f"{getrandbits(128):032x}"
        if tid != "0" * 32:
            break
    while True:
        sid = f"{getrandbits(64):016x}"
        if sid != "0" * 16:
            return tid, sid


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**64), draws=st.integers(min_value=1, max_value=4))
def test_one_draw_gives_the_ids_of_two(seed: int, draws: int) -> None:
    """`new_trace_and_span_id` returns, draw after draw, exactly the ids the two separate
    draws gave on the same seeded generator (the same stream, so seeded runs stay the same)."""
    ref, new = random.Random(seed), random.Random(seed)
    orig = tc.getrandbits
    tc.getrandbits = new.getrandbits
    try:
        for _ in range(draws):
            got = tc.new_trace_and_span_id()
            assert got == _reference_ids(ref.getrandbits)
            assert tc.is_valid_trace_id(got[0]) and tc.is_valid_span_id(got[1])
    finally:
        tc.getrandbits = orig


@pytest.mark.parametrize("zero_bits", [(0, 128), (128, 192)], ids=["zero_trace", "zero_span"])
def test_one_draw_never_gives_an_all_zero_id(monkeypatch, zero_bits):
    """A draw whose trace or span half is zero is not used: the ids come from fresh draws."""
    lo, hi = zero_bits
    first = ((1 << 192) - 1) & ~(((1 << (hi - lo)) - 1) << lo)  # ones but the zero half
    draws = iter([first, 0x1234, 0, 0x5678])  # then: a trace id, a zero span id (redrawn), a span id
    monkeypatch.setattr(tc, "getrandbits", lambda k: next(draws))
    assert tc.new_trace_and_span_id() == (f"{0x1234:032x}", f"{0x5678:016x}")


def test_restart_writes_the_ids_of_two_draws(monkeypatch):
    """continue_or_start on an envelope without a context: trace and span id as the reference."""
    monkeypatch.setattr(tc, "getrandbits", random.Random(29).getrandbits)
    env = new_envelope("t", b"x", namespace="ns")
    cont = tc.continue_or_start(env)
    tid, sid = _reference_ids(random.Random(29).getrandbits)
    obs = env.observability
    assert (cont.trace_id, cont.parent_span_id, obs.trace_id, obs.span_id) == (tid, None, tid, sid)
    assert obs.trace_flags == tc.FLAG_RANDOM | tc.FLAG_SAMPLED


# --------------------------------------------------------------------------- tracestate table

KEY_ALL = "abcdefghijklmnopqrstuvwxyz0123456789_-*/"
VALUE_ALL = "".join(map(chr, range(0x20, 0x2C))) + "".join(map(chr, range(0x2D, 0x3D))) + "".join(
    map(chr, range(0x3E, 0x7F)))

TRACESTATE_CASES = [
    # (id, header values, level, expected items or None = discarded (empty))
    ("single", ["foo=1"], 1, [("foo", "1")]),
    ("two_members_order_kept", ["foo=1,bar=2"], 1, [("foo", "1"), ("bar", "2")]),
    ("multiple_headers_combined_in_order", ["foo=1,bar=2", "rojo=1,congo=2", "baz=3"], 1,
     [("foo", "1"), ("bar", "2"), ("rojo", "1"), ("congo", "2"), ("baz", "3")]),
    ("empty_header", [""], 1, []),
    ("empty_then_value", ["", "foo=1"], 1, [("foo", "1")]),
    ("value_then_empty", ["foo=1", ""], 1, [("foo", "1")]),
    ("empty_members_dropped", ["foo=1,, ,\t,bar=2"], 1, [("foo", "1"), ("bar", "2")]),
    ("ows_around_members", ["foo=1 \t , \t bar=2, \t baz=3"], 1, [("foo", "1"), ("bar", "2"), ("baz", "3")]),
    ("ows_tabs", ["foo=1\t \t,\t \tbar=2,\t \tbaz=3"], 1, [("foo", "1"), ("bar", "2"), ("baz", "3")]),
    ("ows_leading", [" foo=1"], 1, [("foo", "1")]),
    ("ows_trailing_tab", ["foo=1\t"], 1, [("foo", "1")]),
    ("all_allowed_characters", [f"{KEY_ALL}={VALUE_ALL}"], 1, [(KEY_ALL, VALUE_ALL)]),
    ("all_allowed_with_vendor", [f"{KEY_ALL}@a-z0-9_-*/={VALUE_ALL}"], 1,
     [(f"{KEY_ALL}@a-z0-9_-*/", VALUE_ALL)]),
    ("value_leading_space_kept", ["foo= x"], 1, [("foo", " x")]),
    ("duplicated_keys_same_value", ["foo=1,foo=1"], 1, None),
    ("duplicated_keys_different_value", ["foo=1,foo=2"], 1, None),
    ("duplicated_keys_across_headers", ["foo=1", "foo=2"], 1, None),
    ("key_space_before_equals", ["foo =1"], 1, None),
    ("key_uppercase", ["FOO=1"], 1, None),
    ("key_dot", ["foo.bar=1"], 1, None),
    ("vendor_empty_system", ["foo@=1,bar=2"], 1, None),
    ("vendor_empty_tenant", ["@foo=1,bar=2"], 1, None),
    ("vendor_double_at", ["foo@@bar=1,bar=2"], 1, None),
    ("vendor_two_ats", ["foo@bar@baz=1,bar=2"], 1, None),
    ("key_256_ok", ["foo=1", "z" * 256 + "=1"], 1, [("foo", "1"), ("z" * 256, "1")]),
    ("key_257_discarded", ["foo=1", "z" * 257 + "=1"], 1, None),
    ("tenant_241_system_14_ok", ["foo=1", "t" * 241 + "@" + "v" * 14 + "=1"], 1,
     [("foo", "1"), ("t" * 241 + "@" + "v" * 14, "1")]),
    ("tenant_242_discarded", ["foo=1", "t" * 242 + "@v=1"], 1, None),
    ("system_15_discarded", ["foo=1", "t@" + "v" * 15 + "=1"], 1, None),
    ("tenant_may_start_with_digit", ["1t@v=1"], 1, [("1t@v", "1")]),
    ("simple_key_digit_first_level1", ["1foo=1"], 1, None),
    ("value_with_equals", ["foo=bar=baz"], 1, None),
    ("empty_value", ["foo=,bar=3"], 1, None),
    ("no_equals", ["foo"], 1, None),
    ("value_257_chars", ["foo=" + "v" * 257], 1, None),
    ("value_256_chars", ["foo=" + "v" * 256], 1, [("foo", "v" * 256)]),
    ("value_control_char", ["foo=a\x01b"], 1, None),
    ("members_32_ok", [",".join(f"bar{i:02d}={i:02d}" for i in range(1, 33))], 1,
     [(f"bar{i:02d}", f"{i:02d}") for i in range(1, 33)]),
    ("members_33_discarded", [",".join(f"bar{i:02d}={i:02d}" for i in range(1, 34))], 1, None),
    ("non_ascii", ["foo=\u00e9"], 1, None),
    # Level 2 key grammar: '@' anywhere after the first character, first may be a digit.
    ("level2_at_anywhere", ["foo@@bar=1,bar=2"], 2, [("foo@@bar", "1"), ("bar", "2")]),
    ("level2_trailing_at", ["foo@=1"], 2, [("foo@", "1")]),
    ("level2_leading_at", ["@foo=1"], 2, None),
    ("level2_digit_first", ["1foo=1"], 2, [("1foo", "1")]),
    ("level2_key_257", ["z" * 257 + "=1"], 2, None),
]


@pytest.mark.parametrize(("headers", "level", "expected"), [c[1:] for c in TRACESTATE_CASES],
                         ids=[c[0] for c in TRACESTATE_CASES])
def test_parse_tracestate(headers, level, expected):
    got = tc.parse_tracestate(headers, level=level)
    assert list(got.items()) == (expected if expected is not None else [])


def test_tracestate_lenient_drops_only_bad_members():
    got = tc.parse_tracestate("foo=1,BAD=2,bar=x=y,baz=3,foo=9", lenient=True)
    assert list(got.items()) == [("foo", "1"), ("baz", "3")]
    many = tc.parse_tracestate(",".join(f"k{i}=v" for i in range(40)), lenient=True)
    assert len(many) == 32 and "k0" in many and "k32" not in many


def test_tracestate_bytes_and_format_roundtrip():
    ts = tc.parse_tracestate([b"rojo=00f067aa0ba902b7", b"congo=t61rcWkgMzE"])
    assert ts["congo"] == "t61rcWkgMzE"
    assert tc.format_tracestate(ts) == "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    assert tc.parse_tracestate(tc.format_tracestate(ts)) == ts


def test_tracestate_with_entry_moves_key_left_and_caps_at_32():
    ts = tc.parse_tracestate("congo=a,rojo=b")
    ts2 = ts.with_entry("rojo", "c")
    assert ts2.to_header() == "rojo=c,congo=a"
    full = tc.TraceState((f"k{i}", "v") for i in range(32))
    grown = full.with_entry("new", "1")
    assert len(grown) == 32 and grown.items()[0] == ("new", "1") and "k31" not in grown
    with pytest.raises(TraceContextError):
        ts.with_entry("BAD", "1")


def test_tracestate_truncation_removes_long_entries_first_then_from_the_right():
    long_entry = ("big", "x" * 200)
    items = [("a", "1"), long_entry, ("b", "2"), ("c", "3")]
    assert tc.format_tracestate(items, max_length=512) == "a=1,big=" + "x" * 200 + ",b=2,c=3"
    assert tc.format_tracestate(items, max_length=11) == "a=1,b=2,c=3"
    assert tc.format_tracestate(items, max_length=7) == "a=1,b=2"


def test_format_tracestate_refuses_garbage():
    with pytest.raises(TraceContextError):
        tc.format_tracestate([("foo", "a,b")])
    with pytest.raises(TraceContextError):
        tc.format_tracestate([("foo", "1"), ("foo", "2")])
    with pytest.raises(TraceContextError):
        tc.format_tracestate([(f"k{i}", "v") for i in range(33)])


# --------------------------------------------------------------------------- header carriers


@pytest.mark.parametrize("name", ["traceparent", "TraceParent", "TrAcEpArEnT", "TRACEPARENT"])
def test_header_name_any_case(name):
    inc = tc.read_incoming(None, [(name, VALID.encode())])
    assert inc.traceparent is not None and inc.traceparent.trace_id == TID


@pytest.mark.parametrize("name", ["trace-parent", "trace.parent", "traceparent2"])
def test_wrong_header_name_restarts(name):
    assert tc.read_incoming(None, [(name, VALID.encode())]).traceparent is None


def test_duplicated_traceparent_header_restarts():
    headers = [("traceparent", f"00-{TID[:-1]}1-{PID}-01".encode()), ("traceparent", VALID.encode())]
    assert tc.read_incoming(None, headers).traceparent is None


def test_tracestate_ignored_when_traceparent_invalid_or_missing():
    assert tc.carrier_from(None, [("tracestate", b"foo=1")]) == {}
    assert tc.carrier_from(None, [("traceparent", b"garbage"), ("tracestate", b"foo=1")]) == {}


def test_invalid_tracestate_does_not_affect_traceparent():
    carrier = tc.carrier_from(None, {"traceparent": VALID, "tracestate": "foo=1,foo=2"})
    assert carrier == {"traceparent": VALID}


def test_header_carrier_normalizes_future_version():
    carrier = tc.carrier_from(None, {"traceparent": f"cc-{TID}-{PID}-09-future", "TraceState": "foo=1"})
    assert carrier == {"traceparent": f"00-{TID}-{PID}-01", "tracestate": "foo=1"}


def test_trace_headers_for_kafka():
    ts = tc.parse_tracestate("foo=1")
    assert tc.trace_headers(TID, PID, 1, ts) == [("traceparent", VALID.encode()), ("tracestate", b"foo=1")]


# --------------------------------------------------------------------------- continue_or_start


def _env(**kw):
    return new_envelope("orders.created", {"id": 1}, namespace="orders", **kw)


def test_continue_from_envelope_context():
    env = _env()
    obs = env.ensure_observability()
    obs.trace_id, obs.span_id, obs.trace_flags = TID, PID, 1
    env.extensions[tc.TRACESTATE_EXTENSION] = b"congo=t61rcWkgMzE"
    got = tc.continue_or_start(env)
    assert got == (TID, PID, 1)
    assert env.observability.trace_id == TID
    assert env.observability.parent_span_id == PID
    assert tc.is_valid_span_id(env.observability.span_id) and env.observability.span_id != PID
    assert env.extensions[tc.TRACESTATE_EXTENSION] == b"congo=t61rcWkgMzE"
    # A second hop chains: the previous span becomes the parent.
    hop1_span = env.observability.span_id
    assert tc.continue_or_start(env).parent_span_id == hop1_span


def test_continue_from_headers_when_envelope_has_no_context():
    env = _env()
    assert env.observability is None
    got = tc.continue_or_start(env, [("traceparent", VALID.encode()), ("tracestate", b"rojo=1")])
    assert got == (TID, PID, 1)
    assert env.extensions[tc.TRACESTATE_EXTENSION] == b"rojo=1"


def test_envelope_context_wins_over_headers():
    env = _env()
    obs = env.ensure_observability()
    obs.trace_id, obs.span_id, obs.trace_flags = "a" * 32, "b" * 16, 0
    got = tc.continue_or_start(env, [("traceparent", VALID.encode())])
    assert got == ("a" * 32, "b" * 16, 0)


@pytest.mark.parametrize(
    ("trace_id", "span_id", "flags"),
    [("0" * 32, PID, 1), ("4BF92F3577B34DA6A3CE929D0E0E4736", PID, 1), (TID, "0" * 16, 1), (TID, "", 1), ("", PID, 1),
     ("trace-abc-1", PID, 1), (TID, PID, 300), (TID, PID, -1)],
    ids=["zero_trace", "upper_trace", "zero_span", "no_span", "no_trace", "lnmp_style_id", "flags_300",
         "flags_negative"],
)
def test_invalid_envelope_context_restarts_and_never_propagates_garbage(trace_id, span_id, flags):
    env = _env()
    obs = env.ensure_observability()
    obs.trace_id, obs.span_id, obs.trace_flags = trace_id, span_id, flags
    env.extensions[tc.TRACESTATE_EXTENSION] = b"congo=must-be-dropped"
    got = tc.continue_or_start(env)
    assert got.parent_span_id is None
    assert tc.is_valid_trace_id(got.trace_id) and got.trace_id != trace_id
    assert got.flags == tc.FLAG_RANDOM | tc.FLAG_SAMPLED
    assert env.observability.parent_span_id == ""
    assert tc.TRACESTATE_EXTENSION not in env.extensions  # restart cleans tracestate
    assert tc.parse_traceparent(tc.format_traceparent(env.observability.trace_id, env.observability.span_id,
                                                      env.observability.trace_flags)) is not None


def test_invalid_envelope_context_falls_back_to_valid_headers():
    env = _env()
    env.ensure_observability().trace_id = "0" * 32
    assert tc.continue_or_start(env, {"traceparent": VALID}) == (TID, PID, 1)


def test_start_unsampled_when_asked():
    env = _env()
    got = tc.continue_or_start(env, sampled=False)
    assert got.flags == tc.FLAG_RANDOM and got.parent_span_id is None


def test_continued_context_survives_both_wire_layouts():
    from app.envelope import Layout

    env = _env()
    tc.continue_or_start(env, {"traceparent": VALID, "tracestate": "rojo=1"})
    for layout in (Layout.REVIEWED, Layout.DRAFT):
        back = decode(encode(env, layout))
        assert back.observability.trace_id == TID
        assert back.observability.parent_span_id == PID
        assert back.extensions[tc.TRACESTATE_EXTENSION] == b"rojo=1"
        assert tc.read_incoming(back).source == "envelope"
