"""PII governance (RFC-030): annotations, detection of untagged PII, policy, audit.

Where tags live, per format:

- Protobuf: field options from ``prism/annotations.proto`` — ``[(prism.pii) = "email"]``,
  ``(prism.encrypt)``, ``(prism.index)`` — read from the compiled descriptors, so only tags
  that compile count (a comment saying "@prism.pii" does not).
- JSON Schema: ``"x-prism-pii": "email"`` (and ``x-prism-encrypt`` / ``x-prism-index``) on a property.
- Avro: ``"prism.pii": "email"`` (and ``prism.encrypt`` / ``prism.index``) as field attributes.

``(prism.pii) = "none"`` is the explicit opt-out for a PII-looking name that is not personal
data (``hostname``, ``product_name`` aside, e.g. a ``name`` that is a SKU label).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..envelope.compression import DEFAULT_MAX_DECOMPRESSED
from ..untrusted_json import loads_untrusted
from .model import Finding, SchemaFormat, Severity, schema_json

PII_OPTION, ENCRYPT_OPTION, INDEX_OPTION = 50430, 50431, 50432  # keep in sync with annotations.proto


class PiiPolicy(enum.StrEnum):
    """Per-namespace policy: ENFORCE rejects registration, WARN reports, OFF skips detection."""

    ENFORCE = "enforce"
    WARN = "warn"
    OFF = "off"

    @classmethod
    def parse(cls, value: str | PiiPolicy) -> PiiPolicy:
        return value if isinstance(value, PiiPolicy) else cls(value.strip().lower())


# Token rules: a field name is split into lower-case tokens (snake_case and camelCase), and
# a category matches when one of its token sequences appears. Sequences keep "name" from
# matching "file_name" while still catching "full_name" and a bare "name".
_CATEGORY_TOKENS: dict[str, list[tuple[str, ...]]] = {
    "email": [("email",), ("e", "mail"), ("mail", "address"), ("emailaddress",)],
    "phone": [("phone",), ("mobile",), ("msisdn",), ("telephone",), ("tel",), ("fax",), ("cell", "number")],
    "name": [("name",), ("first", "name"), ("last", "name"), ("full", "name"), ("given", "name"),
             ("family", "name"), ("middle", "name"), ("maiden", "name"), ("surname",), ("firstname",),
             ("lastname",), ("fullname",), ("display", "name")],
    "ssn": [("ssn",), ("social", "security"), ("national", "id"), ("passport",), ("tax", "id"), ("nino",)],
    "address": [("address",), ("street",), ("postcode",), ("zip",), ("zipcode",), ("postal", "code"),
                ("billing", "address"), ("shipping", "address")],
    "ip": [("ip",), ("ipv4",), ("ipv6",), ("ip", "address"), ("ipaddress",), ("remote", "addr"), ("client", "ip")],
    "dob": [("dob",), ("birth", "date"), ("date", "of", "birth"), ("birthday",), ("birthdate",)],
    "payment": [("credit", "card"), ("card", "number"), ("iban",), ("pan",), ("cvv",), ("account", "number")],
    "location": [("latitude",), ("longitude",), ("geo", "location"), ("gps",)],
}
# "name" on its own is PII only when the whole field is "name" or a person-name compound;
# these prefixes make it something else (file_name, topic_name...).
_NON_PERSON_NAME = {"file", "host", "topic", "product", "class", "type", "field", "table", "schema", "event",
                    "service", "app", "bucket", "key", "index", "queue", "user", "domain", "display_name_x"}
_NON_PII_ADDRESS = {"mac", "memory", "ip"}  # "ip_address" is handled by the ip category


def tokens(name: str) -> list[str]:
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return [t for t in re.split(r"[^a-zA-Z0-9]+", spaced.lower()) if t]


def detect_category(field_name: str) -> str | None:
    """PII category a field name suggests, or None. Deliberately conservative on 'name'."""
    toks = tokens(field_name)
    for category, seqs in _CATEGORY_TOKENS.items():
        for seq in seqs:
            n = len(seq)
            for i in range(len(toks) - n + 1):
                if tuple(toks[i:i + n]) != seq:
                    continue
                if seq == ("name",) and (i > 0 and toks[i - 1] in _NON_PERSON_NAME):
                    continue
                if seq == ("name",) and i > 0 and toks[i - 1] not in {"first", "last", "full", "given", "family",
                                                                      "middle", "maiden", "display", "legal",
                                                                      "customer", "person", "contact"}:
                    continue
                if seq == ("address",) and i > 0 and toks[i - 1] in _NON_PII_ADDRESS:
                    continue
                return category
    return None


@dataclass(frozen=True, slots=True)
class PiiField:
    """One field that is PII by tag or by name. ``tag`` is None when detection found it untagged."""

    path: str
    tag: str | None
    detected: str | None
    encrypt: str | None = None
    index: str | None = None
    deprecated: bool = False

    @property
    def is_pii(self) -> bool:
        if self.tag is not None:  # "none" (and "false", JSON's false) is the explicit opt-out
            return self.tag.strip().lower() not in ("none", "false")
        return self.detected is not None or self.encrypt is not None

    @property
    def untagged(self) -> bool:
        return self.tag is None and self.detected is not None


@dataclass(frozen=True)
class PiiReport:
    fields: tuple[PiiField, ...] = field(default_factory=tuple)

    @property
    def pii_fields(self) -> list[str]:
        return sorted(f.path for f in self.fields if f.is_pii)

    @property
    def untagged(self) -> list[PiiField]:
        return [f for f in self.fields if f.untagged]


# ---------------------------------------------------------------------------------------------
# Field enumeration per format: (path, name, tags{pii,encrypt,index}, deprecated)


def _proto_user_fields(schema: Any) -> Iterator[tuple[str, Any]]:
    """(path, field descriptor) of every field of every message (map entries aside) in the
    schema's own files; the path is ``Outer.Inner.field``."""
    def walk(msgs: Any, prefix: str) -> Iterator[tuple[str, Any]]:
        for m in msgs:
            if m.options.map_entry:
                continue
            for f in m.field:
                yield f"{prefix}{m.name}.{f.name}", f
            yield from walk(m.nested_type, f"{prefix}{m.name}.")

    for fd in schema.user_files():
        yield from walk(fd.message_type, "")


