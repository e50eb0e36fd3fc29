"""Which shape is this message, and what envelope does it make?

`detect` looks at a message's value and headers and names its shape; `normalize` turns a
message of any shape into a valid `Envelope` (a Prism envelope is passed on as sent: its
required-field problems are the validate stage's to report). Precedence, first match wins - declarations by
the transport before guesses from the bytes, specific before generic:

 1. CLOUDEVENT_STRUCTURED  `content-type` header starts with `application/cloudevents`
 2. CLOUDEVENT_BINARY      any `ce_` header (CloudEvents Kafka binding, binary mode)
 3. PRISM_DRAFT/REVIEWED   the value decodes as an envelope with no required-field problem, or
                           `prism-*` binding headers (other than `prism-auth-token`) say it is one
 4. LNMP_BINARY            the value starts with an LNMP container header (magic, version 1,
                           known mode), or LNMP transport headers / an LNMP content type come
                           with a value that is not UTF-8 text
 5. LNMP_TEXT              the value starts with an `#ENVELOPE` line, or LNMP transport headers /
                           a text/lnmp content type come with UTF-8 text
 6. NATS_HEADERS           a `Nats-*` header or a NATS-style `X-…` metadata header
 7. KAFKA_HEADERS          a Kafka legacy metadata header (`correlation-id`, `schema-id` …)
 8. REDIS_JSON             the value is a JSON object of exactly `payload` and optional `meta`
 9. LNMP_TEXT              UTF-8 text whose every non-comment line is an LNMP field (`F12=…`)
10. RAW                    anything else: the payload is the bytes

Why this order: a CloudEvent may legitimately carry a Prism envelope as its data, so the
CloudEvents declaration wins over the bytes; a valid envelope is near-certain evidence (random
bytes, JSON and text all fail `decode` or `required_problems`), so it is checked before the
weaker signals; header shapes come before value sniffing because Redis (the only JSON-wrapper
shape) has no headers at all. Detection never raises: a message that claims a shape but is
malformed is detected as that shape and `normalize` raises a precise `FormatError` for it.
"""

from __future__ import annotations

import contextlib
import enum
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from google.protobuf.message import Message

from .._gen.prism.envelope.draft import envelope_pb2 as dpb
from .._gen.prism.envelope.v1 import envelope_pb2 as vpb
from ..envelope.codec import (
    DEFAULT_LIMITS,
    Layout,
    Limits,
    decode,
    decode_records,
    detect_layout,
    layout_of_records,
    scan_records,
)
from ..envelope.model import Envelope, set_content_type
from ..envelope.validation import required_problems
from ..envelope.wire import read_varint, scan
from ..errors import (
    AmbiguousMapEntryError,
    CloudEventError,
    EnvelopeError,
    FormatError,
    LnmpError,
    PrismShapeError,
    SizeLimitError,
)
from . import cloudevents as ce
from . import legacy, lnmp, lnmp_bindings
from . import lnmp_envelope as lnmp_env
from ._fields import AUTH_HEADERS, finalize, header_pairs, set_auth_token, take_auth_token

Headers = Sequence[tuple[str, bytes | str]]


class InputShape(enum.StrEnum):
    PRISM_REVIEWED = "prism-reviewed"
    PRISM_DRAFT = "prism-draft"
    CLOUDEVENT_BINARY = "cloudevent-binary"
    CLOUDEVENT_STRUCTURED = "cloudevent-structured"
    KAFKA_HEADERS = "kafka-headers"
    NATS_HEADERS = "nats-headers"
    REDIS_JSON = "redis-json"
    LNMP_BINARY = "lnmp-binary"
    LNMP_TEXT = "lnmp-text"
    RAW = "raw"


Records = list[tuple[int, int, int, int, int]]


