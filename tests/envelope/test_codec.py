import gzip
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app._gen.prism.envelope.draft import envelope_pb2 as dpb
from app._gen.prism.envelope.v1 import envelope_pb2 as vpb
from app.envelope import DEFAULT_LIMITS, Layout, Limits, convert, decode, detect_layout, encode, new_envelope
from app.envelope.codec import _parse_header, decode_records
from app.envelope.model import Envelope, Payload
from app.envelope.wire import LEN, encode_varint, scan
from app.errors import DecodeError, EnvelopeError, LayoutError, SizeLimitError, WireTypeError
from tests.strategies import envelopes


def sample(**kw):
    env = new_envelope("orders.created", {"order_id": 7, "total": 12.5}, namespace="order-events",
                       correlation_id="req-1", priority=8, ttl_seconds=60, labels={"tier": "gold"}, **kw)
    sec = env.ensure_security()
    sec.publisher_id = "svc-orders"
    sec.data_classification = "internal"
    obs = env.ensure_observability()
    obs.trace_id, obs.span_id, obs.trace_flags = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1
    env.ensure_schema().schema_version = "v2"
    env.extensions["x-retry-count"] = b"3"
    return env


@pytest.mark.parametrize("layout", list(Layout))
def test_round_trip_each_layout(layout):
    env = sample()
    data = encode(env, layout)
    assert detect_layout(data) is layout
    back = decode(data)
    assert back == env
    assert back.payload_json() == {"order_id": 7, "total": 12.5}
    assert back.priority == 8 and back.content_type == "application/json"


@settings(max_examples=300, deadline=None)
@given(envelopes())
def test_property_round_trip_reviewed(env):
    assert decode(encode(env, Layout.REVIEWED)) == env


@settings(max_examples=300, deadline=None)
@given(envelopes())
def test_property_round_trip_draft(env):
    from app.envelope.layouts import reviewed_to_draft

    _, reported = reviewed_to_draft(env.header)
    back = decode(encode(env, Layout.DRAFT))
    # The draft's plain proto3 fields cannot hold "explicitly zero": exactly those are
    # reported, and clearing them gives back the original.
    for item in reported:
        path = item.split(":")[0].split(".")
        assert "indistinguishable from unset" in item
        msg = env.header
        for part in path[:-1]:
            msg = getattr(msg, part)
        msg.ClearField(path[-1])
    assert back == env


@settings(max_examples=200, deadline=None)
@given(envelopes())
def test_property_convert_both_ways(env):
    draft = encode(env, Layout.DRAFT)
    reviewed, _ = convert(draft, Layout.REVIEWED)
    again, _ = convert(reviewed, Layout.DRAFT)
    assert decode(again) == decode(draft)


def test_payload_is_lazy_zero_copy_view():
    env = new_envelope("t", b"x" * 100_000, namespace="n")
    data = encode(env)
    back = decode(data)
    assert not back.payload.is_parsed
    assert back.metadata.topic == "t"
    assert not back.payload.is_parsed  # header access never touched the payload
    assert isinstance(back.payload.value, memoryview)
    assert back.payload.value.obj is data  # a view into the received buffer, not a copy
    assert bytes(back.payload.value) == b"x" * 100_000


def test_untouched_payload_reencodes_from_received_bytes():
    env = sample()
    data = encode(env)
    back = decode(data)
    back.metadata.topic = "orders.routed"
    assert decode(encode(back)).payload == env.payload


def test_unknown_fields_survive_round_trip():
    env = sample()
    data = encode(env)
    # a newer producer adds top-level field 5 and metadata field 13
    future = data + b"\x2a\x03new"
    env2 = decode(future)
    md_unknown = b"\x6a\x02hi"  # field 13, LEN
    env2.metadata.MergeFromString(md_unknown)
    again = encode(env2)
    h = vpb.PrismEnvelope.FromString(again)
    assert b"\x2a\x03new" in h.SerializeToString()
    assert md_unknown in h.metadata.SerializeToString()
    assert decode(again).payload == env.payload


def test_draft_unknown_fields_survive_not_silently_lost():
    d = dpb.PrismEnvelope(envelope_version=1)
    d.metadata.message_id, d.metadata.topic, d.metadata.namespace = "m", "t", "n"
    d.metadata.published_at.seconds = 10
    d.metadata.published_at.nanos = 123456789
    d.payload.value = b"p"
    data = d.SerializeToString() + b"\x3a\x01x"  # unknown top-level field 7 (RFC's routing hints example)
    dropped: list[str] = []
    env = decode(data, dropped=dropped)
    assert env.published_at_ms == 10123
    assert any("sub-millisecond" in x for x in dropped)
    # RFC-031 Backward Compatibility: carried, not dropped (tests/envelope/test_evolution.py)
    assert not any("unknown" in x for x in dropped)
    assert env.extensions["prism.unknown.draft"] == b"\x3a\x01x"


