"""Signatures: known-answer vectors, independent verification, tamper and key errors.

Scope v2 (the default) covers the whole envelope except `signature` and `auth_token`; the
legacy scope (memo-031 Option 2) covers the envelope minus its security context and is only
accepted when the verifier says so. docs/signing.md specifies both byte by byte;
`tests/security/spec_signing.py` is that document written out independently."""

from __future__ import annotations

import hashlib
import hmac
import pathlib
from collections.abc import Callable

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from app.envelope import Envelope, Layout, Limits, decode, encode, new_envelope
from app.envelope.codec import encode_parts, security_record
from app.envelope.model import Payload
from app.envelope.wire import encode_varint, iter_records, strip_field
from app.errors import (
    AlgorithmError,
    AmbiguousEnvelopeError,
    DecodeError,
    LegacySignatureScopeError,
    PrismError,
    SignatureError,
    SignatureScopeError,
    SizeLimitError,
    UnknownKeyError,
)
from app.security.signing import (
    SCOPE_LEGACY,
    SCOPE_PAIR,
    SCOPE_V2,
    SigningKey,
    VerificationKey,
    VerificationKeys,
    check_unambiguous,
    sign,
    sign_layouts,
    signed_message,
    verify,
    verify_and_decode,
)
from tests.security import spec_signing
from tests.strategies import envelopes

HMAC_KEY = SigningKey.hmac_sha256("kat-hmac", bytes(range(32)))
HMAC_KEY_2 = SigningKey.hmac_sha256("kat-hmac-2", bytes(range(32, 64)))
ED_KEY = SigningKey.ed25519("kat-ed", Ed25519PrivateKey.from_private_bytes(bytes(range(100, 132))))
ED_KEY_2 = SigningKey.ed25519("kat-ed-2", Ed25519PrivateKey.from_private_bytes(bytes(range(132, 164))))
KEYS = VerificationKeys.of([HMAC_KEY, HMAC_KEY_2, ED_KEY, ED_KEY_2])
LEGACY_OK = VerificationKeys.of([HMAC_KEY, HMAC_KEY_2, ED_KEY, ED_KEY_2], accept_legacy_scope=True)
SIGNERS = pytest.mark.parametrize("key", [HMAC_KEY, ED_KEY], ids=["hmac", "ed25519"])
LAYOUTS = pytest.mark.parametrize("layout", list(Layout), ids=[lay.value for lay in Layout])

LEGACY_KNOWN_ANSWERS = [
    ("kat-hmac", "draft",
     "0801125e0a2430313839306135642d616339362d373734622d626363652d623330323039396138303537120e6f72646572732e637265617465641a0c6f726465722d6576656e747322060880efa4a9062a106170706c69636174696f6e2f6a736f6e22450a0a7376632d6f726465727322200bdf3180db74060c699264a8cace81e33c4dde199cc7fe1f08559a25b9a962f52a0b686d61632d7368613235364a086b61742d686d61631a10120e7b226f726465725f6964223a377d"),
    ("kat-hmac", "reviewed",
     "0a4d0a2430313839306135642d616339362d373734622d626363652d623330323039396138303537120e6f72646572732e637265617465641a0c6f726465722d6576656e747320809883c8b231280212450a0a7376632d6f726465727322204ef60ecadf5115a6ad100f9e1fdd0d3b8156c1893ad7d4480c5c76cc98bbcf7e2a0b686d61632d7368613235364a086b61742d686d61639a0610120e7b226f726465725f6964223a377d"),
    ("kat-ed", "draft",
     "0801125e0a2430313839306135642d616339362d373734622d626363652d623330323039396138303537120e6f72646572732e637265617465641a0c6f726465722d6576656e747322060880efa4a9062a106170706c69636174696f6e2f6a736f6e225f0a0a7376632d6f72646572732240d5f7ccbedf64c2da80a9b7f15e3e1affb1355a44de2f6c23d715aedeb511d430162b4f113cd8b6486178ec9d928220f0f3fdf2b962c07e52e31a6ed49ccbfb042a07656432353531394a066b61742d65641a10120e7b226f726465725f6964223a377d"),
    ("kat-ed", "reviewed",
     "0a4d0a2430313839306135642d616339362d373734622d626363652d623330323039396138303537120e6f72646572732e637265617465641a0c6f726465722d6576656e747320809883c8b2312802125f0a0a7376632d6f726465727322405d25cb85702e48096052a6175c16cc1cecea9fa52f46b93241f3779a8ebdeb3048dc7701889cbd656bb0b4bb980a4f043f37901d348b6aee8a8c64db4ec909092a07656432353531394a066b61742d65649a0610120e7b226f726465725f6964223a377d"),
]

