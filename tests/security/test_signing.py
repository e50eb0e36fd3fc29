"""Signatures: known-answer vectors, independent verification, tamper and key errors."""

import hashlib
import hmac

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings

from app.envelope import Layout, decode, encode, new_envelope
from app.envelope.wire import strip_field
from app.errors import AlgorithmError, SignatureError, UnknownKeyError
from app.security.signing import SigningKey, VerificationKeys, sign, verify
from tests.strategies import envelopes

HMAC_KEY = SigningKey.hmac_sha256("kat-hmac", bytes(range(32)))
ED_KEY = SigningKey.ed25519("kat-ed", Ed25519PrivateKey.from_private_bytes(bytes(range(100, 132))))
KEYS = VerificationKeys.of([HMAC_KEY, ED_KEY])

# Fixed envelope (message id 01890a5d-..., published 2023-10-13T12:26:40Z) signed by the
# fixed keys above. Ed25519 is deterministic (RFC 8032), so these bytes never change
# unless the wire format or signature scope does - which must be a deliberate decision.
KNOWN_ANSWERS = [
    ("kat-hmac", "draft",
     "0801125e0a2430313839306135642d616339362d373734622d626363652d623330323039396138303537120e6f72646572732e637265617465641a0c6f726465722d6576656e747322060880efa4a9062a106170706c69636174696f6e2f6a736f6e22450a0a7376632d6f726465727322200bdf3180db74060c699264a8cace81e33c4dde199cc7fe1f08559a25b9a962f52a0b686d61632d7368613235364a086b61742d686d61631a10120e7b226f726465725f6964223a377d"),
    ("kat-hmac", "reviewed",
     "0a4d0a2430313839306135642d616339362d373734622d626363652d623330323039396138303537120e6f72646572732e637265617465641a0c6f726465722d6576656e747320809883c8b231280212450a0a7376632d6f726465727322204ef60ecadf5115a6ad100f9e1fdd0d3b8156c1893ad7d4480c5c76cc98bbcf7e2a0b686d61632d7368613235364a086b61742d686d61639a0610120e7b226f726465725f6964223a377d"),
    ("kat-ed", "draft",
     "0801125e0a2430313839306135642d616339362d373734622d626363652d623330323039396138303537120e6f72646572732e637265617465641a0c6f726465722d6576656e747322060880efa4a9062a106170706c69636174696f6e2f6a736f6e225f0a0a7376632d6f72646572732240d5f7ccbedf64c2da80a9b7f15e3e1affb1355a44de2f6c23d715aedeb511d430162b4f113cd8b6486178ec9d928220f0f3fdf2b962c07e52e31a6ed49ccbfb042a07656432353531394a066b61742d65641a10120e7b226f726465725f6964223a377d"),
    ("kat-ed", "reviewed",
     "0a4d0a2430313839306135642d616339362d373734622d626363652d623330323039396138303537120e6f72646572732e637265617465641a0c6f726465722d6576656e747320809883c8b2312802125f0a0a7376632d6f726465727322405d25cb85702e48096052a6175c16cc1cecea9fa52f46b93241f3779a8ebdeb3048dc7701889cbd656bb0b4bb980a4f043f37901d348b6aee8a8c64db4ec909092a07656432353531394a066b61742d65649a0610120e7b226f726465725f6964223a377d"),
]


def fixed_envelope():
    env = new_envelope("orders.created", {"order_id": 7}, namespace="order-events",
                       message_id="01890a5d-ac96-774b-bcce-b302099a8057", published_at_ms=1697200000000)
    env.ensure_security().publisher_id = "svc-orders"
    return env


@pytest.mark.parametrize(("key_id", "layout", "hex_bytes"), KNOWN_ANSWERS)
def test_known_answer_vectors(key_id, layout, hex_bytes):
    key = HMAC_KEY if key_id == "kat-hmac" else ED_KEY
    assert sign(fixed_envelope(), key, Layout(layout)).hex() == hex_bytes
    info = verify(bytes.fromhex(hex_bytes), KEYS)
    assert (info.key_id, info.algorithm) == (key_id, key.algorithm)


@pytest.mark.parametrize(("key_id", "layout", "hex_bytes"), KNOWN_ANSWERS)
def test_verifiable_without_prism_code(key_id, layout, hex_bytes):
    """What another language does: cut the security records out, verify what remains."""
    data = bytes.fromhex(hex_bytes)
    sec_field = 4 if layout == "draft" else 2
    signed = b"".join(strip_field(data, sec_field))
    sig = decode(data).security.signature
    if key_id == "kat-hmac":
        assert hmac.compare_digest(hmac.new(bytes(range(32)), signed, hashlib.sha256).digest(), sig)
    else:
        ED_KEY.private_key.public_key().verify(sig, signed)


@settings(max_examples=100, deadline=None)
@given(envelopes())
def test_any_envelope_signs_and_verifies_in_both_layouts(env):
    for layout in Layout:
        for key in (HMAC_KEY, ED_KEY):
            assert verify(sign(env.copy(), key, layout), KEYS).key_id == key.key_id


@pytest.mark.parametrize("key", [HMAC_KEY, ED_KEY], ids=["hmac", "ed25519"])
def test_every_flipped_byte_outside_security_is_detected(key):
    from app.envelope.wire import iter_records

    data = sign(fixed_envelope(), key)
    sec = next(r for r in iter_records(data) if r.field == 2)
    for i in range(len(data)):
        if sec.start <= i < sec.end:
            continue
        bad = bytearray(data)
        bad[i] ^= 0x01
        with pytest.raises(Exception) as exc_info:
            verify(bytes(bad), KEYS)
        assert isinstance(exc_info.value, (SignatureError, UnknownKeyError)) or             exc_info.value.__class__.__module__ == "app.errors", i


def test_unsigned_and_unknown_key_and_bad_algorithm():
    env = fixed_envelope()
    with pytest.raises(SignatureError, match="not signed"):
        verify(encode(env), KEYS)
    other = SigningKey.hmac_sha256("stranger", b"s" * 32)
    with pytest.raises(UnknownKeyError, match="stranger"):
        verify(sign(fixed_envelope(), other), KEYS)
    with pytest.raises(AlgorithmError, match="at least 32"):
        SigningKey.hmac_sha256("short", b"123")
    forged = sign(fixed_envelope(), SigningKey.hmac_sha256("kat-hmac", b"f" * 32))
    with pytest.raises(SignatureError, match="forged or tampered"):
        verify(forged, KEYS)


def test_security_context_edits_do_not_break_signature():
    """Token stripping happens after the producer signed; the scope excludes security."""
    env = fixed_envelope()
    env.ensure_security().auth_token = "tok"
    data = sign(env, HMAC_KEY)
    env2 = decode(data)
    env2.security.ClearField("auth_token")
    from app.envelope.codec import encode_parts, security_record

    head, _, payload = encode_parts(env2)
    assert verify(b"".join([head, security_record(env2), *payload]), KEYS).key_id == "kat-hmac"
