"""The Kafka binding's envelope headers read by the compiled `pair_copies` call
(`prism_native.pair_copies`' headers, prism-client's `pair::envelope_headers`, wired in as
`PreparedMessage.headers` and used by `kafka.prepare_batch_records`) against the Python
`_envelope_headers` they replace on that path: for the same envelope, the same records -
headers (names, values, order, `tracestate` included), key, timestamp - byte for byte, or the
same `PrismError`.

On every conformance envelope (as received, and with the signing fields cleared as the
publisher clears them); on generated envelopes of the binding tests (unicode and control
characters, empty and unknown fields, maps, encryption, tracestates valid and not); on
generated envelopes of the shape the compiled call converts, with trace ids and span ids valid,
all zeros, upper case, too short or long, non-ASCII, trace flags over the whole int32 range, an
observability context without ids, content types of every kind, empty metadata strings and
tracestate entries valid, invalid or absent; and on arbitrary or corrupted header bytes handed
to the compiled function directly (headers only where upb reads the bytes, and then Python's).

Locally these skip without the native module; under CI=true they fail (tests/support.require).
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.message import DecodeError as PbDecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import native
from app._gen.prism.envelope.v1 import envelope_pb2 as vpb
from app.agents.base import Message
from app.agents.publish import Publisher
from app.bindings import kafka
from app.bindings.tracecontext import TRACESTATE_EXTENSION
from app.envelope.codec import Layout
from app.envelope.model import Envelope, Payload
from app.errors import BindingError, PrismError
from app.security import signing
from app.topology import Archive, Outputs, Topology
from tests.bindings.strategies import binding_envelopes
from tests.envelope.test_layouts_native import _cleared, _copy, _envelopes_of_the_vectors, _python_path, envelopes
from tests.security.test_signing import rich_envelope
from tests.support import require

KEY = signing.SigningKey.hmac_sha256("k1", b"k" * 32)
LAYOUT_CHOICES = ((Layout.DRAFT, Layout.REVIEWED), (Layout.REVIEWED, Layout.DRAFT), (Layout.REVIEWED,), ())
TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"


@pytest.fixture(autouse=True)
def _native_built() -> None:
    require(native.ACTIVE and signing._pair_copies is not signing._py_pair_copies,
            f"the compiled pair copies are not active: {native.reason}")


def _records(env: Envelope, layouts: tuple[Layout, ...], forwarded: list[tuple[str, bytes]]) -> Any:
    try:
        pending = kafka.prepare_batch_records(env, layouts, KEY, headers=forwarded)
    except PrismError as exc:
        return ("error", type(exc), str(exc), exc.path, exc.hint), None
    return [(r.key, r.value, r.headers, r.timestamp_ms) for r in pending.records], pending.prepared


def _same(env: Envelope, layouts: tuple[Layout, ...] = (Layout.DRAFT, Layout.REVIEWED),
          forwarded: list[tuple[str, bytes]] | None = None) -> bool:
    """Both paths' records for `env`; True when the compiled call read the headers."""
    got, prepared = _records(_copy(env), layouts, list(forwarded or ()))
    with _python_path():
        expected, _ = _records(_copy(env), layouts, list(forwarded or ()))
    assert got == expected, env.header
    if prepared is not None:  # wherever the compiled call converts a header, it reads its headers too
        assert (prepared.compiled is None) == (prepared.headers is None), env.header
    if prepared is not None and prepared.headers is not None:
        # and `PreparedMessage.headers` is exactly what the Python binding builds, but tracestate
        python = kafka._envelope_headers(_copy(env))
        ours = list(prepared.headers)
        if prepared.tracestate_pending:
            kafka._append_tracestate(env, ours)
        else:
            assert not any(name == kafka.TRACESTATE for name, _ in python), env.header
        assert ours == python, env.header
        return True
    return False


def test_every_conformance_envelope_gives_the_same_records() -> None:
    envs = _envelopes_of_the_vectors()
    assert len(envs) > 300
    compiled = 0
    for env in envs:
        for e in (env, _cleared(env)):
            compiled += _same(e)
    assert compiled > 100, compiled


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(binding_envelopes(), st.sampled_from(LAYOUT_CHOICES))
def test_binding_envelopes_give_the_same_records(env: Envelope, layouts: tuple[Layout, ...]) -> None:
    _same(env, layouts)


#: valid ids (lowercase hex, not all zeros) and ids that are not, drawn half and half below
_valid_ids = lambda n: st.one_of(  # noqa: E731
    st.just(TRACE if n == 32 else SPAN), st.text("0123456789abcdef", min_size=n, max_size=n).filter(lambda s: s != "0" * n))