@dataclass(slots=True)
class NormalizeResult:
    envelope: Envelope
    shape: InputShape
    #: What normalization had to do or could not do (ids generated, values kept verbatim in
    #: extensions, headers dropped). Never contains secret values.
    notes: list[str] = field(default_factory=list)
    #: Set only when the value decoded as an envelope with no required-field problem: its
    #: top-level records (`wire.scan` of the value) and their layout, so that signature
    #: verification reuses this walk instead of repeating it, and validate knows the
    #: required fields were already checked (`required_problems` found none).
    records: Records | None = None
    layout: Layout | None = None


#: `prism-*` header names that mark the value as a Prism envelope (the Kafka binding's names;
#: NATS spells them `Prism-…`, which compares equal case-insensitively).
PRISM_HINT_PREFIX = "prism-"
#: prism-* headers that say nothing about the value's shape: a token, and the DLQ attestation
#: (app/security/attestation.py) that a replayed record of any shape carries.
PRISM_NON_HINTS = frozenset({"prism-auth-token", "prism-dlq-attestation"})
_LNMP_FIELD_LINE = re.compile(r"[ \t]*F[0-9]{1,5}(?::(?:ra|sa|i|f|b|s|r))?[ \t]*=")
_NO_NAMES: frozenset[str] = frozenset()
_LAYOUT_OF = {InputShape.PRISM_DRAFT: Layout.DRAFT, InputShape.PRISM_REVIEWED: Layout.REVIEWED}
# Module-level names for the members the per-message paths test (an EnumType attribute
# lookup costs ~80 ns on CPython 3.11; a frozenset test ~40 ns where a tuple of members ~200 ns).
_PRISM_DRAFT, _PRISM_REVIEWED, _DRAFT = InputShape.PRISM_DRAFT, InputShape.PRISM_REVIEWED, Layout.DRAFT
_PRISM_SHAPES = frozenset({_PRISM_DRAFT, _PRISM_REVIEWED})
_NATS_MARKERS = frozenset(n for n in legacy.NATS_HEADERS)
_KAFKA_MARKERS = frozenset(legacy.KAFKA_HEADERS)
_CE_PREFIX = ce.CE_PREFIX
#: The binding headers `_prism` checks against a Prism envelope, in the order it checks them.
_CROSS_CHECKED = ("prism-message-id", "prism-topic", "prism-namespace")
#: Every header name `_prism` reads: an envelope whose headers have none of them (a live
#: producer's tracing and application headers) has nothing to cross-check and no token to take.
_PRISM_READS = frozenset(_CROSS_CHECKED) | AUTH_HEADERS


def _prism_hints(names: set[str]) -> bool:
    return any(n.startswith(PRISM_HINT_PREFIX) and n not in PRISM_NON_HINTS for n in names)


def _content_type(pairs: list[tuple[str, bytes]]) -> str:
    for name, value in pairs:
        if name == "content-type":
            return value.decode("latin-1").split(";", 1)[0].strip().lower()
    return ""


def _valid_envelope(value: bytes, limits: Limits, dropped: list[str]) -> tuple[Envelope, Layout, Records] | None:
    """The envelope, its layout and its records when `value` decodes with no required-field problem.

    What `decode(value, dropped=...)` does, step by step, so that the scanned records and the
    layout detected from them are kept: the caller (and the signature check after it) needs
    them, and would otherwise scan the bytes again.
    """
    found: list[str] = []
    try:
        if len(value) > limits.max_message_bytes:
            return None  # decode's SizeLimitError, an EnvelopeError like the rest
        view = memoryview(value)
        records = scan_records(view, None, limits)
        layout = layout_of_records(records)
        env = decode_records(view, records, layout, limits, found)
    except EnvelopeError:
        return None
    if required_problems(env):
        return None
    dropped += found
    return env, layout, records