def _proto_fields(text: str, imports: Mapping[str, str] | None = None
                  ) -> Iterator[tuple[str, str, dict[str, str], bool]]:
    from .protoparse import compile_proto, string_options

    for path, f in _proto_user_fields(compile_proto(text, imports=imports)):
        opts = string_options(f.options, (PII_OPTION, ENCRYPT_OPTION, INDEX_OPTION))
        tags = {k: opts[n] for k, n in (("pii", PII_OPTION), ("encrypt", ENCRYPT_OPTION),
                                        ("index", INDEX_OPTION)) if n in opts}
        yield path, f.name, tags, f.options.deprecated


def _json_fields(text: str) -> Iterator[tuple[str, str, dict[str, str], bool]]:
    root = schema_json(text, "JSON Schema")

    def walk(node: Any, prefix: str, depth: int) -> Iterator[tuple[str, str, dict[str, str], bool]]:
        if not isinstance(node, dict) or depth > 32:
            return
        for name, sub in (node.get("properties") or {}).items():
            if not isinstance(sub, dict):
                continue
            tags = {k: str(sub[f"x-prism-{k}"]) for k in ("pii", "encrypt", "index") if f"x-prism-{k}" in sub}
            yield f"{prefix}{name}", name, tags, bool(sub.get("deprecated"))
            yield from walk(sub, f"{prefix}{name}.", depth + 1)
            if isinstance(sub.get("items"), dict):
                yield from walk(sub["items"], f"{prefix}{name}[].", depth + 1)
        for key in ("definitions", "$defs"):
            for dname, sub in (node.get(key) or {}).items():
                yield from walk(sub, f"{prefix}{key}.{dname}.", depth + 1)

    yield from walk(root, "", 0)


