"""Payload validation against a namespace's resolved schema (RFC-030 "Migration Path").

Used by the worker's enrich stage (`validation: warn | strict`, and the older debug switch
`validate_payloads`) and by the SDK's `publish(..., schema_validation=True)`. A validator is
compiled once per schema (`validator_for` caches it by the schema's id: its content hash plus
the protobuf root message), because compiling - protoc for protobuf, the metaschema check for
JSON Schema - costs milliseconds while validating costs microseconds.

Every problem is a `Violation` with a JSONPath-style field path (`$.items[2].price`), so a
log line, a DLQ header or an SDK exception points at the field to fix:

* JSON Schema: `jsonschema` decides; the path is the error's `absolute_path`.
* Avro: a JSON-encoded datum is validated with fastavro; fastavro names the *schema* field
  (`ns.Item.price`), not the datum's position, so the failing position is found by
  re-validating children with fastavro on the way down (records, arrays, maps). A binary
  datum is read with fastavro's schemaless reader (no path: `$`).
* Protobuf: the payload is parsed with the schema's own message class (compiled from the
  descriptors the registry checked), so wire-type errors and invalid UTF-8 are caught and
  unknown fields tolerated, as protobuf readers do; the parser reports no field, so the
  path is `$`. A JSON payload under a protobuf schema is parsed with `json_format`, whose
  message names the field.
"""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

try:
    import orjson as _orjson
except ImportError:  # the client wheel without its `schema` extra: json.loads alone
    _orjson = None  # type: ignore[assignment]

from .. import native
from ..envelope.compression import DEFAULT_MAX_DECOMPRESSED
from ..untrusted_json import loads_untrusted
from .model import schema_json
from .resolve import ResolvedSchema

#: problems reported per payload at most (a broken producer can fail every field)
MAX_VIOLATIONS = 20


@dataclass(frozen=True, slots=True)
class Violation:
    """One way a payload does not match its schema: where (`$.items[2].price`) and what.

    `message` may quote the offending value (fine for a DLQ header, which the worker masks
    for PII, or an exception in the producer's own process); `rule` never does, so it is
    what a log line or a metric-adjacent warning carries."""

    path: str
    message: str
    rule: str = ""

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


Validator = Callable[[bytes, str], list[Violation]]

_CACHE: dict[tuple[str, str, str], Validator] = {}
_CACHE_LOCK = threading.Lock()


def json_path(parts: Any) -> str:
    """`["items", 2, "price"]` -> `$.items[2].price` (keys that are not identifiers are quoted)."""
    out = "$"
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif str(p).isidentifier():
            out += f".{p}"
        else:
            out += f"[{json.dumps(str(p))}]"
    return out


def validator_for(resolved: ResolvedSchema) -> Validator:
    """The compiled validator of `resolved`, built on first use and then shared by every
    caller that validates against the same schema id (hash and root message)."""
    key = (resolved.hash, resolved.format.value, resolved.name)
    v = _CACHE.get(key)
    if v is None:
        with _CACHE_LOCK:
            v = _CACHE.get(key)
            if v is None:
                v = _CACHE[key] = _build(resolved)
    return v


def _build(resolved: ResolvedSchema) -> Validator:
    fmt = resolved.format.value.lower()
    if fmt == "protobuf":
        return _protobuf_validator(resolved)
    if fmt in ("json", "jsonschema", "json-schema", "json_schema"):
        return _jsonschema_validator(resolved)
    if fmt == "avro":
        return _avro_validator(resolved)
    raise ValueError(f"no payload validation for schema format {fmt!r}")


def build_checker(resolved: ResolvedSchema) -> Callable[[bytes, str], list[str]]:
    """`(payload, content_type) -> problems` as text (`$.path: what`), for `validate_payloads`."""
    validate = validator_for(resolved)

    def check(payload: bytes, content_type: str) -> list[str]:
        return [str(v) for v in validate(payload, content_type)]

    return check