_other_ids = lambda n: st.one_of(  # noqa: E731
    st.just(""), st.just("0" * n), st.text("0123456789abcdefABCDEF", min_size=n, max_size=n),
    st.text("0123456789abcdef", min_size=n - 1, max_size=n - 1),
    st.text("0123456789abcdef", min_size=n + 1, max_size=n + 1), st.text("0123456789abcdefé ", max_size=n + 2))
_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
_tracestates = st.sampled_from([None, b"congo=t61rcWkgMzE", b"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
                                b"bad state\x01", b"", b" ", b"a=1,a=2", b"k=v,,", "é=1".encode()])


@st.composite
def shortcut_envelopes(draw: st.DrawFn) -> Envelope:
    """`test_layouts_native`'s envelopes of the shape the compiled call converts, with every
    header-relevant field drawn: metadata strings (empty, unicode), content type, the
    observability context (or none) and at most one extension entry (a tracestate or not)."""
    env: Envelope = draw(envelopes(shortcut_shape=True))
    h = env.header
    m = h.metadata
    m.message_id, m.topic, m.namespace = draw(_text), draw(_text), draw(_text)
    kind = draw(st.sampled_from(["none", "json", "protobuf", "avro", "custom", "custom-empty", "unnamed", "zero"]))
    m.ClearField("content_type")
    m.ClearField("content_type_custom")
    if kind in ("json", "protobuf", "avro"):
        m.content_type = {"protobuf": 1, "json": 2, "avro": 3}[kind]
    elif kind == "custom":
        m.content_type, m.content_type_custom = 99, draw(_text)
    elif kind == "custom-empty":
        m.content_type = 99
    elif kind == "unnamed":
        m.content_type = draw(st.sampled_from([4, 98, 100, -5, 2**20]))
        if draw(st.booleans()):
            m.content_type_custom = draw(_text)  # read only with CUSTOM
    elif kind == "zero":
        m.content_type = 0
    h.ClearField("observability")
    if draw(st.booleans()):
        obs = h.observability
        obs.SetInParent()
        valid = draw(st.booleans())
        obs.trace_id = draw(_valid_ids(32) if valid or draw(st.booleans()) else _other_ids(32))
        obs.span_id = draw(_valid_ids(16) if valid or draw(st.booleans()) else _other_ids(16))
        obs.parent_span_id = draw(st.sampled_from(["", SPAN, "x"]))
        obs.trace_flags = draw(st.one_of(st.integers(0, 3), st.integers(0, 255), st.sampled_from([256, -1, -2**31]),
                                         st.integers(-2**31, 2**31 - 1)))
    h.ClearField("extensions")
    state = draw(_tracestates)
    if state is not None:
        h.extensions[TRACESTATE_EXTENSION] = state
    elif draw(st.booleans()):
        h.extensions[draw(st.sampled_from(["", "x", "prism.identity.method", "w3c.tracestatex"]))] = b"v"
    return env


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shortcut_envelopes(), st.booleans(), st.sampled_from(LAYOUT_CHOICES))
def test_envelopes_of_the_compiled_shape_read_their_headers_there_and_the_same(
        env: Envelope, clear: bool, layouts: tuple[Layout, ...]) -> None:
    env = _cleared(env) if clear else env
    assert _same(env, layouts)


def test_the_trace_headers_by_name() -> None:
    """The cases the W3C rules single out, each taking the compiled path."""
    base = rich_envelope()
    base.header.security.ClearField("encryption")
    base.header.observability.ClearField("labels")
    base.header.extensions.clear()
    cases: list[tuple[str, str, int, bytes | None, list[str]]] = [
        (TRACE, SPAN, 1, None, ["traceparent"]),
        (TRACE, SPAN, 0x83, None, ["traceparent"]),  # unknown flag bits are not propagated
        (TRACE, SPAN, 256, None, []),  # flags outside a byte: no traceparent
        (TRACE, SPAN, -1, None, []),
        (TRACE.upper(), SPAN, 1, None, []),
        ("0" * 32, SPAN, 1, None, []),
        (TRACE, "0" * 16, 1, None, []),
        ("", "", 0, None, []),
        (TRACE, SPAN, 1, b"congo=t61rcWkgMzE", ["traceparent", "tracestate"]),
        (TRACE, SPAN, 1, b"bad state\x01", ["traceparent"]),  # an invalid tracestate is dropped
        ("", SPAN, 1, b"congo=t61rcWkgMzE", []),  # no traceparent: no tracestate either
    ]
    for trace_id, span_id, flags, state, trace_headers in cases:
        env = _copy(base)
        obs = env.header.observability
        obs.trace_id, obs.span_id, obs.trace_flags = trace_id, span_id, flags
        if state is not None:
            env.header.extensions[TRACESTATE_EXTENSION] = state
        assert _same(env), (trace_id, span_id, flags, state)
        pending = kafka.prepare_batch_records(_copy(env), (Layout.DRAFT, Layout.REVIEWED), KEY)
        names = [n for n, _ in pending.records[0].headers]
        assert [n for n in names if n in ("traceparent", "tracestate")] == trace_headers, names
        if flags == 0x83:
            assert pending.records[0].header("traceparent") == f"00-{TRACE}-{SPAN}-03".encode()
    env = _copy(base)
    env.header.ClearField("observability")
    assert _same(env)
    assert kafka.prepare_batch_records(_copy(env), (Layout.REVIEWED,), KEY).records[0].header("prism-trace-id") is None


