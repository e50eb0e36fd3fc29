"""JSON Schema compatibility as a structural subset check.

Confluent's definition: BACKWARD means every document valid under the OLD schema is valid
under the NEW one (the new consumer accepts old data); FORWARD is the reverse. So both
reduce to ``_subset(writer, reader)``: list every way the writer schema admits a document
the reader schema rejects.

Covered: ``type`` (integer is a subset of number), ``properties``, ``required``,
``additionalProperties`` (open/closed content models), ``enum``/``const``, numeric and length
bounds, ``pattern``, ``items``, ``anyOf``/``oneOf`` branches and local ``$ref``s
(``#/definitions/...``, ``#/$defs/...``). Undecidable cases (two different patterns) are
reported as breaking rather than guessed.

One deliberate relaxation: adding a property to an OPEN content model is a warning, not
breaking. Strictly an old producer could have sent that name with any type (Confluent
rejects it, PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL); in practice producers only send what
they declare, and the strict rule makes "add an optional property" — the most common
evolution — impossible without closing the schema.
"""

from __future__ import annotations

import functools
from typing import Any

from jsonschema.validators import validator_for

from app.schema.compat.base import Change
from app.schema.model import SchemaError, schema_json

_ALL_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})


def parse(text: str | dict) -> Any:
    """Parse and validate against the draft's metaschema (cached: metaschema validation is
    the dominant cost, ~40 ms for a 100-property schema, and the same texts recur)."""
    if isinstance(text, str):
        return _parse_text(text)
    return _parse_obj(text)


@functools.lru_cache(maxsize=256)
def _parse_text(text: str) -> Any:
    return _parse_obj(text)


def _parse_obj(text: str | dict) -> Any:
    raw = schema_json(text, "JSON Schema") if isinstance(text, str) else text
    if not isinstance(raw, dict | bool):
        raise SchemaError("a JSON Schema must be an object or a boolean")
    try:
        validator_for(raw).check_schema(raw)
    except Exception as e:
        raise SchemaError(f"invalid JSON Schema: {getattr(e, 'message', e)}") from e
    return raw


class _Ctx:
    def __init__(self, writer_root: Any, reader_root: Any) -> None:
        self.w_root, self.r_root = writer_root, reader_root
        self.seen: set[tuple[int, int]] = set()

    @staticmethod
    def _deref(root: Any, s: Any) -> Any:
        hops = 0
        while isinstance(s, dict) and "$ref" in s and hops < 32:
            ref = s["$ref"]
            if not ref.startswith("#"):
                return {}  # remote refs are not fetched: treat as "anything"
            node = root
            for part in [p for p in ref[1:].split("/") if p]:
                node = node.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(node, dict) else {}
            s = node
            hops += 1
        return s

    def w(self, s: Any) -> Any:
        return self._deref(self.w_root, s)

    def r(self, s: Any) -> Any:
        return self._deref(self.r_root, s)


def _types(s: dict) -> set[str]:
    t = s.get("type")
    if t is None:
        if "properties" in s or "required" in s:
            return {"object"} if "type" in s else set(_ALL_TYPES)
        return set(_ALL_TYPES)
    return {t} if isinstance(t, str) else set(t)


def _norm_types(ts: set[str]) -> set[str]:
    return ts | ({"integer"} if "number" in ts else set())