def _protobuf_validator(resolved: ResolvedSchema) -> Validator:
    from google.protobuf import descriptor_pool, json_format, message_factory

    from .protoparse import compile_proto

    schema = compile_proto(resolved.schema_text, imports=resolved.imports or None)
    pool = descriptor_pool.DescriptorPool()
    for fd in schema.fds.file:
        pool.Add(fd)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(resolved.name))

    desc = cls.DESCRIPTOR
    plan = _json_plan(desc)
    fits = _compiled_fits(plan)
    # json_format's words for a top-level key the message does not have (`_ConvertFieldValuePair`)
    unknown = ('Message type "' + desc.full_name + '" has no field named "{}" at "' + desc.name
               + '".\n Available Fields(except extensions): "' + str([f.json_name for f in desc.fields]) + '"')

    def validate(payload: bytes, content_type: str) -> list[Violation]:
        if "json" in content_type:
            if fits is not None and fits(payload):
                return []  # certainly what Parse accepts, shown by the compiled check (False: as before)
            doc, text = _load_json_plain(payload)
            if text is None:  # not JSON to the plain decoder: Parse's own decode decides, as before
                doc = _load_json(payload)
            verdict: bool | str = False
            counted = -1
            if plan is not None and type(doc) is dict:
                verdict, counted = _walk_top(doc, plan)
            if text is not None and not _no_repeated_keys(doc, text, counted) and _load_json(payload) is _UNLOADED:
                doc = _UNLOADED  # a repeated key (the plain decoder kept the last): Parse words the error
            try:
                if doc is _UNLOADED:  # not JSON (or a duplicate key): Parse words the error
                    json_format.Parse(payload, cls())
                elif verdict is True:
                    return []  # what json_format.Parse would accept, shown without building the message
                elif verdict is not False:
                    # every key before it fits, so Parse accepts them and stops right here, with this error
                    return [Violation("$", f"not a valid {resolved.name} in JSON: " + unknown.format(verdict),
                                      "protobuf JSON mapping")]
                else:
                    _parse_dict(json_format, doc, cls())
            except Exception as exc:  # json_format.ParseError names the field in its message
                return [Violation("$", f"not a valid {resolved.name} in JSON: {exc}", "protobuf JSON mapping")]
            return []
        try:
            cls.FromString(payload)
        except Exception as exc:  # upb's DecodeError
            return [Violation("$", f"not a valid {resolved.name}: {exc}", "protobuf wire format")]
        return []

    return validate


# --------------------------------------------------------------------------- protobuf JSON, fast path
#
# `json_format.Parse` is pure Python: for a 200-byte valid order it costs ~35 µs, most of the
# worker's enrich stage under `validation: warn | strict` (issue 29's worker profile). A valid
# payload needs no message built: `_json_fits` walks the decoded JSON against a plan of the
# schema and says yes only for documents that Parse certainly accepts - strings, bools, integers
# in range, finite numbers, nested messages and repeated fields of those, each field named
# once. Anything else (an unknown or repeated key, null, a float for an integer field, enums,
# bytes, maps, well-known types, oneofs, proto2 required fields, deep nesting) returns False and
# Parse decides, so every violation and its text stay exactly Parse's
# (tests/schema/test_payload_check_fast.py compares both on generated documents).

_INT_RANGES = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1),
               "uint32": (0, 2**32 - 1), "uint64": (0, 2**64 - 1)}
_SURROGATE = re.compile("[\ud800-\udfff]")
#: nesting the fast path follows at most (Parse's own limit is 100 messages deep)
_FAST_DEPTH = 32
_FLOAT32_MAX = 3.4028234663852886e38

