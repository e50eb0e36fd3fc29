"""The pair scope (scope 3): one signature for a message's draft and reviewed copies.

The worker writes every message twice (`.v2` draft, `.v3` reviewed). With the pair scope it
signs once, over SHA-256(draft bytes, cut) and SHA-256(reviewed bytes, cut) in layout
order, and each copy carries the other copy's digest in `security.sibling_digest`
(docs/signing.md). These tests check that each copy verifies on its own with Prism's
verifier and with the independent spec implementation, that every covered field is still
covered in both layouts with both algorithms, that the sibling digest cannot be edited,
swapped or repeated, and that scope v2 and the legacy rules are unchanged.
"""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from app.envelope import Layout, decode, encode
from app.envelope.wire import iter_records
from app.errors import AmbiguousEnvelopeError, SignatureError, SignatureScopeError, UnknownKeyError
from app.security.signing import (
    DIGEST_BYTES,
    SCOPE_PAIR,
    SCOPE_PAIR_CONTEXT,
    SCOPE_V2,
    VerificationKeys,
    sign,
    sign_layouts,
    signed_message,
    verify,
    verify_and_decode,
)
from tests.security import spec_signing
from tests.security.test_signing import (
    ED_KEY,
    HMAC_KEY,
    KEYS,
    LAYOUTS,
    LEGACY_OK,
    MUTATIONS,
    SIGNERS,
    SPEC_KEYS,
    _record,
    _reencode,
    assert_every_flip_detected,
    fixed_envelope,
    rich_envelope,
)
from tests.strategies import envelopes

BOTH = (Layout.DRAFT, Layout.REVIEWED)


def _pair(key, env=None) -> dict[Layout, bytes]:
    draft, reviewed = sign_layouts(env if env is not None else rich_envelope(), key, BOTH, scope=SCOPE_PAIR)
    return {Layout.DRAFT: draft, Layout.REVIEWED: reviewed}


def _security(data: bytes, layout: Layout):
    return next(r for r in iter_records(data) if r.field == layout.security_field)


def _with_security_value(data: bytes, layout: Layout, value: bytes) -> bytes:
    sec = _security(data, layout)
    return data[:sec.start] + _record(layout.security_field, value) + data[sec.end:]


def _inner(data: bytes, layout: Layout) -> tuple[bytes, list]:
    sec = _security(data, layout)
    value = data[sec.value_start:sec.end]
    return value, list(iter_records(value))


def _cut_digest(data: bytes, layout: Layout) -> bytes:
    """SHA-256 of the copy without `signature`, `auth_token` and `sibling_digest`, written
    out here from docs/signing.md (not through either implementation)."""
    sec = _security(data, layout)
    value, inner = _inner(data, layout)
    kept = b"".join(value[r.start:r.end] for r in inner if r.field not in (3, 4, 11))
    return hashlib.sha256(data[:sec.start] + _record(layout.security_field, kept) + data[sec.end:]).digest()


@SIGNERS
def test_one_signature_both_copies_each_verifiable_alone(key):
    out = _pair(key)
    draft, reviewed = decode(out[Layout.DRAFT]), decode(out[Layout.REVIEWED])
    assert draft.security.signature == reviewed.security.signature  # signed once
    assert draft.security.signature_scope == reviewed.security.signature_scope == SCOPE_PAIR
    # each copy names the other one: the sibling's digest, as the spec defines it
    assert reviewed.security.sibling_digest == _cut_digest(out[Layout.DRAFT], Layout.DRAFT)
    assert draft.security.sibling_digest == _cut_digest(out[Layout.REVIEWED], Layout.REVIEWED)
    for layout, data in out.items():
        assert verify(data, KEYS).scope == SCOPE_PAIR
        assert verify_and_decode(data, KEYS)[1].key_id == key.key_id
        assert spec_signing.verify(data, SPEC_KEYS) == "valid"
        message = signed_message(data)
        assert message.layout is layout and message.scope == SCOPE_PAIR
        assert message.joined() == (SCOPE_PAIR_CONTEXT + _cut_digest(out[Layout.DRAFT], Layout.DRAFT)
                                    + _cut_digest(out[Layout.REVIEWED], Layout.REVIEWED))
        assert spec_signing.signed_message(data)[2] == message.joined()


