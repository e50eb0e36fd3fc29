"""S3 / object-storage binding (RFC-031 "S3/Object Storage: Envelope as Blob Metadata").

One envelope is one object:

* key - `events/YYYY/MM/DD/<topic>/<message_id>.bin`, the date from `published_at_ms` in UTC
  (so a day's prefix lists exactly that day's messages, whenever they were archived). The
  topic and message id segments are percent-encoded where needed (`/`, space, non-ASCII,
  `.`/`..` segments), so a topic can never add or climb path segments;
* body - the envelope bytes in one layout;
* metadata - user metadata, as the `Metadata=` dict boto3 takes and `head_object` returns.
  S3 itself sends these as `x-amz-meta-<name>` HTTP headers: the client adds that prefix
  (and strips it on read), so the names here have none; `decode` accepts either form.

  | metadata key             | value                         | when          |
  |--------------------------|-------------------------------|---------------|
  | `prism-envelope-version` | `1`                           | draft layout  |
  | `prism-envelope-layout`  | `draft` / `reviewed`          | always        |
  | `prism-message-id`       | metadata.message_id           | always        |
  | `prism-topic`            | metadata.topic                | always        |
  | `prism-namespace`        | metadata.namespace            | always        |
  | `prism-trace-id`         | observability.trace_id        | when set      |
  | `prism-content-type`     | metadata content type (MIME)  | when set      |

  Values are percent-encoded UTF-8 (ordinary ids and topics are unchanged): S3 user metadata
  must be US-ASCII. S3 lowercases metadata names; `decode` matches names case-insensitively.
  User metadata is limited to 2 KB in total; `encode` checks it.
* content type - `application/protobuf` with the message name as a parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, unquote

from app.bindings import _common as c
from app.envelope.codec import DEFAULT_LIMITS, Layout, Limits
from app.envelope.codec import encode as encode_envelope
from app.envelope.model import Envelope
from app.errors import BindingError
from app.security.signing import SigningKey, VerificationKeys, sign

PREFIX = "prism-"
AMZ_META = "x-amz-meta-"
DEFAULT_KEY_PREFIX = "events"
MAX_KEY_BYTES = 1024
MAX_METADATA_BYTES = 2048
CONTENT_TYPES = {
    Layout.REVIEWED: "application/protobuf; proto=prism.envelope.v1.PrismEnvelope",
    Layout.DRAFT: "application/protobuf; proto=prism.envelope.draft.PrismEnvelope",
}
_WIRE_NAMES = {name: PREFIX + name for name in (c.ENVELOPE_VERSION, c.ENVELOPE_LAYOUT, *(f.name for f in c.FIELDS))}
_LOGICAL = {wire: logical for logical, wire in _WIRE_NAMES.items()}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_KEY_SAFE = "-_.!*'()"  # AWS's "safe characters" for object keys; all else is percent-encoded


@dataclass(frozen=True, slots=True)
class S3Object:
    """What to hand to `put_object(Bucket=..., Key=key, Body=body, Metadata=metadata,
    ContentType=content_type)`."""

    key: str
    body: bytes
    metadata: dict[str, str] = field(default_factory=dict)
    content_type: str = CONTENT_TYPES[Layout.REVIEWED]


def _segment(value: str, what: str) -> str:
    if not value:
        raise BindingError(f"envelope has no {what} to name the object with", path=f"metadata.{what}")
    seg = quote(value, safe=_KEY_SAFE, encoding="utf-8")
    if seg in (".", ".."):
        seg = seg.replace(".", "%2E")
    return seg


def object_key(env: Envelope, *, prefix: str = DEFAULT_KEY_PREFIX) -> str:
    """`<prefix>/YYYY/MM/DD/<topic>/<message_id>.bin` (module docs)."""
    try:
        day = _EPOCH + timedelta(milliseconds=env.published_at_ms)
    except OverflowError:
        raise BindingError(f"published_at_ms {env.published_at_ms} is not a representable date",
                           path="metadata.published_at_ms") from None
    parts = [prefix.strip("/")] if prefix.strip("/") else []
    parts += [f"{day.year:04d}", f"{day.month:02d}", f"{day.day:02d}",
              _segment(env.topic, "topic"), _segment(env.message_id, "message_id") + ".bin"]
    key = "/".join(parts)
    if len(key.encode()) > MAX_KEY_BYTES:
        raise BindingError(f"object key is {len(key.encode())} bytes, over S3's {MAX_KEY_BYTES}-byte limit",
                           path="metadata.topic", hint="shorten the topic or message id")
    return key


def parse_key(key: str) -> tuple[str, str]:
    """(topic, message_id) named by an object key written by `object_key`."""
    parts = key.rsplit("/", 2)
    if len(parts) != 3 or not parts[2].endswith(".bin"):
        raise BindingError(f"object key {key!r} is not <prefix>/YYYY/MM/DD/<topic>/<message_id>.bin", path="key")
    return unquote(parts[1], errors="strict"), unquote(parts[2][: -len(".bin")], errors="strict")


def metadata_for(env: Envelope, layout: Layout) -> dict[str, str]:
    meta = {_WIRE_NAMES[name]: c.pct_encode(value) for name, value in c.metadata_values(env, layout)}
    size = sum(len(k) + len(v) for k, v in meta.items())
    if size > MAX_METADATA_BYTES:
        raise BindingError(f"object metadata is {size} bytes, over S3's {MAX_METADATA_BYTES}-byte limit",
                           path="metadata", hint="shorten the topic, namespace or content type")
    return meta


def encode(
    env: Envelope,
    layout: Layout = Layout.REVIEWED,
    *,
    prefix: str = DEFAULT_KEY_PREFIX,
    sign_with: SigningKey | None = None,
) -> S3Object:
    """The object for `env` (module docs). `sign_with` signs the body."""
    key = object_key(env, prefix=prefix)
    body = sign(env, sign_with, layout) if sign_with is not None else encode_envelope(env, layout)
    return S3Object(key=key, body=body, metadata=metadata_for(env, layout), content_type=CONTENT_TYPES[layout])


def decode(
    body: bytes | bytearray | memoryview,
    metadata: Mapping[str, str] | None = None,
    *,
    key: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
    verify_with: VerificationKeys | None = None,
) -> Envelope:
    """Decode an object body and check its metadata (and `key`, when given) against the
    envelope: `BindingError` on any disagreement. `metadata` is boto3's `Metadata` dict
    (names with or without `x-amz-meta-`)."""
    pairs: list[tuple[str, str]] = []
    for name, value in (metadata or {}).items():
        bare = name.lower().removeprefix(AMZ_META)
        if bare in _LOGICAL:
            pairs.append((bare, c.pct_decode(value, name)))
    found = c.collect(pairs, _LOGICAL, binding="s3")
    env = c.decode_checked(body, found, binding="s3 metadata", spell=_WIRE_NAMES.__getitem__, limits=limits,
                            verify_with=verify_with)
    if key is not None:
        try:
            topic, message_id = parse_key(key)
        except UnicodeDecodeError:
            raise BindingError(f"object key {key!r} is not percent-encoded UTF-8", path="key") from None
        if (topic, message_id) != (env.topic, env.message_id):
            raise BindingError(
                f"object key names topic {topic!r} / message {message_id!r} but the envelope is "
                f"{env.topic!r} / {env.message_id!r}",
                path="key", hint="the object was renamed or overwritten by another message",
            )
    return env
