"""What a caller can say about one publish (`PrismPublishOptions`) and about payload
encryption (`EncryptionOptions`), plus the trace-context normalisation both need.

Options are frozen dataclasses: one instance can be shared by many publishes (and threads)
without anybody mutating it behind the caller's back. Everything is optional; an absent
option leaves the envelope field absent, which memo-031 gives a meaning (priority 5, no TTL).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from ..envelope.validation import CLASSIFICATIONS as _CLASSIFICATIONS
from ..envelope.validation import SanityPolicy, text_problem
from ..errors import ConfigError, TraceContextError
from ..observability.tracecontext import (
    FLAG_SAMPLED,
    is_valid_span_id,
    is_valid_trace_id,
    parse_traceparent,
)
from ..security.algorithms import AES_256_GCM, DEFAULT_POLICY, AlgorithmPolicy
from ..security.keys import DataKeyProvider, KeyProvider
from ..security.signing import SigningKey


@dataclass(frozen=True, slots=True)
class EncryptionOptions:
    """Encrypt the payload end to end (RFC-031 rev. 2) before it leaves the process.

    `key_id` defaults to the provider's current key for the algorithm's key type and the
    client's namespace, which is what key rotation wants: producers never pin a key id.
    """

    provider: KeyProvider | DataKeyProvider
    algorithm: str = AES_256_GCM
    key_id: str | None = None
    policy: AlgorithmPolicy = field(default_factory=lambda: DEFAULT_POLICY)

    def __repr__(self) -> str:  # the provider may hold key material: never print it
        return f"EncryptionOptions(algorithm={self.algorithm!r}, key_id={self.key_id!r})"


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A W3C trace context reduced to what the envelope stores."""

    trace_id: str
    span_id: str
    flags: int = FLAG_SAMPLED
    tracestate: str | None = None


