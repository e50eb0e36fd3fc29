"""The verify_signature stage and signature scopes (issue 13): v2 passes, a legacy-scope
signature is refused with its own reason unless the topology accepts it, a tampered
security context fails, and ambiguous envelopes are refused whether signed or not."""

from __future__ import annotations

import pytest

from app.agents.normalize import Normalize
from app.agents.verify_signature import VerifySignature
from app.envelope import Layout, decode, encode, new_envelope
from app.envelope.wire import encode_varint, iter_records
from app.errors import AmbiguousEnvelopeError, LegacySignatureScopeError, SignatureError
from app.security.signing import SCOPE_LEGACY, SCOPE_V2, sign
from app.topology import NormalizeStage, VerifySignatureStage
from tests.agents.conftest import make_msg

NS = {"orders.created": "order-events"}


def _stage(dev_keys, **kw) -> VerifySignature:
    return VerifySignature(VerifySignatureStage(keyring="x", **kw), keyring=dev_keys.keyring)


def _normalized(value: bytes):
    msg = make_msg(value)
    Normalize(NormalizeStage(), namespaces=NS, formats={"orders.created": "auto"}).process(msg)
    return msg


def _restricted():
    env = new_envelope("orders.created", {"order_id": "o-1"}, namespace="order-events",
                       data_classification="restricted", contains_pii=True)
    env.ensure_security().publisher_id = "svc-orders"
    return env


def _record(field: int, value: bytes) -> bytes:
    return encode_varint(field << 3 | 2) + encode_varint(len(value)) + value


def test_accept_legacy_scope_defaults_to_off() -> None:
    assert VerifySignatureStage(keyring="x").accept_legacy_scope is False


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("policy", ["required", "optional"])
def test_v2_passes_and_legacy_is_refused_with_its_own_reason(dev_keys, layout, policy) -> None:
    key = dev_keys.keyring.signing["dev-producer-1"]
    msg = _normalized(sign(_restricted(), key, layout))
    _stage(dev_keys, policy=policy).process(msg)
    assert msg.signature is not None and msg.signature.scope == SCOPE_V2

    legacy = sign(_restricted(), key, layout, scope=SCOPE_LEGACY)
    with pytest.raises(LegacySignatureScopeError, match="legacy scope") as exc_info:
        _stage(dev_keys, policy=policy).process(_normalized(legacy))
    assert exc_info.value.code == "legacy_signature_scope"  # the DLQ reason
    accepted = _normalized(legacy)
    _stage(dev_keys, policy=policy, accept_legacy_scope=True).process(accepted)
    assert accepted.signature is not None and accepted.signature.scope == SCOPE_LEGACY


@pytest.mark.parametrize("layout", list(Layout))
def test_security_context_tampering_fails_in_the_stage(dev_keys, layout) -> None:
    key = dev_keys.keyring.signing["dev-producer-1"]
    env = decode(sign(_restricted(), key, layout))
    env.security.data_classification, env.security.contains_pii = "public", False
    with pytest.raises(SignatureError, match="forged or tampered"):
        _stage(dev_keys, policy="optional", accept_legacy_scope=True).process(_normalized(encode(env, layout)))


@pytest.mark.parametrize("layout", list(Layout))
def test_an_appended_security_record_cannot_make_a_signed_envelope_look_unsigned(dev_keys, layout) -> None:
    """The merged parse would show an empty signature (policy optional lets unsigned pass);
    the stage checks the record layout first."""
    key = dev_keys.keyring.signing["dev-producer-1"]
    signed = sign(_restricted(), key, layout)
    if layout is Layout.REVIEWED:  # explicit empty signature (proto3 optional keeps presence)
        extra = _record(layout.security_field, _record(4, b"") + _record(8, b"public"))
        msg = _normalized(signed + extra)
        assert not msg.env.security.signature and msg.env.security.data_classification == "public"
    else:  # the draft's plain bytes field cannot be emptied by a merge; the copy still merges over
        extra = _record(layout.security_field, _record(8, b"public"))
        msg = _normalized(signed + extra)
        assert msg.env.security.data_classification == "public"
    with pytest.raises(AmbiguousEnvelopeError) as exc_info:
        _stage(dev_keys, policy="optional").process(msg)
    assert exc_info.value.code == "ambiguous_envelope"


def test_unsigned_ambiguous_envelope_is_refused_and_unsigned_clean_one_passes(dev_keys) -> None:
    data = encode(_restricted())
    md = next(r for r in iter_records(data) if r.field == 1)
    with pytest.raises(AmbiguousEnvelopeError, match="metadata"):
        _stage(dev_keys, policy="optional").process(_normalized(data + data[md.start:md.end]))
    msg = _normalized(data)
    _stage(dev_keys, policy="optional").process(msg)
    assert msg.signature is None
    _stage(dev_keys, policy="off").process(_normalized(data + data[md.start:md.end]))  # off means off