@SIGNERS
@LAYOUTS
def test_sign_with_the_pair_scope_gives_the_same_copy(key, layout):
    """`sign(..., scope=SCOPE_PAIR)` (one layout asked for) is the same copy as the one
    `sign_layouts` writes, and leaves the model encoding to the signed reviewed copy."""
    env = rich_envelope()
    one = sign(env, key, layout, scope=SCOPE_PAIR)
    assert one == _pair(key)[layout]
    assert encode(env) == _pair(key)[Layout.REVIEWED]


@SIGNERS
@LAYOUTS
@pytest.mark.parametrize("field", list(MUTATIONS))
def test_changing_any_covered_field_fails(key, layout, field):
    data = _pair(key)[layout]
    assert verify(_reencode(data, layout, None), KEYS).key_id == key.key_id  # control: re-encoding alone is fine
    tampered = _reencode(data, layout, MUTATIONS[field])
    assert tampered != data
    with pytest.raises((SignatureError, UnknownKeyError)):
        verify(tampered, KEYS)
    with pytest.raises((SignatureError, UnknownKeyError)):
        verify(tampered, LEGACY_OK)
    assert spec_signing.verify(tampered, SPEC_KEYS, accept_legacy_scope=True) != "valid"


@SIGNERS
@LAYOUTS
def test_every_flipped_byte_outside_signature_token_and_sibling_digest_is_detected(key, layout):
    data = _pair(key)[layout]
    sec = _security(data, layout)
    _, inner = _inner(data, layout)
    # the signature and token values are outside the digest; the sibling digest is outside
    # it too, but inside the signed statement: flipping it must fail as well
    skipped = [range(sec.value_start + r.value_start, sec.value_start + r.end) for r in inner if r.field in (3, 4)]
    assert_every_flip_detected(data, skipped)


@SIGNERS
@LAYOUTS
def test_auth_token_is_outside_the_scope(key, layout):
    data = _pair(key)[layout]
    stripped = _reencode(data, layout, lambda e: e.header.security.ClearField("auth_token"))
    assert stripped != data
    assert verify(stripped, KEYS).scope == SCOPE_PAIR


@SIGNERS
def test_v3_record_with_the_v2_siblings_signature_and_digest_fails(key):
    """Swapping in the `.v2` copy's signature and sibling digest (which names the `.v3` copy
    itself) makes the reviewed copy claim `D(v3) || D(v3)`: a statement never signed."""
    out = _pair(key)
    draft = decode(out[Layout.DRAFT]).security

    def swap(env):
        env.header.security.signature = draft.signature
        env.header.security.sibling_digest = draft.sibling_digest

    swapped = _reencode(out[Layout.REVIEWED], Layout.REVIEWED, swap)
    assert swapped != out[Layout.REVIEWED]
    with pytest.raises(SignatureError, match="forged or tampered"):
        verify(swapped, KEYS)
    assert spec_signing.verify(swapped, SPEC_KEYS) == "bad_signature"


@SIGNERS
def test_copies_of_two_messages_do_not_pair(key):
    """The `.v3` copy of message A carrying the draft digest of message B fails, though both
    digests were signed by the same key: only the pair the key signed together verifies."""
    a = _pair(key)
    other = rich_envelope()
    other.header.metadata.correlation_id = "corr-other"
    b_draft_digest = decode(_pair(key, other)[Layout.REVIEWED]).security.sibling_digest
    assert b_draft_digest != decode(a[Layout.REVIEWED]).security.sibling_digest
    forged = _reencode(a[Layout.REVIEWED], Layout.REVIEWED,
                       lambda env: setattr(env.header.security, "sibling_digest", b_draft_digest))
    with pytest.raises(SignatureError, match="forged or tampered"):
        verify(forged, KEYS)