def _envelope_prefix(value: bytes) -> bool:
    """True when the value *starts* like a Prism envelope: its leading metadata record is a
    complete, well-formed metadata block with a message id and a topic.

    Such bytes are a broken envelope (truncated, corrupted further on, a string field that is
    not UTF-8), not opaque raw data: they are rejected with a precise error instead of being
    forwarded as a RAW payload, which would also forward anything inside them (an auth token,
    say) verbatim. The block is checked as records (tags and lengths), not parsed as a protobuf
    message: a parse also validates UTF-8, and an envelope whose namespace is broken UTF-8 came
    out as raw bytes (an outside attack pass found it). Random bytes pass this test with
    negligible probability.
    """
    try:
        key, pos = read_varint(value, 0, len(value))
        md_class: type[Message] = vpb.PrismMetadata
        if key == 0x08:  # draft: envelope_version varint, then metadata as field 2
            version, pos = read_varint(value, pos, len(value))
            key, pos = read_varint(value, pos, len(value))
            if version != 1 or key != 0x12:
                return False
            md_class = dpb.PrismMetadata
        elif key != 0x0A:
            return False
        length, pos = read_varint(value, pos, len(value))
        if pos + length > len(value):
            return False
        fields = md_class.DESCRIPTOR.fields_by_name
        wanted = {fields["message_id"].number, fields["topic"].number}
        present = {f for f, wire_type, _, value_start, end in scan(value, pos, pos + length)
                   if f in wanted and wire_type == 2 and end > value_start}
    except EnvelopeError:
        return False
    return present == wanted


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _is_lnmp_text_record(value: bytes) -> bool:
    """Every non-empty, non-comment line starts with an LNMP field assignment."""
    if not value or len(value) > 1 << 20 or not _is_utf8(value):
        return False
    seen = False
    for line in value.decode("utf-8").splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if not _LNMP_FIELD_LINE.match(line):
            return False
        seen = True
    return seen


def _detect(value: bytes, pairs: list[tuple[str, bytes]], limits: Limits = DEFAULT_LIMITS,
            dropped: list[str] | None = None) -> tuple[InputShape, Envelope | None, Records | None]:
    """(shape, envelope, records): the last two only for a valid envelope (`_valid_envelope`)."""
    if pairs:  # a live producer's records nearly always carry headers: ~0.15 µs saved below
        names = {n for n, _ in pairs}
        ct = _content_type(pairs) if "content-type" in names else ""
        if ct.startswith(ce.STRUCTURED_PREFIX):
            return InputShape.CLOUDEVENT_STRUCTURED, None, None
        for n in names:  # a loop, not any(<generator>): no generator frame per message
            if n.startswith(_CE_PREFIX):
                return InputShape.CLOUDEVENT_BINARY, None, None
    else:  # the usual envelope on Kafka: no header can declare anything
        names, ct = _NO_NAMES, ""
    valid = _valid_envelope(value, limits, dropped if dropped is not None else []) if value else None
    if valid is not None:
        env, layout, records = valid
        return (_PRISM_DRAFT if layout is _DRAFT else _PRISM_REVIEWED), env, records
    if _prism_hints(names) or _envelope_prefix(value):
        env, layout = None, Layout.REVIEWED
        with contextlib.suppress(EnvelopeError):
            layout = detect_layout(value)
        return (InputShape.PRISM_DRAFT if layout is Layout.DRAFT else InputShape.PRISM_REVIEWED), env, None
    lnmp_hint = lnmp_bindings.has_lnmp_headers(names) or ct in lnmp_env.BINARY_CONTENT_TYPES \
        or ct in lnmp_env.TEXT_CONTENT_TYPES
    if lnmp.is_container(value):
        return InputShape.LNMP_BINARY, None, None
    if lnmp.has_text_header(value):
        return InputShape.LNMP_TEXT, None, None
    if lnmp_hint:
        if ct in lnmp_env.BINARY_CONTENT_TYPES or not _is_utf8(value):
            return InputShape.LNMP_BINARY, None, None
        return InputShape.LNMP_TEXT, None, None
    if any(n.startswith("nats-") for n in names) or names & _NATS_MARKERS:
        return InputShape.NATS_HEADERS, None, None
    if names & _KAFKA_MARKERS:
        return InputShape.KAFKA_HEADERS, None, None
    if legacy.looks_like_redis_json(value):
        return InputShape.REDIS_JSON, None, None
    if _is_lnmp_text_record(value):
        return InputShape.LNMP_TEXT, None, None
    return InputShape.RAW, None, None


