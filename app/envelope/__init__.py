"""The Prism envelope: one model, two wire layouts, lazy payloads.

    from app.envelope import new_envelope, encode, decode, Layout

    env = new_envelope("orders.created", {"order_id": 42}, namespace="order-events")
    wire = encode(env, Layout.REVIEWED)     # what <topic>.v3 consumers read
    legacy = encode(env, Layout.DRAFT)      # what <topic>.v2 consumers read
    same = decode(legacy)                   # layout detected; payload stays a zero-copy view
"""

from .codec import DEFAULT_LIMITS, Layout, Limits, convert, decode, detect_layout, encode
from .model import (
    ContentEncoding,
    ContentType,
    EncryptionMetadata,
    EncryptionType,
    Envelope,
    ObservabilityContext,
    Payload,
    PrismMetadata,
    SchemaContext,
    SecurityContext,
    new_envelope,
)
from .validation import SanityPolicy, required_problems, sanity_problems, validate

__all__ = [
    "DEFAULT_LIMITS",
    "ContentEncoding",
    "ContentType",
    "EncryptionMetadata",
    "EncryptionType",
    "Envelope",
    "Layout",
    "Limits",
    "ObservabilityContext",
    "Payload",
    "PrismMetadata",
    "SanityPolicy",
    "SchemaContext",
    "SecurityContext",
    "convert",
    "decode",
    "detect_layout",
    "encode",
    "new_envelope",
    "required_problems",
    "sanity_problems",
    "validate",
]