# The same envelope signed with scope v2 (the default). These changed on purpose when scope
# v2 became the default: the security record gains `signature_scope` (50 02) and the
# signature now covers the security context.
V2_KNOWN_ANSWERS = [
    ("kat-hmac", "draft",
     "0801125e0a2430313839306135642d616339362d373734622d626363652d623330323039396138303537120e6f72646572732e637265617465641a0c6f726465722d6576656e747322060880efa4a9062a106170706c69636174696f6e2f6a736f6e22470a0a7376632d6f7264657273222020284785e3a14e8715fc803624fbaa05dd3bd1b6e9f304bdaf281502d450e1892a0b686d61632d7368613235364a086b61742d686d616350021a10120e7b226f726465725f6964223a377d"),
    ("kat-hmac", "reviewed",
     "0a4d0a2430313839306135642d616339362d373734622d626363652d623330323039396138303537120e6f72646572732e637265617465641a0c6f726465722d6576656e747320809883c8b231280212470a0a7376632d6f7264657273222038b181338ae66cb483d44c6549e8e390cc5da8e33309e4b4e1cc82b439ce62eb2a0b686d61632d7368613235364a086b61742d686d616350029a0610120e7b226f726465725f6964223a377d"),
    ("kat-ed", "draft",
     "0801125e0a2430313839306135642d616339362d373734622d626363652d623330323039396138303537120e6f72646572732e637265617465641a0c6f726465722d6576656e747322060880efa4a9062a106170706c69636174696f6e2f6a736f6e22610a0a7376632d6f72646572732240efb14413e70c41108470ef5eca4c6e30e74c9c27e556f2fb46309f23d3093ba44a15216719cc10aa953a00d0df658bbb071027714fec188592a2e36255bfd9082a07656432353531394a066b61742d656450021a10120e7b226f726465725f6964223a377d"),
    ("kat-ed", "reviewed",
     "0a4d0a2430313839306135642d616339362d373734622d626363652d623330323039396138303537120e6f72646572732e637265617465641a0c6f726465722d6576656e747320809883c8b231280212610a0a7376632d6f7264657273224028dc5f6d5709990af49bcc2136a53cc6ec7a2512e1b9b6ad824742b03d03679202c9caa938814b4a23301194e8ca3003bad3f1fa8e4f312234c6cfd9a6c0df002a07656432353531394a066b61742d656450029a0610120e7b226f726465725f6964223a377d"),
]
KEY_BY_ID = {"kat-hmac": HMAC_KEY, "kat-ed": ED_KEY}
SPEC_KEYS = {"kat-hmac": ("hmac-sha256", bytes(range(32))), "kat-hmac-2": ("hmac-sha256", bytes(range(32, 64))),
             "kat-ed": ("ed25519", ED_KEY.private_key.public_key().public_bytes_raw()),
             "kat-ed-2": ("ed25519", ED_KEY_2.private_key.public_key().public_bytes_raw())}


def fixed_envelope() -> Envelope:
    env = new_envelope("orders.created", {"order_id": 7}, namespace="order-events",
                       message_id="01890a5d-ac96-774b-bcce-b302099a8057", published_at_ms=1697200000000)
    env.ensure_security().publisher_id = "svc-orders"
    return env


def rich_envelope() -> Envelope:
    """Every security-context field set, plus the other contexts, so a mutation of any of
    them has something to change."""
    env = new_envelope("orders.created", {"order_id": 7, "email": "a@example.com"}, namespace="order-events",
                       message_id="01890a5d-ac96-774b-bcce-b302099a8058", published_at_ms=1697200000000,
                       priority=7, ttl_seconds=3600, correlation_id="corr-1", causality_parent="parent-1",
                       labels={"tier": "gold"}, extensions={"x-ext": b"\x01\x02"},
                       data_classification="restricted", contains_pii=True)
    sec = env.ensure_security()
    sec.publisher_id, sec.publisher_team = "svc-orders", "team-orders"
    sec.auth_token = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJzdmMtb3JkZXJzIn0.c2ln"
    enc = sec.encryption
    enc.key_id, enc.algorithm, enc.encryption_type = "kek-1", "aes-256-gcm", 1
    enc.iv, enc.aad = bytes(12), b"prism-envelope-aad/v1\x00aad"
    obs = env.ensure_observability()
    obs.trace_id, obs.span_id, obs.trace_flags = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", 1
    sch = env.ensure_schema()
    sch.schema_url, sch.schema_version = "registry://orders", "v2"
    return env


@pytest.mark.parametrize(("key_id", "layout", "hex_bytes"), V2_KNOWN_ANSWERS)
def test_v2_known_answer_vectors(key_id, layout, hex_bytes):
    key = KEY_BY_ID[key_id]
    assert sign(fixed_envelope(), key, Layout(layout)).hex() == hex_bytes
    info = verify(bytes.fromhex(hex_bytes), KEYS)
    assert (info.key_id, info.algorithm, info.scope) == (key_id, key.algorithm, SCOPE_V2)


@pytest.mark.parametrize(("key_id", "layout", "hex_bytes"), LEGACY_KNOWN_ANSWERS)
def test_legacy_signing_is_byte_identical_and_refused_by_default(key_id, layout, hex_bytes):
    key = KEY_BY_ID[key_id]
    assert sign(fixed_envelope(), key, Layout(layout), scope=SCOPE_LEGACY).hex() == hex_bytes
    data = bytes.fromhex(hex_bytes)
    with pytest.raises(LegacySignatureScopeError, match="legacy scope") as exc_info:
        verify(data, KEYS)
    assert exc_info.value.code == "legacy_signature_scope"
    info = verify(data, KEYS, accept_legacy_scope=True)
    assert (info.key_id, info.scope) == (key_id, SCOPE_LEGACY)
    assert verify(data, LEGACY_OK).scope == SCOPE_LEGACY  # the keyring's default
    with pytest.raises(LegacySignatureScopeError):
        verify(data, LEGACY_OK, accept_legacy_scope=False)  # an explicit answer wins


