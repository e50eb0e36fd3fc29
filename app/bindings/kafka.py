"""Kafka binding (RFC-031 "Kafka: Envelope as Message Value + Headers").

A Prism record on Kafka is:

* value - the envelope bytes in one layout: draft for `<topic>.v2`, reviewed for `<topic>.v3`
  (`layout_for_topic`);
* headers - copies of the metadata for tools that never parse protobuf (console consumer,
  Connect SMTs, ksqlDB filters), plus W3C `traceparent`/`tracestate` so tracing
  instrumentation joins the trace without knowing Prism:

  | header                   | value                                          | when            |
  |--------------------------|------------------------------------------------|-----------------|
  | `prism-envelope-version` | `1`                                            | draft layout    |
  | `prism-envelope-layout`  | `draft` / `reviewed`                           | always          |
  | `prism-message-id`       | metadata.message_id                            | always          |
  | `prism-topic`            | metadata.topic                                 | always          |
  | `prism-namespace`        | metadata.namespace                             | always          |
  | `prism-trace-id`         | observability.trace_id                         | when set        |
  | `prism-content-type`     | metadata content type (MIME)                   | when set        |
  | `traceparent`            | `00-<trace_id>-<span_id>-<flags:02x>`          | valid trace ids |
  | `tracestate`             | extensions[`w3c.tracestate`]                   | when valid      |

  Values are UTF-8 bytes.
* key - the partition key. Re-publishing keeps the input record's key (pass it as `key`),
  because per-key ordering and compaction are what Kafka users built on that key. A new
  message without a key gets its `correlation_id` (related messages stay ordered on one
  partition), else no key (the producer's sticky partitioner spreads load); `message_id` is
  available as a fallback but is rarely useful: a unique key orders nothing.
* timestamp - `published_at_ms` (CreateTime), so time-based retention and lookups follow the
  publish time, not the time Prism re-published the message.

Pure functions: no client, no I/O. The live producers/consumers call these.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..envelope.codec import DEFAULT_LIMITS, Layout, Limits
from ..envelope.codec import encode as encode_envelope
from ..envelope.model import Envelope
from ..errors import BindingError
from ..security.signing import (
    DEFAULT_SCOPE,
    PreparedMessage,
    SigningKey,
    VerificationKeys,
    finish_batch,
    prepare_batch,
    sign_layouts,
)
from . import _common as c
from .tracecontext import traceparent_of, tracestate_of

PREFIX = "prism-"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_WIRE_NAMES = {name: PREFIX + name for name in
               (c.ENVELOPE_VERSION, c.ENVELOPE_LAYOUT, *(f.name for f in c.FIELDS))}
_LOGICAL = {wire: logical for logical, wire in _WIRE_NAMES.items()}


class KeyFallback(enum.StrEnum):
    """Which envelope field becomes the record key when the caller passes none."""

    CORRELATION_ID = "correlation_id"
    MESSAGE_ID = "message_id"
    NONE = "none"


@dataclass(slots=True)
class KafkaRecord:
    """What to hand to a Kafka producer (`send(topic, value, key, headers, timestamp_ms)`).

    Not frozen: a frozen dataclass sets each field through `object.__setattr__` (0.72 against
    0.32 µs per record here), the worker builds two records per message, and a batch-scope
    signature fills the value of records built before it (`finish_batch_records`)."""

    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp_ms: int | None = None

    def header(self, name: str) -> bytes | None:
        """First value of header `name` (exact name), or None."""
        for n, v in self.headers:
            if n == name:
                return v
        return None


class RecordLike(Protocol):
    """Anything with a value and headers: `KafkaRecord`, aiokafka's `ConsumerRecord`, ..."""

    @property
    def value(self) -> bytes | None: ...

    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]] | None: ...


def layout_for_topic(topic: str) -> Layout:
    """The layout a migration topic carries: `<topic>.v2` draft, `<topic>.v3` reviewed."""
    if topic.endswith(".v2"):
        return Layout.DRAFT
    if topic.endswith(".v3"):
        return Layout.REVIEWED
    raise BindingError(f"topic {topic!r} is neither a .v2 nor a .v3 migration topic", path="topic",
                       hint="pass the layout explicitly for other topics")


def partition_key(env: Envelope, key: bytes | None = None,
                  fallback: KeyFallback = KeyFallback.CORRELATION_ID) -> bytes | None:
    """The record key: `key` when given, else the `fallback` field of the envelope (module docs)."""
    if key is not None:
        return key
    md = env.header.metadata
    if fallback is KeyFallback.CORRELATION_ID and md.correlation_id:
        return md.correlation_id.encode()
    if fallback is KeyFallback.MESSAGE_ID and md.message_id:
        return md.message_id.encode()
    return None


