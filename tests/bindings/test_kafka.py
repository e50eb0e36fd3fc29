"""Kafka binding: value + prism-* headers, round trips, header cross-checks, signatures."""

from __future__ import annotations

import pytest
from aiokafka.structs import ConsumerRecord
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from app.bindings import kafka
from app.bindings.kafka import KafkaRecord, KeyFallback
from app.bindings.tracecontext import TRACESTATE_EXTENSION
from app.envelope import Layout, new_envelope
from app.errors import BindingError, SignatureError
from app.security.signing import SCOPE_PAIR, SigningKey, VerificationKeys, verify
from tests.bindings.strategies import binding_envelopes, wire_equivalent

HMAC = SigningKey.hmac_sha256("worker-hmac", bytes(range(32)))
ED = SigningKey.ed25519("worker-ed", Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33))))
KEYS = VerificationKeys.of([HMAC, ED])
layouts = st.sampled_from(list(Layout))


def order(**kw):
    env = new_envelope("orders.created", {"order_id": 42}, namespace="order-events",
                       message_id="01890a5d-ac96-774b-bcce-b302099a8057", published_at_ms=1697200000123, **kw)
    obs = env.ensure_observability()
    obs.trace_id, obs.span_id, obs.trace_flags = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", 1
    return env


def with_header(rec: KafkaRecord, name: str, value: bytes | None) -> KafkaRecord:
    headers = [(n, v) for n, v in rec.headers if n != name] + [(name, value)]
    return KafkaRecord(rec.key, rec.value, headers, rec.timestamp_ms)


# --------------------------------------------------------------------------- round trips


@settings(max_examples=150, deadline=None)
@given(binding_envelopes(), layouts)
def test_round_trip_any_envelope(env, layout):
    rec = kafka.encode(env, layout)
    out = kafka.decode(rec)
    assert out == wire_equivalent(env, layout)
    if layout is Layout.REVIEWED:
        assert out == env
    assert rec.timestamp_ms == env.published_at_ms
    names = [n for n, _ in rec.headers]
    assert len(names) == len(set(names))
    assert rec.header("prism-message-id") == env.message_id.encode()
    assert rec.header("prism-topic") == env.topic.encode()
    assert rec.header("prism-namespace") == env.namespace.encode()
    assert rec.header("prism-envelope-layout") == layout.value.encode()
    assert rec.header("prism-envelope-version") == (b"1" if layout is Layout.DRAFT else None)


@settings(max_examples=60, deadline=None)
@given(binding_envelopes(), layouts, st.sampled_from([HMAC, ED]))
def test_signed_values_verify_after_decode(env, layout, key):
    rec = kafka.encode(env, layout, sign_with=key)
    out = kafka.decode(rec, verify_with=KEYS)
    assert out.security is not None and out.security.signature_key_id == key.key_id
    assert verify(rec.value, KEYS).key_id == key.key_id


@settings(max_examples=40, deadline=None)
@given(binding_envelopes(), st.sampled_from([HMAC, ED]))
def test_pair_signed_layouts_each_verify_after_decode(env, key):
    """`encode_layouts` with the pair scope (the worker's default): one signature, two
    records, each verified on its own by `decode(..., verify_with=...)`."""
    draft, reviewed = kafka.encode_layouts(env, [Layout.DRAFT, Layout.REVIEWED], sign_with=key, scope=SCOPE_PAIR)
    for rec in (draft, reviewed):
        out = kafka.decode(rec, verify_with=KEYS)
        assert out.security.signature_scope == SCOPE_PAIR
        assert verify(rec.value, KEYS).key_id == key.key_id
    assert kafka.decode(draft).security.signature == kafka.decode(reviewed).security.signature


def test_tampered_signed_value_is_refused():
    rec = kafka.encode(order(), Layout.REVIEWED, sign_with=HMAC)
    tampered = bytearray(rec.value)
    tampered[-2] ^= 0x01  # inside the payload
    with pytest.raises(SignatureError):
        kafka.decode(KafkaRecord(rec.key, bytes(tampered), rec.headers), verify_with=KEYS)


def test_aiokafka_consumer_record_decodes():
    rec = kafka.encode(order(), Layout.DRAFT)
    cr = ConsumerRecord(topic="orders.created.v2", partition=0, offset=7, timestamp=rec.timestamp_ms,
                        timestamp_type=0, key=rec.key, value=rec.value, checksum=None,
                        serialized_key_size=0, serialized_value_size=len(rec.value), headers=tuple(rec.headers))
    assert kafka.decode(cr) == wire_equivalent(order(), Layout.DRAFT)