@pytest.mark.parametrize(("key_id", "layout", "hex_bytes"), LEGACY_KNOWN_ANSWERS)
def test_legacy_verifiable_without_prism_code(key_id, layout, hex_bytes):
    """What another language does for the legacy scope: cut the security records out."""
    data = bytes.fromhex(hex_bytes)
    sec_field = 4 if layout == "draft" else 2
    signed = b"".join(strip_field(data, sec_field))
    sig = decode(data).security.signature
    if key_id == "kat-hmac":
        assert hmac.compare_digest(hmac.new(bytes(range(32)), signed, hashlib.sha256).digest(), sig)
    else:
        ED_KEY.private_key.public_key().verify(sig, signed)
    assert spec_signing.verify(data, SPEC_KEYS, accept_legacy_scope=True) == "valid"
    assert spec_signing.verify(data, SPEC_KEYS) == "legacy_signature_scope"


@pytest.mark.parametrize(("key_id", "layout", "hex_bytes"), V2_KNOWN_ANSWERS)
def test_v2_verifiable_from_the_spec_alone(key_id, layout, hex_bytes):
    data = bytes.fromhex(hex_bytes)
    lay, scope, message, *_ = spec_signing.signed_message(data)
    assert (lay, scope) == (layout, SCOPE_V2)
    assert signed_message(data).joined() == message
    assert message.startswith(b"prism-envelope-signature/v2/" + layout.encode() + b"\x00")
    assert spec_signing.verify(data, SPEC_KEYS) == "valid"


@settings(max_examples=100, deadline=None)
@given(envelopes())
def test_any_envelope_signs_and_verifies_in_both_layouts(env):
    for layout in Layout:
        for key in (HMAC_KEY, ED_KEY):
            data = sign(env.copy(), key, layout)
            assert verify(data, KEYS).key_id == key.key_id
            assert verify_and_decode(data, KEYS)[1].key_id == key.key_id
            assert spec_signing.verify(data, SPEC_KEYS) == "valid"
            assert verify(sign(env.copy(), key, layout, scope=SCOPE_LEGACY), LEGACY_OK).scope == SCOPE_LEGACY


def _secret_spans(data: bytes, layout: Layout) -> list[range]:
    """Byte ranges of the signature and auth-token values: the only bytes scope v2 leaves out."""
    sec = next(r for r in iter_records(data) if r.field == layout.security_field)
    return [range(sec.value_start + r.value_start, sec.value_start + r.end)
            for r in iter_records(data[sec.value_start:sec.end]) if r.field in (3, 4)]


@SIGNERS
@LAYOUTS
def test_v2_every_flipped_byte_outside_signature_and_token_is_detected(key, layout):
    """Every byte of the envelope, the security context included, is covered by scope v2,
    except the signature itself and the auth token (which the worker strips)."""
    data = sign(rich_envelope(), key, layout)
    skipped = _secret_spans(data, layout)
    assert sum(len(r) for r in skipped) > 40  # signature and token are there
    assert_every_flip_detected(data, skipped)


def assert_every_flip_detected(data: bytes, skipped: list[range], keys: VerificationKeys = KEYS) -> None:
    """Flipping any one bit of `data` outside the `skipped` byte spans must fail verification."""
    for i in range(len(data)):
        if any(i in r for r in skipped):
            continue
        bad = bytearray(data)
        bad[i] ^= 0x01
        with pytest.raises(PrismError):
            verify(bytes(bad), keys)


@SIGNERS
def test_legacy_every_flipped_byte_outside_security_is_detected(key):
    data = sign(fixed_envelope(), key, scope=SCOPE_LEGACY)
    sec = next(r for r in iter_records(data) if r.field == 2)
    for i in range(len(data)):
        if sec.start <= i < sec.end:
            continue
        bad = bytearray(data)
        bad[i] ^= 0x01
        with pytest.raises(PrismError):
            verify(bytes(bad), LEGACY_OK)


# --------------------------------------------------------------------------- tampering with decoded fields


def _set(path: str, value: object) -> Callable[[Envelope], None]:
    def apply(env: Envelope) -> None:
        *parents, name = path.split(".")
        obj = env.header
        for p in parents:
            obj = getattr(obj, p)
        if value is None:
            obj.ClearField(name)
        else:
            setattr(obj, name, value)
    return apply


def _set_payload(env: Envelope) -> None:
    env.payload = Payload(b'{"order_id":8}', env.payload.type_url)


def _other_trusted_key(env: Envelope) -> None:
    """Another key the verifier trusts, of the same algorithm (a key-id swap, not an unknown key)."""
    sec = env.header.security
    sec.signature_key_id = "kat-hmac-2" if sec.signature_algorithm == "hmac-sha256" else "kat-ed-2"


def _other_algorithm(env: Envelope) -> None:
    sec = env.header.security
    sec.signature_algorithm = "ed25519" if sec.signature_algorithm == "hmac-sha256" else "hmac-sha256"


