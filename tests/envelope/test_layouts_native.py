"""The compiled copies of a message in both layouts (`prism_native.pair_copies`, wired in as
`signing._pair_copies`) against the Python path (`_py_pair_copies`: `codec.draft_split` with
`layouts.draft_metadata`, or the full `reviewed_to_draft` conversion, then the digests): for
the same envelope, the same reviewed and draft heads, the same draft security context, the
same payload records and the same two digests byte for byte - or the same `PrismError` class,
text, path and hint. On every conformance hex string that decodes to an envelope (as
received, and with the signing fields cleared as the publisher clears them), on generated
headers with unknown fields, extreme and negative numbers and 70-bit varints, and on
arbitrary bytes handed to the compiled function directly (a value only where the bytes are
an encoder's canonical output of a header, and then the Python path's bytes).

Locally these skip without the native module; under CI=true they fail (tests/support.require).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf.message import DecodeError as PbDecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import native
from app._gen.prism.envelope.v1 import envelope_pb2 as vpb
from app.envelope import codec
from app.envelope.codec import Layout
from app.envelope.model import Envelope, Payload
from app.errors import PrismError
from app.security import signing
from tests.envelope.test_draft_split import headers as draft_split_headers
from tests.envelope.test_wire_native import _vector_bytes
from tests.security.test_signing import rich_envelope
from tests.support import require

CUTS = (signing._CUT_PAIR, signing._CUT_BATCH)
HMAC = signing.SigningKey.hmac_sha256("k1", b"k" * 32)


@pytest.fixture(autouse=True)
def _native_built() -> None:
    require(native.ACTIVE and signing._pair_copies is not signing._py_pair_copies,
            f"the compiled pair copies are not active: {native.reason}")


@contextlib.contextmanager
def _python_path() -> Iterator[None]:
    """Signing without the compiled copies: the pair scope's, and the batch scope's prepare
    and finish (which use the compiled pieces and finish directly)."""
    compiled = signing._pair_copies, signing._compiled_pieces, signing._native_finish_batch
    signing._pair_copies = signing._py_pair_copies
    signing._compiled_pieces = lambda env, batch: None
    signing._native_finish_batch = None
    try:
        yield
    finally:
        signing._pair_copies, signing._compiled_pieces, signing._native_finish_batch = compiled


def _copy(env: Envelope) -> Envelope:
    header = vpb.PrismEnvelope()
    header.CopyFrom(env.header)
    payload = Payload.from_wire(bytes(env.payload.wire())) if env.payload.present else Payload.absent()
    return Envelope(header, payload)


def _plain(result: Any) -> Any:
    copies, digest_d, digest_r = result
    return ([(lay, type(hsec).__module__, hsec.SerializeToString(), bytes(head), [bytes(p) for p in payload])
             for lay, hsec, head, payload in copies], digest_d, digest_r)


def _outcome(env: Envelope, cut: frozenset[int]) -> Any:
    try:
        return ("ok", _plain(signing._pair_copies(env, cut)))
    except PrismError as exc:
        return ("error", type(exc), str(exc), exc.path, exc.hint)


def _same(env: Envelope, cut: frozenset[int]) -> Any:
    compiled = _outcome(_copy(env), cut)
    with _python_path():
        expected = _outcome(_copy(env), cut)
    assert compiled == expected, env.header
    return expected


def _took_shortcut(env: Envelope, cut: frozenset[int]) -> bool:
    payload = env.payload.wire() if env.payload.present else None
    return native.module.pair_copies(env.header.SerializeToString(), payload, cut == signing._CUT_BATCH) is not None


def _cleared(env: Envelope) -> Envelope:
    env = _copy(env)
    signing.begin_signature(env, HMAC, signing.SCOPE_BATCH)
    return env


def _envelopes_of_the_vectors() -> list[Envelope]:
    found = []
    for data in _vector_bytes():
        with contextlib.suppress(PrismError):
            found.append(codec.decode(data))
    return found


def test_every_conformance_envelope_gives_the_same_copies() -> None:
    envs = _envelopes_of_the_vectors()
    assert len(envs) > 300
    shortcut = ok = errors = 0
    for env in envs:
        for e in (env, _cleared(env)):
            # the compiled shortcut is taken exactly where Python's `draft_split` takes its own
            python_fast = codec.draft_split(e.header, codec.split_header(e.header, Layout.REVIEWED)[0]) is not None
            for cut in CUTS:
                out = _same(e, cut)
                ok += out[0] == "ok"
                errors += out[0] == "error"
                assert _took_shortcut(e, cut) == python_fast, e.header
                shortcut += python_fast
    assert ok > 1500 and errors > 20 and shortcut > 140, (ok, errors, shortcut)


def test_the_bench_shape_takes_the_shortcut_and_signs_the_same() -> None:
    """The worker's message: metadata, security without encryption, observability and schema
    contexts, the identity extension entry, a payload; then whole pair and batch signatures."""
    env = rich_envelope()
    env.header.security.ClearField("encryption")
    env.header.observability.ClearField("labels")
    env.header.extensions.clear()
    env.header.extensions["prism.identity.method"] = b"hmac-signature"
    for cut in CUTS:
        assert _took_shortcut(_cleared(env), cut)
        _same(_cleared(env), cut)
    for scope in (signing.SCOPE_PAIR, signing.SCOPE_BATCH):
        compiled = signing.sign_layouts(_copy(env), HMAC, (Layout.DRAFT, Layout.REVIEWED), scope=scope)
        with _python_path():
            expected = signing.sign_layouts(_copy(env), HMAC, (Layout.DRAFT, Layout.REVIEWED), scope=scope)
        assert compiled == expected
        for data in compiled:
            signing.verify(data, signing.VerificationKeys.of([HMAC.verification_key()]))
    batch = [_copy(env) for _ in range(5)]
    compiled = signing.sign_batch(batch, HMAC, (Layout.DRAFT, Layout.REVIEWED))
    with _python_path():
        expected = signing.sign_batch([_copy(env) for _ in range(5)], HMAC, (Layout.DRAFT, Layout.REVIEWED))
    assert compiled == expected


_VARINT70 = b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f"
#: unknown fields (a newer producer's) and known numbers with another wire type
_UNKNOWN = st.sampled_from([b"", b"\xa8\x06\x01", b"\xa0\x06" + _VARINT70, b"\xaa\x06\x02hi", b"\x7d\x00\x00\x00\x00",
                            b"\x48\x05", b"\x3a\x01x", b"\x0d\x01\x02\x03\x04"])


@st.composite
def envelopes(draw: st.DrawFn, shortcut_shape: bool = False) -> Envelope:
    """`test_draft_split`'s headers (encryption, maps, extension entries of every kind), with
    extreme numbers, unknown fields in the metadata, security context and top level, and a
    payload or none. `shortcut_shape`: only headers the compiled shortcut converts (no
    encryption, maps or unknown fields, at most one extension entry, not a carried one)."""
    h: vpb.PrismEnvelope = draw(draft_split_headers())
    if shortcut_shape:
        h.security.ClearField("encryption")
        h.observability.ClearField("baggage")
        h.observability.ClearField("labels")
        kept = [(k, v) for k, v in h.extensions.items() if not k.startswith("prism.unknown.")][:1]
        h.ClearField("extensions")
        h.extensions.update(kept)
    m = h.metadata
    m.published_at_ms = draw(st.one_of(st.integers(-2**63, 2**63 - 1), st.sampled_from([0, -1, -999, -1000, -1001])))
    if draw(st.booleans()):
        m.priority = draw(st.integers(-2**31, 2**31 - 1))
    if draw(st.booleans()):
        m.ttl_seconds = draw(st.integers(-2**63, 2**63 - 1))
    if draw(st.booleans()):
        m.content_type = draw(st.sampled_from([4, 98, 100, 2**20, -5]))  # values this build has no name for
    for msg in (m, h.security, h):
        with contextlib.suppress(PbDecodeError):
            msg.MergeFromString(b"" if shortcut_shape else draw(_UNKNOWN))
    if draw(st.booleans()):
        h.security.tree_index, h.security.tree_size = draw(st.integers(0, 2**64 - 1)), draw(st.integers(0, 2**64 - 1))
        h.security.sibling_digest, h.security.signature = b"s" * 32, b"g" * 32
    payload = Payload.absent()
    if draw(st.booleans()):
        payload = Payload.from_wire(draw(st.binary(max_size=300)))
    return Envelope(h, payload)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(envelopes(), st.sampled_from(CUTS), st.booleans())
def test_generated_envelopes_give_the_same_copies(env: Envelope, cut: frozenset[int], clear: bool) -> None:
    _same(_cleared(env) if clear else env, cut)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(envelopes(shortcut_shape=True), st.sampled_from(CUTS), st.booleans())
def test_generated_envelopes_of_the_shortcut_shape_take_it_and_give_the_same_copies(
        env: Envelope, cut: frozenset[int], clear: bool) -> None:
    env = _cleared(env) if clear else env
    assert _took_shortcut(env, cut)
    _same(env, cut)


def test_what_the_shortcut_leaves_to_python_still_gives_the_same_copies() -> None:
    base = rich_envelope()
    base.header.security.ClearField("encryption")
    base.header.observability.ClearField("labels")
    base.header.extensions.clear()
    cases: dict[str, Envelope] = {}

    def case(name: str) -> Envelope:
        cases[name] = _copy(base)
        return cases[name]

    case("encryption").header.security.encryption.key_id = "k"
    case("baggage").header.observability.baggage["k"] = "v"
    e = case("two extension entries")
    e.header.extensions["a"], e.header.extensions["b"] = b"1", b"2"
    case("carried unknown entry").header.extensions["prism.unknown.reviewed.metadata"] = b"\xa8\x06\x01"
    case("unknown metadata field").header.metadata.MergeFromString(b"\xa0\x06" + _VARINT70)
    case("unknown security field").header.security.MergeFromString(b"\xa8\x06\x01")
    case("unknown top-level field").header.MergeFromString(b"\xa8\x06\x01")
    case("no security").header.ClearField("security")
    case("odd map entry").header.MergeFromString(b"\x8a\x06\x05\x0a\x01a\x18\x01")
    for name, env in cases.items():
        for cut in CUTS:
            assert not _took_shortcut(env, cut), name
            out = _same(env, cut)
            if name == "odd map entry":
                assert out[0] == "error" and out[1].__name__ == "AmbiguousMapEntryError", out


def test_a_token_in_the_record_is_cut_from_both_digests_as_in_python() -> None:
    env = rich_envelope()
    env.header.security.ClearField("encryption")
    env.header.observability.ClearField("labels")
    env.header.extensions.clear()
    env = _cleared(env)
    env.header.security.auth_token = "eyJ.token"
    for cut in CUTS:
        assert _took_shortcut(env, cut)
        _same(env, cut)


def test_a_panic_is_worded_as_a_prism_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: Any) -> None:
        raise native.module.WireFault("internal", 0, None, None, None, None)

    monkeypatch.setattr(signing, "_native_pair_copies", boom)
    env = _cleared(rich_envelope())
    with pytest.raises(PrismError, match=r"compiled pair copies failed \(internal\)") as info:
        signing._pair_copies(env, signing._CUT_BATCH)
    assert "PRISM_NATIVE=0" in (info.value.hint or "")


def _python_for_bytes(data: bytes, payload: bytes | None, batch: bool) -> tuple[bytes, ...] | None:
    """What the Python path gives for a reviewed header's bytes, when upb reads them as a
    header and writes the same bytes back (else None: not an encoder's output)."""
    try:
        header = vpb.PrismEnvelope.FromString(data)
    except PbDecodeError:
        return None
    if header.SerializeToString() != data or header.HasField("payload"):
        return None
    env = Envelope(header, Payload.from_wire(payload) if payload is not None else Payload.absent())
    try:
        copies, digest_d, digest_r = signing._py_pair_copies(env, signing._CUT_BATCH if batch else signing._CUT_PAIR)
    except PrismError:
        return None
    (_, sec_d, head_d, _), (_, _, head_r, _) = copies
    return bytes(head_r), bytes(head_d), sec_d.SerializeToString(), digest_d, digest_r


def _check_bytes(data: bytes, payload: bytes | None, batch: bool) -> None:
    got = native.module.pair_copies(data, payload, batch)
    if got is None:
        return
    expected = _python_for_bytes(data, payload, batch)
    assert expected is not None, data.hex()  # a value only for an encoder's canonical output
    head_r, head_d, sec_d, digest_d, digest_r, _, _ = got
    assert (head_r, head_d, vpb.SecurityContext.FromString(sec_d).SerializeToString(), digest_d, digest_r) == (
        expected[0], expected[1], vpb.SecurityContext.FromString(expected[2]).SerializeToString(), *expected[3:]), data.hex()


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=120), st.one_of(st.none(), st.binary(max_size=40)), st.booleans())
def test_arbitrary_bytes_give_a_value_or_none_never_an_error(data: bytes, payload: bytes | None, batch: bool) -> None:
    _check_bytes(data, payload, batch)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(envelopes(), st.data())