def is_owned(name: str) -> bool:
    """Headers this binding writes and checks; callers may not set them to other values."""
    return name.lower().startswith(PREFIX)


def passthrough_headers(headers: Iterable[tuple[str, bytes | None]] | None) -> list[tuple[str, bytes | None]]:
    """An input record's headers minus the ones `encode` regenerates (`prism-*`, `traceparent`,
    `tracestate`): what to forward when re-publishing, so stale copies never clash."""
    out = []
    for n, v in headers or ():
        low = n.lower()
        if not low.startswith(PREFIX) and low not in _REGENERATED:
            out.append((n, v))
    return out


#: `passthrough_headers` drops these besides `prism-*` (built once, not per record).
_REGENERATED = frozenset({TRACEPARENT, TRACESTATE})
#: The layout-only part of `headers_for` (version, layout), the same for every record of a layout.
_LAYOUT_HEADERS: dict[Layout, tuple[tuple[str, bytes], ...]] = {
    lay: tuple((_WIRE_NAMES[name], value.encode()) for name, value in c.layout_values(lay)) for lay in Layout}
_FIELD_WIRE = tuple(_WIRE_NAMES[f.name] for f in c.FIELDS)


def _envelope_headers(env: Envelope) -> list[tuple[str, bytes]]:
    """The part of `headers_for` that depends on the envelope only, not on the layout: the
    metadata copies and the W3C trace headers. Computed once when one envelope is written in
    several layouts (`encode_layouts`)."""
    out = []
    for wire, value in zip(_FIELD_WIRE, c.field_values(env), strict=True):
        if value:
            out.append((wire, value.encode()))
    # traceparent_of() is None without an observability context: skip the call then.
    tp = traceparent_of(env) if env.header.HasField("observability") else None
    if tp is not None:
        out.append((TRACEPARENT, tp.encode()))
        _append_tracestate(env, out)
    return out


def _append_tracestate(env: Envelope, out: list[tuple[str, bytes]]) -> None:
    """The `tracestate` header after `traceparent`, when the envelope carries a valid one."""
    ts = tracestate_of(env)
    if ts is not None:
        out.append((TRACESTATE, ts.encode()))


def headers_for(env: Envelope, layout: Layout) -> list[tuple[str, bytes]]:
    """The binding's own headers for `env` (see the module table)."""
    return [*_LAYOUT_HEADERS[layout], *_envelope_headers(env)]


def encode(
    env: Envelope,
    layout: Layout = Layout.REVIEWED,
    *,
    key: bytes | None = None,
    key_fallback: KeyFallback = KeyFallback.CORRELATION_ID,
    headers: Iterable[tuple[str, bytes]] = (),
    sign_with: SigningKey | None = None,
    scope: int = DEFAULT_SCOPE,
) -> KafkaRecord:
    """Build the Kafka record for `env`.

    `headers` (e.g. forwarded with `passthrough_headers`, or DLQ context headers) come first
    and are never overwritten; a `prism-*` one that disagrees with the envelope raises
    `BindingError`. With `sign_with`, the value is signed (`app.security.signing.sign`, which
    also records the key id, algorithm and `scope` in `env.security`; scope v2 by default).
    """
    return encode_layouts(env, (layout,), key=key, key_fallback=key_fallback, headers=headers,
                          sign_with=sign_with, scope=scope)[0]


def encode_layouts(
    env: Envelope,
    layouts: Sequence[Layout],
    *,
    key: bytes | None = None,
    key_fallback: KeyFallback = KeyFallback.CORRELATION_ID,
    headers: Iterable[tuple[str, bytes]] = (),
    sign_with: SigningKey | None = None,
    scope: int = DEFAULT_SCOPE,
) -> list[KafkaRecord]:
    """`[encode(env, layout, ...) for layout in layouts]`, record for record the same.

    The worker writes every message in two layouts; what does not depend on the layout (the
    metadata and trace headers, the key, the timestamp) is worked out once. Signing only
    touches `env.security`, which none of those read, so computing them first is exact.
    """
    extra = list(headers)
    common = _envelope_headers(env)
    record_key = partition_key(env, key, key_fallback)
    ts = env.published_at_ms
    timestamp = ts if ts > 0 else None
    values = (sign_layouts(env, sign_with, layouts, scope=scope) if sign_with is not None
              else [encode_envelope(env, layout) for layout in layouts])
    return _records(layouts, values, common, extra, record_key, timestamp)


