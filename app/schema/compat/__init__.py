"""Schema compatibility checker: Protobuf, JSON Schema and Avro under Confluent's modes.

Usage::

    from app.schema.compat import check
    result = check(SchemaFormat.PROTOBUF, new_text, [v1_text, v2_text], "BACKWARD")
    result.is_compatible, result.findings

``previous`` is ordered oldest -> newest. Non-transitive modes compare with the latest
only; ``*_TRANSITIVE`` modes compare with every earlier version (a v1 -> v3 problem that
v2 hid is caught). Under NONE every change is reported as a warning and nothing breaks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from app.schema.compat import avro as _avro
from app.schema.compat import jsonschema as _json
from app.schema.compat import protobuf as _proto
from app.schema.compat.base import Change
from app.schema.model import CompatibilityMode, CompatResult, Finding, SchemaFormat, Severity
from app.schema.protoparse import ProtoSchema, compile_proto

__all__ = ["Change", "CheckOptions", "check", "diff", "parse_schema"]


@dataclass(frozen=True)
class CheckOptions:
    """Knobs that change rule strictness (see each module's docstring for why they exist)."""

    implicit_presence_is_required: bool = True  # RFC-030: proto3 field without `optional` = required
    proto_imports: Mapping[str, str] = field(default_factory=dict)
    proto_filename: str = "schema.proto"


def parse_schema(fmt: SchemaFormat | str, text: str | ProtoSchema, options: CheckOptions | None = None) -> object:
    """Parse (and thereby validate) a schema; raises SchemaError with a readable message."""
    fmt = SchemaFormat.parse(fmt)
    opts = options or CheckOptions()
    if isinstance(text, ProtoSchema):  # already compiled (with its references' imports)
        return text
    if fmt is SchemaFormat.PROTOBUF:
        return compile_proto(text, opts.proto_filename, opts.proto_imports)
    if fmt is SchemaFormat.AVRO:
        return _avro.parse(text)
    return _json.parse(text)


def diff(fmt: SchemaFormat | str, old: str | ProtoSchema, new: str | ProtoSchema,
         options: CheckOptions | None = None) -> list[Change]:
    """Direction-annotated changes from ``old`` to ``new`` (mode-independent)."""
    fmt = SchemaFormat.parse(fmt)
    opts = options or CheckOptions()
    if fmt is SchemaFormat.PROTOBUF:
        o = old if isinstance(old, ProtoSchema) else compile_proto(old, opts.proto_filename, opts.proto_imports)
        n = new if isinstance(new, ProtoSchema) else compile_proto(new, opts.proto_filename, opts.proto_imports)
        return _proto.diff(o, n, implicit_presence_is_required=opts.implicit_presence_is_required)
    assert isinstance(old, str) and isinstance(new, str)
    if fmt is SchemaFormat.AVRO:
        return _avro.diff(old, new)
    return _json.diff(old, new)


def _findings(changes: Sequence[Change], mode: CompatibilityMode, against: str | None) -> list[Finding]:
    out = []
    for c in changes:
        breaking = mode is not CompatibilityMode.NONE and (
            (mode.checks_backward and c.breaks_backward) or (mode.checks_forward and c.breaks_forward)
        )
        reason = c.reason
        if not breaking and (c.breaks_backward or c.breaks_forward) and mode is not CompatibilityMode.NONE:
            which = "BACKWARD" if c.breaks_backward else "FORWARD"
            reason = f"{reason} (would break {which})"
        out.append(Finding(Severity.BREAKING if breaking else Severity.WARNING, c.path, c.rule, reason,
                           c.hint, against))
    return out


def check(
    fmt: SchemaFormat | str,
    new: str | ProtoSchema,
    previous: Sequence[str] | Sequence[tuple[str, str]] | Sequence[tuple[str, str | ProtoSchema]],
    mode: CompatibilityMode | str = CompatibilityMode.BACKWARD,
    options: CheckOptions | None = None,
) -> CompatResult:
    """Check ``new`` against ``previous`` versions (oldest first) under ``mode``.

    ``previous`` items may be plain schema texts or ``(label, text)`` pairs; the label
    (e.g. ``"v2"``) is recorded in each finding's ``against``. Protobuf schemas may also be
    given compiled (:class:`ProtoSchema`): the registry does that for schemas with
    references, because each version may import different referenced files.
    """
    mode = CompatibilityMode.parse(mode)
    fmt = SchemaFormat.parse(fmt)
    parse_schema(fmt, new, options)  # a new schema that does not parse is an error, even under NONE
    labelled: list[tuple[str | None, str | ProtoSchema]] = [
        (p[0], p[1]) if isinstance(p, tuple) else (None, p) for p in previous
    ]
    if not labelled:
        return CompatResult(mode, ())
    targets = labelled if mode.transitive else labelled[-1:]
    findings: list[Finding] = []
    seen: set[tuple[str, str, str, str | None]] = set()
    for label, text in reversed(targets):  # newest first: the most relevant findings lead
        for f in _findings(diff(fmt, text, new, options), mode, label):
            key = (f.severity, f.path, f.rule, f.reason)
            if key in seen:
                continue
            seen.add(key)
            findings.append(f)
    findings.sort(key=lambda f: (f.severity is not Severity.BREAKING,))
    return CompatResult(mode, tuple(findings))
