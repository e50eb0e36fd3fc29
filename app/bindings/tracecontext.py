"""W3C Trace Context (`traceparent` / `tracestate`) for the backend bindings.

The envelope's `ObservabilityContext` holds the trace id, span id and flags; it has no
`tracestate` field, so the vendor-specific trace state rides in the envelope's extensions
under `TRACESTATE_EXTENSION` (extensions exist in both layouts and unknown keys are ignored
by every consumer). Every binding that has headers emits both W3C headers from the envelope,
so tracing tools that never parse a Prism envelope still join the trace.

Header formats (W3C Trace Context level 1):
  traceparent = "00-" 32 hex trace-id "-" 16 hex parent-id "-" 2 hex flags
  tracestate  = up to 32 comma-separated `key=value` members, printable ASCII, <= 512 chars
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.envelope.model import Envelope

#: Extension key holding the W3C `tracestate` header value (UTF-8 bytes).
TRACESTATE_EXTENSION = "w3c.tracestate"

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX16 = re.compile(r"[0-9a-f]{16}")
_TRACESTATE_CHARS = re.compile(r"[\x20-\x7e]*")
_MAX_TRACESTATE = 512
_MAX_TRACESTATE_MEMBERS = 32


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A parsed `traceparent` header (version 00 semantics)."""

    trace_id: str
    span_id: str
    flags: int

    def __str__(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 0x01)


def parse_traceparent(value: str | bytes | None) -> TraceParent | None:
    """Parse a `traceparent` header; None when it is absent or invalid.

    Invalid values are not errors: the W3C spec tells receivers to ignore a traceparent they
    cannot parse and start a new trace, which is what the enrich stage does with None.
    Versions above 00 are read by their 00 prefix, as the spec requires; version ff is invalid.
    """
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    m = _TRACEPARENT.fullmatch(value.strip())
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest) or (rest and not rest.startswith("-")):
        return None
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return TraceParent(trace_id, span_id, int(flags, 16))


def traceparent_of(env: Envelope) -> str | None:
    """The `traceparent` header value for the envelope's observability context.

    None when the envelope has no usable trace (missing/invalid/all-zero ids): emitting a
    made-up parent would graft the message onto a trace that does not exist.
    """
    obs = env.observability
    if obs is None:
        return None
    if not (_HEX32.fullmatch(obs.trace_id) and _HEX16.fullmatch(obs.span_id)):
        return None
    if obs.trace_id == "0" * 32 or obs.span_id == "0" * 16:
        return None
    return str(TraceParent(obs.trace_id, obs.span_id, obs.trace_flags & 0xFF))


def tracestate_of(env: Envelope) -> str | None:
    """The `tracestate` header value carried in the envelope's extensions, if valid.

    An invalid tracestate (non-ASCII, too long, too many members) is dropped rather than
    forwarded, as W3C Trace Context requires of a vendor that cannot parse it.
    """
    raw = env.header.extensions.get(TRACESTATE_EXTENSION)
    if not raw:
        return None
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    if not is_valid_tracestate(text):
        return None
    return text


def is_valid_tracestate(text: str) -> bool:
    """Cheap structural check of a `tracestate` value (length, charset, member count)."""
    if not text or len(text) > _MAX_TRACESTATE or not _TRACESTATE_CHARS.fullmatch(text):
        return False
    members = [m.strip() for m in text.split(",") if m.strip()]
    if not members or len(members) > _MAX_TRACESTATE_MEMBERS:
        return False
    return all("=" in m and m.index("=") > 0 for m in members)