# --------------------------------------------------------------------------- headers


def test_header_table_for_a_known_envelope():
    env = order(correlation_id="cart-9")
    env.extensions[TRACESTATE_EXTENSION] = b"congo=t61rcWkgMzE"
    draft = dict(kafka.encode(env, Layout.DRAFT).headers)
    assert draft == {
        "prism-envelope-version": b"1",
        "prism-envelope-layout": b"draft",
        "prism-message-id": b"01890a5d-ac96-774b-bcce-b302099a8057",
        "prism-topic": b"orders.created",
        "prism-namespace": b"order-events",
        "prism-trace-id": b"0af7651916cd43dd8448eb211c80319c",
        "prism-content-type": b"application/json",
        "traceparent": b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "tracestate": b"congo=t61rcWkgMzE",
    }
    reviewed = dict(kafka.encode(env, Layout.REVIEWED).headers)
    assert "prism-envelope-version" not in reviewed
    assert reviewed["prism-envelope-layout"] == b"reviewed"


def test_no_trace_headers_without_a_trace():
    env = new_envelope("t", b"x", namespace="n")
    names = {n for n, _ in kafka.encode(env).headers}
    assert not names & {"traceparent", "tracestate", "prism-trace-id", "prism-content-type"}


def test_key_rules():
    env = order(correlation_id="cart-9")
    assert kafka.encode(env, key=b"input-key").key == b"input-key"  # re-publish keeps the input key
    assert kafka.encode(env).key == b"cart-9"
    assert kafka.encode(env, key_fallback=KeyFallback.MESSAGE_ID).key == env.message_id.encode()
    assert kafka.encode(env, key_fallback=KeyFallback.NONE).key is None
    assert kafka.encode(order()).key is None  # no correlation id: null key, sticky partitioner


def test_caller_headers_are_kept_first_and_never_overwritten():
    env = order()
    extra = [("app-tenant", b"acme"), ("traceparent", b"00-11111111111111111111111111111111-2222222222222222-00"),
             ("app-tenant", b"second"), ("prism-topic", b"orders.created")]
    rec = kafka.encode(env, headers=extra)
    assert rec.headers[:4] == extra
    assert [v for n, v in rec.headers if n == "traceparent"] == [extra[1][1]]
    assert [n for n, _ in rec.headers].count("prism-topic") == 1
    assert kafka.decode(rec) == env


def test_conflicting_prism_caller_header_is_refused():
    with pytest.raises(BindingError, match="prism-topic"):
        kafka.encode(order(), headers=[("prism-topic", b"payments.created")])
    with pytest.raises(BindingError, match="prism-envelope-version"):  # reviewed layout has no version
        kafka.encode(order(), Layout.REVIEWED, headers=[("prism-envelope-version", b"1")])


def test_passthrough_headers_drop_regenerated_ones():
    old = kafka.encode(order(), Layout.DRAFT, headers=[("app-tenant", b"acme")])
    kept = kafka.passthrough_headers(old.headers)
    assert kept == [("app-tenant", b"acme")]
    republished = kafka.encode(order(), Layout.REVIEWED, key=old.key, headers=kept)
    assert kafka.decode(republished) == order()


def test_layout_for_topic():
    assert kafka.layout_for_topic("orders.created.v2") is Layout.DRAFT
    assert kafka.layout_for_topic("orders.created.v3") is Layout.REVIEWED
    with pytest.raises(BindingError, match=r"\.v2 nor a \.v3"):
        kafka.layout_for_topic("orders.created")


# --------------------------------------------------------------------------- cross-checks


@settings(max_examples=80, deadline=None)
@given(binding_envelopes(), layouts, st.sampled_from(["prism-message-id", "prism-topic", "prism-namespace",
                                                      "prism-trace-id", "prism-content-type"]),
       st.text(min_size=1, max_size=12))
def test_any_disagreeing_header_is_refused(env, layout, name, value):
    rec = kafka.encode(env, layout)
    if rec.header(name) == value.encode():
        value += "x"
    with pytest.raises(BindingError) as err:
        kafka.decode(with_header(rec, name, value.encode()))
    assert err.value.path == name


