"""Envelope validation: required fields (memo-031 "Field Presence Semantics") and sanity
of metadata from untrusted producers (LNMP envelope spec section 9.1).

Both return *every* problem at once, each with its field path, because a producer fixing
one field per round-trip through a DLQ is a miserable experience.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from ..errors import FieldProblem, ValidationError
from .model import Envelope

_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX16 = re.compile(r"[0-9a-f]{16}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
CLASSIFICATIONS = frozenset({"public", "internal", "confidential", "restricted"})


def has_control_characters(text: str) -> bool:
    """The sanity rule for producer strings; `isprintable()` first answers the usual text."""
    return not text.isprintable() and _CONTROL.search(text) is not None


def text_problem(text: object, longest: int) -> str | None:
    """Why `text` cannot be a producer string of an envelope: not a str, over `longest`
    characters, a control character (the sanity rule), or not encodable as UTF-8 (a lone
    surrogate, which protobuf refuses at serialization); None when it can. The SDK's publish
    options and its audit records ask this before a broker is involved."""
    if not isinstance(text, str):
        return f"must be a str, got {type(text).__name__}"
    if len(text) > longest:
        return f"is {len(text)} characters, over {longest}"
    if has_control_characters(text):
        return "contains control characters"
    try:
        text.encode()
    except UnicodeEncodeError:
        return "is not valid Unicode text (a lone surrogate)"
    return None


def required_problems(env: Envelope) -> list[FieldProblem]:
    """Problems that make an envelope unusable anywhere (missing ids, payload, ...)."""
    p: list[FieldProblem] = []
    h = env.header  # the contexts read straight off the header: this runs on every message
    # An absent context reads as its empty default (reading never sets it), so a presence test
    # (~60 ns each) is made only where a value cannot answer: a message id implies metadata, a
    # priority out of 0-10 or a classification that is not empty implies the field is set.
    md = h.metadata
    message_id = md.message_id
    if not message_id and not h.HasField("metadata"):
        p.append(FieldProblem("metadata", "is required but absent"))
    if not message_id:
        p.append(FieldProblem("metadata.message_id", "is required (a UUIDv7 string)"))
    if not md.topic:
        p.append(FieldProblem("metadata.topic", "is required"))
    if not md.namespace:
        p.append(FieldProblem("metadata.namespace", "is required"))
    if md.published_at_ms <= 0:
        p.append(FieldProblem("metadata.published_at_ms", "is required (Unix epoch milliseconds > 0)"))
    if not 0 <= md.priority <= 10:  # absent reads 0
        p.append(FieldProblem("metadata.priority", f"must be 0-10, got {md.priority}"))
    if md.ttl_seconds < 0:
        p.append(FieldProblem("metadata.ttl_seconds", f"must be >= 0, got {md.ttl_seconds}"))
    if not env.payload.present:
        p.append(FieldProblem("payload", "is required but absent"))
    sec = h.security  # absent: every field below reads empty and unset
    classification = sec.data_classification
    if classification not in CLASSIFICATIONS and (classification or sec.HasField("data_classification")):
        p.append(FieldProblem("security.data_classification",
                              f"must be one of {sorted(CLASSIFICATIONS)}, got {classification!r}"))
    if not sec.signature_algorithm and sec.HasField("signature"):
        p.append(FieldProblem("security.signature_algorithm", "is required when a signature is present"))
    if sec.HasField("encryption"):
        enc = sec.encryption
        if not enc.key_id:
            p.append(FieldProblem("security.encryption.key_id", "is required for an encrypted payload"))
        if not enc.algorithm:
            p.append(FieldProblem("security.encryption.algorithm", "is required for an encrypted payload"))
    if h.HasField("observability"):
        obs = h.observability
        if obs.trace_id and not _HEX32.fullmatch(obs.trace_id):
            p.append(FieldProblem("observability.trace_id", "must be 32 lowercase hex characters (W3C)"))
        if obs.span_id and not _HEX16.fullmatch(obs.span_id):
            p.append(FieldProblem("observability.span_id", "must be 16 lowercase hex characters (W3C)"))
        if obs.parent_span_id and not _HEX16.fullmatch(obs.parent_span_id):
            p.append(FieldProblem("observability.parent_span_id", "must be 16 lowercase hex characters (W3C)"))
    return p


def validate(env: Envelope) -> None:
    """Raise `ValidationError` listing every required-field problem; return None if valid."""
    problems = required_problems(env)
    if problems:
        raise ValidationError(problems)


@dataclass(frozen=True, slots=True)
class SanityPolicy:
    """Limits for metadata written by producers Prism does not trust (LNMP section 9.1)."""

    max_future_skew_ms: int = 5 * 60 * 1000      # published_at more than 5 min ahead is rejected
    max_age_ms: int = 365 * 24 * 3600 * 1000      # older than a year is unrealistic for a live stream
    max_id_length: int = 128                      # message_id, correlation_id, causality_parent
    max_name_length: int = 249                    # topic (Kafka's own limit) and namespace
    max_label_count: int = 64
    max_label_length: int = 256


_ID_FIELDS = ("message_id", "correlation_id", "causality_parent")
_NAME_FIELDS = ("topic", "namespace")
_WHO_FIELDS = ("publisher_id", "publisher_team")


def _string_problems(ids: tuple[str, ...], names: tuple[str, ...], who: tuple[str, ...],
                     policy: SanityPolicy) -> list[FieldProblem]:
    """`sanity_problems`' findings on the metadata ids/names and the publisher strings, field by field."""
    p: list[FieldProblem] = []
    for name, val in zip(_ID_FIELDS, ids, strict=True):
        if len(val) > policy.max_id_length:
            p.append(FieldProblem(f"metadata.{name}", f"is {len(val)} chars, over {policy.max_id_length}"))
        if _CONTROL.search(val):
            p.append(FieldProblem(f"metadata.{name}", "contains control characters"))
    for name, val in zip(_NAME_FIELDS, names, strict=True):
        if len(val) > policy.max_name_length:
            p.append(FieldProblem(f"metadata.{name}", f"is {len(val)} chars, over {policy.max_name_length}"))
        if _CONTROL.search(val):
            p.append(FieldProblem(f"metadata.{name}", "contains control characters"))
    for name, val in zip(_WHO_FIELDS, who, strict=False):  # `who` is empty without a security context
        if _CONTROL.search(val):
            p.append(FieldProblem(f"security.{name}", "contains control characters"))
    return p