def test_corrupted_headers_give_the_python_bytes_or_none(env: Envelope, data: st.DataObject) -> None:
    full = bytearray(env.header.SerializeToString())
    if full:
        at = data.draw(st.integers(0, len(full) - 1))
        full[at] = data.draw(st.integers(0, 255))
        if data.draw(st.booleans()):
            del full[data.draw(st.integers(0, len(full))):]
    _check_bytes(bytes(full), b"p", data.draw(st.booleans()))
    for view in (memoryview(bytes(full)), bytearray(full)):
        assert native.module.pair_copies(view, memoryview(b"p"), True) == native.module.pair_copies(bytes(full), b"p",
                                                                                                  True)


@pytest.mark.parametrize("hostile", [
    b"", b"\x0a", b"\x0a\x00", b"\x0a\x00\x12\x00", _VARINT70, b"\x0b\x0c", b"\x0a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x02",
    b"\x0a\x02\x20" + b"\xff" * 9 + b"\x12\x00",  # published_at_ms runs past its record
    b"\x0a\x0b\x20" + _VARINT70 + b"\x12\x00",  # a 70-bit published_at_ms
    b"\x0a\x00\x12\x0b\x60" + _VARINT70,  # a 70-bit tree_index
    b"\x0a\x00\x12\x00\x8a\x06\x00",  # an extensions entry with neither key nor value
    b"\x0a\x00\x12\x00\x8a\x06\x02\x0a\x7f",  # its key runs past the entry
    # found by hypothesis: a schema record that does not walk (upb refuses the header) was copied
    bytes.fromhex("0a14380040004a07303030f090808052033030306a00120812002a0042004a0022032a0030"),
    b"\x0a\x05\x0a\x01m\x20\x00\x12\x00",  # published_at_ms 0 written out (upb drops it)
    b"\x0a\x05\x0a\x01m\x20\x01\x12\x00\x1a\x02\x0a\x00",  # an empty trace_id written out
], ids=lambda b: b.hex() or "empty")
def test_named_hostile_headers(hostile: bytes) -> None:
    for batch in (False, True):
        _check_bytes(hostile, None, batch)
        _check_bytes(hostile, hostile, batch)