def _add_extension(env: Envelope) -> None:
    env.header.extensions["x-injected"] = b"1"


def _add_label(env: Envelope) -> None:
    env.header.observability.labels["tier"] = "platinum"


#: Every covered field a consumer decides on, changed after signing (decode, change, encode).
MUTATIONS: dict[str, Callable[[Envelope], None]] = {
    "security.publisher_id": _set("security.publisher_id", "svc-mallory"),
    "security.publisher_id removed": _set("security.publisher_id", None),
    "security.publisher_team": _set("security.publisher_team", "team-mallory"),
    "security.data_classification": _set("security.data_classification", "public"),
    "security.data_classification removed": _set("security.data_classification", None),
    "security.contains_pii": _set("security.contains_pii", False),
    "security.contains_pii removed": _set("security.contains_pii", None),
    "security.encryption.key_id": _set("security.encryption.key_id", "kek-mallory"),
    "security.encryption.algorithm": _set("security.encryption.algorithm", "chacha20-poly1305"),
    "security.encryption.iv": _set("security.encryption.iv", b"\x01" * 12),
    "security.encryption.aad": _set("security.encryption.aad", b"other"),
    "security.encryption removed": _set("security.encryption", None),
    "security.signature_key_id": _other_trusted_key,
    "security.signature_algorithm": _other_algorithm,
    "security.signature_scope": _set("security.signature_scope", None),
    "metadata.namespace": _set("metadata.namespace", "payments"),
    "metadata.topic": _set("metadata.topic", "payments.created"),
    "metadata.message_id": _set("metadata.message_id", "01890a5d-ac96-774b-bcce-b302099a8059"),
    "metadata.published_at_ms": _set("metadata.published_at_ms", 1697200001000),
    "metadata.priority": _set("metadata.priority", 9),
    "metadata.ttl_seconds": _set("metadata.ttl_seconds", 99999),
    "metadata.correlation_id": _set("metadata.correlation_id", "corr-2"),
    "metadata.causality_parent": _set("metadata.causality_parent", "parent-2"),
    "observability.trace_id": _set("observability.trace_id", "1" * 32),
    "observability.labels": _add_label,
    "schema.schema_version": _set("schema.schema_version", "v3"),
    "extensions": _add_extension,
    "payload": _set_payload,
}


def _reencode(data: bytes, layout: Layout, mutate: Callable[[Envelope], None] | None) -> bytes:
    env = decode(data)
    if mutate is not None:
        mutate(env)
    return encode(env, layout)


@SIGNERS
@LAYOUTS
@pytest.mark.parametrize("field", list(MUTATIONS))
def test_v2_changing_any_covered_field_fails(key, layout, field):
    data = sign(rich_envelope(), key, layout)
    assert verify(_reencode(data, layout, None), KEYS).key_id == key.key_id  # control: re-encoding alone is fine
    tampered = _reencode(data, layout, MUTATIONS[field])
    assert tampered != data
    with pytest.raises((SignatureError, UnknownKeyError)):
        verify(tampered, KEYS)
    with pytest.raises((SignatureError, UnknownKeyError)):  # a verifier that accepts legacy is not fooled either
        verify(tampered, LEGACY_OK)
    assert spec_signing.verify(tampered, SPEC_KEYS, accept_legacy_scope=True) != "valid"


@SIGNERS
@LAYOUTS
def test_v2_auth_token_is_outside_the_scope(key, layout):
    """The worker strips the token after the producer signed: the signature must still hold."""
    data = sign(rich_envelope(), key, layout)
    stripped = _reencode(data, layout, _set("security.auth_token", None))
    assert stripped != data
    assert verify(stripped, KEYS).key_id == key.key_id
    assert verify(_reencode(data, layout, _set("security.auth_token", "other")), KEYS).key_id == key.key_id


@SIGNERS
@LAYOUTS
def test_the_issue_13_attack_on_the_legacy_scope(key, layout):
    """The measured problem: restricted + PII, signed, rewritten to public / no PII. Scope v2
    rejects it; the legacy scope accepts it (the downgrade risk `accept_legacy_scope` takes)."""
    env = rich_envelope()
    attack = MUTATIONS["security.data_classification"], MUTATIONS["security.contains_pii"]

    def rewrite(e: Envelope) -> None:
        for m in attack:
            m(e)

    v2 = _reencode(sign(env.copy(), key, layout), layout, rewrite)
    with pytest.raises(SignatureError, match="forged or tampered"):
        verify_and_decode(v2, KEYS)
    legacy = _reencode(sign(env.copy(), key, layout, scope=SCOPE_LEGACY), layout, rewrite)
    with pytest.raises(LegacySignatureScopeError):
        verify_and_decode(legacy, KEYS)
    got, info = verify_and_decode(legacy, LEGACY_OK)  # what accepting the legacy scope means
    assert info.scope == SCOPE_LEGACY
    assert got.security.data_classification == "public" and not got.security.contains_pii


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(env=envelopes(), field=st.sampled_from(sorted(MUTATIONS)), layout=st.sampled_from(list(Layout)),
       key=st.sampled_from([HMAC_KEY, ED_KEY]))
