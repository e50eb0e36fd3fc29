"""Confluent schema references: a schema that imports/uses another registered schema.

A reference is ``{"name", "subject", "version"}``. What ``name`` means depends on the format
(as in Confluent):

- Protobuf: the import path (``import "common/money.proto";`` -> name ``common/money.proto``).
  The referenced texts are handed to protoc as those files, so the schema compiles exactly
  as it would on disk.
- JSON Schema: the ``$ref`` target (``"$ref": "address.json"``, optionally with a fragment
  ``address.json#/definitions/Street``).
- Avro: the full name of a named type (``com.acme.Address``) that the schema uses by name.

Why expansion instead of teaching every checker about references: the compatibility rules,
the PII scan and the payload checks already work on one self-contained schema. For Avro and
JSON Schema we therefore build that self-contained schema (referenced definitions inlined,
:func:`expand_avro`, :func:`expand_json`); for protobuf the import files are the natural
self-contained form (:func:`compile_proto` takes them). The stored text is never changed:
expansion happens whenever a schema is parsed or compared.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..decimal_text import decimal
from .model import SchemaError, schema_json


@dataclass(frozen=True, slots=True)
class Reference:
    """One entry of a schema's ``references`` list; ``version`` is always concrete (>= 1)."""

    name: str
    subject: str
    version: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "subject": self.subject, "version": self.version}


@dataclass(frozen=True, slots=True)
class RawReference:
    """A reference as a client sent it: ``version`` may still be ``"latest"`` (Confluent's -1)."""

    name: str
    subject: str
    version: int | str


def parse_references(raw: Sequence[Mapping[str, Any]] | None) -> tuple[RawReference, ...]:
    """Validate the shape of a request's ``references``; raises :class:`SchemaError` on a bad entry.

    Names must be unique: two references with one name would make the import (or ``$ref``,
    or Avro type name) ambiguous.
    """
    out: list[RawReference] = []
    seen: set[str] = set()
    for i, r in enumerate(raw or ()):
        if not isinstance(r, Mapping):
            raise SchemaError(f"reference #{i} is not an object")
        name, subject, version = r.get("name"), r.get("subject"), r.get("version")
        if not isinstance(name, str) or not name:
            raise SchemaError(f"reference #{i} has no name")
        if not isinstance(subject, str) or not subject:
            raise SchemaError(f"reference {name!r} has no subject")
        if version is None or version in (-1, "-1", "latest"):
            v: int | str = "latest"
        elif isinstance(version, int) and not isinstance(version, bool) and version >= 1:
            v = version
        elif isinstance(version, str) and (number := decimal(version)) is not None and number >= 1:
            v = number
        else:
            raise SchemaError(f"reference {name!r} has an invalid version {version!r}")
        if name in seen:
            raise SchemaError(f"reference name {name!r} appears twice")
        seen.add(name)
        out.append(RawReference(name, subject, v))
    return tuple(out)


def identity_suffix(refs: Sequence[Reference]) -> bytes:
    """Bytes appended to the canonical form when hashing: the same text with different
    references is a different schema (Confluent compares text *and* references)."""
    if not refs:
        return b""
    return b"\x00references:" + json.dumps([r.to_dict() for r in refs], sort_keys=True,
                                             separators=(",", ":")).encode()


# -- Avro ---------------------------------------------------------------------------------------

_AVRO_NAMED = ("record", "error", "enum", "fixed")
_AVRO_PRIMS = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def _avro_fullname(node: Mapping[str, Any], ns: str) -> str:
    name = str(node.get("name", ""))
    if "." in name:
        return name
    space = node.get("namespace", ns)
    return f"{space}.{name}" if space else name


def _avro_defined(node: Any, ns: str, out: dict[str, Any]) -> None:
    """Every named type defined inside ``node`` (full name -> definition)."""
    if isinstance(node, list):
        for b in node:
            _avro_defined(b, ns, out)
    elif isinstance(node, dict):
        t = node.get("type")
        if t in _AVRO_NAMED and "name" in node:
            full = _avro_fullname(node, ns)
            out[full] = node
            inner = full.rsplit(".", 1)[0] if "." in full else ""
            for f in node.get("fields", []) or []:
                _avro_defined(f.get("type"), inner, out)
        elif t == "array":
            _avro_defined(node.get("items"), ns, out)
        elif t == "map":
            _avro_defined(node.get("values"), ns, out)
        elif isinstance(t, dict | list):
            _avro_defined(t, ns, out)