def test_forwarded_headers_merge_the_same_way() -> None:
    env = _cleared(rich_envelope())
    env.header.security.ClearField("encryption")
    env.header.observability.ClearField("labels")
    env.header.extensions.clear()
    topic = env.header.metadata.topic.encode()
    for forwarded in ([("x-app", b"1")], [("prism-topic", topic), ("traceparent", b"mine")]):
        assert _same(env, forwarded=forwarded)
    assert not _same(env, forwarded=[("Prism-Topic", b"other")])  # the same BindingError on both paths
    with pytest.raises(BindingError, match="conflicts"):
        kafka.prepare_batch_records(_copy(env), (Layout.DRAFT,), KEY, headers=[("prism-topic", b"other")])


def test_what_the_compiled_call_leaves_to_python_gets_the_same_headers() -> None:
    """Headers `pair_copies` does not convert (maps, encryption, unknown fields) come back
    without any, and the Python binding builds them."""
    base = rich_envelope()
    for name, change in (("labels, encryption, two extension entries", lambda e: None),
                         ("unknown metadata field", lambda e: e.header.metadata.MergeFromString(b"\xa8\x06\x01"))):
        env = _copy(base)
        change(env)
        assert not _same(env), name


def test_the_worker_publishes_the_same_records() -> None:
    """`Publisher.prepare` + `finish` of the worker's message shape (a tracestate too, and a
    forwarded header): the same emissions with the headers read by the compiled call as with
    the Python binding."""
    topology = Topology(name="t", namespace="ns", sources=[{"topic": "orders.created"}],
                        stages=[{"name": "normalize", "settings": {}}], outputs=Outputs(), archive=Archive(topic="arch"))
    env = rich_envelope()
    env.header.security.ClearField("encryption")
    env.header.observability.ClearField("labels")
    env.header.extensions.clear()
    env.header.extensions[TRACESTATE_EXTENSION] = b"congo=t61rcWkgMzE"

    def run() -> tuple[list[Any], int]:
        pub = Publisher(topology, worker_key=KEY)
        msgs = []
        for i in range(3):
            msg = Message("orders.created", 0, i, b"", key=b"k", headers=[("x-app", b"1")])
            msg.envelope, msg.settled = _copy(env), True
            msgs.append(msg)
        prepared = [pub.prepare(m) for m in msgs]
        read = sum(p.pending is not None and p.pending.prepared.headers is not None for p in prepared)
        done = pub.finish(prepared)
        return [[(e.topic, e.record.key, e.record.value, e.record.headers) for e in ems] for ems in done], read

    compiled, read = run()
    with _python_path():
        expected, read_python = run()
    assert compiled == expected
    assert (read, read_python) == (3, 0)
    assert any(n == "tracestate" for n, _ in compiled[0][0][3])


def _python_headers(data: bytes) -> list[tuple[str, bytes]] | None:
    """`_envelope_headers` of the header upb reads from `data` (None when it refuses it)."""
    try:
        header = vpb.PrismEnvelope.FromString(data)
    except PbDecodeError:
        return None
    return kafka._envelope_headers(Envelope(header, Payload.absent()))


def _check_bytes(data: bytes) -> None:
    got = native.module.pair_copies(data, None, True)
    if got is None or got[5] is None:
        return
    expected = _python_headers(data)
    assert expected is not None, data.hex()  # pair_copies answers only for an encoder's output
    ours = list(got[5])
    if got[6]:
        kafka._append_tracestate(Envelope(vpb.PrismEnvelope.FromString(data), Payload.absent()), ours)
    assert ours == expected, data.hex()


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=160))
def test_arbitrary_bytes_give_the_python_headers_or_none(data: bytes) -> None:
    _check_bytes(data)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shortcut_envelopes(), st.data())
def test_corrupted_headers_give_the_python_headers_or_none(env: Envelope, data: st.DataObject) -> None:
    full = bytearray(env.header.SerializeToString())
    _check_bytes(bytes(full))
    if full:
        at = data.draw(st.integers(0, len(full) - 1))
        full[at] = data.draw(st.integers(0, 255))
        if data.draw(st.booleans()):
            del full[data.draw(st.integers(0, len(full))):]
    _check_bytes(bytes(full))