def test_layout_header_must_match_the_bytes():
    rec = kafka.encode(order(), Layout.REVIEWED)
    with pytest.raises(BindingError, match="draft layout but the bytes are a reviewed"):
        kafka.decode(with_header(rec, "prism-envelope-layout", b"draft"))
    with pytest.raises(BindingError, match="reviewed layout, which has no version"):
        kafka.decode(with_header(rec, "prism-envelope-version", b"1"))
    with pytest.raises(BindingError, match="unknown envelope layout"):
        kafka.decode(with_header(rec, "prism-envelope-layout", b"v9"))
    draft = kafka.encode(order(), Layout.DRAFT)
    with pytest.raises(BindingError, match="unsupported envelope version '2'"):
        kafka.decode(with_header(draft, "prism-envelope-version", b"2"))


def test_layout_detected_without_headers():
    for layout in Layout:
        rec = kafka.encode(order(), layout)
        assert kafka.decode(KafkaRecord(None, rec.value, [])) == wire_equivalent(order(), layout)


def test_malformed_headers_and_values():
    rec = kafka.encode(order())
    with pytest.raises(BindingError, match="twice with different values"):
        kafka.decode(KafkaRecord(None, rec.value, [*rec.headers, ("prism-topic", b"other")]))
    with pytest.raises(BindingError, match="null value"):
        kafka.decode(with_header(rec, "prism-topic", None))
    with pytest.raises(BindingError, match="not valid UTF-8"):
        kafka.decode(with_header(rec, "prism-topic", b"\xff"))
    with pytest.raises(BindingError, match="tombstone"):
        kafka.decode(KafkaRecord(b"k", None, []))  # type: ignore[arg-type]
    with pytest.raises(BindingError, match="no envelope bytes"):
        kafka.decode(KafkaRecord(None, b"", []))
    # A header name differing only in case is the same header.
    with pytest.raises(BindingError, match="prism-topic is 'other'"):
        kafka.decode(KafkaRecord(None, rec.value, [("PRISM-TOPIC", b"other")]))
    # Unknown prism-* headers from newer producers are ignored, whatever their bytes.
    assert kafka.decode(KafkaRecord(None, rec.value, [*rec.headers, ("prism-future", b"\xff")])) == order()


def test_size_limit_is_checked_before_anything_else():
    from app.envelope import Limits
    from app.errors import SizeLimitError

    rec = kafka.encode(order(), sign_with=HMAC)
    with pytest.raises(SizeLimitError, match="over the 64-byte limit"):
        kafka.decode(rec, limits=Limits(max_message_bytes=64), verify_with=KEYS)


# --------------------------------------------------------------------------- caller headers, once per message


def _merge_headers_before(ours, extra, *, owned, binding):
    """`app.bindings._common.merge_headers` as it was when `_records` called it once per layout
    for every message with caller headers: the reference the per-message path must equal."""
    extra = list(extra)
    if not extra:
        return list(ours)
    ours_by_name = {name.lower(): value for name, value in ours}
    taken = set()
    for name, value in extra:
        key = name.lower()
        if owned(key) and (key not in ours_by_name or ours_by_name[key] != value):
            raise BindingError(
                f"caller header {name} conflicts with the {binding} binding's own headers",
                path=name,
                hint="drop prism headers of the input record before re-publishing "
                     "(app.bindings.<backend>.passthrough_headers)",
            )
        taken.add(key)
    return extra + [(n, v) for n, v in ours if n.lower() not in taken]


def _headers_before(env, layouts, extra):
    """The header lists (or the error) `encode_layouts` gave before: the merge per layout."""
    try:
        out = []
        for layout in layouts:
            ours = kafka.headers_for(env, layout)
            out.append(_merge_headers_before(ours, extra, owned=kafka.is_owned, binding="kafka") if extra else ours)
        return out
    except BindingError as exc:
        return (type(exc), str(exc), exc.path, exc.hint)


def _headers_now(call):
    try:
        return [r.headers for r in call()]
    except BindingError as exc:
        return (type(exc), str(exc), exc.path, exc.hint)


def _spellings(name: str) -> st.SearchStrategy[str]:
    return st.sampled_from([name, name.upper(), name.title(), name[:1].upper() + name[1:]])