@SIGNERS
@LAYOUTS
def test_sibling_digest_missing_short_repeated_or_mistyped(key, layout):
    data = _pair(key)[layout]
    value, inner = _inner(data, layout)
    sib = next(r for r in inner if r.field == 11)
    without = value[:sib.start] + value[sib.end:]
    cases = {
        "missing": (without, SignatureError, "bad_signature"),
        "short": (without + _record(11, bytes(DIGEST_BYTES - 1)), SignatureError, "bad_signature"),
        "long": (without + _record(11, bytes(DIGEST_BYTES + 1)), SignatureError, "bad_signature"),
        "flipped": (without + _record(11, bytes([value[sib.value_start] ^ 1]) + value[sib.value_start + 1:sib.end]),
                    SignatureError, "bad_signature"),
        "repeated": (value + value[sib.start:sib.end], AmbiguousEnvelopeError, "ambiguous_envelope"),
        "repeated-other": (value + _record(11, bytes(DIGEST_BYTES)), AmbiguousEnvelopeError, "ambiguous_envelope"),
        "mistyped": (without + bytes([11 << 3 | 0, 0x01]), AmbiguousEnvelopeError, "ambiguous_envelope"),
    }
    for name, (inner_value, error, reason) in cases.items():
        bad = _with_security_value(data, layout, inner_value)
        with pytest.raises(error):
            verify(bad, LEGACY_OK)
        assert spec_signing.verify(bad, SPEC_KEYS, accept_legacy_scope=True) == reason, name


@SIGNERS
@LAYOUTS
def test_scope_relabelling_fails_both_ways(key, layout):
    """A pair signature relabelled v2, and a v2 signature relabelled pair (given a sibling
    digest), do not verify: the context strings differ, and scope and digest are signed."""
    pair = _pair(key)[layout]
    as_v2 = _reencode(pair, layout, lambda e: setattr(e.header.security, "signature_scope", SCOPE_V2))
    with pytest.raises(SignatureError, match="forged or tampered"):
        verify(as_v2, KEYS)
    v2 = sign(rich_envelope(), key, layout)

    def to_pair(env):
        env.header.security.signature_scope = SCOPE_PAIR
        env.header.security.sibling_digest = bytes(DIGEST_BYTES)

    with pytest.raises(SignatureError, match="forged or tampered"):
        verify(_reencode(v2, layout, to_pair), KEYS)


def test_unknown_scope_still_refused_and_v2_still_accepted():
    data = _pair(HMAC_KEY)[Layout.REVIEWED]
    value, inner = _inner(data, Layout.REVIEWED)
    scope = next(r for r in inner if r.field == 10)
    bad = _with_security_value(data, Layout.REVIEWED, value[:scope.start] + bytes([0x50, 0x09]) + value[scope.end:])
    with pytest.raises(SignatureScopeError):
        verify(bad, LEGACY_OK)
    assert spec_signing.verify(bad, SPEC_KEYS) == "unsupported_signature_scope"
    for layout in Layout:
        assert verify(sign(fixed_envelope(), ED_KEY, layout), KEYS).scope == SCOPE_V2


def test_a_verifier_without_the_key_refuses_the_pair():
    data = _pair(ED_KEY)[Layout.DRAFT]
    with pytest.raises(UnknownKeyError):
        verify(data, VerificationKeys.of([HMAC_KEY]))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(env=envelopes(), key=st.sampled_from([HMAC_KEY, ED_KEY]), field=st.sampled_from(sorted(MUTATIONS)),
       layout=st.sampled_from(list(Layout)), token=st.booleans())
def test_any_envelope_pair_signed_verifies_and_any_covered_change_fails(env, key, field, layout, token):
    sec = env.ensure_security()
    sec.publisher_id = sec.publisher_id or "svc"
    sec.data_classification = sec.data_classification or "confidential"
    if token:
        sec.auth_token = "tok"
    out = _pair(key, env)
    for lay, data in out.items():
        assert verify(data, KEYS, layout=lay).scope == SCOPE_PAIR
        assert spec_signing.verify(data, SPEC_KEYS) == "valid"
    data = out[layout]
    try:  # some envelopes do not survive decode + encode byte for byte (empty draft payload)
        verify(_reencode(data, layout, None), KEYS)
    except SignatureError:
        assume(False)
    tampered = _reencode(data, layout, MUTATIONS[field])
    assume(tampered != _reencode(data, layout, None))
    with pytest.raises((SignatureError, UnknownKeyError)):
        verify(tampered, KEYS)