def test_v2_any_envelope_any_covered_change_fails(env, field, layout, key):
    sec = env.ensure_security()
    sec.publisher_id = sec.publisher_id or "svc"
    sec.data_classification = sec.data_classification or "confidential"
    data = sign(env, key, layout)
    try:  # the control: some envelopes do not survive decode + encode byte for byte (empty draft payload)
        verify(_reencode(data, layout, None), KEYS)
    except SignatureError:
        assume(False)
    tampered = _reencode(data, layout, MUTATIONS[field])
    assume(tampered != _reencode(data, layout, None))  # the mutation changed something (a value may already match)
    with pytest.raises((SignatureError, UnknownKeyError)):
        verify(tampered, KEYS)


# --------------------------------------------------------------------------- ambiguous record layouts


def _record(field: int, value: bytes) -> bytes:
    return encode_varint(field << 3 | 2) + encode_varint(len(value)) + value


def _security_value(data: bytes, layout: Layout) -> bytes:
    rec = next(r for r in iter_records(data) if r.field == layout.security_field)
    return data[rec.value_start:rec.end]


@SIGNERS
@LAYOUTS
def test_second_security_record_is_rejected(key, layout):
    data = sign(rich_envelope(), key, layout)
    # public, no PII, appended: protobuf merges it over the signed context
    extra = _record(layout.security_field, _record(8, b"public") + bytes([0x38, 0x00]))
    assert decode(data + extra).security.data_classification == "public"  # what a merging reader would see
    for bad in (data + extra, extra + data):
        with pytest.raises(AmbiguousEnvelopeError, match=r"security \(field \d\) appears more than once") as exc_info:
            verify(bad, LEGACY_OK)
        assert exc_info.value.code == "ambiguous_envelope"
        with pytest.raises(AmbiguousEnvelopeError):
            verify_and_decode(bad, KEYS)
        with pytest.raises(AmbiguousEnvelopeError):
            check_unambiguous(bad)
        assert spec_signing.verify(bad, SPEC_KEYS) == "ambiguous_envelope"


@SIGNERS
@LAYOUTS
def test_duplicated_metadata_and_payload_records_are_rejected(key, layout):
    data = sign(rich_envelope(), key, layout)
    md_field = 2 if layout is Layout.DRAFT else 1
    md = next(r for r in iter_records(data) if r.field == md_field)
    pl = next(r for r in iter_records(data) if r.field == layout.payload_field)
    for bad in (data + data[md.start:md.end], data + _record(md_field, _record(3, b"payments")),
                data + data[pl.start:pl.end]):
        with pytest.raises(AmbiguousEnvelopeError, match="appears more than once"):
            verify(bad, KEYS)
        assert spec_signing.verify(bad, SPEC_KEYS) == "ambiguous_envelope"


@SIGNERS
@LAYOUTS
def test_repeated_or_mistyped_security_fields_are_rejected(key, layout):
    data = sign(rich_envelope(), key, layout)
    sec = next(r for r in iter_records(data) if r.field == layout.security_field)
    value = data[sec.value_start:sec.end]
    sig = decode(data).security.signature
    for inner in (value + _record(8, b"public"),            # classification twice (last one wins in protobuf)
                  _record(4, b"\x00" * len(sig)) + value,    # a second signature before the real one
                  value + bytes([0x50, 0x00]),               # scope twice (legacy appended)
                  value + bytes([0x40, 0x01]),               # data_classification (LEN) as a varint
                  value + _record(7, b"\x00"),               # contains_pii (varint) as a LEN record
                  value + _record(11, bytes(32)) * 2,        # sibling_digest twice
                  value + bytes([0x58, 0x01])):              # sibling_digest (LEN) as a varint
        bad = data[:sec.start] + _record(layout.security_field, inner) + data[sec.end:]
        with pytest.raises(AmbiguousEnvelopeError, match=r"security\."):
            verify(bad, KEYS)
        with pytest.raises(AmbiguousEnvelopeError):  # unsigned readers run the same check
            check_unambiguous(bad)
        assert spec_signing.verify(bad, SPEC_KEYS) == "ambiguous_envelope"


def test_unknown_security_fields_are_covered_not_rejected():
    """A newer producer's extra security field (reviewed layout: the model keeps unknown
    fields) is signed like any other byte, not rejected and not skipped."""
    env = rich_envelope()
    env.header.security.MergeFromString(_record(15, b"future"))
    data = sign(env, HMAC_KEY)
    assert b"future" in data
    assert verify(data, KEYS).key_id == "kat-hmac"
    sec = next(r for r in iter_records(data) if r.field == 2)
    value = data[sec.value_start:sec.end].replace(b"future", b"futurE")
    with pytest.raises(SignatureError, match="forged or tampered"):
        verify(data[:sec.start] + _record(2, value) + data[sec.end:], KEYS)


