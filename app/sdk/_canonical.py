"""Signatures that survive a backend which stores the envelope as JSON (PostgreSQL).

Every other backend carries the signed bytes themselves, and `app.security.signing.verify`
checks exactly what arrived. PostgreSQL stores a JSONB document instead, so a consumer must
re-encode the header to get bytes to verify - and the codec's ordinary encoding is not
reproducible: protobuf writes map entries (labels, baggage, extensions) in hash-table order,
which depends on insertion history (measured: 184 of 200 envelopes with labels re-encoded
differently after a JSONB round trip).

So envelopes bound for PostgreSQL are signed over the *deterministic* encoding (map entries
sorted by key), and the PostgreSQL reader re-encodes deterministically. The result is still
an ordinary scope-v2 signature in the ordinary layout: `head + security + payload`, verified
by the unchanged `signing.verify` (docs/signing.md).
"""

from __future__ import annotations

from .._gen.prism.envelope.v1 import envelope_pb2 as pb
from ..envelope.codec import Layout, security_record
from ..envelope.model import Envelope
from ..envelope.wire import LEN, encode_varint
from ..security.signing import DEFAULT_SCOPE, SigningKey, begin_signature, signature_over, signed_parts

_PAYLOAD_TAG = encode_varint((Layout.REVIEWED.payload_field << 3) | LEN)


def _head(env: Envelope) -> bytes:
    header = pb.PrismEnvelope()
    header.CopyFrom(env.header)
    header.ClearField("security")
    return header.SerializeToString(deterministic=True)


def _payload_record(env: Envelope) -> bytes:
    if not env.payload.present:
        return b""
    value = bytes(env.payload.wire())
    return _PAYLOAD_TAG + encode_varint(len(value)) + value


def canonical_wire(env: Envelope) -> bytes:
    """The reviewed-layout bytes of `env` with a reproducible header encoding."""
    return _head(env) + security_record(env, Layout.REVIEWED) + _payload_record(env)


def sign_canonical(env: Envelope, key: SigningKey, *, scope: int = DEFAULT_SCOPE) -> bytes:
    """Sign `env` over its deterministic encoding (recording algorithm, key id and scope in
    `env.security`, like `signing.sign`) and return the signed reviewed-layout bytes."""
    sec = begin_signature(env, key, scope)
    payload = _payload_record(env)
    parts = signed_parts(Layout.REVIEWED, scope, _head(env), security_record(env, Layout.REVIEWED),
                         [payload] if payload else [])
    sec.signature = signature_over(key, parts)
    return canonical_wire(env)