def _avro_record_fields(root: Any, descend: Callable[[dict[str, Any]], bool] = lambda f: True
                        ) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, field) of every field of every record defined inline in ``root``, in schema order;
    the walk goes into a field's type where ``descend(field)``. The path is
    ``Record.field.Inner.field``."""
    seen: set[int] = set()

    def walk(node: Any, prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
        if isinstance(node, list):
            for b in node:
                yield from walk(b, prefix)
            return
        if not isinstance(node, dict) or id(node) in seen:
            return
        seen.add(id(node))
        t = node.get("type")
        if t in ("record", "error"):
            rec = node.get("name", "")
            for f in node.get("fields", []):
                path = f"{prefix}{rec}.{f['name']}"
                yield path, f
                if descend(f):
                    yield from walk(f.get("type"), f"{path}.")
        elif t == "array":
            yield from walk(node.get("items"), prefix)
        elif t == "map":
            yield from walk(node.get("values"), prefix)
        elif isinstance(t, dict | list):
            yield from walk(t, prefix)

    yield from walk(root, "")


def avro_named_types(root: Any, kinds: tuple[str, ...] = ("record", "error", "enum", "fixed")) -> dict[str, Any]:
    """The named Avro types of ``kinds`` in ``root``, by full name and by short name (the
    names a field's type may use for them)."""
    named: dict[str, Any] = {}

    def index(node: Any, ns: str) -> None:
        if isinstance(node, list):
            for b in node:
                index(b, ns)
        elif isinstance(node, dict):
            t = node.get("type")
            if t in kinds and isinstance(node.get("name"), str):
                space = node.get("namespace", ns) or ""
                name = node["name"]
                full = name if "." in name or not space else f"{space}.{name}"
                named[full] = named[name.rsplit(".", 1)[-1]] = node
                for f in node.get("fields", []) if t in ("record", "error") else []:
                    index(f.get("type") if isinstance(f, dict) else None, space)
            elif t in ("array", "map"):
                index(node.get("items" if t == "array" else "values"), ns)
            elif isinstance(t, dict | list):
                index(t, ns)

    index(root, root.get("namespace", "") if isinstance(root, dict) else "")
    return named


def _avro_fields(text: str) -> Iterator[tuple[str, str, dict[str, str], bool]]:
    for path, f in _avro_record_fields(schema_json(text, "Avro schema")):
        tags = {k: str(f[f"prism.{k}"]) for k in ("pii", "encrypt", "index") if f"prism.{k}" in f}
        yield path, f["name"], tags, bool(f.get("deprecated"))


def scan(fmt: SchemaFormat | str, text: str, imports: Mapping[str, str] | None = None) -> PiiReport:
    """Every field that is tagged PII or looks like PII, with its tags.

    ``imports`` (protobuf): referenced files by import path, for schemas with references;
    their fields are scanned too, since they travel in the same payload."""
    fmt = SchemaFormat.parse(fmt)
    fields = (_proto_fields(text, imports) if fmt is SchemaFormat.PROTOBUF
              else _json_fields(text) if fmt is SchemaFormat.JSON else _avro_fields(text))
    out = []
    for path, name, tags, deprecated in fields:
        detected = detect_category(name)
        if tags or detected:
            out.append(PiiField(path, tags.get("pii"), detected, tags.get("encrypt"), tags.get("index"), deprecated))
    return PiiReport(tuple(out))


def pii_fields(fmt: SchemaFormat | str, text: str, imports: Mapping[str, str] | None = None) -> list[str]:
    """Paths of the schema's PII fields (tagged, or detected and not opted out).

    Feeds ``SecurityContext.contains_pii``: untagged-but-detected fields count, because a
    WARN-policy namespace still carries that data and the flag must not under-report.
    """
    return scan(fmt, text, imports).pii_fields


def _hint(fmt: SchemaFormat, f: PiiField) -> str:
    cat = f.detected or "pii"
    if fmt is SchemaFormat.PROTOBUF:
        return f'Add annotation: [(prism.pii) = "{cat}"] (import "prism/annotations.proto"), or "none" if not PII'
    if fmt is SchemaFormat.JSON:
        return f'Add "x-prism-pii": "{cat}" to the property (or "none" if not PII)'
    return f'Add "prism.pii": "{cat}" to the field (or "none" if not PII)'


def check_policy(fmt: SchemaFormat | str, text: str, policy: PiiPolicy | str,
                 imports: Mapping[str, str] | None = None) -> list[Finding]:
    """Findings for untagged PII under ``policy`` (ENFORCE: breaking, WARN: warning, OFF: none)."""
    fmt, policy = SchemaFormat.parse(fmt), PiiPolicy.parse(policy)
    if policy is PiiPolicy.OFF:
        return []
    sev = Severity.BREAKING if policy is PiiPolicy.ENFORCE else Severity.WARNING
    report = scan(fmt, text, imports)
    out = [
        Finding(sev, f.path, "PII_UNTAGGED",
                f"Field '{f.path.rsplit('.', 1)[-1]}' contains PII ({f.detected}) but lacks a prism.pii annotation",
                _hint(fmt, f))
        for f in report.untagged
    ]
    for f in report.fields:
        if f.is_pii and f.index and f.index.lower() not in ("none", ""):
            out.append(Finding(Severity.WARNING, f.path, "PII_INDEXED",
                               f"PII field is tagged for indexing ({f.index})",
                               "index a hashed or tokenized copy instead of the raw value"))
    return out


# ---------------------------------------------------------------------------------------------
# RFC-030 "Migration Path" phase 3: a PII tag on every leaf field (policy `require_pii_tags`)


def _proto_leaves(text: str, imports: Mapping[str, str] | None) -> Iterator[tuple[str, bool]]:
    """(path, has a pii tag) of every leaf field of every message in the schema's own files.

    A leaf holds a value rather than another of the schema's messages: scalars, enums, bytes,
    maps (the tag goes on the map field; its entry type is generated), and message types from
    library files (``google.protobuf.Timestamp``), whose fields no one can tag."""
    from .protoparse import compile_proto, messages_by_name, string_options

    schema = compile_proto(text, imports=imports)
    own = {name for name, m in messages_by_name(schema.user_files(), leading_dot=True).items()
           if not m.options.map_entry}
    for path, f in _proto_user_fields(schema):
        if f.type == f.TYPE_MESSAGE and f.type_name in own:
            continue  # its own fields are leaves (or not) where that message is defined
        yield path, PII_OPTION in string_options(f.options, (PII_OPTION,))


def _json_deref(root: Any, node: Any) -> Any:
    """A property schema with a local ``$ref`` (``#/definitions/X``, ``#/$defs/X``) followed once."""
    ref = node.get("$ref") if isinstance(node, dict) else None
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(target, dict) else None
        if isinstance(target, dict):
            return target
    return node


def _json_has_fields(root: Any, node: Any) -> bool:
    """Whether a property's value is an object (or array of objects) with properties of its own."""
    node = _json_deref(root, node)
    if not isinstance(node, dict):
        return False
    if node.get("properties"):
        return True
    if any(isinstance(node.get(k), list) and any(_json_has_fields(root, b) for b in node[k])
           for k in ("anyOf", "oneOf", "allOf")):
        return True
    items = node.get("items")
    return isinstance(items, dict) and _json_has_fields(root, items)


def _json_leaves(text: str) -> Iterator[tuple[str, bool]]:
    root = schema_json(text, "JSON Schema")

    def walk(node: Any, prefix: str, depth: int) -> Iterator[tuple[str, bool]]:
        if not isinstance(node, dict) or depth > 32:
            return
        for name, sub in (node.get("properties") or {}).items():
            if not isinstance(sub, dict):
                continue
            path = f"{prefix}{name}"
            if not _json_has_fields(root, sub):
                yield path, "x-prism-pii" in sub
                continue
            yield from walk(sub, f"{path}.", depth + 1)
            if isinstance(sub.get("items"), dict):
                yield from walk(sub["items"], f"{path}[].", depth + 1)
            for key in ("anyOf", "oneOf", "allOf"):
                for branch in sub.get(key) or []:
                    yield from walk(branch, f"{path}.", depth + 1)
        for key in ("definitions", "$defs"):
            for dname, sub in (node.get(key) or {}).items():
                yield from walk(sub, f"{prefix}{key}.{dname}.", depth + 1)

    seen: set[str] = set()
    for path, tagged in walk(root, "", 0):
        if path not in seen:  # a property in two anyOf branches is one field
            seen.add(path)
            yield path, tagged


def _avro_leaves(text: str) -> Iterator[tuple[str, bool]]:
    root = schema_json(text, "Avro schema")
    records = set(avro_named_types(root, ("record", "error")))

    def has_record(t: Any, depth: int = 0) -> bool:
        if depth > 32:
            return False
        if isinstance(t, str):
            return t in records
        if isinstance(t, list):
            return any(has_record(b, depth + 1) for b in t)
        if isinstance(t, dict):
            kind = t.get("type")
            if kind in ("record", "error"):
                return True
            if kind == "array":
                return has_record(t.get("items"), depth + 1)
            if kind == "map":
                return has_record(t.get("values"), depth + 1)
            return isinstance(kind, dict | list) and has_record(kind, depth + 1)
        return False

    def leaf(f: dict[str, Any]) -> bool:
        return not has_record(f.get("type"))

    for path, f in _avro_record_fields(root, descend=lambda f: not leaf(f)):
        if leaf(f):
            yield path, "prism.pii" in f


def untagged_leaves(fmt: SchemaFormat | str, text: str, imports: Mapping[str, str] | None = None) -> list[str]:
    """Paths of the leaf fields without an explicit PII tag (``"none"`` is explicit), in schema
    order - what a ``require_pii_tags`` policy refuses. Paths are :func:`scan`'s."""
    fmt = SchemaFormat.parse(fmt)
    leaves = (_proto_leaves(text, imports) if fmt is SchemaFormat.PROTOBUF
              else _json_leaves(text) if fmt is SchemaFormat.JSON else _avro_leaves(text))
    return [path for path, tagged in leaves if not tagged]


def _tag_hint(fmt: SchemaFormat, path: str) -> str:
    cat = detect_category(path.rsplit(".", 1)[-1].removesuffix("[]"))
    value = f'"{cat}"' if cat else '"<category>" (email, phone, name, ...)'
    if fmt is SchemaFormat.PROTOBUF:
        return f'[(prism.pii) = {value}] (import "prism/annotations.proto"), or [(prism.pii) = "none"] if not PII'
    key = "x-prism-pii" if fmt is SchemaFormat.JSON else "prism.pii"
    return f'"{key}": {value} on the {"property" if fmt is SchemaFormat.JSON else "field"}, or "{key}": "none" ' \
           "if not PII"


def required_tag_findings(fmt: SchemaFormat | str, text: str,
                          imports: Mapping[str, str] | None = None) -> list[Finding]:
    """One breaking ``PII_TAG_MISSING`` finding per untagged leaf field, each with the
    annotation that fixes it (RFC-030 phase 3: every schema says, field by field, what is PII)."""
    fmt = SchemaFormat.parse(fmt)
    return [Finding(Severity.BREAKING, path, "PII_TAG_MISSING",
                    f"Field '{path}' has no PII tag; the policy requires one on every field", _tag_hint(fmt, path))
            for path in untagged_leaves(fmt, text, imports)]


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One schema's PII status for ``prism schema audit``."""

    label: str
    ok: bool
    untagged: tuple[str, ...]
    pii_fields: tuple[str, ...]

    def render(self) -> str:
        if self.ok:
            return f"✅ {self.label}: All PII fields tagged ({len(self.pii_fields)} PII field(s))"
        return "\n".join(f"❌ {self.label}: Field '{p.rsplit('.', 1)[-1]}' missing @prism.pii tag" for p in self.untagged)


def audit(schemas: Iterable[tuple[str, SchemaFormat | str, str]
                            | tuple[str, SchemaFormat | str, str, Mapping[str, str] | None]]) -> list[AuditEntry]:
    """PII audit over many schemas (label, format, text[, protobuf imports]); unparsable
    schemas are reported, not raised."""
    out = []
    for label, fmt, text, *rest in schemas:
        try:
            report = scan(fmt, text, rest[0] if rest else None)
        except Exception as e:  # an audit must cover everything, even broken entries
            out.append(AuditEntry(f"{label} (unparsable: {e})", False, (), ()))
            continue
        untagged = tuple(f.path for f in report.untagged)
        out.append(AuditEntry(label, not untagged, untagged, tuple(report.pii_fields)))
    return out


# ---------------------------------------------------------------------------------------------
# Values of PII fields in payloads (the running worker's redaction)


class PiiValueFinder:
    """The values a payload carries in the schema's PII fields, so the worker can mask them in
    what it writes about a failed message (log lines, DLQ context headers, span attributes).

    Built once per namespace from the resolved schema's PII paths (``pii_fields``: tagged, or
    detected by name) plus the topology's ``enrich.pii_fields``. Matching is by field *name*:
    schema paths differ per format (``OrderCreated.customer_email``, ``customer.email``,
    ``items[].name``) while payloads are trees, and masking a same-named non-PII value too only
    ever redacts more. JSON payloads (whatever the schema format) are walked as JSON; protobuf
    payloads are parsed with the schema's message class. Encrypted payloads are never read.
    The walk is bounded (``max_nodes``, depth 32): the payload is untrusted.
    """

    def __init__(self, paths: Iterable[str], *, schema_format: str = "", schema_text: str = "",
                 message_name: str = "", imports: Mapping[str, str] | None = None, max_nodes: int = 10_000) -> None:
        self.names = frozenset(n for n in (_leaf(p) for p in paths) if n)
        self.max_nodes = max_nodes
        self._proto: Any = None
        self._proto_args = (schema_text, message_name, imports) if schema_format.lower() == "protobuf" else None

    def __bool__(self) -> bool:
        return bool(self.names)

    def values(self, payload: bytes, content_type: str = "") -> list[str]:
        """PII values in `payload` as text (strings, and numbers of 4+ digits); never raises."""
        if not self.names or not payload:
            return []
        doc: Any = None
        ct = content_type.lower()
        if "json" in ct or payload[:1] in (b"{", b"["):
            try:
                doc = loads_untrusted(payload, what="payload", max_bytes=DEFAULT_MAX_DECOMPRESSED)
            except ValueError:  # JsonInputError (syntax, size, depth) is a ValueError
                doc = None
        if doc is None and self._proto_args is not None and ("protobuf" in ct or not ct):
            doc = self._proto_doc(payload)
        if doc is None:
            return []
        out: list[str] = []
        budget = [self.max_nodes]
        self._walk(doc, False, 0, out, budget)
        return out

    def _proto_doc(self, payload: bytes) -> Any:
        try:
            if self._proto is None:
                from google.protobuf import descriptor_pool, message_factory

                from .protoparse import compile_proto

                text, name, imports = self._proto_args  # type: ignore[misc]
                schema = compile_proto(text, imports=imports)
                pool = descriptor_pool.DescriptorPool()
                for fd in schema.fds.file:
                    pool.Add(fd)
                self._proto = message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
            from google.protobuf.json_format import MessageToDict

            return MessageToDict(self._proto.FromString(payload), preserving_proto_field_name=True)
        except Exception:  # not this message type (or no usable schema): nothing to find
            return None

    def _walk(self, node: Any, pii: bool, depth: int, out: list[str], budget: list[int]) -> None:
        budget[0] -= 1
        if budget[0] < 0 or depth > 32:
            return
        if isinstance(node, dict):
            for k, v in node.items():
                self._walk(v, pii or (isinstance(k, str) and k in self.names), depth + 1, out, budget)
        elif isinstance(node, list):
            for v in node:
                self._walk(v, pii, depth + 1, out, budget)
        elif pii and isinstance(node, str) and node:
            out.append(node)
        elif pii and isinstance(node, int | float) and not isinstance(node, bool) and abs(node) >= 1000:
            out.append(str(node))


def _leaf(path: str) -> str:
    return path.rsplit(".", 1)[-1].removesuffix("[]").strip()