def test_unknown_scope_is_refused_never_guessed():
    data = sign(fixed_envelope(), HMAC_KEY)
    sec = next(r for r in iter_records(data) if r.field == 2)
    value = data[sec.value_start:sec.end]
    assert value.endswith(bytes([0x50, 0x02]))
    for raw_scope in (bytes([0x50, 0x01]), bytes([0x50, 0x07]), bytes([0x50, 0x82, 0x80, 0x80, 0x80, 0x10])):
        # (the last is 2**32 + 2, which must not wrap to 2 through the int32 enum)
        bad = data[:sec.start] + _record(2, value[:-2] + raw_scope) + data[sec.end:]
        with pytest.raises(SignatureScopeError, match="not supported") as exc_info:
            verify(bad, LEGACY_OK)
        assert exc_info.value.code == "unsupported_signature_scope"
        assert spec_signing.verify(bad, SPEC_KEYS, accept_legacy_scope=True) == "unsupported_signature_scope"
    with pytest.raises(SignatureScopeError):
        sign(fixed_envelope(), HMAC_KEY, scope=1)


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


def test_token_stripped_by_reencoding_keeps_the_signature():
    """Token stripping happens after the producer signed; scope v2 leaves the token out."""
    env = fixed_envelope()
    env.ensure_security().auth_token = "tok"
    data = sign(env, HMAC_KEY)
    env2 = decode(data)
    env2.security.ClearField("auth_token")
    head, _, payload = encode_parts(env2)
    assert verify(b"".join([head, security_record(env2), *payload]), KEYS).key_id == "kat-hmac"


def _prism_verdict(data: bytes, keys: VerificationKeys) -> PrismError | None:
    try:
        verify(data, keys)
    except PrismError as exc:
        return exc
    return None


@settings(max_examples=150, deadline=None)
@given(env=envelopes(), layout=st.sampled_from(list(Layout)), key=st.sampled_from([HMAC_KEY, ED_KEY]),
       scope=st.sampled_from([SCOPE_V2, SCOPE_LEGACY, SCOPE_PAIR]), edit=st.data())
def test_spec_and_verifier_agree_on_edited_bytes(env, layout, key, scope, edit):
    """Random edits of signed bytes (flip, insert, delete, append a copy of a record): what
    Prism's verifier accepts, the independent spec implementation accepts, and the reverse,
    except for bytes that are not a valid envelope (Prism parses the security context with
    its schema, nested messages and UTF-8 included; the spec's byte walk need not)."""
    data = bytearray(sign(env, key, layout, scope=scope))
    kind = edit.draw(st.sampled_from(["flip", "insert", "delete", "append-record"]))
    if kind == "append-record":
        recs = list(iter_records(bytes(data)))
        r = recs[edit.draw(st.integers(0, len(recs) - 1))]
        data += data[r.start:r.end]
    else:
        i = edit.draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[i] ^= edit.draw(st.integers(1, 255))
        elif kind == "insert":
            data[i:i] = bytes([edit.draw(st.integers(0, 255))])
        else:
            del data[i]
    for accept in (False, True):
        keys = LEGACY_OK if accept else KEYS
        spec = spec_signing.verify(bytes(data), SPEC_KEYS, accept_legacy_scope=accept)
        prism = _prism_verdict(bytes(data), keys)
        if prism is None:
            assert spec == "valid", (kind, accept, spec)
        elif spec == "valid":
            # only a malformed envelope may pass the byte walk and fail Prism: decoding fails too
            assert isinstance(prism, DecodeError) and not isinstance(prism, SignatureError), (kind, accept, prism)
            with pytest.raises(DecodeError):
                decode(bytes(data))


def _sign_each(env: Envelope, key: SigningKey, layouts: list[Layout], scope: int) -> list[bytes]:
    return [sign(env, key, layout, scope=scope) for layout in layouts]


@settings(max_examples=120, deadline=None)
@given(env=envelopes(), key=st.sampled_from([HMAC_KEY, ED_KEY]),
       scope=st.sampled_from([SCOPE_V2, SCOPE_LEGACY, SCOPE_PAIR]), layouts=st.lists(st.sampled_from(list(Layout)), min_size=1, max_size=3), token=st.booleans())
def test_sign_layouts_is_sign_per_layout_byte_for_byte(env, key, scope, layouts, token):
    """The publisher's one-pass signer skips work, never changes a byte: same outputs and the
    same `env.security` afterwards as calling `sign` once per layout, tokens and unknown
    security fields included (the cases where it must fall back to re-framing)."""
    if token:
        env.ensure_security().auth_token = "tok"
    # The same object both times: map entries (`extensions`) of a decoded copy may serialize
    # in another order, and both signers leave `env` in a state they both start from.
    expected = _sign_each(env, key, layouts, scope)
    after_sign = env.header.__deepcopy__()
    fast = sign_layouts(env, key, layouts, scope=scope)
    assert fast == expected
    assert env.header == after_sign
    for data, layout in zip(fast, layouts, strict=True):
        assert verify(data, LEGACY_OK, layout=layout).key_id == key.key_id


@SIGNERS
def test_sign_layouts_with_a_mistyped_signature_record_from_the_input(key):
    """An input whose security context holds field 4 as a varint keeps it as an unknown
    field (upb cannot store it as `signature`); scope v2 cuts every field-4 record, so the
    one-pass signer must re-frame exactly like `sign` does rather than sign the record as is."""
    env = rich_envelope()
    env.header.security.ClearField("auth_token")  # (a token alone would take the re-framing path)
    env.header.security.MergeFromString(bytes([0x20, 0x05]) + _record(15, b"future"))
    layouts = [Layout.DRAFT, Layout.REVIEWED]
    expected = _sign_each(env, key, layouts, SCOPE_V2)
    assert sign_layouts(env, key, layouts) == expected


