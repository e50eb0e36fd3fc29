"""Avro compatibility = the Avro specification's schema-resolution rules.

``_resolve(reader, writer)`` lists why a reader could NOT decode data written with the
writer schema (empty list = resolvable). BACKWARD runs it with (reader=new, writer=old),
FORWARD with (reader=old, writer=new), exactly as Confluent does for Avro.

Rules (Avro 1.11 spec, "Schema Resolution"):
- primitives must match, or the writer's type is promotable: int->long->float->double,
  string<->bytes;
- records match by (unqualified) name or reader alias; a reader field missing from the
  writer needs a default; writer fields the reader lacks are ignored;
- enums: every writer symbol must exist in the reader, unless the reader has a default;
- fixed: same name and size; arrays/maps: items/values resolve;
- unions: each writer branch must resolve against the reader (a reader union needs one
  matching branch); a non-union writer must match some branch of a reader union.
"""

from __future__ import annotations

from typing import Any

import fastavro

from app.schema.compat.base import Change
from app.schema.model import SchemaError, schema_json

_PRIMS = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_PROMOTE = {
    "int": {"long", "float", "double"}, "long": {"float", "double"}, "float": {"double"},
    "string": {"bytes"}, "bytes": {"string"},
}


def parse(text: str | dict | list) -> Any:
    """Validate with fastavro and return the plain JSON structure (named types kept inline)."""
    raw = schema_json(text, "Avro schema") if isinstance(text, str) else text
    try:
        fastavro.parse_schema(raw, _write_hint=False)
    except Exception as e:  # fastavro raises several exception types
        raise SchemaError(f"invalid Avro schema: {e}") from e
    return raw


def canonical(text: str) -> str:
    """Avro Parsing Canonical Form (the spec's own normalization, used for hashing)."""
    from fastavro.schema import to_parsing_canonical_form

    return to_parsing_canonical_form(fastavro.parse_schema(parse(text), _write_hint=False))


class _Names:
    """Named-type table: Avro lets later occurrences refer to a record/enum/fixed by name."""

    def __init__(self, schema: Any) -> None:
        self.types: dict[str, dict] = {}
        self._collect(schema, "")

    def _collect(self, s: Any, ns: str) -> None:
        if isinstance(s, list):
            for b in s:
                self._collect(b, ns)
        elif isinstance(s, dict):
            t = s.get("type")
            if t in ("record", "error", "enum", "fixed"):
                full = _fullname(s, ns)
                self.types[full] = s
                self.types.setdefault(full.rsplit(".", 1)[-1], s)
                ns = full.rsplit(".", 1)[0] if "." in full else ""
                for f in s.get("fields", []):
                    self._collect(f.get("type"), ns)
            elif t == "array":
                self._collect(s.get("items"), ns)
            elif t == "map":
                self._collect(s.get("values"), ns)
            elif isinstance(t, dict | list):
                self._collect(t, ns)

    def deref(self, s: Any) -> Any:
        if isinstance(s, str) and s not in _PRIMS:
            return self.types.get(s, self.types.get(s.rsplit(".", 1)[-1], s))
        if isinstance(s, dict) and s.get("type") in _PRIMS and len(s) >= 1 and "logicalType" not in s:
            return s["type"]
        if isinstance(s, dict) and isinstance(s.get("type"), str) and s["type"] not in (
            _PRIMS | {"record", "error", "enum", "fixed", "array", "map"}
        ):
            return self.deref(s["type"])
        return s


def _fullname(s: dict, ns: str) -> str:
    name = s.get("name", "")
    if "." in name:
        return name
    space = s.get("namespace", ns)
    return f"{space}.{name}" if space else name


def _kind(s: Any) -> str:
    if isinstance(s, list):
        return "union"
    if isinstance(s, str):
        return s
    if isinstance(s, dict):
        t = s.get("type")
        if t == "error":
            return "record"
        if isinstance(t, str):
            return t
    return "unknown"


def _short(s: Any) -> str:
    k = _kind(s)
    if k in ("record", "enum", "fixed"):
        return f"{k} {s.get('name')}"
    if k == "array":
        return f"array<{_short(s.get('items'))}>"
    if k == "map":
        return f"map<{_short(s.get('values'))}>"
    if k == "union":
        return "[" + ", ".join(_short(b) for b in s) + "]"
    if isinstance(s, dict) and "logicalType" in s:
        return f"{s['type']}({s['logicalType']})"
    return k