def expand_avro(text: str, referenced: Mapping[str, str]) -> str:
    """Inline the referenced named types at their first use, so the result parses alone.

    ``referenced`` maps each reference name to the referenced schema's (already expanded)
    text. Every named type a referenced schema defines becomes known - not just its root -
    because Avro resolves names through the whole schema. An inlined definition gets an
    explicit namespace (``""`` for the null namespace), so moving it does not rename it.
    """
    root = schema_json(text, "Avro schema")
    available: dict[str, Any] = {}
    for name, ref_text in referenced.items():
        _avro_defined(schema_json(ref_text, f"referenced schema {name!r}"), "", available)
    defined: dict[str, Any] = {}
    _avro_defined(root, "", defined)

    def inline(full: str) -> Any:
        node = copy.deepcopy(available[full])
        node["namespace"] = full.rsplit(".", 1)[0] if "." in full else ""
        node["name"] = full.rsplit(".", 1)[-1]
        _avro_defined(node, "", defined)
        return walk(node, node["namespace"])

    def resolve_name(name: str, ns: str) -> str | None:
        for cand in ((name,) if "." in name else (f"{ns}.{name}" if ns else name, name)):
            if cand not in defined and cand in available:
                return cand
        return None

    def walk(node: Any, ns: str) -> Any:
        if isinstance(node, str):
            if node in _AVRO_PRIMS:
                return node
            full = resolve_name(node, ns)
            return inline(full) if full else node
        if isinstance(node, list):
            return [walk(b, ns) for b in node]
        if not isinstance(node, dict):
            return node
        t = node.get("type")
        if t in _AVRO_NAMED and "name" in node:
            full = _avro_fullname(node, ns)
            inner = full.rsplit(".", 1)[0] if "." in full else ""
            if "fields" in node:
                node["fields"] = [{**f, "type": walk(f.get("type"), inner)} for f in node["fields"]]
            return node
        if t == "array":
            return {**node, "items": walk(node.get("items"), ns)}
        if t == "map":
            return {**node, "values": walk(node.get("values"), ns)}
        if isinstance(t, str | dict | list):
            return {**node, "type": walk(t, ns)}
        return node

    return json.dumps(walk(root, ""))


# -- JSON Schema --------------------------------------------------------------------------------

_BUNDLE = "__prism_ref_"


def _rewrite_local(node: Any, prefix: str) -> Any:
    """Point a bundled schema's own ``#/...`` refs at its new home ``#/$defs/<key>/...``."""
    if isinstance(node, list):
        return [_rewrite_local(n, prefix) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _rewrite_local(v, prefix) for k, v in node.items()}
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = prefix + ref[1:]
    return out


def expand_json(text: str, referenced: Mapping[str, str]) -> str:
    """Bundle the referenced schemas under ``$defs`` and point the ``$ref``s at them.

    ``{"$ref": "address.json#/definitions/Street"}`` becomes
    ``{"$ref": "#/$defs/__prism_ref_0/definitions/Street"}``; the referenced schema's own
    local refs are rewritten the same way, and its ``$id``/``$schema`` dropped (an ``$id``
    would change the base URI its refs resolve against). ``referenced`` values must already
    be expanded (a referenced schema's own references bundled).
    """
    root = schema_json(text, "JSON Schema")
    docs = {name: schema_json(t, f"referenced schema {name!r}") for name, t in referenced.items()}
    if not isinstance(root, dict) or not docs:
        return text
    keys = {name: f"{_BUNDLE}{i}" for i, name in enumerate(docs)}

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(n) for n in node]
        if not isinstance(node, dict):
            return node
        out = {k: walk(v) for k, v in node.items()}
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            base, _, frag = ref.partition("#")
            if base in keys:
                out["$ref"] = f"#/$defs/{keys[base]}{frag}"
        return out

    bundled = walk(root)
    defs = dict(bundled.get("$defs", {}))
    for name, doc in docs.items():
        if isinstance(doc, dict):
            doc = {k: v for k, v in doc.items() if k not in ("$id", "$schema")}
        defs[keys[name]] = _rewrite_local(doc, f"#/$defs/{keys[name]}")
    bundled["$defs"] = defs
    return json.dumps(bundled)


# -- resolving a fetched schema's references (worker, SDK) --------------------------------------