@pytest.mark.parametrize("layout", list(Layout))
def test_verify_and_decode_applies_the_message_size_limit_like_decode(layout):
    """A consumer that decodes and verifies in one call gets the same size refusal as `decode`
    (conformance/negative, "limits/message"), before any record is read."""
    data = sign(rich_envelope(), HMAC_KEY, layout)
    tight = Limits(max_message_bytes=len(data) - 1)
    for call in (lambda: decode(data, limits=tight), lambda: verify_and_decode(data, KEYS, limits=tight)):
        with pytest.raises(SizeLimitError):
            call()
    assert verify_and_decode(data, KEYS, limits=Limits(max_message_bytes=len(data)))[1].key_id == HMAC_KEY.key_id


@settings(max_examples=40, deadline=None)
@given(secret=st.binary(max_size=31))
def test_a_short_hmac_verification_key_is_refused_where_it_is_built(secret: bytes) -> None:
    """Anyone can compute HMAC under an empty or short secret (an unset environment variable):
    a `VerificationKey` built directly with one verified such forged signatures. It is now the
    same typed error `SigningKey.hmac_sha256` raises, when the key is built, as the Go and Rust
    clients refuse it; the forged envelope never verifies."""
    forger = SigningKey.__new__(SigningKey)  # a signing key the constructor would refuse
    object.__setattr__(forger, "key_id", "k")
    object.__setattr__(forger, "algorithm", "hmac-sha256")
    object.__setattr__(forger, "secret", secret)
    object.__setattr__(forger, "private_key", None)
    forged = sign(fixed_envelope(), forger)
    with pytest.raises(AlgorithmError, match=f"'k' is {len(secret)} bytes; at least 32 required"):
        VerificationKey("k", "hmac-sha256", secret=secret)
    with pytest.raises(AlgorithmError, match="at least 32"):
        VerificationKeys.of([forger])
    good = VerificationKey("k", "hmac-sha256", secret=b"s" * 32)
    object.__setattr__(good, "secret", secret)  # swapped after it was built
    with pytest.raises(AlgorithmError, match="at least 32"):
        VerificationKeys().add(good)
    with pytest.raises(SignatureError):
        verify(forged, VerificationKeys.of([SigningKey.hmac_sha256("k", b"s" * 32)]))


def test_an_hmac_verification_key_without_a_secret_is_refused() -> None:
    with pytest.raises(AlgorithmError, match="'k' is 0 bytes"):
        VerificationKey("k", "hmac-sha256")