_STR, _INT, _NUM, _BOOL, _MSG = range(5)
_DOUBLE_MAX = 1.7976931348623157e308
#: a field's check: (kind, lo, hi, repeated, sub-plan, the field's other JSON key or None).
#: `_NUM`: lo/hi bound a float (and exclude inf and NaN, which compare false); an int may be any
#: 64-bit value (well inside either float range)
_FieldPlan = tuple[int, Any, Any, bool, Any, "str | None"]
#: the check of every single string field with one JSON name (one object: `_fits_messages` tests
#: it by identity, the commonest value of a document)
_PLAIN_STR: _FieldPlan = (_STR, 0, 0, False, None, None)


def _json_plan(desc: Any, _seen: dict[str, Any] | None = None) -> dict[str, _FieldPlan] | None:
    """JSON key (both the field's json_name and its proto name) -> check, for a message whose
    every field the fast path understands; None otherwise (Parse then decides every payload)."""
    from google.protobuf.descriptor import FieldDescriptor as FD

    if desc.full_name.startswith("google.protobuf."):  # well-known types have JSON forms of their own
        return None
    seen = {} if _seen is None else _seen
    if desc.full_name in seen:
        return seen[desc.full_name]  # a recursive message: the same plan (filled in below)
    plan: dict[str, _FieldPlan] = {}
    seen[desc.full_name] = plan
    if any(len(o.fields) > 1 for o in desc.oneofs):
        return None
    oneof_names = {o.name for o in desc.oneofs}
    int_kinds = {FD.TYPE_INT32: "int32", FD.TYPE_SINT32: "int32", FD.TYPE_SFIXED32: "int32",
                 FD.TYPE_INT64: "int64", FD.TYPE_SINT64: "int64", FD.TYPE_SFIXED64: "int64",
                 FD.TYPE_UINT32: "uint32", FD.TYPE_FIXED32: "uint32",
                 FD.TYPE_UINT64: "uint64", FD.TYPE_FIXED64: "uint64"}
    for f in desc.fields:
        if f.is_required or f.name in oneof_names or f.json_name in oneof_names:
            return None
        repeated = f.is_repeated
        sub = None
        if f.type == FD.TYPE_STRING:
            check: tuple[int, Any, Any, bool, Any] = (_STR, 0, 0, repeated, None)
        elif f.type == FD.TYPE_BOOL:
            check = (_BOOL, 0, 0, repeated, None)
        elif f.type == FD.TYPE_DOUBLE:
            check = (_NUM, -_DOUBLE_MAX, _DOUBLE_MAX, repeated, None)
        elif f.type == FD.TYPE_FLOAT:
            check = (_NUM, -_FLOAT32_MAX, _FLOAT32_MAX, repeated, None)
        elif f.type in int_kinds:
            lo, hi = _INT_RANGES[int_kinds[f.type]]
            check = (_INT, lo, hi, repeated, None)
        elif f.type == FD.TYPE_MESSAGE:
            mt = f.message_type
            if mt.full_name.startswith("google.protobuf.") or mt.GetOptions().map_entry:
                return None
            sub = _json_plan(mt, seen)
            if sub is None:
                return None
            check = (_MSG, 0, 0, repeated, sub)
        else:  # enums, bytes, groups: Parse's rules for those are not worth copying
            return None
        if f.json_name == f.name:
            plan[f.name] = _PLAIN_STR if check == _PLAIN_STR[:5] else (*check, None)
        else:  # both spellings name the field; a document using both is left to Parse
            plan[f.json_name], plan[f.name] = (*check, f.name), (*check, f.json_name)
    return plan


#: a message of `_flat_plan`: per field, (its JSON keys, kind, lo, hi, repeated, message index or None)
_FlatMessage = list[tuple[tuple[str, ...], int, Any, Any, bool, int | None]]