def test_compression_transparent_on_decode():
    for enc in ("gzip", "snappy", "zstd"):
        env = new_envelope("t", {"big": "y" * 5000}, namespace="n", content_encoding=enc)
        assert len(env.payload.value) < 1000
        back = decode(encode(env, Layout.DRAFT))
        assert back.content_encoding == enc
        assert back.payload_json() == {"big": "y" * 5000}


def test_gzip_from_foreign_producer():
    env = new_envelope("t", gzip.compress(json.dumps([1, 2]).encode()), namespace="n",
                       content_type="application/json")
    from app.envelope.model import set_content_encoding
    set_content_encoding(env.metadata, "gzip")
    assert decode(encode(env)).payload_json() == [1, 2]


def test_size_limits_checked_before_payload():
    env = new_envelope("t", b"x" * 2000, namespace="n")
    data = encode(env)
    with pytest.raises(SizeLimitError, match="over the 1000-byte limit"):
        decode(data, limits=Limits(max_message_bytes=1000))
    env.extensions["big"] = b"h" * 5000
    with pytest.raises(SizeLimitError, match="header"):
        decode(encode(env), limits=Limits(max_header_bytes=1024))


def test_absent_payload_is_detected():
    h = vpb.PrismEnvelope()
    h.metadata.message_id = "m"
    back = decode(h.SerializeToString())
    assert not back.payload.present


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", LayoutError),
        (b"\x0a\x05abc", EnvelopeError),                 # truncated metadata
        (b"\x0a\x02\x0a\xff", DecodeError),              # nested truncated string
        (b"\x0a\x03\x0a\x01\xff", DecodeError),          # invalid UTF-8 in message_id
        (b"\x98\x06\x01", WireTypeError),                # payload field 99 as a varint
        # the same after a metadata and a payload record: the small-envelope fast path (upb, which
        # keeps a mistyped known field as unknown) must refuse it like the general path
        (b"\x0a\x03\x0a\x01m\x9a\x06\x00\x98\x06\x01", WireTypeError),
    ],
)
def test_malformed_inputs_raise_documented_errors(data, error):
    with pytest.raises(error):
        decode(data)


def test_multiple_payload_records_merge_like_protobuf():
    a = vpb.PrismEnvelope()
    a.payload.type_url = "type.googleapis.com/x.Y"
    b = vpb.PrismEnvelope()
    b.payload.value = b"v"
    env = decode(a.SerializeToString() + b.SerializeToString())
    assert env.payload.type_url == "type.googleapis.com/x.Y" and bytes(env.payload.value) == b"v"


def test_protobuf_payload_and_type_url():
    inner = vpb.SchemaContext(schema_name="OrderCreated")
    env = new_envelope("t", inner, namespace="n")
    back = decode(encode(env, Layout.DRAFT))
    assert back.payload.type_url == "type.googleapis.com/prism.envelope.v1.SchemaContext"
    assert back.payload_message(vpb.SchemaContext) == inner


def test_repr_redacts_token():
    env = sample()
    env.ensure_security().auth_token = "eyJsecret.token.value"
    assert "eyJsecret" not in repr(env)


def test_payload_equality_and_default_limits():
    assert Payload(b"a", "u") == Payload(b"a", "u")
    assert DEFAULT_LIMITS.max_message_bytes == 16 * 1024 * 1024


@settings(max_examples=150, deadline=None)
@given(envelopes())
def test_split_header_cuts_the_one_security_record_whatever_the_header_holds(env):
    """`split_header` reads the security record's position off the bytes when it follows
    the lower-numbered records; the result must be what a full record walk finds: the
    serialized header minus every security record, and those records."""
    from app.envelope.codec import layout_header, split_header
    from app.envelope.wire import scan, strip_field

    for layout in Layout:
        header = layout_header(env, layout)
        full = header.SerializeToString()
        head, sec = split_header(header, layout)
        assert head == b"".join(strip_field(full, layout.security_field))
        assert sec == b"".join(full[r[2]:r[4]] for r in scan(full) if r[0] == layout.security_field)
        assert bool(sec) == header.HasField("security")


