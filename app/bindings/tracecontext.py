"""W3C Trace Context headers (`traceparent` / `tracestate`) for the backend bindings.

The envelope's `ObservabilityContext` holds the trace id, span id and flags; it has no
`tracestate` field, so the vendor-specific trace state rides in the envelope's extensions
under `TRACESTATE_EXTENSION` (extensions exist in both layouts and unknown keys are ignored
by every consumer). Every binding that has headers emits both W3C headers from the envelope,
so tracing tools that never parse a Prism envelope still join the trace.

Parsing and validation are `app.observability.tracecontext`'s (the one W3C-conformant
implementation in Prism); this module only turns an envelope into header values.
"""

from __future__ import annotations

from ..envelope.model import Envelope
from ..observability.tracecontext import (
    TRACESTATE_EXTENSION,
    TraceParent,
    _from_envelope_fields,
    format_tracestate,
    parse_traceparent,
    parse_tracestate,
)

__all__ = ["TRACESTATE_EXTENSION", "TraceParent", "is_valid_tracestate", "parse_traceparent", "traceparent_of",
           "tracestate_of"]


def traceparent_of(env: Envelope) -> str | None:
    """The `traceparent` header value for the envelope's observability context.

    None when the envelope has no usable trace (missing/invalid/all-zero ids): emitting a
    made-up parent would graft the message onto a trace that does not exist.
    """
    obs = env.observability
    if obs is None:
        return None
    tp = _from_envelope_fields(obs.trace_id, obs.span_id, obs.trace_flags)
    return None if tp is None else tp.to_header()


def tracestate_of(env: Envelope) -> str | None:
    """The `tracestate` header value carried in the envelope's extensions, if valid.

    An invalid tracestate is dropped rather than forwarded, as W3C Trace Context requires of
    a vendor that cannot parse it.
    """
    raw = env.header.extensions.get(TRACESTATE_EXTENSION)
    if not raw:
        return None
    state = parse_tracestate(raw)
    return format_tracestate(state) if state else None


def is_valid_tracestate(text: str) -> bool:
    """True when `text` is a well-formed `tracestate` value (W3C Level 1 grammar)."""
    return bool(parse_tracestate(text))