def detect(value: bytes | bytearray | memoryview, headers: Headers | None = None) -> InputShape:
    """The shape of one message (see the module docstring for the precedence). Never raises."""
    return _detect(bytes(value), header_pairs(headers))[0]


def normalize(
    value: bytes | bytearray | memoryview,
    headers: Headers | None = None,
    *,
    topic: str,
    namespace: str,
    default_content_type: str | None = None,
    now_ms: int | None = None,
    key: bytes | None = None,
    strict: bool = True,
    limits: Limits = DEFAULT_LIMITS,
    id_seed: bytes | Callable[[], bytes] | None = None,
) -> NormalizeResult:
    """Turn a message of any shape into a valid envelope.

    Keeps producer ids, timestamps and trace ids; generates a UUIDv7 id and uses `now_ms` (or
    the clock) only when the input has none; `topic`/`namespace` come from the transport unless
    the input is a Prism envelope, which carries its own. The payload is always the producer's
    bytes. An auth token found anywhere (an `Authorization: Bearer` or `prism-auth-token`
    header, Redis `meta.auth_token`) ends up in `security.auth_token` and nowhere else.
    `key` is the Kafka record key (the CloudEvents `partitionkey`). `strict=False` applies the
    LNMP loose mode (a malformed LNMP envelope is ignored, the record kept). `id_seed` makes a
    generated message id deterministic (see `app.envelope.ids.uuid7_from_seed`); a callable
    giving it is called only for the shapes that may need one (not for a Prism envelope, which
    carries its own id): the worker's seed is then not formatted for every record.

    Raises a `FormatError` subclass for malformed input, `SizeLimitError` for oversized input.
    """
    size = len(value)
    if size > limits.max_message_bytes:
        raise SizeLimitError(f"message is {size} bytes, over the {limits.max_message_bytes}-byte limit",
                             hint="raise Limits.max_message_bytes or have the producer split the message")
    # `bytes(b)` of a bytes object is that object, but through the type call (~60 ns): the
    # worker's values are always bytes (issue 29)
    data = value if type(value) is bytes else bytes(value)
    pairs = header_pairs(headers) if headers else []
    dropped: list[str] = []
    shape, env, records = _detect(data, pairs, limits, dropped)
    notes: list[str] = [f"dropped converting the draft layout: {d}" for d in dropped] if dropped else []
    error: type[FormatError] = FormatError

    if shape in _PRISM_SHAPES:
        if env is None or pairs:  # else `_prism` has nothing to do (the usual envelope on Kafka)
            env = _prism(data, pairs, env, notes, limits)
        if records is not None:
            return NormalizeResult(env, shape, notes, records, _LAYOUT_OF[shape])
        return NormalizeResult(env, shape, notes)
    elif shape is InputShape.CLOUDEVENT_STRUCTURED:
        error = CloudEventError
        d = ce.from_kafka_structured(data, pairs, key, topic=topic, namespace=namespace, now_ms=now_ms)
        env, notes = d.envelope, d.notes
    elif shape is InputShape.CLOUDEVENT_BINARY:
        error = CloudEventError
        d = ce.from_kafka_binary(data, pairs, key, topic=topic, namespace=namespace, now_ms=now_ms)
        env, notes = d.envelope, d.notes
    elif shape in (InputShape.LNMP_BINARY, InputShape.LNMP_TEXT):
        error = LnmpError
        env = _lnmp(data, pairs, notes, strict)
    else:
        error = legacy.LegacyFormatError
        if shape is InputShape.REDIS_JSON:
            decoded = legacy.from_redis_json(data)
            auth = take_auth_token(pairs)
            notes += auth.notes
            set_auth_token(decoded.envelope, auth.token, notes, "headers")
        elif shape is InputShape.NATS_HEADERS:
            decoded = legacy.from_nats_headers(data, pairs)
        elif shape is InputShape.KAFKA_HEADERS:
            decoded = legacy.from_kafka_headers(data, pairs)
        else:
            decoded = legacy.from_raw(data, pairs)
        env = decoded.envelope
        notes += decoded.notes
    assert env is not None
    if shape not in _PRISM_SHAPES:
        # Legacy shapes carry no ids/timestamps of their own: fill them in. A Prism envelope
        # is the producer's promise of complete metadata; one that breaks it is rejected by
        # the validate stage (memo-031 "missing required fields"), never silently patched.
        finalize(env, topic=topic, namespace=namespace, default_content_type=default_content_type,
                 now_ms=now_ms, notes=notes, error=error, id_seed=id_seed() if callable(id_seed) else id_seed)
    return NormalizeResult(env, shape, notes)


