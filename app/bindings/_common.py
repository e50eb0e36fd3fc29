"""What every backend binding shares: the duplicated-metadata headers, their cross-check on
decode, the merge with caller-supplied headers, and a header-safe text encoding.

Why duplicate metadata outside the envelope at all (RFC-031 "Why Duplicate Metadata in
Headers")? Broker tools, routers and non-Prism consumers can read headers without parsing
protobuf. The price is that two copies can disagree, so every `decode` checks each copy it
finds against the envelope and refuses a record whose copies disagree (`BindingError`):
a consumer that routes by header and one that routes by envelope must never see different
messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import quote, unquote

from ..envelope.codec import DEFAULT_LIMITS, Layout, Limits, decode, detect_layout
from ..envelope.model import Envelope, get_content_type
from ..errors import BindingError, SizeLimitError
from ..security.signing import VerificationKeys, verify

#: RFC-031 `prism-envelope-version` value; sent with the draft layout only (the reviewed
#: layout has no version field, memo-031 Recommendation 4).
DRAFT_ENVELOPE_VERSION = "1"

# Logical header names; each binding spells them its own way (Kafka `prism-message-id`,
# NATS `Prism-Message-ID`, S3 metadata `prism-message-id`, Redis stream field `message_id`).
ENVELOPE_VERSION = "envelope-version"
ENVELOPE_LAYOUT = "envelope-layout"
MESSAGE_ID = "message-id"
TOPIC = "topic"
NAMESPACE = "namespace"
TRACE_ID = "trace-id"
CONTENT_TYPE = "content-type"


V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class HeaderField:
    """One duplicated metadata field: its logical name and how to read it from an envelope."""

    name: str
    path: str
    read: Callable[[Envelope], str]


def _trace_id(env: Envelope) -> str:
    obs = env.observability
    return obs.trace_id if obs is not None else ""


#: The envelope fields that bindings duplicate, in emission order. A field whose value is
#: empty is not emitted (an empty header says nothing a missing one does not).
FIELDS: tuple[HeaderField, ...] = (
    HeaderField(MESSAGE_ID, "metadata.message_id", lambda e: e.message_id),
    HeaderField(TOPIC, "metadata.topic", lambda e: e.topic),
    HeaderField(NAMESPACE, "metadata.namespace", lambda e: e.namespace),
    HeaderField(TRACE_ID, "observability.trace_id", _trace_id),
    HeaderField(CONTENT_TYPE, "metadata.content_type", lambda e: e.content_type),
)


_FIELD_NAMES = tuple(f.name for f in FIELDS)
# `field_values` reads the fields in this order; a change to FIELDS must change it too.
assert _FIELD_NAMES == (MESSAGE_ID, TOPIC, NAMESPACE, TRACE_ID, CONTENT_TYPE), _FIELD_NAMES


def field_values(env: Envelope) -> tuple[str, str, str, str, str]:
    """`tuple(f.read(env) for f in FIELDS)`, read straight from the protobuf header: this runs
    for every message a binding encodes (every SDK publish), where the generic loop over
    the `read` callables and `Envelope` properties cost a few µs."""
    header = env.header
    md = header.metadata
    trace_id = header.observability.trace_id if header.HasField("observability") else ""
    return md.message_id, md.topic, md.namespace, trace_id, get_content_type(md)


def metadata_values(env: Envelope, layout: Layout) -> list[tuple[str, str]]:
    """(logical name, value) pairs a binding emits for `env` in `layout`."""
    out = layout_values(layout)
    for name, value in zip(_FIELD_NAMES, field_values(env), strict=True):
        if value:
            out.append((name, value))
    return out


def layout_values(layout: Layout) -> list[tuple[str, str]]:
    """The (logical name, value) pairs that depend on the layout alone (version, layout): the
    first entries of `metadata_values`, which bindings may precompute once per layout."""
    if layout is Layout.DRAFT:
        return [(ENVELOPE_VERSION, DRAFT_ENVELOPE_VERSION), (ENVELOPE_LAYOUT, layout.value)]
    return [(ENVELOPE_LAYOUT, layout.value)]


def layout_from_value(value: str, where: str) -> Layout:
    try:
        return Layout(value)
    except ValueError:
        raise BindingError(
            f"unknown envelope layout {value!r}",
            path=where,
            hint=f"expected one of {[lay.value for lay in Layout]}",
        ) from None


def decode_checked(
    data: bytes | bytearray | memoryview,
    found: Mapping[str, str],
    *,
    binding: str,
    spell: Callable[[str], str],
    limits: Limits = DEFAULT_LIMITS,
    verify_with: VerificationKeys | None = None,
) -> Envelope:
    """Decode envelope bytes and cross-check them against the duplicated metadata `found`
    (logical name -> value, already de-duplicated by `collect`).

    The layout comes from the layout header when present (a version header alone means the
    draft layout, the only one that has a version); otherwise it is detected from the bytes.
    The size limit is checked first, then the signature (`verify_with`), before any decoding.
    """
    if data is None or len(data) == 0:
        raise BindingError(f"{binding} message has no envelope bytes", path=f"{binding} value",
                           hint="a tombstone/empty message is not a Prism envelope")
    check_size(data, limits)
    detected = detect_layout(data, limits=limits)
    layout = detected
    if ENVELOPE_LAYOUT in found:
        layout = layout_from_value(found[ENVELOPE_LAYOUT], spell(ENVELOPE_LAYOUT))
    elif ENVELOPE_VERSION in found:
        layout = Layout.DRAFT
    if ENVELOPE_VERSION in found:
        version = found[ENVELOPE_VERSION]
        if version != DRAFT_ENVELOPE_VERSION:
            raise BindingError(f"unsupported envelope version {version!r}", path=spell(ENVELOPE_VERSION),
                               hint=f"this Prism reads envelope version {DRAFT_ENVELOPE_VERSION} (draft layout)")
        if layout is not Layout.DRAFT:
            raise BindingError("a version header was sent with the reviewed layout, which has no version",
                               path=spell(ENVELOPE_VERSION),
                               hint="send prism-envelope-version only with draft-layout envelopes")
    if detected is not layout:
        raise BindingError(
            f"headers say the {layout.value} layout but the bytes are a {detected.value}-layout envelope",
            path=spell(ENVELOPE_LAYOUT if ENVELOPE_LAYOUT in found else ENVELOPE_VERSION),
            hint="the producer set the wrong layout header, or the value was replaced without its headers",
        )
    if verify_with is not None:
        verify(data, verify_with, layout=layout, limits=limits)
    env = decode(data, layout=layout, limits=limits)
    for f in FIELDS:
        if f.name in found:
            expected = f.read(env)
            if found[f.name] != expected:
                raise BindingError(
                    f"{binding} header {spell(f.name)} is {clip(found[f.name])} but the envelope's {f.path} "
                    f"is {clip(expected)}",
                    path=spell(f.name),
                    hint="headers and envelope must come from one encode(); re-encode instead of editing headers",
                )
    return env


def clip(value: str, limit: int = 80) -> str:
    """repr() of a possibly huge, attacker-controlled value, bounded for error messages."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def check_size(data: bytes | bytearray | memoryview, limits: Limits) -> None:
    """Refuse oversized input before walking a single byte of it."""
    if len(data) > limits.max_message_bytes:
        raise SizeLimitError(
            f"envelope is {len(data)} bytes, over the {limits.max_message_bytes}-byte limit",
            hint="raise Limits.max_message_bytes or have the producer split the message",
        )