def _flat_plan(plan: dict[str, _FieldPlan]) -> list[_FlatMessage]:
    """`_json_plan`'s output as the compiled check takes it: messages by index (the first is the
    document's, a recursive message one index), each field once with every key that names it.
    A flattening, not a second reading of the descriptors: both paths follow one plan."""
    index = {id(plan): 0}
    plans = [plan]
    messages: list[_FlatMessage] = []
    for p in plans:  # grows as nested messages are found: each plan once
        fields: _FlatMessage = []
        named: set[str] = set()
        for key, (kind, lo, hi, repeated, sub, alias) in p.items():
            if key in named:
                continue
            keys = (key,) if alias is None else (key, alias)
            named.update(keys)
            at = None
            if kind == _MSG:
                if id(sub) not in index:
                    index[id(sub)] = len(plans)
                    plans.append(sub)
                at = index[id(sub)]
            fields.append((keys, kind, lo, hi, repeated, at))
        messages.append(fields)
    return messages


def _compiled_fits(plan: dict[str, _FieldPlan] | None) -> Callable[[bytes], bool] | None:
    """The compiled one-sided check of `plan` (`prism_native.DocPlan.fits`, issue 29) when the
    compiled hot path is in use (app/native.py chooses), else None.

    Why: even the Python fast path costs ~10 µs for a 1 KB order (the decode, then the walk of
    the decoded value); the compiled check reads the bytes once against the plan and builds
    nothing. It says True only for documents Parse certainly accepts and False for anything it
    is not sure of, so on False the Python path runs exactly as without it and words every
    violation as before (tests/schema/test_payload_check_native.py)."""
    if plan is None or native.module is None:
        return None
    try:
        return native.module.DocPlan(_flat_plan(plan), _FAST_DEPTH).fits  # type: ignore[no-any-return]
    except ValueError:  # a key naming two fields (a proto2 JSON-name clash): Python decides every payload
        return None


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        raise _DuplicateKey
    return d


#: `_load_json` could not decode the payload
_UNLOADED: Any = object()
#: json_format.Parse's decode (its `_DuplicateChecker` hook, as `_no_duplicates`), built once:
#: `json.loads(..., object_pairs_hook=...)` builds a decoder per call
_HOOKED = json.JSONDecoder(object_pairs_hook=_no_duplicates)


def _load_json(payload: bytes) -> Any:
    """The payload decoded the way `json_format.Parse` decodes it (UTF-8 text, `json.loads`,
    duplicate keys refused), or `_UNLOADED`. Since issue 29 the judge only where the plain decode
    (`_load_json_plain`) failed or the count (`_no_repeated_keys`) could not clear the text: when
    it succeeds, its value equals the plain decoder's (the hook builds the same dict)."""
    try:
        text = payload.decode("utf-8")
        if text.startswith("\ufeff"):  # json.loads' own check, which `JSONDecoder.decode` leaves out
            return _UNLOADED
        return _HOOKED.decode(text)
    except (ValueError, _DuplicateKey, RecursionError):
        return _UNLOADED


def _load_json_plain(payload: bytes) -> tuple[Any, str | None]:
    """(value, text) by a C decoder without a hook, or (`_UNLOADED`, None). A Python call per
    JSON object - Parse's duplicate-key hook - costs about as much as the whole decode (~20 vs ~9
    µs for the 30-item order), so the value is decoded plainly and `_no_repeated_keys` shows from
    the text that no object repeated a key; only where it cannot does `_load_json` decide.

    The decoder is orjson where it is installed and can be trusted with these bytes
    (`_orjson_loads`), else `json.loads`: both give the same value for every document orjson
    is given here."""
    try:
        text = payload.decode("utf-8")
    except ValueError:
        return _UNLOADED, None
    doc = _orjson_loads(payload)
    if doc is not _UNLOADED:
        return doc, text
    try:
        return json.loads(text), text
    except (ValueError, RecursionError):
        return _UNLOADED, None


