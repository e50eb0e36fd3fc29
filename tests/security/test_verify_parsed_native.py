"""`verify(..., security=...)`: the verifier handed the security context the worker's normalize
stage already parsed (`VerifySignature` passes `env.header.security` with normalize's walk)
against the verifier that parses the record itself.

With the compiled module the record is only located and checked (`prism_native.security_span`,
no tuple per inner record) and never parsed; without it (`PRISM_NATIVE=0`) the Python check
runs and only the parse is skipped. Either way the verdict must be the one the pure-Python
verifier gives from the bytes alone - the same `SignatureInfo`, or the same `PrismError`
class, text, path and hint: on the signature vectors of the conformance suite (every scope,
both algorithms, both layouts, with and without legacy acceptance), on every other
conformance hex string, on generated hostile security records (repeated, mistyped, 70-bit
scopes, unknown keys and algorithms) and on signed envelopes with a flipped byte. The context
handed in is the one a decode of the same bytes gives (a draft header converted to the
reviewed model, as normalize does), or - for bytes no decode accepts - one parsed from the
record, so a merged or absent context must still lose to the ambiguity and not-signed checks.

Locally the compiled half skips without the native module; under CI=true it fails
(tests/support.require).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import native
from app._gen.prism.envelope.v1 import envelope_pb2 as vpb
from app.envelope import Layout, wire
from app.envelope.codec import decode
from app.errors import PrismError
from app.security import signing
from tests.envelope.test_wire_native import _vector_bytes
from tests.security.test_signature_vectors import DOCS, _keyring
from tests.security.test_signing import rich_envelope
from tests.security.test_signing_statement_native import _FIELDS, KEYS, SECRET, _record, _sec
from tests.support import require

ED_KEY = signing.SigningKey.ed25519("e1", Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
#: k1 named by id (one candidate: the MAC comes with the record's check), the same secret
#: under no id (every HMAC key of the keyring is a candidate, the right one second), Ed25519
SIGNERS = [signing.SigningKey.hmac_sha256("k1", SECRET), signing.SigningKey.hmac_sha256("", SECRET), ED_KEY]
BOTH = signing.VerificationKeys.of([*KEYS.keys.values(), ED_KEY], accept_legacy_scope=True)


@contextmanager
def _pure_python() -> Iterator[None]:
    """Every compiled piece of the verifier swapped for its Python original (what
    `PRISM_NATIVE=0` runs), put back afterwards."""
    saved = (signing._security_record, signing._message_parts, signing._native_mac, signing._native_security_span)
    signing._security_record, signing._message_parts = signing._py_security_record, signing._py_message_parts
    signing._native_mac = signing._native_security_span = None
    try:
        yield
    finally:
        (signing._security_record, signing._message_parts, signing._native_mac,
         signing._native_security_span) = saved


def _outcome(data: bytes, keys: signing.VerificationKeys, **kwargs: Any) -> Any:
    signing.clear_verification_cache()
    try:
        return ("ok", signing.verify(data, keys, **kwargs))
    except PrismError as exc:
        return ("error", type(exc), str(exc), exc.path, exc.hint)


def _contexts(data: bytes, lay: Layout) -> list[Any]:
    """What a caller may hand in for these bytes: the decoded header's context (normalize's),
    else the record parsed alone; for bytes with no single security record (absent,
    ambiguous, not walkable: no caller would verify them) a signed-looking context, which
    the checks that run first must still refuse. A record that does not parse gives no
    context at all (no decode of these bytes succeeds, so no caller has one)."""
    try:
        header = decode(data, layout=lay).header
    except PrismError:
        pass
    else:
        return [header.security] if header.HasField("security") else [vpb.SecurityContext()]
    view = memoryview(data)
    try:
        rec = signing._py_security_record(view, wire._py_scan(view), lay)[0]
    except PrismError:
        return [vpb.SecurityContext(signature=b"s", signature_algorithm=signing.HMAC_SHA256)]
    try:
        return [signing._parse_security(view[rec[3]:rec[4]], lay)]
    except PrismError:
        return []


def _same(data: bytes, lay: Layout, keys: signing.VerificationKeys, **kwargs: Any) -> Any:
    with _pure_python():
        expected = _outcome(data, keys, layout=lay, **kwargs)
    for sec in _contexts(data, lay):
        with _pure_python():
            assert _outcome(data, keys, layout=lay, security=sec, **kwargs) == expected, (data.hex(), lay)
        assert _outcome(data, keys, layout=lay, security=sec, **kwargs) == expected, (data.hex(), lay)
    return expected


@pytest.fixture(autouse=True)
def _native_built() -> None:
    require(native.ACTIVE and signing._native_security_span is not None,
            f"the compiled security span is not active: {native.reason}")


def test_the_signature_vectors_give_the_same_verdict() -> None:
    verdicts: dict[str, int] = {}
    for doc in DOCS.values():
        for vector in doc["vectors"]:
            data, lay = bytes.fromhex(vector["envelope_hex"]), Layout(vector["layout"])
            for accept in (False, True):
                v = _same(data, lay, _keyring(doc, accept))
                key = "valid" if v[0] == "ok" else v[1].__name__
                verdicts[key] = verdicts.get(key, 0) + 1
    assert verdicts["valid"] > 50
    assert verdicts["SignatureError"] > 50
    assert verdicts["LegacySignatureScopeError"] > 0


def test_every_conformance_hex_string_gives_the_same_verdict() -> None:
    outcomes = [_same(data, lay, KEYS) for data in _vector_bytes() for lay in Layout]
    assert sum(o[0] == "error" for o in outcomes) > 300
    assert len({o[1] for o in outcomes if o[0] == "error"}) >= 4  # not-signed, ambiguous, wire, forged ...


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(list(Layout)), _FIELDS, st.binary(max_size=40), st.binary(max_size=40))
def test_generated_security_records_give_the_same_verdict(lay: Layout, body: bytes, head: bytes, tail: bytes) -> None:
    data = _record(20, wire.LEN, head) + _record(lay.security_field, wire.LEN, body) + _record(21, wire.LEN, tail)
    _same(data, lay, KEYS)


_SCOPES = [signing.SCOPE_V2, signing.SCOPE_LEGACY, signing.SCOPE_PAIR, signing.SCOPE_BATCH]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(list(Layout)), st.sampled_from(_SCOPES), st.sampled_from(SIGNERS), st.booleans(),
       st.integers(0, 10**6), st.integers(0, 255), st.binary(max_size=3))
def test_signed_envelopes_flipped_or_extended_give_the_same_verdict(
        lay: Layout, scope: int, key: signing.SigningKey, accept: bool, at: int, xor: int, extra: bytes) -> None:
    data = bytearray(signing.sign(rich_envelope(), key, lay, scope=scope))
    if xor:
        data[at % len(data)] ^= xor
    keys = signing.VerificationKeys(BOTH.keys, accept_legacy_scope=accept)
    _same(bytes(data) + extra, lay, keys)


@pytest.mark.parametrize("data", [
    _sec(_record(4, wire.LEN, b"s"), _record(4, wire.LEN, b"t")),  # signature twice: protobuf would merge
    _sec(_record(4, wire.LEN, b"s")) * 2,  # two security records
    _sec(_record(10, wire.VARINT, 2**70 - 1), _record(4, wire.LEN, b"s")),  # a 70-bit scope
    _sec(_record(10, wire.VARINT, 9), _record(4, wire.LEN, b"s")),  # an unknown scope
    _sec(_record(4, wire.LEN, b"s"), _record(5, wire.LEN, b"none")),  # an unknown algorithm
    _sec(_record(4, wire.LEN, b"s"), _record(5, wire.LEN, b"hmac-sha256"), _record(9, wire.LEN, b"nobody")),
    _sec(_record(4, wire.VARINT, 1)),  # signature as a varint
    _sec(),  # a security record without a signature
    _record(1, wire.LEN, b"\x0a\x01x"),  # no security record at all
    b"\x12\x05\x22\x09",  # a record that does not walk
    b"",
])
def test_hostile_security_records_give_the_same_typed_error(data: bytes) -> None:
    for lay in Layout:
        outcome = _same(data, lay, KEYS)
        assert outcome[0] == "error"


def test_a_context_that_disagrees_with_unambiguous_bytes_is_the_callers_promise() -> None:
    """The contract is a parse of *these* bytes: the verdict is then the one the bytes give.
    This pins that the compiled path really reads the handed-in context (a mutant that parsed
    the record anyway would pass the tests above)."""
    data = signing.sign(rich_envelope(), SIGNERS[0], Layout.REVIEWED)
    assert _same(data, Layout.REVIEWED, KEYS)[0] == "ok"
    other = vpb.SecurityContext(signature=b"\x00" * 32, signature_algorithm=signing.HMAC_SHA256,
                                signature_key_id="k1")
    got = _outcome(data, KEYS, layout=Layout.REVIEWED, security=other)
    assert got[0] == "error" and "forged or tampered" in got[2]