#: how deep references may nest (the registry's own limit, ``Registry.effective``)
MAX_REFERENCE_DEPTH = 32
#: how many referenced versions one schema may pull in, transitively (the Go client's limit)
MAX_REFERENCES = 256

#: ``fetch(subject, version)`` -> the registry's version document (``schema``, ``version``,
#: optional ``references``); ``version`` is a number or ``"latest"``
FetchVersion = Callable[[str, str], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class ResolvedReferences:
    """What a schema's references resolve to, the way :meth:`Registry.effective` resolves them.

    ``imports`` (protobuf): every referenced file by import path, transitively - the files
    protoc reads for the schema's imports. ``text``: the self-contained schema (Avro and JSON
    Schema with the referenced definitions inlined; protobuf unchanged). ``references``: the
    schema's own references with concrete versions, for the identity hash."""

    text: str
    imports: Mapping[str, str]
    references: tuple[Reference, ...]


def resolve_fetched(fmt: Any, text: str, raw: Sequence[Mapping[str, Any]] | None,
                    fetch: FetchVersion, *, root: tuple[str, int] | None = None) -> ResolvedReferences:
    """Fetch ``raw`` (a registry answer's ``references``) and what they reference, transitively,
    and resolve ``text`` against them. The registry answer is input like any other, so the walk
    is bounded: :data:`MAX_REFERENCE_DEPTH` deep, :data:`MAX_REFERENCES` versions in all, and a
    reference back to a schema on the current path (a cycle) is refused, not followed. ``root``:
    the (subject, version) ``text`` was read from, so a reference back to it is a cycle at once.
    Raises :class:`app.schema.resolve.ReferencesUnresolvable` (an
    :class:`app.errors.SchemaReferencesError`) naming the reference at fault."""
    from .model import SchemaFormat

    fmt = SchemaFormat.parse(fmt)
    fetched = [0]

    def fail(message: str) -> Exception:
        from .resolve import ReferencesUnresolvable

        return ReferencesUnresolvable(message, path="schema.references")

    def walk(text: str, raw: Any, depth: int, stack: tuple[tuple[str, int], ...], where: str
             ) -> tuple[str, dict[str, str], tuple[Reference, ...]]:
        try:
            parsed = parse_references(raw if isinstance(raw, list | tuple) else ([] if raw is None else [raw]))
        except SchemaError as e:
            raise fail(f"{where}: {e}") from None
        if not parsed:
            return text, {}, ()
        if depth >= MAX_REFERENCE_DEPTH:
            raise fail(f"{where}: references nest more than {MAX_REFERENCE_DEPTH} deep")
        imports: dict[str, str] = {}
        expanded: dict[str, str] = {}
        concrete: list[Reference] = []
        for r in parsed:
            fetched[0] += 1
            if fetched[0] > MAX_REFERENCES:
                raise fail(f"{where}: the schema pulls in more than {MAX_REFERENCES} referenced versions")
            try:
                doc = fetch(r.subject, str(r.version))
                ref_text, number = doc["schema"], int(doc["version"])
                if not isinstance(ref_text, str):
                    raise TypeError("schema is not text")
            except Exception as e:  # the fetch's own error (HTTP, missing key): name the reference
                raise fail(f"{where}: reference {r.name!r} (subject {r.subject!r} version {r.version}) "
                           f"cannot be read: {str(e)[:300]}") from None
            key = (r.subject, number)
            if key in stack:
                chain = " -> ".join(f"{s} v{v}" for s, v in (*stack, key))
                raise fail(f"{where}: references form a cycle ({chain[:500]})")
            inner_text, inner_imports, _ = walk(ref_text, doc.get("references"), depth + 1, (*stack, key),
                                                f"reference {r.name!r} ({r.subject} v{number})")
            imports.update(inner_imports)
            imports[r.name] = ref_text
            expanded[r.name] = inner_text
            concrete.append(Reference(r.name, r.subject, number))
        try:
            if fmt is SchemaFormat.PROTOBUF:
                out = text
            elif fmt is SchemaFormat.AVRO:
                out = expand_avro(text, expanded)
            else:
                out = expand_json(text, expanded)
        except (SchemaError, ValueError, TypeError, AttributeError, RecursionError) as e:
            raise fail(f"{where}: the schema does not resolve against its references: {str(e)[:300]}") from None
        return out, imports, tuple(concrete)

    out, imports, refs = walk(text, raw, 0, (root,) if root else (), "schema")
    return ResolvedReferences(out, imports, refs)