#: A run of 19 digits: an integer literal orjson may not keep as an int. It turns integers outside
#: [-2**63, 2**64) into floats where `json` (and so `json_format.Parse`) keeps exact ints - a
#: different value, and a different verdict for an integer or double field. Every integer outside
#: that range has at least 19 digits, so a document without a 19-digit run has none. (Digits in
#: strings count too: such documents merely take `json.loads`.) Found as 19 zeros once every digit
#: is a zero: ~0.9 µs for the 1 KB order, where a regular expression took ~8.5 µs - as long as
#: json's whole decode.
_LONG_DIGITS = b"0" * 19
_DIGITS_AS_ZERO = bytes.maketrans(b"0123456789", b"0000000000")


def _orjson_loads(payload: bytes) -> Any:
    """orjson's value of `payload`, or `_UNLOADED` when orjson is absent, refuses the bytes, or the
    bytes may hold an integer literal it would read as a float (`_LONG_DIGITS`).

    Why orjson: the decode was the largest single function of the worker (json's `raw_decode`,
    ~7 % of its samples; ~8.5 µs against orjson's ~3.4 µs for the 0.9 KB order, BENCHMARKS.md).
    Why it is safe: for any document orjson is given here and accepts, its value equals
    `json.loads`' - the same types, the same dict key order (a repeated key: the last value at
    the first key's place), floats correctly rounded by both - so everything downstream (the plan
    walk, the repeated-key count, `ParseDict`'s wording) sees the same value
    (tests/schema/test_payload_check_orjson.py: property tests over number literals, floats,
    documents, bytes and mutated documents; without the digit guard they and the fast path's
    Parse comparison fail). What orjson refuses and `json` reads - NaN and Infinity, numbers
    that overflow to inf, lone surrogate escapes - goes to `json.loads` as before."""
    if _orjson is None or _LONG_DIGITS in payload.translate(_DIGITS_AS_ZERO):
        return _UNLOADED
    try:
        return _orjson.loads(payload)
    except _orjson.JSONDecodeError:
        return _UNLOADED


def _colon_bound(text: str) -> int:
    """An upper bound of (object members in `text`) + (colons in its decoded string values) - see
    `_no_repeated_keys`: every ':' of the text, plus the escapes that decode to one."""
    n = text.count(":")
    if "\\" in text:
        n += text.count("\\u003a") + text.count("\\u003A")
    return n


def _no_repeated_keys(doc: Any, text: str, counted: int = -1) -> bool:
    """True only if no JSON object of `text` (which the plain decoder read as `doc`) names a key
    twice - the verdict of Parse's hook, from a count instead of a call per object.

    Why it is sound: each member of an object has exactly one ':' outside strings, so with M
    members in the text and R raw colons inside its strings, `text.count(":") == M + R`. The plain
    decoder keeps one entry per distinct key, so the decoded objects have K <= M keys in all, and
    K == M only if no object repeated a key (a repeated key loses an entry; an object dropped with
    the value it overwrote was inside an object that repeated a key). The decoded string values
    hold C colons, each a raw colon of its own string or a `\\u003a`/`\\u003A` escape, so R >= C - E
    with E the escapes of that spelling anywhere in the text. Hence K + C == count(":") + E
    implies M <= K, so M == K. Keys' own colons are not counted (R only grows): such documents,
    and any with an unrelated escape, merely fail the test and take Parse's decode.

    `counted`: K + C, when `_walk_top` already summed it while checking the document (>= 0)."""
    if counted < 0:
        counted = 0
        todo = [doc]
        for v in todo:  # a walk that appends as it goes: each value once, no recursion
            t = type(v)
            if t is dict:
                counted += len(v)
                todo += v.values()
            elif t is list:
                todo += v
            elif t is str and ":" in v:
                counted += v.count(":")
    return counted == _colon_bound(text)


def _parse_dict(json_format: Any, doc: Any, message: Any) -> None:
    """`json_format.Parse` after its `json.loads`: `ParseDict`, other errors worded as Parse
    words them (so a violation's text does not depend on which path found it)."""
    try:
        json_format.ParseDict(doc, message)
    except json_format.ParseError:
        raise
    except Exception as e:
        raise json_format.ParseError(f"Failed to parse JSON: {type(e).__name__}: {e}.") from e


