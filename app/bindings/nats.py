"""NATS binding (RFC-031 "NATS: Envelope as Message Data + NATS Headers").

A Prism message on NATS is `subject` (the envelope's topic unless given), `data` (envelope
bytes in one layout) and headers, as the `dict[str, str]` nats-py publishes and delivers:

  | header                   | value                                   | when            |
  |--------------------------|-----------------------------------------|-----------------|
  | `Prism-Envelope-Version` | `1`                                     | draft layout    |
  | `Prism-Envelope-Layout`  | `draft` / `reviewed`                    | always          |
  | `Prism-Message-ID`       | metadata.message_id                     | always          |
  | `Prism-Topic`            | metadata.topic                          | always          |
  | `Prism-Namespace`        | metadata.namespace                      | always          |
  | `Prism-Trace-ID`         | observability.trace_id                  | when set        |
  | `Prism-Content-Type`     | metadata content type (MIME)            | when set        |
  | `Nats-Msg-Id`            | metadata.message_id                     | always          |
  | `traceparent`            | `00-<trace_id>-<span_id>-<flags:02x>`   | valid trace ids |
  | `tracestate`             | extensions[`w3c.tracestate`]            | when valid      |

`Nats-Msg-Id` is JetStream's de-duplication id: a re-delivered publish of the same envelope
inside the stream's duplicate window is dropped by the server, which is the broker half of
Prism's dedup-by-message-id.

Header values are percent-encoded UTF-8 (printable ASCII other than space and `%` passes
unchanged, so ordinary ids and topics read as-is): NATS clients trim values and replace
line breaks, so raw text would not survive a round trip, and a raw CR/LF would be header
injection. Names are matched case-insensitively on decode.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..envelope.codec import DEFAULT_LIMITS, Layout, Limits
from ..envelope.codec import encode as encode_envelope
from ..envelope.model import Envelope
from ..errors import BindingError
from ..security.signing import SigningKey, VerificationKeys, sign
from . import _common as c
from .tracecontext import traceparent_of, tracestate_of

PREFIX = "Prism-"
NATS_MSG_ID = "Nats-Msg-Id"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_WIRE_NAMES = {
    c.ENVELOPE_VERSION: "Prism-Envelope-Version",
    c.ENVELOPE_LAYOUT: "Prism-Envelope-Layout",
    c.MESSAGE_ID: "Prism-Message-ID",
    c.TOPIC: "Prism-Topic",
    c.NAMESPACE: "Prism-Namespace",
    c.TRACE_ID: "Prism-Trace-ID",
    c.CONTENT_TYPE: "Prism-Content-Type",
}
_LOGICAL = {wire.lower(): logical for logical, wire in _WIRE_NAMES.items()}
_BAD_SUBJECT_CHAR = re.compile(r"[\s\x00-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class NatsMessage:
    """What to hand to `nc.publish(subject, data, headers=headers)` / `js.publish(...)`."""

    subject: str
    data: bytes
    headers: dict[str, str] = field(default_factory=dict)


class MsgLike(Protocol):
    """Anything with data and headers: `NatsMessage`, nats-py's `Msg`, ..."""

    @property
    def data(self) -> bytes: ...

    @property
    def headers(self) -> Mapping[str, str] | None: ...


def check_subject(subject: str) -> str:
    """A subject a message can be published to: dot-separated non-empty tokens, no
    whitespace, no wildcards."""
    problem = None
    if not subject:
        problem = "is empty"
    elif _BAD_SUBJECT_CHAR.search(subject):
        problem = "contains whitespace or control characters"
    elif any(tok in ("", "*", ">") for tok in subject.split(".")):
        problem = "has an empty token or a wildcard (* or >)"
    if problem:
        raise BindingError(f"NATS subject {subject!r} {problem}", path="subject",
                           hint="pass subject= explicitly, or use a topic that is a valid NATS subject")
    return subject


def is_owned(name: str) -> bool:
    key = name.lower()
    return key.startswith(PREFIX.lower()) or key == NATS_MSG_ID.lower()


def passthrough_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """An input message's headers minus the ones `encode` regenerates."""
    drop = {TRACEPARENT, TRACESTATE}
    return {n: v for n, v in (headers or {}).items() if not is_owned(n) and n.lower() not in drop}


#: The layout-only headers and the wire names of the per-envelope ones, in emission order.
_LAYOUT_HEADERS = {lay: tuple((_WIRE_NAMES[name], c.pct_encode(value)) for name, value in c.layout_values(lay))
                   for lay in Layout}
_FIELD_WIRE = tuple(_WIRE_NAMES[f.name] for f in c.FIELDS)


def headers_for(env: Envelope, layout: Layout) -> list[tuple[str, str]]:
    out = list(_LAYOUT_HEADERS[layout])
    values = c.field_values(env)
    for wire, value in zip(_FIELD_WIRE, values, strict=True):
        if value:
            out.append((wire, c.pct_encode(value)))
    message_id = values[0]
    if message_id:
        out.append((NATS_MSG_ID, c.pct_encode(message_id)))
    # traceparent_of() is None without an observability context: skip the call then.
    tp = traceparent_of(env) if env.header.HasField("observability") else None
    if tp is not None:
        out.append((TRACEPARENT, tp))
        ts = tracestate_of(env)
        if ts is not None:
            out.append((TRACESTATE, ts))
    return out


def encode(
    env: Envelope,
    layout: Layout = Layout.REVIEWED,
    *,
    subject: str | None = None,
    headers: Mapping[str, str] | None = None,
    sign_with: SigningKey | None = None,
) -> NatsMessage:
    """Build the NATS message for `env` (subject defaults to the envelope's topic).

    Caller `headers` are kept and never overwritten; a `Prism-*`/`Nats-Msg-Id` one that
    disagrees with the envelope raises `BindingError`. `sign_with` signs the data.
    """
    subj = check_subject(subject if subject is not None else env.topic)
    data = sign(env, sign_with, layout) if sign_with is not None else encode_envelope(env, layout)
    merged = c.merge_headers(headers_for(env, layout), (headers or {}).items(), owned=is_owned, binding="nats")
    return NatsMessage(subj, data, dict(merged))


def decode(
    msg: MsgLike,
    *,
    limits: Limits = DEFAULT_LIMITS,
    verify_with: VerificationKeys | None = None,
) -> Envelope:
    """Decode a NATS message and check its `Prism-*` and `Nats-Msg-Id` headers against the
    envelope (`BindingError` on any disagreement); see `app.bindings.kafka.decode` for the
    layout rules and `verify_with`."""
    headers = msg.headers or {}
    pairs = [(n, c.pct_decode(v, n)) for n, v in headers.items() if n.lower() in _LOGICAL]
    found = c.collect(pairs, _LOGICAL, binding="nats")
    env = c.decode_checked(msg.data, found, binding="nats", spell=_WIRE_NAMES.__getitem__, limits=limits,
                            verify_with=verify_with)
    for name, value in headers.items():
        if name.lower() == NATS_MSG_ID.lower() and c.pct_decode(value, name) != env.message_id:
            raise BindingError(
                f"NATS header {name} is {value!r} but the envelope's metadata.message_id is {env.message_id!r}",
                path=name,
                hint="JetStream would de-duplicate by a different id than Prism; let encode() set it",
            )
    return env