@dataclass(frozen=True, slots=True)
class PrismPublishOptions:
    """Per-message options of `PrismClient.publish` (RFC-031 "Developer APIs").

    * `trace_context` - a W3C `traceparent` string, an OpenTelemetry `SpanContext`, or an
      OpenTelemetry `Span`; it becomes the envelope's observability context (and the
      `traceparent` header on Kafka/NATS). Without it, the active OpenTelemetry span is used
      when there is one.
    * `signing_key` - sign the envelope (after encryption, so the signature covers the
      ciphertext); overrides the client's default key.
    * `encryption` - encrypt the payload (`EncryptionOptions`).
    * `message_id` - set it when retrying a publish whose outcome is unknown: consumers and
      idempotent sinks then see the retry as the same message.
    * `key` - Kafka partition key (ignored by other backends); defaults to the correlation id.
    """

    correlation_id: str | None = None
    causality_parent: str | None = None
    priority: int | None = None
    ttl_seconds: int | None = None
    labels: Mapping[str, str] | None = None
    trace_context: Any = None
    signing_key: SigningKey | None = None
    encryption: EncryptionOptions | None = None
    content_type: str | None = None
    content_encoding: str = ""
    data_classification: str | None = None
    contains_pii: bool | None = None
    message_id: str | None = None
    key: bytes | None = None
    extensions: Mapping[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Every problem at once, each as the envelope field would refuse it later - as a
        protobuf `ValueError`, `TypeError` or `UnicodeEncodeError` at publish, or a DLQ entry
        at the worker (metadata sanity): a caller's mistake is a `ConfigError` here."""
        problems = []
        if self.priority is not None and not (_is_int(self.priority) and 0 <= self.priority <= 10):
            problems.append(f"priority must be 0-10, got {self.priority!r}")
        if self.ttl_seconds is not None and not (_is_int(self.ttl_seconds) and 0 <= self.ttl_seconds <= _INT64_MAX):
            problems.append(f"ttl_seconds must be an integer from 0 to {_INT64_MAX}, got {self.ttl_seconds!r}")
        if self.key is not None and not isinstance(self.key, bytes):
            problems.append("key must be bytes")
        for name in ("message_id", "correlation_id", "causality_parent"):
            text = getattr(self, name)
            if text is not None and (why := text_problem(text, _MAX_ID_LENGTH)):
                problems.append(f"{name} {why}")
        if self.message_id == "":
            problems.append("message_id must not be empty (None: a new UUIDv7)")
        for name in ("content_type", "content_encoding"):
            text = getattr(self, name)
            if text is not None and (why := text_problem(text, _MAX_NAME_LENGTH)):
                problems.append(f"{name} {why}")
        if self.data_classification is not None and self.data_classification not in _CLASSIFICATIONS:
            problems.append(f"data_classification must be one of {sorted(_CLASSIFICATIONS)}, "
                            f"got {self.data_classification!r}")
        problems += _map_problems("labels", self.labels, str, _MAX_LABELS)
        problems += _map_problems("extensions", self.extensions, bytes, None)
        if problems:
            raise ConfigError("invalid PrismPublishOptions: " + "; ".join(problems), path="PrismPublishOptions",
                              hint="docs/sdk.md (PrismPublishOptions) gives each option's range; priority is 0 (lowest) "
                                   "to 10 (highest), ttl_seconds 0 means no expiry")


_INT64_MAX = 2**63 - 1
#: The worker's metadata sanity limits (app/envelope/validation.py `SanityPolicy`): what the
#: SDK lets through here the worker would dead-letter.
_SANITY = SanityPolicy()
_MAX_ID_LENGTH = _SANITY.max_id_length
_MAX_NAME_LENGTH = _SANITY.max_name_length
_MAX_LABELS = _SANITY.max_label_count
_MAX_LABEL_LENGTH = _SANITY.max_label_length


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _map_problems(name: str, value: Any, kind: type, most: int | None) -> list[str]:
    """`labels` (str -> str, at most `most` entries, each pair within the label length) and
    `extensions` (str -> bytes) as the envelope's protobuf maps take them."""
    if value is None:
        return []
    if not isinstance(value, Mapping):
        return [f"{name} must be a mapping, got {type(value).__name__}"]
    if most is not None and len(value) > most:
        return [f"{name} has {len(value)} entries, over {most}"]
    out = []
    for k, v in value.items():
        why = text_problem(k, _MAX_LABEL_LENGTH)
        if why is None and not isinstance(v, kind):
            why = f"value must be {kind.__name__}, got {type(v).__name__}"
        elif why is None and kind is str:  # a label: key and value together within the length
            why = text_problem(v, _MAX_LABEL_LENGTH - len(k))
        if why:
            out.append(f"{name}[{str(k)[:32]!r}] {why}")
    return out


DEFAULT_OPTIONS = PrismPublishOptions()


def trace_context_of(value: Any) -> TraceContext | None:
    """Normalise what a caller passed as `trace_context` (see `PrismPublishOptions`).

    A caller passing garbage is a bug, so unlike a *received* context (which silently
    restarts the trace) it raises `TraceContextError`.
    """
    if value is None:
        return None
    if isinstance(value, TraceContext):
        return value
    if isinstance(value, str | bytes):
        tp = parse_traceparent(value)
        if tp is None:
            raise TraceContextError(f"trace_context {value!r:.80} is not a valid W3C traceparent",
                                    path="PrismPublishOptions.trace_context",
                                    hint="pass '00-<32 hex trace id>-<16 hex span id>-<2 hex flags>' or a SpanContext")
        return TraceContext(tp.trace_id, tp.parent_id, tp.propagated_flags())
    ctx = value.get_span_context() if hasattr(value, "get_span_context") else value
    if hasattr(ctx, "trace_id") and hasattr(ctx, "span_id") and isinstance(ctx.trace_id, int):
        trace_id, span_id = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
        if not (is_valid_trace_id(trace_id) and is_valid_span_id(span_id)):
            raise TraceContextError("trace_context is an invalid (all-zero) OpenTelemetry span context",
                                    path="PrismPublishOptions.trace_context",
                                    hint="publish inside a started span, or omit trace_context")
        state = getattr(ctx, "trace_state", None)
        header = state.to_header() if state is not None and len(state) else None
        return TraceContext(trace_id, span_id, int(getattr(ctx, "trace_flags", FLAG_SAMPLED)) & 0xFF, header or None)
    raise TraceContextError(f"trace_context of type {type(value).__name__} is not supported",
                            path="PrismPublishOptions.trace_context",
                            hint="pass a traceparent string, an OpenTelemetry SpanContext or Span")


try:
    from opentelemetry.trace import INVALID_SPAN as _NO_SPAN
    from opentelemetry.trace import get_current_span as _current_span
except ImportError:  # opentelemetry-api is the optional `[otel]` extra of the prism-client distribution
    _current_span = _NO_SPAN = None


def current_otel_context() -> TraceContext | None:
    """The active OpenTelemetry span's context, when OpenTelemetry is installed and a valid
    span is active (so instrumented code gets trace propagation without passing anything)."""
    if _current_span is None:
        return None
    span = _current_span()
    if span is _NO_SPAN:  # what get_current_span returns outside any span: nothing to look at
        return None
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return trace_context_of(ctx)


def _context_getter() -> Callable[[], Any]:
    """What `otel_context()` is: `get` of the ContextVar behind OpenTelemetry's default runtime
    context when that is the one in use; without OpenTelemetry a function returning None; with
    another runtime context (or a future OpenTelemetry that renames the private attribute, read
    once and type-checked) a function returning True, so every publish asks `current_otel_context`."""
    if _current_span is None:
        return lambda: None
    try:
        from opentelemetry.context import _RUNTIME_CONTEXT
    except ImportError:
        return lambda: True
    var = getattr(_RUNTIME_CONTEXT, "_current_context", None)
    return var.get if isinstance(var, ContextVar) else lambda: True


#: `not otel_context()` means `current_otel_context()` is certainly None: OpenTelemetry is not
#: installed, or its current context holds nothing at all (no span, no baggage). An empty context
#: is the common case of an uninstrumented publish, and testing it is one ContextVar read instead
#: of the four frames of `get_current_span` (issue 29: ~1.5 µs per publish between round trips).
#: Anything else means "look": the caller then asks `current_otel_context`.
otel_context: Callable[[], Any] = _context_getter()