#: Names a caller header can have: every one the binding writes, each in several spellings, other
#: `prism-*` names, names that only look like ours, a live producer's ordinary ones, any text.
_OUR_NAMES = [*kafka._WIRE_NAMES.values(), kafka.TRACEPARENT, kafka.TRACESTATE]
_caller_names = st.one_of(
    st.sampled_from(_OUR_NAMES).flatmap(_spellings),
    st.sampled_from(["prism-source", "prism-auth-token", "Prism-X-New", "prism-", "prism_topic", "xprism-topic",
                     "traceparent2", "trace-parent", "bench-sent", "app-tenant", "ce_id", "content-type"]),
    st.text(max_size=12),
)


@st.composite
def _caller_headers(draw, env):
    """Caller headers for `env`: values often equal to the binding's own for that name (so an
    owned header can agree, and give way), else any bytes or None; duplicates allowed."""
    ours = {n: v for lay in Layout for n, v in kafka.headers_for(env, lay)}
    out = []
    for name in draw(st.lists(_caller_names, max_size=6)):
        own = ours.get(name.lower())
        choices = [st.binary(max_size=8), st.none()] + ([st.just(own)] * 3 if own is not None else [])
        out.append((name, draw(st.one_of(*choices))))
    return out


_LAYOUT_ORDERS = st.sampled_from([(Layout.DRAFT, Layout.REVIEWED), (Layout.REVIEWED, Layout.DRAFT),
                                  (Layout.REVIEWED,), (Layout.DRAFT,), ()])


@settings(max_examples=400, deadline=None)
@given(st.data(), binding_envelopes(), _LAYOUT_ORDERS)
def test_caller_headers_merge_as_once_per_layout(data, env, layouts):
    """`encode_layouts` and `prepare_batch_records` decide the caller headers once per message
    (`_common.can_clash`); the records' headers, or the BindingError, are what the merge once per
    layout gave: same lists, same order, same message, path and hint - in every layout order."""
    extra = data.draw(_caller_headers(env))
    expected = _headers_before(env, layouts, extra)
    assert _headers_now(lambda: kafka.encode_layouts(env, layouts, headers=extra)) == expected
    pending = _headers_now(lambda: kafka.prepare_batch_records(env, layouts, HMAC, headers=extra).records)
    assert pending == expected


def test_ordinary_caller_headers_go_first_in_every_layout():
    """The live producer's case: headers that cannot meet ours, in every record, each record's
    list its own (the publisher appends to one layout's alone)."""
    env = order()
    extra = [("bench-sent", b"1764495000.1"), ("App-Tenant", b"acme"), ("bench-sent", None)]
    recs = kafka.encode_layouts(env, (Layout.DRAFT, Layout.REVIEWED), headers=extra)
    for rec, layout in zip(recs, (Layout.DRAFT, Layout.REVIEWED), strict=True):
        assert rec.headers == [*extra, *kafka.headers_for(env, layout)]
    assert recs[0].headers is not recs[1].headers


def test_a_caller_header_that_meets_ours_is_still_merged():
    """`traceparent` in any case gives way to nothing of the caller's; an agreeing `prism-*`
    replaces ours; a disagreeing one is refused in the first layout that disagrees."""
    env = order()
    tp = (b"00-11111111111111111111111111111111-2222222222222222-00")
    recs = kafka.encode_layouts(env, (Layout.DRAFT, Layout.REVIEWED), headers=[("TraceParent", tp)])
    assert all([v for n, v in r.headers if n.lower() == "traceparent"] == [tp] for r in recs)
    with pytest.raises(BindingError, match="prism-envelope-layout") as err:
        kafka.encode_layouts(env, (Layout.REVIEWED, Layout.DRAFT), headers=[("prism-envelope-layout", b"draft")])
    assert err.value.path == "prism-envelope-layout"


def test_every_name_the_binding_writes_is_owned_or_regenerated():
    """`_records`' once-per-message check is exact only if each of our names is `prism-*` or in
    `_REGENERATED` (`_common.can_clash`): on an envelope that carries every optional header."""
    env = order(content_type="application/json")
    env.extensions["w3c.tracestate"] = b"congo=t61rcWkgMzE"
    names = {n for lay in Layout for n, _ in kafka.headers_for(env, lay)}
    assert {"traceparent", "tracestate", "prism-trace-id", "prism-envelope-version"} <= names
    assert all(kafka.is_owned(n) or n in kafka._REGENERATED for n in names)