def collect(
    pairs: Iterable[tuple[str, str]],
    names: Mapping[str, str],
    *,
    binding: str,
) -> dict[str, str]:
    """Pick the duplicated-metadata headers out of `pairs` (case-insensitive names).

    `names` maps the lowercased wire name to the logical name. A name that appears twice with
    different values is refused: which one a downstream tool reads would be arbitrary.
    """
    found: dict[str, str] = {}
    for wire_name, value in pairs:
        logical = names.get(wire_name.lower())
        if logical is None:
            continue
        if logical in found and found[logical] != value:
            raise BindingError(f"{binding} header {wire_name} appears twice with different values",
                               path=wire_name, hint="send each prism header once")
        found[logical] = value
    return found


def merge_headers(
    ours: list[tuple[str, V]],
    extra: Iterable[tuple[str, V]],
    *,
    owned: Callable[[str], bool],
    binding: str,
) -> list[tuple[str, V]]:
    """Caller headers first, untouched and in order, then ours.

    Never overwrites a caller header. A caller header in the binding's own namespace
    (`owned`) must agree with what the binding emits, because a record whose header copy of
    the metadata disagrees with its envelope is refused by every `decode`; other clashes
    (`traceparent` set by tracing instrumentation, ...) are resolved in the caller's favour.
    Forward an input record's headers with `passthrough_headers` to drop stale copies first.
    """
    extra = list(extra)
    if not extra:  # the usual case when re-publishing: nothing to check or to give way to
        return list(ours)
    ours_by_name: dict[str, V] = {name.lower(): value for name, value in ours}
    taken: set[str] = set()
    for name, value in extra:
        key = name.lower()
        if owned(key) and (key not in ours_by_name or ours_by_name[key] != value):
            raise BindingError(
                f"caller header {name} conflicts with the {binding} binding's own headers",
                path=name,
                hint="drop prism headers of the input record before re-publishing "
                     "(app.bindings.<backend>.passthrough_headers)",
            )
        taken.add(key)
    return extra + [(n, v) for n, v in ours if n.lower() not in taken]