def sanity_problems(env: Envelope, *, now_ms: int | None = None,
                    policy: SanityPolicy = SanityPolicy()) -> list[FieldProblem]:
    """Future timestamps, over-long ids and control characters in producer metadata."""
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    h = env.header
    md = h.metadata
    p: list[FieldProblem] = []
    published = md.published_at_ms
    if published > now + policy.max_future_skew_ms:
        p.append(FieldProblem("metadata.published_at_ms",
                              f"is {(published - now) // 1000}s in the future "
                              f"(allowed skew {policy.max_future_skew_ms // 1000}s)"))
    elif 0 < published < now - policy.max_age_ms:
        p.append(FieldProblem("metadata.published_at_ms", "is unrealistically old"))
    ids = mid, cid, cause = (md.message_id, md.correlation_id, md.causality_parent)
    names = topic, namespace = (md.topic, md.namespace)
    sec = h.security if h.HasField("security") else None
    who = (sec.publisher_id, sec.publisher_team) if sec is not None else ()
    # Five length tests and one control-character test over all the strings (a control
    # character is one character: joining cannot make or hide one) find the usual "no
    # problem" at once; only then are the fields named one by one. The lengths are compared
    # one by one, not by `max(map(len, ...))` (~0.25 µs less), and the joined text is first
    # asked `isprintable()`: every control character is unprintable, so a printable text has
    # none and the regex search (~0.2 µs more on a valid message's ~70 characters) is left
    # for a text with some unprintable character, which it then judges as before.
    id_max, name_max = policy.max_id_length, policy.max_name_length
    joined = "".join((*ids, *names, *who))
    if (len(mid) > id_max or len(cid) > id_max or len(cause) > id_max or len(topic) > name_max
            or len(namespace) > name_max or (not joined.isprintable() and _CONTROL.search(joined))):
        p += _string_problems(ids, names, who, policy)
    obs = h.observability if h.HasField("observability") else None
    labels = obs.labels if obs is not None else None
    if labels:
        if len(labels) > policy.max_label_count:
            p.append(FieldProblem("observability.labels", f"has {len(labels)} entries, over {policy.max_label_count}"))
        for k, v in labels.items():
            if len(k) + len(v) > policy.max_label_length or _CONTROL.search(k) or _CONTROL.search(v):
                p.append(FieldProblem(f"observability.labels[{k[:32]!r}]", "is too long or has control characters"))
    return p