def _walk_top(doc: dict[str, Any], plan: dict[str, _FieldPlan]) -> tuple[bool | str, int]:
    """(verdict, count) of the top-level document. The verdict: True when it fits, the first key
    the message does not have when every key before it fits (Parse reports exactly that key; an
    extension-like "[...]" key is not named, Parse words those differently), False otherwise.
    The count, when it fits: its objects' keys plus its string values' colons (what
    `_no_repeated_keys` compares with the text), else -1."""
    counted = len(doc)
    for key, value in doc.items():
        check = plan.get(key)
        if check is None:
            return (False if key.startswith("[") else key), -1
        n = _fits_field(check, value, doc, 1)
        if n < 0:
            return False, -1
        counted += n
    return True, counted


def _fits_messages(docs: Any, plan: dict[str, _FieldPlan], depth: int) -> int:
    """-1, or when every value of `docs` (a list, or a 1-tuple for a single field) is an object
    that fits `plan`: their keys, their nested objects' keys and their string values' colons.
    The values of a repeated field are walked in one call, and a single string or integer - most
    values of an order - is checked here without a call to `_fits_field`: a 30-item order has
    ~90 values, and the calls cost about half of the walk."""
    if depth > _FAST_DEPTH:
        return -1 if docs else 0  # as before: the depth limit stops objects, not an empty list
    counted = 0
    for doc in docs:
        if type(doc) is not dict:
            return -1
        counted += len(doc)
        for key, value in doc.items():
            check = plan.get(key)
            if check is _PLAIN_STR:
                if type(value) is not str or (not value.isascii() and _SURROGATE.search(value) is not None):
                    return -1
                if ":" in value:
                    counted += value.count(":")
                continue
            if check is None:
                return -1
            kind, lo, hi, repeated, _sub, alias = check
            if kind == _INT and not repeated and alias is None:
                if type(value) is not int or not lo <= value <= hi:
                    return -1
            else:
                n = _fits_field(check, value, doc, depth)
                if n < 0:
                    return -1
                counted += n
    return counted


def _fits_field(check: _FieldPlan, value: Any, doc: dict[str, Any], depth: int) -> int:
    """One field's value: -1 when it does not fit, else the keys of the objects in it and the
    colons of its strings (`_no_repeated_keys`). Checks inlined by kind: a 30-item order is ~100
    values, and a call per value would cost as much as the checks themselves."""
    kind, lo, hi, repeated, sub, alias = check
    if alias is not None and alias in doc:
        return -1
    if repeated:
        if type(value) is not list:
            return -1
        values = value
    else:
        values = (value,)
    counted = 0
    if kind == _STR:
        for v in values:
            if type(v) is not str or (not v.isascii() and _SURROGATE.search(v) is not None):
                return -1
            if ":" in v:
                counted += v.count(":")
    elif kind == _INT:
        for v in values:
            if type(v) is not int or not lo <= v <= hi:
                return -1
    elif kind == _MSG:
        return _fits_messages(values, sub, depth + 1)
    elif kind == _NUM:
        for v in values:
            t = type(v)
            if not ((t is float and lo <= v <= hi) or (t is int and -2**63 <= v < 2**64)):
                return -1
    else:
        for v in values:
            if type(v) is not bool:
                return -1
    return counted