def can_clash(extra: Iterable[tuple[str, object]], *, owned: Callable[[str], bool], shared: frozenset[str]) -> bool:
    """Whether `merge_headers(ours, extra, owned=owned, ...)` can be anything but `[*extra, *ours]`.

    Why: a binding that writes one message in several layouts (Kafka's `.v2` and `.v3`) would
    otherwise run the merge once per layout, and a live producer's records nearly always carry
    headers of their own (tracing, application headers) that can never meet ours. For every
    `ours` whose names, lowercased, are all `owned` or in `shared` (the lowercase names the
    binding writes outside its own namespace, e.g. `traceparent`): when no `extra` name,
    lowercased, is owned or in `shared`, `merge_headers` raises nothing (only an owned name can
    conflict) and gives way to nothing (no `extra` name equals one of ours), so it returns
    exactly `[*extra, *ours]`. False means that, True that the caller must merge.
    """
    for name, _ in extra:
        key = name.lower()
        if key in shared or owned(key):
            return True
    return False


# --------------------------------------------------------------------------- header-safe text

# Printable ASCII except space and '%': these pass through unchanged, so ordinary ids and
# topic names look exactly as in the envelope. Everything else is percent-encoded UTF-8.
_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


def pct_encode(value: str) -> str:
    """Make a string safe for transports that only carry trimmed printable ASCII (NATS header
    values are stripped and newline-translated by clients; S3 user metadata must be US-ASCII)."""
    # Printable ASCII without space and '%' is exactly `_SAFE`, which quote() returns as it
    # is: ids, topics and MIME types take this branch, three C scans instead of quote().
    if value.isascii() and value.isprintable() and " " not in value and "%" not in value:
        return value
    return quote(value, safe=_SAFE, encoding="utf-8")


def pct_decode(value: str, where: str) -> str:
    try:
        return unquote(value, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise BindingError("header value is not percent-encoded UTF-8", path=where,
                           hint="the header was written by something other than a Prism binding") from None
