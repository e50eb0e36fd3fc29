"""Dead-letter records: the original message, minus secrets, plus why it failed.

Modelled on Kafka Connect's `errors.deadletterqueue.context.headers.enable` headers
(`__connect.errors.topic`, `.partition`, `.offset`, `.class.name`,
`.exception.class.name`, `.exception.message`, ...), under a `prism.errors.` prefix, plus
the stage, a stable reason code and the attempt count. Unlike Connect's DLQ, Prism's also
covers failures of the final writes (output topics, sinks).

Secrets are masked *in place with the same length*: the value stays a decodable envelope
(protobuf length prefixes still match) or valid JSON/text, just without the token. The
`prism.errors.*` headers are the worker's alone: ones the failed message already carried were
written by its producer and are dropped (`build_dlq_record` says why); `prism dlq replay`
removes the worker's before re-injecting a record.

A message whose identity was verified before it failed also gets a `prism-dlq-attestation`
header: that identity, signed by the worker and bound to this record's value and headers
(`app.security.attestation`). It replaces the masked token on replay. The token itself is
never in the DLQ.

A DLQ copy must itself be writable, or the message would be in neither place: `fit_dlq_record`
cuts a copy down to the DLQ topic's size limit (`app.worker.limits`). The `prism.errors.*`
headers and the reason always stay; the value is truncated and described by
`prism.errors.value.sha256` (of the whole DLQ value, the digest an attestation binds) and
`prism.errors.value.length`; the full value stays in the source topic at the recorded
topic/partition/offset for its retention - and, with `dlq.overflow` configured, for good in a
blob store, content-addressed by that digest and named by `prism.errors.value.ref`
(`app.worker.dlq_overflow`), so `prism dlq replay` can bring back the whole record after the
source topic has deleted it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from app.agents.base import Message
from app.errors import PrismError
from app.observability.redaction import jwt_spans
from app.security.attestation import HEADER as ATTESTATION_HEADER
from app.security.attestation import Attester

PREFIX = "prism.errors."
#: On a DLQ copy cut down to its topic's size limit (`fit_dlq_record`).
VALUE_TRUNCATED = PREFIX + "value.truncated"
VALUE_SHA256 = PREFIX + "value.sha256"
VALUE_LENGTH = PREFIX + "value.length"
HEADERS_TRUNCATED = PREFIX + "headers.truncated"
KEY_SHA256 = PREFIX + "key.sha256"
#: Where the whole value of a truncated copy is stored (`dlq.overflow`): a URL ending in its SHA-256.
VALUE_REF = PREFIX + "value.ref"
#: Stores a truncated copy's whole value under its SHA-256 (hex) and returns its reference, or
#: None when it could not be stored (the copy then keeps only the digest and the length).
Overflow = Callable[[str, bytes], str | None]
_BEARER = re.compile(rb"(?i)(bearer\s+)([A-Za-z0-9._~+/=-]{8,})")
_SECRET_HEADERS = frozenset({"authorization", "prism-auth-token", "x-auth-token", "auth-token", "ce_authtoken",
                             "proxy-authorization", "cookie"})


def mask_secrets(data: bytes, known: list[bytes] | tuple[bytes, ...] = ()) -> bytes:
    """Replace known secrets, JWTs and bearer credentials with '*' of the same length."""
    if not data:
        return data
    out = data
    for s in known:
        if s and s in out:
            out = out.replace(s, b"*" * len(s))
    spans = jwt_spans(out, strict=True)  # linear: `out` is an untrusted payload of up to megabytes
    if spans:
        masked = bytearray(out)
        for start, end in spans:
            masked[start:end] = b"*" * (end - start)
        out = bytes(masked)
    out = _BEARER.sub(lambda m: m.group(1) + b"*" * len(m.group(2)), out)
    return out


def scrub_headers(headers: list[tuple[str, bytes]], known: list[bytes]) -> list[tuple[str, bytes]]:
    return [(k, b"*" * len(v) if k.lower() in _SECRET_HEADERS else mask_secrets(v, known)) for k, v in headers]


@dataclass(frozen=True, slots=True)
class DlqRecord:
    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp_ms: int | None = None
    reason: str = ""


def build_dlq_record(msg: Message, *, stage: str, stage_class: str, error: BaseException,
                     dlq_topic: str, attester: Attester | None = None,
                     pii_values: list[str] | tuple[str, ...] = ()) -> DlqRecord:
    """The DLQ copy of `msg`: original key/value/headers/timestamp, secrets masked, and (with an
    `attester` and a verified identity) the attestation of that identity.

    `pii_values` (the payload's PII field values) are masked in the `prism.errors.*` context
    headers - an error message may quote them - but not in the value: the DLQ keeps the message
    intact, minus secrets, so it can be replayed; whoever reads a DLQ reads payloads anyway."""
    known = list(msg.secrets)
    if isinstance(error, PrismError):
        reason, text = error.code, str(error)
    else:  # a bug in a stage: still never crash, never drop
        reason, text = "internal_error", f"{type(error).__name__}: {error}"
    # `prism.errors.*` on the failed message are not this worker's: a producer wrote them (they
    # also pass through to the outputs, and so reach a sink's dead letters). Kept, they stood in
    # for the worker's own context - a forged reason, stage, error text and "fix" shown to the
    # operator, the true ones dropped - and a forged `prism.errors.value.ref` + `.value.sha256`
    # made `prism dlq replay` (and the console's Replay) read the file or S3 object the producer
    # named, on the operator's machine, and put it on the source topic. The DLQ copy is what a
    # replay sends, which strips them anyway; the source topic keeps the original.
    headers = scrub_headers(strip_error_headers(list(msg.headers)), known)
    value = mask_secrets(msg.value, known)
    if attester is not None and msg.identity is not None and msg.envelope is not None:
        # A replayed record that failed again: its old attestation is superseded by this one
        # (same identity, this record's coordinates). Without a new one the old is kept as evidence.
        headers = [(k, v) for k, v in headers if k != ATTESTATION_HEADER]
        headers.append(attester.header(msg.identity, message_id=msg.envelope.message_id, topic=msg.topic,
                                       partition=msg.partition, offset=msg.offset, key=msg.key, value=value,
                                       headers=headers))
    context = {
        "topic": msg.topic,
        "partition": str(msg.partition),
        "offset": str(msg.offset),
        "stage": stage,
        "class.name": stage_class,
        "exception.class.name": f"{type(error).__module__}.{type(error).__qualname__}",
        "exception.message": text[:2000],
        "reason": reason,
        "attempts": str(msg.attempts),
    }
    context_known = known + [f for v in pii_values for f in {v.encode(), repr(v)[1:-1].encode()}]
    for name, val in context.items():
        headers.append((PREFIX + name, mask_secrets(val.encode(), context_known)))
    return DlqRecord(dlq_topic, msg.key, value, headers, msg.timestamp_ms, reason)


def _size(key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]) -> int:
    return int(DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers))


def fit_dlq_record(rec: DlqRecord, limit: int, overflow: Overflow | None = None) -> DlqRecord:
    """`rec` as it can be written to a topic that accepts records of at most `limit` bytes
    (`app.worker.limits.record_size`): unchanged when it fits. Otherwise the value is cut to
    what fits and marked (`prism.errors.value.truncated`, `.value.sha256`, `.value.length`,
    and with an `overflow` store `.value.ref`: the whole value is stored there first, so the
    reference in the record never points at nothing); if
    the headers alone do not fit, the original headers' values are emptied (their digest in
    `prism.errors.headers.truncated`), and then the key replaced by its digest. The
    `prism.errors.*` context headers - the reason above all - always stay.

    Why here and not by retrying: a record over the limit is refused for good, and a DLQ write
    that can never succeed used to hold the batch, and every later batch's offsets, forever."""
    if _size(rec.key, rec.value, rec.headers) <= limit:
        return rec
    value = rec.value
    digest = hashlib.sha256(value).hexdigest()
    headers = [*rec.headers, (VALUE_TRUNCATED, b"true"), (VALUE_SHA256, digest.encode()),
               (VALUE_LENGTH, str(len(value)).encode())]
    ref = overflow(digest, value) if overflow is not None else None
    if ref is not None:
        headers.append((VALUE_REF, ref.encode()))
    key = rec.key
    if _size(key, b"", headers) > limit:
        original = [(k, v) for k, v in headers if not k.startswith(PREFIX)]
        digest = hashlib.sha256(b"".join(k.encode() + b"\0" + v + b"\0" for k, v in original)).hexdigest()
        headers = [(k, b"") for k, _ in original] + [(k, v) for k, v in headers if k.startswith(PREFIX)]
        headers.append((HEADERS_TRUNCATED, digest.encode()))
        if _size(key, b"", headers) > limit:
            headers = [(k, v) for k, v in headers if k.startswith(PREFIX)]
        if _size(key, b"", headers) > limit and key is not None:
            headers.append((KEY_SHA256, hashlib.sha256(key).hexdigest().encode()))
            key = None
    room = limit - _size(key, b"", headers) - 8  # the value's length varint grows with it
    cut = value[:max(0, room)]
    while cut and _size(key, cut, headers) > limit:
        cut = cut[:-max(1, len(cut) // 100)]
    return replace(rec, key=key, value=cut, headers=headers)


def strip_error_headers(headers: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """For replay: the record goes back to its source topic as it originally was."""
    return [(k, v) for k, v in headers if not k.startswith(PREFIX)]


def error_context(headers: list[tuple[str, bytes]]) -> dict[str, str]:
    return {k.removeprefix(PREFIX): v.decode(errors="replace") for k, v in headers if k.startswith(PREFIX)}