def _jsonschema_validator(resolved: ResolvedSchema) -> Validator:
    import jsonschema

    schema = schema_json(resolved.schema_text, "JSON Schema")
    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)

    def validate(payload: bytes, content_type: str) -> list[Violation]:
        try:
            doc = loads_untrusted(payload, what="payload", max_bytes=DEFAULT_MAX_DECOMPRESSED)
        except ValueError as exc:  # JsonInputError: syntax, size or depth
            return [Violation("$", f"payload is not JSON: {exc}", "not JSON")]
        errors = sorted(validator.iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
        return [Violation(json_path(e.absolute_path), e.message, _rule(e)) for e in errors[:MAX_VIOLATIONS]]

    return validate


def _rule(e: Any) -> str:
    """A jsonschema error as `keyword: expectation` (`type: number`), without the instance."""
    expected = json.dumps(e.validator_value, separators=(",", ":"), default=str)
    return f"{e.validator}: {expected[:80]}"


def _avro_validator(resolved: ResolvedSchema) -> Validator:
    import fastavro
    from fastavro.validation import validate as avro_valid

    named: dict[str, Any] = {}
    parsed = fastavro.parse_schema(schema_json(resolved.schema_text, "Avro schema"), named_schemas=named)
    #: the same schema with named types inlined, so most sub-schemas stand alone for `locate`
    expanded = fastavro.parse_schema(schema_json(resolved.schema_text, "Avro schema"), expand=True)

    def valid(value: Any, sub: Any) -> bool:
        """`value` matches the sub-schema `sub`. A recursive type stays a bare name even when
        expanded, and fastavro cannot validate against a bare name alone (`UnknownType`): the
        sub-schema is checked as the one field of a probe record parsed with the schema's named
        types. Only the path of a violation the whole datum already has depends on this."""
        try:
            probe = fastavro.parse_schema({"type": "record", "name": "__prism_probe", "fields": [
                {"name": "x", "type": sub}]}, named_schemas=dict(named))
            return bool(avro_valid({"x": value}, probe, raise_errors=False))
        except Exception:  # a sub-schema fastavro cannot take alone: stop descending here
            return True

    def locate(datum: Any, schema: Any, path: list[Any]) -> list[Any]:
        """The deepest position under `path` whose value fastavro rejects."""
        s = named.get(schema, schema) if isinstance(schema, str) else schema
        if isinstance(s, list):  # a union: follow the one branch of the datum's shape, if one
            shape = ("record", "map") if isinstance(datum, dict) else ("array",) if isinstance(datum, list) else ()
            branches = [b for b in (named.get(x, x) if isinstance(x, str) else x for x in s)
                        if isinstance(b, dict) and b.get("type") in shape]
            s = branches[0] if len(branches) == 1 else None
        if isinstance(s, dict):
            t = s.get("type")
            if t == "record" and isinstance(datum, dict):
                for f in s["fields"]:
                    value = datum.get(f["name"], f.get("default"))
                    if not valid(value, f["type"]):
                        return locate(value, f["type"], [*path, f["name"]])
            elif t == "array" and isinstance(datum, list):
                for i, item in enumerate(datum):
                    if not valid(item, s["items"]):
                        return locate(item, s["items"], [*path, i])
            elif t == "map" and isinstance(datum, dict):
                for k, item in datum.items():
                    if not valid(item, s["values"]):
                        return locate(item, s["values"], [*path, k])
        return path

    def validate(payload: bytes, content_type: str) -> list[Violation]:
        if "json" in content_type:
            try:
                datum: Any = loads_untrusted(payload, what="payload", max_bytes=DEFAULT_MAX_DECOMPRESSED)
            except ValueError as exc:  # JsonInputError: syntax, size or depth
                return [Violation("$", f"payload is not JSON: {exc}", "not JSON")]
            try:
                avro_valid(datum, parsed, raise_errors=True)
            except Exception as exc:
                errors = getattr(exc, "errors", None) or [exc]
                where = json_path(locate(datum, expanded, []))
                return [Violation(where, f"does not match the Avro schema: {str(errors[0]).strip()}",
                                  "avro: value does not match the field's type")]
            return []
        try:
            fastavro.schemaless_reader(io.BytesIO(payload), parsed)
        except Exception as exc:
            return [Violation("$", f"payload is not binary Avro of this schema: {exc}", "avro binary encoding")]
        return []

    return validate