def _resolve(r: Any, w: Any, rn: _Names, wn: _Names, path: str, seen: set) -> list[tuple[str, str, str, str]]:
    """(rule, path, reason, hint) for every reason reader ``r`` cannot read writer ``w``."""
    r, w = rn.deref(r), wn.deref(w)
    key = (id(r), id(w))
    if key in seen:
        return []
    seen = seen | {key}
    rk, wk = _kind(r), _kind(w)
    if wk == "union":
        out = []
        for branch in w:
            if _kind(rn.deref(r)) == "union":
                if not any(not _resolve(rb, branch, rn, wn, path, seen) for rb in r):
                    out.append(("UNION_BRANCH_MISSING", path, f"union has no branch for the data's "
                                f"{_short(wn.deref(branch))}", f"add {_short(wn.deref(branch))} to the union"))
            else:
                out += _resolve(r, branch, rn, wn, path, seen)
        return out
    if rk == "union":
        if any(not _resolve(rb, w, rn, wn, path, seen) for rb in r):
            return []
        return [("TYPE_MISMATCH", path, f"union {_short(r)} has no branch for the data's {_short(w)}",
                 f"add {_short(w)} to the union")]
    if rk in _PRIMS or wk in _PRIMS:
        if rk == wk or rk in _PROMOTE.get(wk, set()):
            return []
        return [("TYPE_MISMATCH", path, f"reads {_short(r)} but the data is {_short(w)}, which Avro does not "
                 "promote (allowed: int->long->float->double, string<->bytes)",
                 "add a new field with the new type (with a default) instead")]
    if rk != wk:
        return [("TYPE_MISMATCH", path, f"reads {_short(r)} but the data is {_short(w)}", "keep the type")]
    if rk == "array":
        return _resolve(r["items"], w["items"], rn, wn, f"{path}[]", seen)
    if rk == "map":
        return _resolve(r["values"], w["values"], rn, wn, f"{path}{{}}", seen)
    rname, wname = r.get("name", "").rsplit(".", 1)[-1], w.get("name", "").rsplit(".", 1)[-1]
    aliases = {a.rsplit(".", 1)[-1] for a in r.get("aliases", [])}
    if rname != wname and wname not in aliases:
        return [("NAME_MISMATCH", path or rname, f"{rk} is named {rname} but the data's is {wname}",
                 f'add "aliases": ["{wname}"] to {rname}')]
    if rk == "fixed":
        if r.get("size") != w.get("size"):
            return [("FIXED_SIZE_MISMATCH", path or rname, f"fixed size is {r.get('size')}, the data's is "
                     f"{w.get('size')}", "use a new fixed type")]
        return []
    if rk == "enum":
        missing = [s for s in w.get("symbols", []) if s not in r.get("symbols", [])]
        if missing and "default" not in r:
            return [("MISSING_ENUM_SYMBOLS", path or rname, f"enum {rname} lacks symbol(s) {', '.join(missing)} "
                     "that the data may carry", 'keep the symbols or give the reader enum a "default"')]
        return []
    # records
    out = []
    prefix = f"{path}." if path else f"{rname}."
    wfields = {f["name"]: f for f in w.get("fields", [])}
    for rf in r.get("fields", []):
        fpath = prefix + rf["name"]
        wf = wfields.get(rf["name"])
        if wf is None:
            for alias in rf.get("aliases", []):
                wf = wfields.get(alias)
                if wf:
                    break
        if wf is None:
            if "default" not in rf:
                out.append(("READER_FIELD_MISSING_DEFAULT_VALUE", fpath, f"needs field '{rf['name']}', which the data "
                            "lacks, and it has no default", 'give it a default, e.g. "default": null '
                            'with a ["null", ...] union'))
            continue
        out += _resolve(rf["type"], wf["type"], rn, wn, fpath, seen)
    return out


def diff(old_text: str, new_text: str) -> list[Change]:
    old, new = parse(old_text), parse(new_text)
    on, nn = _Names(old), _Names(new)
    changes: dict[tuple[str, str], Change] = {}
    for rule, path, reason, hint in _resolve(new, old, nn, on, "", set()):
        changes[(rule, path)] = Change(rule, path, f"new schema {reason} (old data)", hint, breaks_backward=True)
    for rule, path, reason, hint in _resolve(old, new, on, nn, "", set()):
        prev = changes.get((rule, path))
        if prev:
            changes[(rule, path)] = Change(rule, path, prev.reason, prev.hint, True, True)
        else:
            changes[(rule, path)] = Change(rule, path, f"old schema {reason} (new data)", hint, breaks_forward=True)
    out = list(changes.values())
    out += _informational(old, new, on, nn)
    return out


def _informational(old: Any, new: Any, on: _Names, nn: _Names) -> list[Change]:
    """Non-breaking notes: fields added with defaults, fields removed (for the RFC's warnings)."""
    o, n = on.deref(old), nn.deref(new)
    if _kind(o) != "record" or _kind(n) != "record":
        return []
    out = []
    name = n.get("name", "")
    of = {f["name"] for f in o.get("fields", [])}
    nf = {f["name"]: f for f in n.get("fields", [])}
    for fname, f in nf.items():
        if fname not in of and "default" in f:
            out.append(Change("FIELD_ADDED", f"{name}.{fname}", f"added optional field '{fname}' (has a default)",
                              "safe in both directions"))
    for fname in of - set(nf):
        out.append(Change("FIELD_REMOVED", f"{name}.{fname}", f"field '{fname}' removed",
                          "consumers still reading it get its default"))
    return out