def _decode_records_before(view, records, lay, limits=DEFAULT_LIMITS, dropped=None):
    """`decode_records` as it was before issue 29 counted the payload records in a loop: the
    reference the property test below holds the current one to (only the count changed)."""
    pf = lay.payload_field
    if records:
        f, wt, start, vstart, end = records[-1]
        if f == pf and wt == LEN and [r[0] for r in records].count(pf) == 1:
            if start > limits.max_header_bytes:
                raise SizeLimitError(
                    f"envelope header is {start} bytes, over the {limits.max_header_bytes}-byte limit",
                    hint="move bulky data into the payload, or raise Limits.max_header_bytes",
                )
            return Envelope(_parse_header(view[:start], lay, dropped), Payload.from_wire(view[vstart:end]))
    header_parts, payload_recs, header_len = [], [], 0
    for r in records:
        if r[0] == pf:
            if r[1] != LEN:
                raise WireTypeError(f"payload field {pf} must be length-delimited, got wire type {r[1]}",
                                    path=f"byte {r[2]}")
            payload_recs.append(r)
        else:
            header_parts.append(view[r[2] : r[4]])
            header_len += r[4] - r[2]
    if header_len > limits.max_header_bytes:
        raise SizeLimitError(
            f"envelope header is {header_len} bytes, over the {limits.max_header_bytes}-byte limit",
            hint="move bulky data into the payload, or raise Limits.max_header_bytes",
        )
    header = _parse_header(b"".join(header_parts), lay, dropped)
    if not payload_recs:
        payload = Payload.absent()
    elif len(payload_recs) == 1:
        r = payload_recs[0]
        payload = Payload.from_wire(view[r[3] : r[4]])
    else:
        payload = Payload.from_wire(b"".join(view[r[3] : r[4]] for r in payload_recs))
    return Envelope(header, payload)


def _outcome(fn, data, lay, limits):
    """What one decode_records gives: the envelope's every observable part, or the error."""
    view = memoryview(data)
    dropped: list[str] = []
    try:
        env = fn(view, scan(view), lay, limits, dropped)
    except EnvelopeError as exc:
        return type(exc), str(exc), exc.path, exc.hint
    raw = env.payload._raw
    return (env.header.SerializeToString(deterministic=True), env.payload.present,
            None if raw is None else bytes(raw), dropped)


def _payload_record(field: int, body: bytes) -> bytes:
    return encode_varint(field << 3 | LEN) + encode_varint(len(body)) + body


@settings(max_examples=300, deadline=None)
@given(env=envelopes(), layout=st.sampled_from(list(Layout)),
       extra=st.lists(st.tuples(st.integers(0, 1000), st.sampled_from(["len", "varint", "other"]),
                                st.binary(max_size=12)), max_size=3),
       small_header=st.booleans())
def test_decode_records_takes_the_same_path_as_before(env, layout, extra, small_header):
    """Envelopes with payload records added anywhere (none, one, several; length-delimited or
    not), under a header limit that sometimes refuses them: the same envelope or the same error."""
    data = encode(env, layout)
    pf = layout.payload_field
    records = scan(memoryview(data))
    pieces = [data[r[2] : r[4]] for r in records]
    for where, kind, body in extra:
        rec = (_payload_record(pf, body) if kind == "len" else
               encode_varint(pf << 3) + encode_varint(len(body)) if kind == "varint" else
               _payload_record(97 if layout is Layout.DRAFT else 5, body))
        pieces.insert(where % (len(pieces) + 1), rec)
    mixed = b"".join(pieces)
    limits = Limits(max_header_bytes=len(mixed) // 3) if small_header else DEFAULT_LIMITS
    assert _outcome(decode_records, mixed, layout, limits) == _outcome(_decode_records_before, mixed, layout, limits)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=40), st.integers(0, 40), st.integers(0, 40))
def test_payload_from_wire_reads_a_view_or_bytes_alike(buf, a, b):
    """from_wire keeps a memoryview it is given (the decoder's fresh slice) and wraps bytes in
    one: either way a memoryview of the same bytes, parsed the same."""
    view = memoryview(buf)[min(a, b) : max(a, b)]
    for p in (Payload.from_wire(view), Payload.from_wire(bytes(view))):
        assert type(p._raw) is memoryview and bytes(p._raw) == bytes(view) and p.present
    assert _parsed(Payload.from_wire(view)) == _parsed(Payload.from_wire(bytes(view)))


def _parsed(p):
    try:
        return p.type_url, bytes(p.value)
    except EnvelopeError as exc:
        return type(exc), str(exc)


