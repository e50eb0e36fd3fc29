"""W3C Trace Context (`traceparent` / `tracestate`) parsing and formatting, by the letter.

Sources: W3C Trace Context Level 1 (Recommendation) and Level 2 (Candidate Recommendation),
sections "traceparent Header", "Versioning of traceparent", "tracestate Header" and
"Mutating the traceparent/tracestate Field", plus the W3C conformance suite
(`w3c/trace-context/test/test.py`, strict level 2), which pins down the cases the prose
leaves to judgement.

Why a hand-written parser when OpenTelemetry has a propagator: a message's trace context
arrives from two places (the envelope's `ObservabilityContext` and the Kafka headers) and
must be judged by ONE set of rules before anything is handed to the OTel SDK. Everything
leaving this module is normalized (version `00`, lowercase, known flag bits only), so what
OTel's propagator sees is always valid, and garbage is never propagated.

Rules implemented (every one has a row in tests/observability/test_tracecontext.py):

* Leading/trailing spaces and tabs (HTTP OWS) around the value are ignored.
* `version` is 2 lowercase hex digits followed by `-`; `ff` is invalid.
* Version `00`: exactly `00-<32 hex>-<16 hex>-<2 hex>`, 55 characters; anything after the
  flags (even `-...`) is invalid.
* A higher version: at least 55 characters; trace-id, parent-id and flags at the version-00
  positions, each followed by `-` (the flags by `-` or the end); the rest is ignored and the
  context is re-emitted as version `00` ("Downgrade the version" mutation). Only the
  `sampled` bit is taken from a future version's flags (the spec says "parse the sampled
  bit"), since we cannot know what its other bits mean.
* Hex is lowercase only (`HEXDIGLC`); all-zero trace-id or parent-id is invalid.
* Flags: `sampled` (0x01, Level 1) and `random-trace-id` (0x02, Level 2) are propagated,
  every other bit is set to zero ("Vendors MUST set those to zero").
* Invalid `traceparent` -> restart the trace, and do NOT parse `tracestate`.
* `tracestate`: multiple header fields are joined with `,`; empty and whitespace-only
  members are dropped; at most 32 members; key/value grammar of the chosen level; a
  duplicated key, an invalid member or more than 32 members discards the WHOLE tracestate
  (what the conformance suite's strict level requires and what OTel does); `lenient=True`
  instead drops just the offending members. An invalid tracestate never affects traceparent.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from random import getrandbits
from typing import TYPE_CHECKING, NamedTuple

from ..errors import TraceContextError

if TYPE_CHECKING:
    from ..envelope.model import Envelope

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

#: Envelope extension key that carries `tracestate` next to the observability context
#: (`ObservabilityContext` has no tracestate field; the CloudEvents distributed-tracing
#: extension uses the same attribute name). Consumers that do not know it ignore it.
TRACESTATE_EXTENSION = "w3c.tracestate"

FLAG_SAMPLED = 0x01
FLAG_RANDOM = 0x02
#: The flag bits this implementation knows (Level 2). Unknown bits are zeroed on output.
KNOWN_FLAGS = FLAG_SAMPLED | FLAG_RANDOM

TRACEPARENT_V00_LENGTH = 55
#: Larger values are "prohibitively large" (spec: only disallow those); OTel uses the same cap.
TRACEPARENT_MAX_LENGTH = 512
TRACESTATE_MAX_MEMBERS = 32
#: Combined tracestate longer than this is discarded before parsing (DoS guard, as OTel).
TRACESTATE_MAX_LENGTH = 8192
#: "Vendors SHOULD propagate at least 512 characters of a combined header."
TRACESTATE_PROPAGATE_AT_LEAST = 512

_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
_HEXLC = frozenset("0123456789abcdef")
_OWS = " \t"

_KEYCHARS = r"[a-z0-9_\-*/]"
_KEY_L1 = re.compile(
    rf"[a-z]{_KEYCHARS}{{0,255}}"  # simple-key
    rf"|[a-z0-9]{_KEYCHARS}{{0,240}}@[a-z]{_KEYCHARS}{{0,13}}"  # multi-tenant-key: tenant-id "@" system-id
)
_KEY_L2 = re.compile(r"[a-z0-9][a-z0-9_\-*/@]{0,255}")
_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")


def _is_hexlc(s: str) -> bool:
    return bool(s) and _HEXLC.issuperset(s)


def _text(value: str | bytes | bytearray | memoryview | None) -> str | None:
    """Header values arrive as bytes from Kafka. Non-ASCII cannot be valid trace context."""
    if value is None:
        return None
    if isinstance(value, str):
        return value if value.isascii() else None
    try:
        return bytes(value).decode("ascii")
    except UnicodeDecodeError:
        return None


# --------------------------------------------------------------------------- traceparent


class TraceParent(NamedTuple):
    """A parsed, valid `traceparent`. `flags` is the received byte; see `propagated_flags`.
    (A NamedTuple: immutable and built at C speed - one is made per message.)"""

    version: str
    trace_id: str
    parent_id: str
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & FLAG_SAMPLED)

    @property
    def random(self) -> bool:
        """Level 2 `random-trace-id` flag (meaningless for a future version: not propagated)."""
        return self.version == "00" and bool(self.flags & FLAG_RANDOM)

    def propagated_flags(self) -> int:
        """The flags to send on: known bits only; just `sampled` from a future version."""
        return self.flags & (KNOWN_FLAGS if self.version == "00" else FLAG_SAMPLED)

    def to_header(self) -> str:
        """Version-00 form (a higher version is downgraded, as the spec prescribes)."""
        return f"00-{self.trace_id}-{self.parent_id}-{self.propagated_flags():02x}"


def parse_traceparent(value: str | bytes | bytearray | memoryview | None) -> TraceParent | None:
    """Parse one `traceparent` value; None when absent or invalid (the caller restarts the trace).

    Never raises: the input is untrusted producer data.
    """
    text = _text(value)
    if text is None:
        return None
    text = text.strip(_OWS)
    n = len(text)
    if n < TRACEPARENT_V00_LENGTH or n > TRACEPARENT_MAX_LENGTH:
        # Also covers "a higher version shorter than 55 characters: restart".
        return None
    version = text[0:2]
    if text[2] != "-" or not _is_hexlc(version) or version == "ff":
        return None
    if version == "00" and n != TRACEPARENT_V00_LENGTH:
        return None  # version 00 has exactly four fields; trailing data is invalid
    trace_id, parent_id, flags = text[3:35], text[36:52], text[53:55]
    if text[35] != "-" or text[52] != "-" or (n > TRACEPARENT_V00_LENGTH and text[55] != "-"):
        return None
    if not (_is_hexlc(trace_id) and _is_hexlc(parent_id) and _is_hexlc(flags)):
        return None
    if trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:
        return None
    return TraceParent(version, trace_id, parent_id, int(flags, 16))


def is_valid_trace_id(trace_id: str) -> bool:
    return len(trace_id) == 32 and _is_hexlc(trace_id) and trace_id != _ZERO_TRACE


def is_valid_span_id(span_id: str) -> bool:
    return len(span_id) == 16 and _is_hexlc(span_id) and span_id != _ZERO_SPAN


def format_traceparent(trace_id: str, parent_id: str, flags: int = 0) -> str:
    """Build a version-00 `traceparent`. Raises `TraceContextError` rather than emit garbage.

    Unknown flag bits are cleared ("Vendors MUST set those to zero").
    """
    if not is_valid_trace_id(trace_id):
        raise TraceContextError("trace id must be 32 lowercase hex characters, not all zero",
                                path="trace_id", hint="use new_trace_id() or a valid incoming trace id")
    if not is_valid_span_id(parent_id):
        raise TraceContextError("parent id must be 16 lowercase hex characters, not all zero",
                                path="parent_id", hint="use new_span_id()")
    if not isinstance(flags, int) or not 0 <= flags <= 0xFF:
        raise TraceContextError(f"trace flags must be an int in 0..255, got {flags!r}", path="trace_flags",
                                hint="combine FLAG_SAMPLED / FLAG_RANDOM")
    return f"00-{trace_id}-{parent_id}-{flags & KNOWN_FLAGS:02x}"


def new_trace_id() -> str:
    """16 random bytes (so the Level 2 `random-trace-id` flag may be set).

    From `random.getrandbits`, as OpenTelemetry's own id generator does: W3C asks ids to be
    unpredictable enough not to collide, not secret, and `secrets` costs a system call per id
    (two per message in the worker's enrich stage). The module reseeds after fork.
    """
    while True:
        tid = f"{getrandbits(128):032x}"
        if tid != _ZERO_TRACE:
            return tid


def new_span_id() -> str:
    while True:
        sid = f"{getrandbits(64):016x}"
        if sid != _ZERO_SPAN:
            return sid


def new_trace_and_span_id() -> tuple[str, str]:
    """`(new_trace_id(), new_span_id())`, the same two ids from one 192-bit draw.

    Why: a restarted trace needs both (the worker's enrich stage, for every message that
    arrives without a context); one `getrandbits(192)` turned into hex by `bytes.hex` is
    ~0.3 µs less than two draws formatted by `format`. The ids are the very same:
    `getrandbits` fills an n-bit number from 32-bit outputs, least significant first, so the
    low 128 bits are what `getrandbits(128)` would have returned and the high 64 bits the next
    `getrandbits(64)` (tests/observability/test_tracecontext.py checks it on seeded
    generators). An all-zero id (never in practice) falls back to the two draws.
    """
    h = getrandbits(192).to_bytes(24).hex()
    sid, tid = h[:16], h[16:]
    if tid == _ZERO_TRACE or sid == _ZERO_SPAN:
        return new_trace_id(), new_span_id()
    return tid, sid


# --------------------------------------------------------------------------- tracestate


class TraceState:
    """An immutable, ordered `tracestate` list (left-most = most recently updated vendor)."""

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self._items: tuple[tuple[str, str], ...] = tuple(items)

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __contains__(self, key: object) -> bool:
        return any(k == key for k, _ in self._items)

    def __getitem__(self, key: str) -> str:
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def get(self, key: str, default: str | None = None) -> str | None:
        try:
            return self[key]
        except KeyError:
            return default

    def items(self) -> tuple[tuple[str, str], ...]:
        return self._items

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TraceState) and self._items == other._items

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return f"TraceState({format_tracestate(self)!r})"

    def with_entry(self, key: str, value: str, *, level: int = 1) -> TraceState:
        """Add or update `key` and move it to the left; the right-most member falls off past 32."""
        if not _valid_key(key, level) or not _VALUE.fullmatch(value):
            raise TraceContextError("tracestate entry does not follow the W3C key/value grammar",
                                    path=f"tracestate[{key[:32]!r}]",
                                    hint="keys: lowercase a-z 0-9 _ - * / (@ for multi-tenant); values: printable ASCII without , =")
        rest = [(k, v) for k, v in self._items if k != key]
        return TraceState([(key, value), *rest][:TRACESTATE_MAX_MEMBERS])

    def without(self, key: str) -> TraceState:
        return TraceState((k, v) for k, v in self._items if k != key)

    def to_header(self, *, max_length: int | None = None) -> str:
        return format_tracestate(self, max_length=max_length)


def _valid_key(key: str, level: int) -> bool:
    return bool((_KEY_L2 if level >= 2 else _KEY_L1).fullmatch(key))


def parse_tracestate(
    value: str | bytes | Iterable[str | bytes] | None,
    *,
    level: int = 1,
    lenient: bool = False,
) -> TraceState:
    """Parse one or more `tracestate` header values (joined with `,`, RFC 7230 field order).

    `level=1` uses the Level 1 key grammar (simple-key / tenant@system, what OpenTelemetry
    accepts); `level=2` the Level 2 grammar (`@` anywhere after the first character).
    Strict by default: any invalid member, duplicated key or more than 32 members returns an
    empty TraceState. `lenient=True` drops the offending members and keeps the first 32.
    Never raises.
    """
    if value is None:
        return TraceState()
    parts = [value] if isinstance(value, str | bytes | bytearray | memoryview) else list(value)
    texts: list[str] = []
    for part in parts:
        t = _text(part)
        if t is None:
            if lenient:
                continue
            return TraceState()
        texts.append(t)
    combined = ",".join(texts)
    if len(combined) > TRACESTATE_MAX_LENGTH:
        return TraceState()
    items: list[tuple[str, str]] = []
    seen: set[str] = set()
    for raw in combined.split(","):
        member = raw.strip(_OWS)
        if not member:
            continue  # empty / whitespace-only members are allowed and dropped
        key, eq, val = member.partition("=")
        if not eq or not _valid_key(key, level) or not _VALUE.fullmatch(val) or key in seen:
            if lenient:
                continue
            return TraceState()
        seen.add(key)
        items.append((key, val))
    if len(items) > TRACESTATE_MAX_MEMBERS:
        if not lenient:
            return TraceState()
        items = items[:TRACESTATE_MAX_MEMBERS]
    return TraceState(items)


def format_tracestate(
    state: TraceState | Iterable[tuple[str, str]] | Mapping[str, str],
    *,
    max_length: int | None = None,
    level: int = 1,
) -> str:
    """Serialize as `k1=v1,k2=v2`. With `max_length`, truncate by whole entries as the spec
    says: entries longer than 128 characters go first, then entries from the right.

    Raises `TraceContextError` for members that break the grammar (never emits garbage).
    """
    pairs = list(state.items()) if isinstance(state, TraceState | Mapping) else list(state)
    seen: set[str] = set()
    for k, v in pairs:
        if not _valid_key(k, level) or not _VALUE.fullmatch(v) or k in seen:
            raise TraceContextError("tracestate member is invalid or duplicated", path=f"tracestate[{k[:32]!r}]",
                                    hint="build it with TraceState.with_entry()")
        seen.add(k)
    if len(pairs) > TRACESTATE_MAX_MEMBERS:
        raise TraceContextError(f"tracestate has {len(pairs)} members, over {TRACESTATE_MAX_MEMBERS}",
                                path="tracestate", hint="drop right-most members")
    entries = [f"{k}={v}" for k, v in pairs]
    if max_length is not None:
        entries = _truncate(entries, max_length)
    return ",".join(entries)


def _truncate(entries: list[str], max_length: int) -> list[str]:
    def size(es: list[str]) -> int:
        return sum(map(len, es)) + max(len(es) - 1, 0)

    if size(entries) <= max_length:
        return entries
    while size(entries) > max_length and any(len(e) > 128 for e in entries):
        # remove the right-most long entry first
        idx = max(i for i, e in enumerate(entries) if len(e) > 128)
        entries = entries[:idx] + entries[idx + 1 :]
    while entries and size(entries) > max_length:
        entries = entries[:-1]
    return entries


_EMPTY_STATE = TraceState()

# --------------------------------------------------------------------------- carriers

HeadersLike = Mapping[str, "str | bytes | None"] | Iterable[tuple[str, "str | bytes | None"]]


def header_values(headers: HeadersLike | None) -> tuple[list[str | bytes], list[str | bytes]]:
    """All `traceparent` and `tracestate` values, header names matched case-insensitively
    ("Vendors MUST expect the header name in any case"). Kafka headers may repeat a key."""
    if not headers:
        return [], []
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    tps: list[str | bytes] = []
    tss: list[str | bytes] = []
    for name, val in pairs:
        if val is None or not isinstance(name, str):
            continue
        lname = name.lower()
        if lname == TRACEPARENT:
            tps.append(val)
        elif lname == TRACESTATE:
            tss.append(val)
    return tps, tss


class Incoming(NamedTuple):
    """The trace context a message arrived with, after validation (None -> restart)."""

    traceparent: TraceParent | None
    tracestate: TraceState
    source: str  # "envelope" | "headers" | "none"


def _from_envelope_fields(trace_id: str, span_id: str, flags: int) -> TraceParent | None:
    """The header's version-00 rules applied to the envelope's fields (no OWS to strip)."""
    if (0 <= flags <= 0xFF and len(trace_id) == 32 and len(span_id) == 16 and _HEXLC.issuperset(trace_id)
            and _HEXLC.issuperset(span_id) and trace_id != _ZERO_TRACE and span_id != _ZERO_SPAN):
        return TraceParent("00", trace_id, span_id, flags)
    return None


def read_incoming(envelope: Envelope | None, headers: HeadersLike | None = None) -> Incoming:
    """Find the message's trace context: the envelope's observability context first (it
    travels with the data across every transport), then the Kafka/CloudEvents headers.

    An invalid context in one place is ignored, never repaired; `tracestate` is only read
    from the place whose `traceparent` was valid.
    """
    obs = envelope.observability if envelope is not None else None
    if obs is not None:
        trace_id, span_id = obs.trace_id, obs.span_id  # each read of a protobuf string builds a new str
    if obs is not None and (trace_id or span_id):
        tp = _from_envelope_fields(trace_id, span_id, obs.trace_flags)
        if tp is not None:
            ext = envelope.extensions  # type: ignore[union-attr]
            state = parse_tracestate(ext[TRACESTATE_EXTENSION]) if TRACESTATE_EXTENSION in ext else _EMPTY_STATE
            return Incoming(tp, state, "envelope")
    if headers:  # (most envelopes on Kafka carry none)
        tps, tss = header_values(headers)
        if len(tps) == 1:  # a duplicated traceparent is invalid (conformance suite)
            tp = parse_traceparent(tps[0])
            if tp is not None:
                return Incoming(tp, parse_tracestate(tss) if tss else _EMPTY_STATE, "headers")
    return _NO_INCOMING


#: "no valid incoming context" (immutable, so one instance serves every message)
_NO_INCOMING = Incoming(None, _EMPTY_STATE, "none")


def carrier_from(envelope: Envelope | None, headers: HeadersLike | None = None) -> dict[str, str]:
    """A normalized W3C carrier (`traceparent` [+ `tracestate`]) for OTel's propagator;
    empty when there is no valid incoming context, which makes OTel start a new trace."""
    inc = read_incoming(envelope, headers)
    if inc.traceparent is None:
        return {}
    carrier = {TRACEPARENT: inc.traceparent.to_header()}
    if inc.tracestate:
        carrier[TRACESTATE] = format_tracestate(inc.tracestate)
    return carrier


def trace_headers(trace_id: str, span_id: str, flags: int, tracestate: TraceState | None = None) -> list[tuple[str, bytes]]:
    """Kafka record headers for the next hop (lowercase names, as the spec asks senders)."""
    out = [(TRACEPARENT, format_traceparent(trace_id, span_id, flags).encode("ascii"))]
    if tracestate:
        out.append((TRACESTATE, format_tracestate(tracestate).encode("ascii")))
    return out


# --------------------------------------------------------------------------- envelope


class TraceContinuation(NamedTuple):
    trace_id: str
    #: The span id this hop continues from; None when the trace was (re)started here.
    parent_span_id: str | None
    flags: int


def write_envelope_context(
    envelope: Envelope, trace_id: str, span_id: str, parent_span_id: str | None, flags: int,
    tracestate: TraceState | str | None = None,
) -> None:
    """Store a (valid) trace context in the envelope; clears a stale tracestate.

    `tracestate` may be a TraceState or an already formatted, already validated header
    (what OpenTelemetry's `TraceState.to_header()` returns); only changed fields are written.
    """
    obs = envelope.ensure_observability()
    if obs.trace_id != trace_id:
        obs.trace_id = trace_id
    obs.span_id = span_id
    obs.parent_span_id = parent_span_id or ""
    obs.trace_flags = flags
    ext = envelope.extensions
    if tracestate:
        raw = (tracestate if isinstance(tracestate, str) else format_tracestate(tracestate)).encode("ascii")
        if ext.get(TRACESTATE_EXTENSION) != raw:
            ext[TRACESTATE_EXTENSION] = raw
    elif TRACESTATE_EXTENSION in ext:
        del ext[TRACESTATE_EXTENSION]


def continue_or_start(
    envelope: Envelope, headers: HeadersLike | None = None, *, sampled: bool = True,
) -> TraceContinuation:
    """Make this hop a new span of the message's trace, or start a new trace.

    Reads the envelope's observability context (or, failing that, the `traceparent`/
    `tracestate` headers), generates a new span id and writes it into the envelope: the
    previous span id becomes `parent_span_id`. An absent or invalid context restarts the
    trace (new random trace id, `random-trace-id` flag set, `sampled` as asked, tracestate
    cleared, as the spec's "Restart trace" mutation says). Never raises on bad input.
    """
    inc = read_incoming(envelope, headers)
    if inc.traceparent is not None:
        trace_id = inc.traceparent.trace_id
        parent: str | None = inc.traceparent.parent_id
        flags = inc.traceparent.propagated_flags()
        state = inc.tracestate
        span_id = new_span_id()
    else:
        trace_id, span_id = new_trace_and_span_id()
        parent, state = None, _EMPTY_STATE  # immutable: one shared empty state
        flags = FLAG_RANDOM | (FLAG_SAMPLED if sampled else 0)
    write_envelope_context(envelope, trace_id, span_id, parent, flags, state)
    return TraceContinuation(trace_id, parent, flags)
