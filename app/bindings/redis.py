"""Redis binding (RFC-031 "Redis: Envelope as Pub/Sub Message").

Pub/Sub (`PUBLISH <channel> <bytes>`) has no headers, so the message is the envelope bytes
alone: self-contained, everything a consumer needs is inside. The channel is the envelope's
topic by convention (`channel_for`).

Streams (`XADD <key> * field value ...`) do have fields, so the stream entry carries the
envelope plus copies of the metadata, which lets `XRANGE`/`XREAD` users and Lua scripts
filter without parsing protobuf:

  | field              | value                                | when          |
  |--------------------|--------------------------------------|---------------|
  | `envelope`         | envelope bytes                       | always        |
  | `envelope_version` | `1`                                  | draft layout  |
  | `layout`           | `draft` / `reviewed`                 | always        |
  | `message_id`       | metadata.message_id                  | always        |
  | `topic`            | metadata.topic                       | always        |
  | `namespace`        | metadata.namespace                   | always        |
  | `trace_id`         | observability.trace_id               | when set      |
  | `content_type`     | metadata content type (MIME)         | when set      |

All values are bytes (UTF-8 for text). Read streams with a client created with
`decode_responses=False`: the envelope is binary and a decoding client would corrupt it.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..envelope.codec import DEFAULT_LIMITS, Layout, Limits
from ..envelope.codec import decode as decode_envelope
from ..envelope.codec import encode as encode_envelope
from ..envelope.model import Envelope
from ..errors import BindingError
from ..security.signing import SigningKey, VerificationKeys, sign, verify
from . import _common as c

ENVELOPE_FIELD = "envelope"
_WIRE_NAMES = {
    c.ENVELOPE_VERSION: "envelope_version",
    c.ENVELOPE_LAYOUT: "layout",
    c.MESSAGE_ID: "message_id",
    c.TOPIC: "topic",
    c.NAMESPACE: "namespace",
    c.TRACE_ID: "trace_id",
    c.CONTENT_TYPE: "content_type",
}
_LOGICAL = {wire: logical for logical, wire in _WIRE_NAMES.items()}
#: The layout-only fields (version, layout) and the wire names of the per-envelope ones, in
#: emission order: `encode_stream_fields` runs for every SDK publish.
_LAYOUT_FIELDS = {lay: {_WIRE_NAMES[name]: value.encode() for name, value in c.layout_values(lay)} for lay in Layout}
_FIELD_WIRE = tuple(_WIRE_NAMES[f.name] for f in c.FIELDS)


def channel_for(env: Envelope) -> str:
    """The Pub/Sub channel (or stream key) for an envelope: its topic."""
    if not env.topic:
        raise BindingError("envelope has no topic to publish to", path="metadata.topic")
    return env.topic


def _bytes(env: Envelope, layout: Layout, sign_with: SigningKey | None) -> bytes:
    return sign(env, sign_with, layout) if sign_with is not None else encode_envelope(env, layout)


def encode_pubsub(env: Envelope, layout: Layout = Layout.REVIEWED, *, sign_with: SigningKey | None = None) -> bytes:
    """The PUBLISH message: the envelope bytes, nothing else."""
    return _bytes(env, layout, sign_with)


def decode_pubsub(
    data: bytes | bytearray | memoryview | str,
    *,
    layout: Layout | None = None,
    limits: Limits = DEFAULT_LIMITS,
    verify_with: VerificationKeys | None = None,
) -> Envelope:
    """Decode a Pub/Sub message (layout detected unless given)."""
    raw = _raw(data, "pubsub message")
    c.check_size(raw, limits)
    if verify_with is not None:
        verify(raw, verify_with, layout=layout, limits=limits)
    return decode_envelope(raw, layout=layout, limits=limits)


def encode_stream_fields(
    env: Envelope, layout: Layout = Layout.REVIEWED, *, sign_with: SigningKey | None = None
) -> dict[str, bytes]:
    """The field map for `XADD <key> * ...` (see the module table)."""
    fields = {ENVELOPE_FIELD: _bytes(env, layout, sign_with)}
    fields.update(_LAYOUT_FIELDS[layout])
    for wire, value in zip(_FIELD_WIRE, c.field_values(env), strict=True):
        if value:
            fields[wire] = value.encode()
    return fields


def decode_stream_fields(
    fields: Mapping[bytes, bytes] | Mapping[str, bytes] | Mapping[str, str],
    *,
    limits: Limits = DEFAULT_LIMITS,
    verify_with: VerificationKeys | None = None,
) -> Envelope:
    """Decode a stream entry's field map (as `XRANGE`/`XREAD` return it) and check the
    metadata copies against the envelope (`BindingError` on any disagreement)."""
    envelope: bytes | None = None
    pairs: list[tuple[str, str]] = []
    for k, v in fields.items():
        name = k.decode("utf-8", "replace") if isinstance(k, bytes | bytearray) else str(k)
        if name == ENVELOPE_FIELD:
            envelope = _raw(v, f"stream field {ENVELOPE_FIELD!r}")
        elif name in _LOGICAL:
            if isinstance(v, str):
                pairs.append((name, v))
                continue
            try:
                pairs.append((name, bytes(v).decode("utf-8")))
            except UnicodeDecodeError:
                raise BindingError(f"stream field {name!r} is not valid UTF-8", path=name) from None
    if envelope is None:
        raise BindingError(f"stream entry has no {ENVELOPE_FIELD!r} field", path=ENVELOPE_FIELD,
                           hint="the entry was not written by a Prism binding")
    found = c.collect(pairs, _LOGICAL, binding="redis")
    return c.decode_checked(envelope, found, binding="redis stream", spell=_WIRE_NAMES.__getitem__, limits=limits,
                            verify_with=verify_with)


def _raw(data: object, what: str) -> bytes | bytearray | memoryview:
    if isinstance(data, str):
        raise BindingError(f"{what} arrived as text, not bytes", path=what,
                           hint="create the Redis client with decode_responses=False; envelopes are binary")
    if not isinstance(data, bytes | bytearray | memoryview):
        raise BindingError(f"{what} is a {type(data).__name__}, expected bytes", path=what)
    return data