def _subset(w: Any, r: Any, ctx: _Ctx, path: str) -> list[tuple[str, str, str, str]]:
    w, r = ctx.w(w), ctx.r(r)
    key = (id(w), id(r))
    if key in ctx.seen:
        return []
    ctx.seen.add(key)
    if r is True or r == {}:
        return []
    if r is False:
        return [] if w is False else [("TYPE_NARROWED", path or "$", "rejects everything", "")]
    if w is False:
        return []
    if w is True:
        w = {}
    out: list[tuple[str, str, str, str]] = []
    p = path or "$"
    # combinators on the writer side: every branch must be accepted
    for kw in ("anyOf", "oneOf"):
        if kw in w:
            base = {k: v for k, v in w.items() if k != kw}
            for _i, branch in enumerate(w[kw]):
                merged = {**base, **ctx.w(branch)}
                out += _subset(merged, r, ctx, path)
                if out:
                    return out
            return out
    for kw in ("anyOf", "oneOf"):
        if kw in r:
            if any(not _subset(w, b, _Ctx(ctx.w_root, ctx.r_root), path) for b in r[kw]):
                return []
            return [("TYPE_NARROWED", p, f"no {kw} branch accepts the data",
                     f"add a {kw} branch matching the old definition")]
    wt, rt = _types(w), _types(r)
    missing = _norm_types(wt) - _norm_types(rt)
    if missing:
        out.append(("TYPE_NARROWED", p, f"accepts type {sorted(rt)} but data may be {sorted(wt)}",
                    "keep accepting the old type(s) (e.g. a type list or anyOf)"))
        return out
    if "enum" in r:
        if "enum" in w:
            gone = [v for v in w["enum"] if v not in r["enum"]]
            if gone:
                out.append(("ENUM_NARROWED", p, f"does not allow enum value(s) {gone}", "keep the old values"))
        elif "const" in w:
            if w["const"] not in r["enum"]:
                out.append(("ENUM_NARROWED", p, f"does not allow const {w['const']!r}", "add it to the enum"))
        else:
            out.append(("ENUM_ADDED", p, "restricts the value to an enum; the data side is unrestricted",
                        "drop the enum or accept every old value"))
    if "const" in r and w.get("const", object()) != r["const"] and not ("enum" in w and w["enum"] == [r["const"]]):
        out.append(("CONST_CHANGED", p, "has a const restriction the data side lacks", "drop the const"))
    for kw, tighter in (("minimum", max), ("exclusiveMinimum", max), ("minLength", max), ("minItems", max),
                        ("minProperties", max), ("maximum", min), ("exclusiveMaximum", min),
                        ("maxLength", min), ("maxItems", min), ("maxProperties", min)):
        if kw in r and isinstance(r[kw], int | float) and not isinstance(r[kw], bool):
            old = w.get(kw)
            if old is None or (tighter(old, r[kw]) == r[kw] and old != r[kw]):
                out.append(("RANGE_NARROWED", p, f"has {kw} {r[kw]} (data side: {old if old is not None else 'unset'})", f"keep {kw} at {old if old is not None else 'unset'} or looser"))
    if "pattern" in r and w.get("pattern") != r["pattern"]:
        out.append(("PATTERN_CHANGED", p, f"requires pattern {r['pattern']!r} (data side: {w.get('pattern', 'none')!r})", "old values may not match; keep the old pattern"))
    if "multipleOf" in r and w.get("multipleOf") != r["multipleOf"]:
        out.append(("RANGE_NARROWED", p, f"requires multipleOf {r['multipleOf']}", "drop multipleOf"))
    if "object" in (wt & rt):
        out += _objects(w, r, ctx, path)
    if "array" in (wt & rt):
        wi, ri = w.get("items", {}), r.get("items", {})
        if isinstance(wi, dict | bool) and isinstance(ri, dict | bool):
            out += _subset(wi, ri, ctx, f"{path}[]")
        if r.get("uniqueItems") and not w.get("uniqueItems"):
            out.append(("UNIQUE_ITEMS_ADDED", p, "requires uniqueItems", "drop uniqueItems"))
    return out