def _prism(data: bytes, pairs: list[tuple[str, bytes]], env: Envelope | None, notes: list[str],
           limits: Limits) -> Envelope:
    if env is None:  # detected by prism-* headers alone: decode to say precisely what is wrong
        dropped: list[str] = []
        try:
            env = decode(data, limits=limits, dropped=dropped)
        except (SizeLimitError, AmbiguousMapEntryError):
            raise  # reasons of their own in the DLQ: not "corrupted bytes"
        except EnvelopeError as exc:
            raise PrismShapeError(f"value looks like a Prism envelope (prism-* headers or a leading metadata "
                                  f"block) but does not decode: {exc.message}",
                                  path=exc.path or "value",
                                  hint=f"{exc.hint + '; ' if exc.hint else ''}the producer sent truncated or "
                                       "corrupted envelope bytes: re-send the complete envelope, encoded "
                                       "by a Prism SDK") from None
        notes += [f"dropped converting the draft layout: {d}" for d in dropped]
    # Nothing to cross-check, no token to take: the usual envelope on Kafka has no headers, a
    # live producer's has only its own (~1.2 µs per message for the checks that find nothing).
    # A loop, not any(<generator>): ~60 against ~150 ns for one header.
    for name, _ in pairs:
        if name in _PRISM_READS:
            break
    else:
        return env
    found = {n: v for n, v in pairs}
    for header, actual in zip(_CROSS_CHECKED, (env.message_id, env.topic, env.namespace), strict=True):
        claimed = found.get(header)
        if claimed is not None and actual and claimed.decode("utf-8", errors="replace") != actual:
            raise PrismShapeError(f"header {header} disagrees with the envelope", path=f"header {header}",
                                  hint="headers and envelope must come from one encode()")
    auth = take_auth_token(pairs)
    notes += auth.notes
    set_auth_token(env, auth.token, notes, "headers")
    return env


def _lnmp(data: bytes, pairs: list[tuple[str, bytes]], notes: list[str], strict: bool) -> Envelope:
    transport = lnmp_bindings.from_any_headers(pairs, strict=strict, notes=notes) if pairs else None
    mapped = lnmp_env.decode_message(data, strict=strict, transport=transport)
    notes += mapped.notes
    auth = take_auth_token(pairs)
    notes += auth.notes
    set_auth_token(mapped.envelope, auth.token, notes, "headers")
    ct = _content_type(pairs)
    if ct in lnmp_env.TEXT_CONTENT_TYPES | lnmp_env.BINARY_CONTENT_TYPES and not lnmp.is_container(data):
        set_content_type(mapped.envelope.metadata, ct)
    return mapped.envelope