def test_verify_and_decode_applies_the_header_limit_while_walking() -> None:
    """16 MiB of three-byte records ending in a truncated one: refused for the header's size
    once the walk passes 256 KiB (it walked all 5.6M records first and answered `LengthError`)."""
    data = b"\x90\x03\x00" * (16 * 1024 * 1024 // 3 - 2) + b"\x92\x03\x05"
    with pytest.raises(SizeLimitError, match=r"header is over the 262144-byte limit \(\d+ bytes by byte 2621\d\d\)"):
        verify_and_decode(data, KEYS)


@pytest.mark.parametrize("text", ["just text", "[1, 2]", "keys: none"])
def test_a_keyring_that_is_not_one_says_how_to_fix_it(tmp_path: pathlib.Path, text: str) -> None:
    """`keyring: /etc/hostname` in a topology: the error named the file but no fix."""
    from app.security.signing import load_signing_keyring

    path = tmp_path / "ring.yaml"
    path.write_text(text)
    with pytest.raises(PrismError, match="must be a mapping with a `keys` list") as exc:
        load_signing_keyring(path)
    assert "; fix: " in str(exc.value) and "prism keys init" in str(exc.value)


# --------------------------------------------------------------------------- bounded walks
# `signed_message`, `check_unambiguous` and `verify` (without a caller's walk) walked the
# producer's bytes with the unbounded `wire.scan`: 16 MiB of tiny records became ~5.6M tuples
# (~170 MB compiled, ~650 MB and 5-7 s in Python), and one 16 MiB security record of tiny inner
# records ~1.8 GB and 5-8 s, before any limit was read. They now walk as `decode` does
# (`codec.scan_records`: the header limit applied while walking).

_MIB16 = 16 * 1024 * 1024


def _security_flood() -> bytes:
    """One reviewed security record of 16 MiB of two-byte unknown inner records."""
    inner = b"\x78\x00" * (_MIB16 // 2 - 8)
    return b"\x12" + encode_varint(len(inner)) + inner


_WALKERS: dict[str, Callable[..., object]] = {
    "signed_message": lambda data, **kw: signed_message(data, **kw),
    "check_unambiguous": lambda data, **kw: check_unambiguous(data, **kw),
    "verify": lambda data, **kw: verify(data, KEYS, **kw),
}


@pytest.mark.parametrize("name", sorted(_WALKERS))
@pytest.mark.parametrize(("what", "data", "by_byte"), [
    ("tiny records", b"\x90\x03\x00" * (_MIB16 // 3 - 2) + b"\x92\x03\x05", r"2621\d\d"),
    ("one security record of tiny records", _security_flood(), str(_MIB16 - 11)),
], ids=["tiny-records", "security-record-flood"])
def test_the_signature_walks_apply_the_header_limit_while_walking(name: str, what: str, data: bytes,
                                                                  by_byte: str) -> None:
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(SizeLimitError, match=rf"header is over the 262144-byte limit \(\d+ bytes by byte {by_byte}\)"):
            _WALKERS[name](data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 * 1024 * 1024, f"{what}: {peak / 1e6:.0f} MB"
    with pytest.raises(SizeLimitError):  # the caller's limits are the ones applied
        _WALKERS[name](sign(fixed_envelope(), HMAC_KEY), limits=Limits(max_header_bytes=16))


def _unbounded(view: memoryview, layout: object, limits: Limits) -> list[tuple[int, int, int, int, int]]:
    """The walk these functions made before they were bounded: every record, no limit."""
    from app.envelope.wire import scan

    return scan(view)


def _answer(fn: Callable[[], object]) -> object:
    """What a call answers, comparable: its value, or its error's type and message."""
    try:
        out = fn()
    except PrismError as exc:
        return type(exc), str(exc)
    return out.joined() if hasattr(out, "joined") else out


@st.composite
def _floods(draw: st.DrawFn) -> bytes:
    """Bytes an attacker could send: random, a signed envelope, either one followed or preceded
    by a run of small records (unknown varints, empty payload records of either layout, empty
    security records), possibly wrapped whole in one security record of the reviewed layout."""
    base = draw(st.one_of(st.binary(max_size=64),
                          st.builds(lambda lay, k: sign(fixed_envelope(), k, lay),
                                    st.sampled_from(list(Layout)), st.sampled_from([HMAC_KEY, ED_KEY]))))
    run = draw(st.sampled_from([b"\x90\x03\x00", b"\x9a\x06\x00", b"\x1a\x00", b"\x78\x00", b"\x12\x00", b"\x22\x00"]))
    body = run * draw(st.integers(0, 3000))
    data = draw(st.sampled_from([base + body, body + base, base]))
    if draw(st.booleans()):
        data = b"\x12" + encode_varint(len(data)) + data
    return data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_floods(), max_header=st.integers(0, 96), name=st.sampled_from(sorted(_WALKERS)),
       layout=st.sampled_from([None, *Layout]))
def test_for_any_bytes_the_walks_are_bounded_and_agree_with_the_unbounded_ones(
        data: bytes, max_header: int, name: str, layout: Layout | None) -> None:
    """For any bytes: a value or a `PrismError`; never more records walked than the header limit
    allows (a record is at least two bytes of header, so at most `max_header // 2 + 1` of them,
    and as many again inside a security record - whatever the input's length: up to ~9 KB here,
    ~3000 records, which the unbounded walk went through); and the answer of the walk before it
    was bounded unless that is `SizeLimitError`."""
    from app.envelope import codec, wire
    from app.security import signing

    limits = Limits(max_header_bytes=max_header)
    walked: list[int] = []

    def counted(fn: Callable[..., object], pick: Callable[[object], object] = lambda r: r) -> Callable[..., object]:
        def run(*args: object, **kw: object) -> object:
            out = fn(*args, **kw)
            walked.append(len(pick(out)))  # type: ignore[arg-type]
            return out
        return run

    with pytest.MonkeyPatch.context() as mp:
        for mod in (wire, codec, signing):
            mp.setattr(mod, "scan", counted(mod.scan))
        mp.setattr(wire, "_walk", counted(wire._walk))
        mp.setattr(signing, "_security_record", counted(signing._security_record, lambda r: r[1]))
        bounded = _answer(lambda: _WALKERS[name](data, layout=layout, limits=limits))
    assert max(walked, default=0) <= max_header // 2 + 1, (len(data), walked[:10])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(signing, "scan_records", _unbounded)
        before = _answer(lambda: _WALKERS[name](data, layout=layout, limits=limits))
    if not (isinstance(bounded, tuple) and bounded[0] is SizeLimitError):
        assert bounded == before


@settings(max_examples=40, deadline=None)
@given(env=envelopes(), layout=st.sampled_from(list(Layout)), key=st.sampled_from([HMAC_KEY, ED_KEY]),
       scope=st.sampled_from([SCOPE_V2, SCOPE_LEGACY]))
def test_for_valid_envelopes_the_bounded_walks_answer_as_before(env: Envelope, layout: Layout, key: SigningKey,
                                                                 scope: int) -> None:
    from app.security import signing

    data = sign(env, key, layout, scope=scope)
    keys = LEGACY_OK if scope == SCOPE_LEGACY else KEYS
    calls = [lambda: signed_message(data), lambda: check_unambiguous(data), lambda: verify(data, keys),
             lambda: signed_message(data, layout=layout), lambda: verify(data, keys, layout=layout)]
    now = [_answer(c) for c in calls]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(signing, "scan_records", _unbounded)
        assert [_answer(c) for c in calls] == now
    assert now[2] == verify(data, keys, records=iter_records_tuples(data))  # the worker's pre-walked form


def iter_records_tuples(data: bytes) -> list[tuple[int, int, int, int, int]]:
    return [tuple(r) for r in iter_records(data)]  # type: ignore[misc]