def _objects(w: dict, r: dict, ctx: _Ctx, path: str) -> list[tuple[str, str, str, str]]:
    out: list[tuple[str, str, str, str]] = []
    wp, rp = w.get("properties", {}), r.get("properties", {})
    w_add = w.get("additionalProperties", True)
    r_add = r.get("additionalProperties", True)
    wreq, rreq = set(w.get("required", [])), set(r.get("required", []))
    pre = f"{path}." if path else ""
    for name in sorted(rreq - wreq):
        out.append(("REQUIRED_PROPERTY_ADDED", pre + name, f"requires property '{name}', which data may lack", "make it optional (leave it out of 'required')"))
    for name, ws in wp.items():
        if name in rp:
            out += _subset(ws, rp[name], ctx, pre + name)
        elif r_add is False:
            out.append(("PROPERTY_REMOVED_FROM_CLOSED_MODEL", pre + name, f"is closed (additionalProperties: false) and "
                        f"lacks property '{name}', which data may carry",
                        f"keep '{name}' (deprecate it) or open the content model"))
        elif isinstance(r_add, dict):
            out += _subset(ws, r_add, ctx, pre + name)
    for name, rs in rp.items():
        if name in wp:
            continue
        if w_add is False:
            continue  # old writer could never send it
        if isinstance(w_add, dict):
            out += _subset(w_add, rs, ctx, pre + name)
        elif ctx.r(rs) not in ({}, True):
            out.append(("PROPERTY_ADDED_TO_OPEN_MODEL", pre + name, f"constrains property '{name}', which the data "
                        "side's open content model left unconstrained", "(warning) close the model or keep new properties optional"))
    if w_add is not False and r_add is False:
        out.append(("ADDITIONAL_PROPERTIES_CLOSED", path or "$", "is closed (additionalProperties: false) while the "
                    "data side's model is open", "keep the content model open"))
    elif isinstance(r_add, dict) and w_add is True:
        out.append(("ADDITIONAL_PROPERTIES_NARROWED", path or "$", "restricts additionalProperties to a schema",
                    "keep additionalProperties open"))
    elif isinstance(r_add, dict) and isinstance(w_add, dict):
        out += _subset(w_add, r_add, ctx, f"{pre}*")
    return out


_WARNING_ONLY = {"PROPERTY_ADDED_TO_OPEN_MODEL", "PROPERTY_REMOVED_FROM_OPEN_MODEL"}
#: the same check run the other way round describes the opposite edit
_FORWARD_NAMES = {
    "TYPE_NARROWED": "TYPE_WIDENED", "ENUM_NARROWED": "ENUM_WIDENED", "ENUM_ADDED": "ENUM_REMOVED",
    "RANGE_NARROWED": "RANGE_WIDENED", "REQUIRED_PROPERTY_ADDED": "REQUIRED_PROPERTY_REMOVED",
    "PROPERTY_REMOVED_FROM_CLOSED_MODEL": "PROPERTY_ADDED_TO_CLOSED_MODEL",
    "PROPERTY_ADDED_TO_OPEN_MODEL": "PROPERTY_REMOVED_FROM_OPEN_MODEL",
    "ADDITIONAL_PROPERTIES_CLOSED": "ADDITIONAL_PROPERTIES_OPENED",
    "ADDITIONAL_PROPERTIES_NARROWED": "ADDITIONAL_PROPERTIES_WIDENED", "UNIQUE_ITEMS_ADDED": "UNIQUE_ITEMS_REMOVED",
}


def diff(old_text: str, new_text: str) -> list[Change]:
    old, new = parse(old_text), parse(new_text)
    back = _subset(old, new, _Ctx(old, new), "")   # new reader accepts old data?
    fwd = _subset(new, old, _Ctx(new, old), "")    # old reader accepts new data?
    changes: dict[tuple[str, str], Change] = {}
    for rule, path, reason, hint in back:
        changes[(rule, path)] = Change(rule, path, f"new schema {reason}", hint,
                                       breaks_backward=rule not in _WARNING_ONLY)
    for rule, path, reason, hint in fwd:
        rule = _FORWARD_NAMES.get(rule, rule)
        reason = f"old schema {reason}"
        prev = changes.get((rule, path))
        if prev:
            changes[(rule, path)] = Change(rule, path, prev.reason, prev.hint, prev.breaks_backward,
                                           rule not in _WARNING_ONLY)
        else:
            changes[(rule, path)] = Change(rule, path, reason, hint, breaks_forward=rule not in _WARNING_ONLY)
    out = list(changes.values())
    # RFC-030-style information: optional properties added / removed
    if isinstance(old, dict) and isinstance(new, dict):
        op, np_ = old.get("properties", {}), new.get("properties", {})
        for name in np_:
            if name not in op and name not in set(new.get("required", [])):
                out.append(Change("PROPERTY_ADDED", name, f"added optional property '{name}'", "safe for readers"))
    return out