@pytest.mark.parametrize("layout", [None, Layout.DRAFT, Layout.REVIEWED])
@pytest.mark.parametrize("record", [b"\x90\x03\x00", b"\x9a\x06\x00", b"\x1a\x00"])
def test_decode_applies_the_header_limit_while_walking(layout, record):
    """16 MiB of tiny records (or of empty payload records, whose repeated framing is header)
    ending in a truncated record: refused for the header's size near its 256 KiB, not walked
    into millions of records first (which then failed on the last one, or for a flood of
    payload records, decoded)."""
    data = b"\x08\x01" + record * ((16 * 1024 * 1024 - 2) // len(record) - 2) + b"\x92\x03\x05"
    with pytest.raises(SizeLimitError, match=r"header is over the 262144-byte limit \(\d+ bytes by byte 26\d{4}\)"):
        decode(data, layout=layout)


def test_a_repeated_payload_records_framing_is_header():
    many = b"\x9a\x06\x00" * 400 + b"\x0a\x00"  # reviewed: 400 empty payload records, merged
    assert bytes(decode(many, layout=Layout.REVIEWED).payload.value) == b""
    with pytest.raises(SizeLimitError, match="header"):
        decode(many, layout=Layout.REVIEWED, limits=Limits(max_header_bytes=1000))


def test_detect_layout_applies_the_header_limit_while_walking():
    """`detect_layout` walked the producer's bytes with the unbounded `scan`: 16 MiB of three-byte
    records became 5.6M tuples (~170 MB compiled, ~650 MB and 5 s in Python) and then failed on
    the truncated last one. It walks as `decode` does now, stopping near the 256 KiB limit."""
    import tracemalloc

    data = b"\x90\x03\x00" * (16 * 1024 * 1024 // 3 - 2) + b"\x92\x03\x05"
    tracemalloc.start()
    try:
        with pytest.raises(SizeLimitError, match=r"header is over the 262144-byte limit \(\d+ bytes by byte 2621\d\d\)"):
            detect_layout(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 * 1024 * 1024, f"{peak / 1e6:.0f} MB"
    big = encode(sample(), Layout.DRAFT)
    assert detect_layout(big) is Layout.DRAFT
    with pytest.raises(SizeLimitError):
        detect_layout(big, limits=Limits(max_header_bytes=8))


@settings(max_examples=200, deadline=None)
@given(prefix=st.binary(max_size=48), run=st.sampled_from([b"\x90\x03\x00", b"\x9a\x06\x00", b"\x1a\x00", b"\x08\x01"]),
       n=st.integers(0, 3000), max_header=st.integers(0, 96), env=st.none() | envelopes(),
       layout=st.sampled_from(list(Layout)))
def test_detect_layout_is_bounded_and_answers_as_the_unbounded_walk(prefix, run, n, max_header, env, layout):
    """For any bytes: a layout or an `EnvelopeError`; never more records than the header limit
    allows (at most `max_header // 2 + 1`, whatever the input's length), and the unbounded
    walk's answer unless that is `SizeLimitError` - which it never is for an envelope whose
    header fits."""
    from app.envelope import codec, wire

    data = (encode(env, layout) if env is not None else prefix) + run * n
    walked: list[int] = []
    with pytest.MonkeyPatch.context() as mp:
        for mod in (wire, codec):
            real_scan = mod.scan
            mp.setattr(mod, "scan", lambda *a, _f=real_scan: walked.append(len(r := _f(*a))) or r)
        real_walk = wire._walk
        mp.setattr(wire, "_walk", lambda *a: walked.append(len(r := real_walk(*a))) or r)
        try:
            bounded = detect_layout(data, limits=Limits(max_header_bytes=max_header))
        except EnvelopeError as exc:
            bounded = exc
    assert max(walked, default=0) <= max_header // 2 + 1
    try:
        before = codec.layout_of_records(scan(data))
    except EnvelopeError as exc:
        before = exc
    if isinstance(bounded, SizeLimitError):  # refused only when over the limit in both layouts
        assert len(data) > max_header
        if not isinstance(before, EnvelopeError):
            assert min(_header_size(scan(data), pf) for pf in (3, 99)) > max_header
    elif isinstance(bounded, EnvelopeError):
        assert (type(bounded), str(bounded)) == (type(before), str(before))
    else:
        assert bounded is before
    if env is not None and not n:
        assert detect_layout(data) is layout  # a valid envelope under the default limits


def _header_size(records, payload_field):
    """The header by the documented rule (docs/formats.md, "Size first"): every record but the
    first payload record; a repeated payload record's tag and length count."""
    seen, total = False, 0
    for f, wt, start, vstart, end in records:
        if f != payload_field or wt != LEN:
            total += end - start
        elif seen:
            total += vstart - start
        else:
            seen = True
    return total