def _records(layouts: Sequence[Layout], values: Sequence[bytes], common: list[tuple[str, bytes]],
             extra: list[tuple[str, bytes]], record_key: bytes | None, timestamp: int | None) -> list[KafkaRecord]:
    """One record per layout, `extra` merged with our headers (`c.merge_headers`).

    Our names are `prism-*` or `traceparent`/`tracestate` (`_REGENERATED`), so caller headers
    that are none of these - a live producer's forwarded ones (`passthrough_headers` drops the
    rest) - are checked once per message (`c.can_clash`) and simply go first in every layout:
    the merge, once per layout, was ~3 µs of a message with one producer header."""
    merge = bool(extra) and c.can_clash(extra, owned=is_owned, shared=_REGENERATED)
    out = []
    for layout, value in zip(layouts, values, strict=True):
        if merge:
            headers = c.merge_headers([*_LAYOUT_HEADERS[layout], *common], extra, owned=is_owned, binding="kafka")
        else:
            headers = [*extra, *_LAYOUT_HEADERS[layout], *common]
        out.append(KafkaRecord(key=record_key, value=value, headers=headers, timestamp_ms=timestamp))
    return out


@dataclass(slots=True)
class PendingRecords:
    """One message's records in several layouts, complete except for their values, which a
    batch-scope signature fills in (`prepare_batch_records`, then `finish_batch_records`).
    `records` hold empty values until then and are what `finish_batch_records` returns, values
    filled in, so headers appended to them meanwhile are kept."""

    prepared: PreparedMessage
    records: list[KafkaRecord]


def prepare_batch_records(
    env: Envelope,
    layouts: Sequence[Layout],
    sign_with: SigningKey,
    *,
    key: bytes | None = None,
    key_fallback: KeyFallback = KeyFallback.CORRELATION_ID,
    headers: Iterable[tuple[str, bytes]] = (),
) -> PendingRecords:
    """The per-message half of `encode_layouts` with a batch-scope signature: headers, key,
    timestamp and both copies' bytes and digests (`app.security.signing.prepare_batch`).
    Everything that can fail for this message alone (a header that disagrees with the
    envelope, an encoding error) fails here, before the batch is signed. On the compiled path
    the envelope headers come from `prepare_batch`'s compiled call, which reads them from the
    bytes it serializes anyway (`PreparedMessage.headers`; the same headers, tests/bindings/
    test_kafka_headers_native.py)."""
    extra = list(headers)
    record_key = partition_key(env, key, key_fallback)
    ts = env.published_at_ms
    prepared = prepare_batch(env, sign_with, layouts)  # only touches env.security: the headers read none of it
    common = prepared.headers
    if common is None:
        common = _envelope_headers(env)
    elif prepared.tracestate_pending:  # the compiled reader leaves the W3C grammar to tracestate_of
        common = [*common]
        _append_tracestate(env, common)
    records = _records(layouts, [b""] * len(layouts), common, extra, record_key, ts if ts > 0 else None)
    return PendingRecords(prepared, records)


def finish_batch_records(pending: Sequence[PendingRecords], sign_with: SigningKey) -> list[list[KafkaRecord]]:
    """Sign prepared messages with one batch-scope signature (`finish_batch`); per message,
    its records as `encode_layouts` would return them, values signed (filled into the pending
    records themselves, which are then complete: finish each batch once)."""
    values = finish_batch([p.prepared for p in pending], sign_with)
    out: list[list[KafkaRecord]] = []
    for p, vs in zip(pending, values, strict=True):
        for r, v in zip(p.records, vs, strict=True):
            r.value = v
        out.append(p.records)
    return out


def _text_headers(headers: Sequence[tuple[str, bytes | None]] | None) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for name, raw in headers or ():
        if name.lower() not in _LOGICAL:
            continue  # other prism-* headers are from newer producers: ignored, like unknown fields
        if raw is None:
            raise BindingError(f"kafka header {name} has a null value", path=name,
                               hint="prism headers always carry a value")
        try:
            out.append((name, bytes(raw).decode("utf-8")))
        except UnicodeDecodeError:
            raise BindingError(f"kafka header {name} is not valid UTF-8", path=name) from None
    return out


def decode(
    record: RecordLike,
    *,
    limits: Limits = DEFAULT_LIMITS,
    verify_with: VerificationKeys | None = None,
) -> Envelope:
    """Decode a Kafka record's value and check its `prism-*` headers against the envelope.

    The layout is taken from `prism-envelope-layout` (or implied by `prism-envelope-version`)
    and must match the bytes; otherwise it is detected. Any header copy that disagrees with
    the envelope raises `BindingError`. With `verify_with`, the signature is verified on the
    received bytes first (`SignatureError`/`UnknownKeyError` when it does not hold).
    Other failures are the codec's `EnvelopeError` subclasses.
    """
    value = record.value
    if value is None:
        raise BindingError("kafka record has no value (tombstone)", path="kafka value",
                           hint="tombstones carry no envelope; skip them before decoding")
    found = c.collect(_text_headers(record.headers), _LOGICAL, binding="kafka")
    return c.decode_checked(value, found, binding="kafka", spell=_WIRE_NAMES.__getitem__, limits=limits,
                            verify_with=verify_with)
