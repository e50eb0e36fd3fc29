"""Consumers that use the schema (RFC-030 "Consumer PII Awareness"), and the publish side of
RFC-030 "Migration Path" phase 2.

**Decoding by the envelope's schema.** A received envelope names its schema in its
`SchemaContext`: `schema_url` is the registry URL of a subject version
(`.../v1/subjects/{s}/versions/{n}`, Prism; `.../subjects/{s}/versions/{n}`, Confluent) or
of a schema id (`.../v1/schemas/{id}`, `.../schemas/ids/{id}`), or the Confluent schema id
travels in the `schema.id` extension. `SchemaResolver` turns that reference into a
`PayloadSchema` - fetched from the **client's own** registry (`PrismClient(registry_url=)`),
cached per subject version and per id (LRU, bounded) - which decodes the payload (protobuf,
JSON Schema, Avro) and knows which fields are PII.

What a reference may not do, because the envelope is producer-controlled:

* make the consumer call another host: only the URL's *path* is read; the scheme and host
  are ignored, the client's `registry_url` is asked;
* borrow another subject's schema (say one without PII tags, so that nothing is masked): the
  subject must be the message's topic (or `<topic>-value`), or the one the consumer names
  with `subject=`; an id must be registered under such a subject;
* swap the content: a `schema_hash` in the envelope must be the fetched schema's;
* flood the registry: a reference that failed is remembered (bounded, `negative_ttl_s`), so
  a stream of forged references costs one registry call per distinct reference and interval.

Each of these raises `SchemaReferenceError`; the message is left unsettled for the consumer.

**PII.** Paths are payload paths, JSONPath-style: `$.customer.email`, `$.items[3].ssn`
(indices and `[*]` are ignored; a map's key is any segment). A field is PII when the schema
tags it - `(prism.pii)`, `x-prism-pii`, `prism.pii` with any value but `"none"`, or an
encryption tag - or when a field enclosing it is. **Untagged means not PII**: a field the
schema does not know (an extra JSON property, an unknown protobuf field) or does not tag is
not masked; a registry policy of `require_pii_tags` (phase 3) is what makes every field say
which it is. `mask_pii(value)` returns a copy with every PII field replaced by `MASK`
(`"***"`; protobuf: strings and bytes get the mask, other types are cleared, since a number
field cannot hold it); the input is never changed. Deeper than `MAX_DEPTH` levels, a value
is masked whole (an untrusted payload cannot make the walk unbounded or skip a field).

**Publish (phase 2).** With `registry_url`, `publish` asks the registry once per namespace
and `ttl_s` whether the namespace's policy has `require_schema`; if so, a topic whose subject
(named like the topic) has no registered version raises `SchemaRequiredError` before
anything is sent. A registry that cannot be reached does not stop publishing (logged once;
production traffic must not depend on the registry's uptime) - the worker's start-up check
(`app.worker.schema_policy`) is the strict one.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import re
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..decimal_text import decimal
from ..envelope.compression import DEFAULT_MAX_DECOMPRESSED
from ..errors import PayloadError, SchemaReferenceError, SchemaRequiredError
from ..schema.model import SchemaFormat, schema_json
from ..schema.pii import avro_named_types
from ..schema.resolve import ResolvedSchema, SchemaResolutionError, build_resolved
from ..untrusted_json import loads_untrusted

log = logging.getLogger("prism.sdk.schemas")

#: what a PII field's value is replaced with
MASK = "***"
#: payload nesting deeper than this is masked whole
MAX_DEPTH = 64
#: the `schema.id` envelope extension (Confluent schema ids from headers, app/formats/_fields.py)
SCHEMA_ID_EXTENSION = "schema.id"

# [0-9]{1,10}, not \d+: a received envelope's URL, read back by int() (no other digits, no 5,000 of them)
_SUBJECT_VERSION = re.compile(r"/subjects/([^/]+)/versions/([0-9]{1,10})/?$")
_SCHEMA_ID = re.compile(r"/(?:v1/schemas|schemas/ids)/([0-9]{1,10})/?$")
_PII_OPTION, _ENCRYPT_OPTION = 50430, 50431  # app/schema/pii.py


# --------------------------------------------------------------------------------------------- PII tree


@dataclass(eq=False)
class _Node:
    """A field of the payload: whether it is PII, and its own fields (shared between every
    use of one message/record/definition, so recursive types are finite). `keyed`: a map,
    whose next path segment is a key."""

    pii: bool = False
    fields: dict[str, _Node] = field(default_factory=dict)
    keyed: bool = False


def _is_pii(tags: dict[str, str]) -> bool:
    tag = tags.get("pii")
    if tag is not None:
        return tag.strip().lower() not in ("none", "false", "")
    return bool(tags.get("encrypt"))


def _proto_tree(text: str, root: str, imports: dict[str, str] | None = None) -> _Node:
    from ..schema.protoparse import compile_proto, messages_by_name, string_options

    msgs: dict[str, Any] = messages_by_name(compile_proto(text, imports=imports or None).files, leading_dot=True)
    memo: dict[str, _Node] = {}

    def build(full: str) -> _Node:
        if full in memo:
            return memo[full]
        node = memo[full] = _Node()
        for f in msgs[full].field:
            opts = string_options(f.options, (_PII_OPTION, _ENCRYPT_OPTION))
            tags = {k: opts[n] for k, n in (("pii", _PII_OPTION), ("encrypt", _ENCRYPT_OPTION)) if n in opts}
            child = _Node(pii=_is_pii(tags))
            target = f.type_name if f.type == f.TYPE_MESSAGE and f.type_name in msgs else None
            if target is not None and msgs[target].options.map_entry:
                child.keyed = True  # the tag is on the map field; its values' fields are the value type's
                value = next((v for v in msgs[target].field if v.number == 2), None)
                target = value.type_name if value is not None and value.type_name in msgs else None
            if target is not None:
                child.fields = build(target).fields
            for name in {f.name, f.json_name or f.name}:  # JSON payloads use either spelling
                node.fields[name] = child
        return node

    key = root if root.startswith(".") else f".{root}"
    if key not in msgs:
        raise SchemaResolutionError(f"message {root!r} is not in the schema")
    return build(key)


def _json_tree(text: str) -> _Node:
    root = schema_json(text, "JSON Schema")
    memo: dict[str, _Node] = {}

    def deref(node: Any) -> tuple[Any, str | None]:
        ref = node.get("$ref") if isinstance(node, dict) else None
        if isinstance(ref, str) and ref.startswith("#"):
            target: Any = root
            for part in ref[2:].split("/") if len(ref) > 1 else []:
                target = target.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(target, dict) else None
            return target, ref
        return node, None

    def build(schema: Any, into: _Node, depth: int) -> None:
        schema, ref = deref(schema)
        if not isinstance(schema, dict) or depth > 32:
            return
        if ref is not None:
            known = memo.get(ref)
            if known is not None:
                if known is not into:  # share (recursive definitions stay finite), or merge into siblings
                    into.fields = known.fields if not into.fields else {**into.fields, **known.fields}
                return
            memo[ref] = into
        for name, sub in (schema.get("properties") or {}).items():
            if not isinstance(sub, dict):
                continue
            tags = {k: str(sub[f"x-prism-{k}"]) for k in ("pii", "encrypt") if f"x-prism-{k}" in sub}
            child = into.fields.get(name) or _Node()
            child.pii = child.pii or _is_pii(tags)
            into.fields[name] = child
            build(sub, child, depth + 1)
        items = schema.get("items")
        if isinstance(items, dict):
            build(items, into, depth + 1)  # an array is transparent: its items' fields are the field's
        for key in ("anyOf", "oneOf", "allOf"):
            for branch in schema.get(key) or []:
                build(branch, into, depth + 1)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and not schema.get("properties"):
            into.keyed = True
            build(extra, into, depth + 1)

    top = _Node()
    build(root, top, 0)
    return top


def _avro_tree(text: str) -> _Node:
    root = schema_json(text, "Avro schema")
    named = avro_named_types(root)
    memo: dict[int, _Node] = {}

    def build(t: Any, into: _Node, depth: int) -> None:
        if depth > 32:
            return
        if isinstance(t, str):
            t = named.get(t, t)
        if isinstance(t, list):
            for b in t:
                build(b, into, depth + 1)
            return
        if not isinstance(t, dict):
            return
        kind = t.get("type")
        if kind in ("record", "error"):
            known = memo.get(id(t))
            if known is not None:
                if known is not into:
                    into.fields = known.fields if not into.fields else {**into.fields, **known.fields}
                return
            memo[id(t)] = into
            for f in t.get("fields", []):
                tags = {k: str(f[f"prism.{k}"]) for k in ("pii", "encrypt") if f"prism.{k}" in f}
                child = _Node(pii=_is_pii(tags))
                into.fields[f["name"]] = child
                build(f.get("type"), child, depth + 1)
        elif kind == "array":
            build(t.get("items"), into, depth + 1)
        elif kind == "map":
            into.keyed = True
            build(t.get("values"), into, depth + 1)
        elif (isinstance(kind, str) and kind in named) or isinstance(kind, dict | list):
            build(kind, into, depth + 1)  # {"type": {...}} or {"type": "NamedRecord"}

    top = _Node()
    build(root, top, 0)
    return top


_SEGMENT = re.compile(r"""\.([^.\[\]]+)|\[(\d+|\*|)\]|\[(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)')\]""")


def _segments(path: str) -> list[str]:
    """`$.items[2]["the key"].price` -> `["items", "the key", "price"]` (indices dropped)."""
    p = path.strip()
    if p.startswith("$"):
        p = p[1:]
    if p and not p.startswith((".", "[")):
        p = "." + p
    out: list[str] = []
    pos = 0
    while pos < len(p):
        m = _SEGMENT.match(p, pos)
        if m is None:
            raise ValueError(f"not a field path: {path!r} (use $.a.b[0].c)")
        name = m.group(1) if m.group(1) is not None else m.group(3) if m.group(3) is not None else m.group(4)
        if name is not None:
            out.append(name)
        pos = m.end()
    return out


# --------------------------------------------------------------------------------------------- schema


class PayloadSchema:
    """A registered schema a consumer decodes payloads with, and its PII fields (module docs)."""

    def __init__(self, resolved: ResolvedSchema, *, subject: str = "", version: int | None = None,
                 schema_id: int | None = None) -> None:
        self.resolved = resolved
        self.subject, self.version, self.schema_id = subject, version, schema_id
        #: (subject, version) pairs the registry holds this schema under (filled for lookups by id)
        self.registered_as: frozenset[tuple[str, int]] = frozenset(
            {(subject, version)} if subject and version is not None else ())
        #: the registry's hash of the schema (differs from `hash` only for schemas with references)
        self.registry_hash = ""
        self.format = resolved.format
        self._classes: dict[str, Any] = {}
        self._trees: dict[str, _Node] = {}
        self._avro: Any = None

    @classmethod
    def from_text(cls, text: str, fmt: SchemaFormat | str, *, subject: str = "", version: int | None = None,
                  schema_id: int | None = None, message: str | None = None) -> PayloadSchema:
        """Build one from a schema's text (tests, or a schema the application holds itself)."""
        resolved = build_resolved(text, fmt, url=f"{subject}/versions/{version}" if subject else "local",
                                  version=f"v{version}" if version is not None else "", message=message)
        return cls(resolved, subject=subject, version=version, schema_id=schema_id)

    @property
    def hash(self) -> str:
        return self.resolved.hash

    def accepts_hash(self, digest: str) -> bool:
        """Whether an envelope's `schema_hash` names this schema: its hash, the registry's, or
        (Avro, JSON Schema with references) the hash of its text alone, which producers
        stamped before references were resolved."""
        return digest in (self.resolved.hash, self.registry_hash, *self.resolved.alternate_hashes) and bool(digest)

    def __repr__(self) -> str:
        where = f"{self.subject} v{self.version}" if self.subject else self.resolved.url
        return f"PayloadSchema({where}, {self.format.value}, id={self.schema_id})"

    # -- protobuf ------------------------------------------------------------------------------
    def _root(self, message: str | None) -> str:
        name = self.resolved.name
        if message and self.format is SchemaFormat.PROTOBUF:
            try:
                self._message_class(message)
                return message
            except (KeyError, SchemaResolutionError):
                pass
        return name

    def _message_class(self, name: str) -> Any:
        cls = self._classes.get(name)
        if cls is None:
            from google.protobuf import descriptor_pool, message_factory

            from ..schema.protoparse import compile_proto

            pool = descriptor_pool.DescriptorPool()
            for fd in compile_proto(self.resolved.schema_text, imports=dict(self.resolved.imports) or None).fds.file:
                pool.Add(fd)
            cls = self._classes[name] = message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
        return cls

    def _tree(self, root: str | None = None) -> _Node:
        key = root or self.resolved.name
        tree = self._trees.get(key)
        if tree is None:
            text = self.resolved.schema_text
            tree = self._trees[key] = (_proto_tree(text, key, dict(self.resolved.imports))
                                       if self.format is SchemaFormat.PROTOBUF
                                       else _json_tree(text) if self.format is SchemaFormat.JSON else _avro_tree(text))
        return tree

    # -- decode --------------------------------------------------------------------------------
    def decode(self, payload: bytes, content_type: str = "", *, message: str | None = None) -> Any:
        """The payload as this schema reads it: a protobuf message (binary, or JSON under the
        protobuf JSON mapping), the parsed JSON value (JSON Schema), or the Avro datum (binary
        Avro, or a JSON document). `message`: the protobuf root (default: the schema's; the
        payload's type URL when it names one of the schema's messages). Raises `PayloadError`."""
        ct = content_type.split(";", 1)[0].strip().lower()
        try:
            if self.format is SchemaFormat.PROTOBUF:
                cls = self._message_class(self._root(message))
                if "json" in ct:
                    from google.protobuf import json_format

                    return json_format.Parse(payload, cls())
                return cls.FromString(payload)
            if self.format is SchemaFormat.JSON or "json" in ct:
                return loads_untrusted(payload, what="payload", max_bytes=DEFAULT_MAX_DECOMPRESSED)
            import io

            import fastavro

            if self._avro is None:
                self._avro = fastavro.parse_schema(schema_json(self.resolved.schema_text, "Avro schema"))
            buf = io.BytesIO(payload)
            datum = fastavro.schemaless_reader(buf, self._avro)
            if buf.tell() != len(payload):
                raise ValueError(f"{len(payload) - buf.tell()} byte(s) after the Avro datum")
            return datum
        except PayloadError:
            raise
        except Exception as exc:  # each library's own parse error; the payload is untrusted
            raise PayloadError(f"payload is not a valid {self.format.value} value of {self!r}: "
                               f"{str(exc)[:200]}", path="payload",
                               hint="read it with payload_bytes(); the producer wrote something else") from None

    # -- PII -----------------------------------------------------------------------------------
    def is_pii_field(self, path: str, *, message: str | None = None) -> bool:
        """Whether the payload field at `path` (`$.customer.email`, `$.items[0].ssn`) is PII by
        this schema's tags, or lies under a tagged field. Unknown and untagged fields: False."""
        node = self._tree(self._root(message) if self.format is SchemaFormat.PROTOBUF else None)
        skip_key = False
        for seg in _segments(path):
            if skip_key:
                skip_key = False
                continue
            child = node.fields.get(seg)
            if child is None:
                return False
            if child.pii:
                return True
            node, skip_key = child, child.keyed
        return False

    def pii_paths(self) -> list[str]:
        """Payload paths (dotted; `*` for a map key) of the fields the schema tags as PII."""
        out: list[str] = []
        seen: set[int] = set()

        def walk(node: _Node, prefix: str) -> None:
            if id(node.fields) in seen:
                return
            seen.add(id(node.fields))
            for name, child in node.fields.items():
                path = f"{prefix}{name}"
                if child.pii:
                    out.append(path)
                elif child.fields:
                    walk(child, f"{path}.*." if child.keyed else f"{path}.")
            seen.discard(id(node.fields))

        walk(self._tree(), "")
        return sorted(set(out))

    def mask_pii(self, value: Any, *, message: str | None = None) -> Any:
        """A copy of `value` (a decoded payload: dict/list, or a protobuf message) with every PII
        field masked (module docs). Never changes `value`."""
        from google.protobuf.message import Message

        if isinstance(value, Message):
            root = value.DESCRIPTOR.full_name
            out = type(value)()
            out.CopyFrom(value)
            _mask_message(out, self._tree(root if self.format is SchemaFormat.PROTOBUF else None), 0)
            return out
        node = self._tree(self._root(message) if self.format is SchemaFormat.PROTOBUF else None)
        return _mask(value, node, 0)


def _mask(value: Any, node: _Node, depth: int) -> Any:
    if depth > MAX_DEPTH:
        return MASK
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            child = node.fields.get(k) if isinstance(k, str) else None
            if child is None:
                out[k] = _mask(v, _Node(), depth + 1) if isinstance(v, dict | list) else v
            elif child.pii:
                out[k] = MASK
            elif child.keyed and isinstance(v, dict):
                out[k] = {key: _mask(item, child, depth + 2) for key, item in v.items()}
            else:
                out[k] = _mask(v, child, depth + 1)
        return out
    if isinstance(value, list):
        return [_mask(v, node, depth + 1) for v in value]
    return copy.copy(value)


def _mask_message(msg: Any, node: _Node, depth: int) -> None:
    """Mask a protobuf message copy in place (module docs)."""
    for fd, value in msg.ListFields():
        if fd.is_extension:
            continue
        child = node.fields.get(fd.name)
        if child is None:
            continue
        is_map = fd.message_type is not None and fd.message_type.GetOptions().map_entry
        if child.pii or depth > MAX_DEPTH:
            _mask_proto_field(msg, fd, is_map)
        elif fd.message_type is not None:
            if is_map:
                vfd = fd.message_type.fields_by_name["value"]
                if vfd.message_type is not None:
                    for k in list(value):
                        _mask_message(value[k], child, depth + 1)
            elif _repeated(fd):
                for item in value:
                    _mask_message(item, child, depth + 1)
            else:
                _mask_message(value, child, depth + 1)


def _repeated(fd: Any) -> bool:
    # protobuf 6 has `is_repeated` (and no `label` on upb descriptors); older ones the label
    flag = getattr(fd, "is_repeated", None)
    return bool(flag) if flag is not None else fd.label == 3


def _mask_proto_field(msg: Any, fd: Any, is_map: bool) -> None:
    T = fd.type
    if is_map:
        vfd = fd.message_type.fields_by_name["value"]
        container = getattr(msg, fd.name)
        if vfd.type in (vfd.TYPE_STRING, vfd.TYPE_BYTES):
            mask = MASK if vfd.type == vfd.TYPE_STRING else MASK.encode()
            for k in list(container):
                container[k] = mask
            return
        msg.ClearField(fd.name)
        return
    if T in (fd.TYPE_STRING, fd.TYPE_BYTES):
        mask = MASK if T == fd.TYPE_STRING else MASK.encode()
        if _repeated(fd):
            container = getattr(msg, fd.name)
            n = len(container)
            del container[:]
            container.extend([mask] * n)
        else:
            setattr(msg, fd.name, mask)
        return
    msg.ClearField(fd.name)


# --------------------------------------------------------------------------------------------- resolver


@dataclass(frozen=True, slots=True)
class SchemaRef:
    """What an envelope's schema context points at: a subject version, or a schema id."""

    subject: str | None
    version: int | None
    schema_id: int | None
    hash: str = ""
    message: str = ""

    @classmethod
    def of(cls, env: Any) -> SchemaRef:
        """Read the reference from an envelope (raises `SchemaReferenceError` when it names none)."""
        header = env.header
        sc = header.schema if header.HasField("schema") else None
        url = sc.schema_url if sc is not None else ""
        digest = sc.schema_hash if sc is not None else ""
        name = sc.schema_name if sc is not None else ""
        path = urllib.parse.urlsplit(url).path if "://" in url else url
        m = _SUBJECT_VERSION.search(path)
        if m is not None:
            return cls(urllib.parse.unquote(m.group(1)), int(m.group(2)), None, digest, name)
        m = _SCHEMA_ID.search(path)
        raw = env.extensions.get(SCHEMA_ID_EXTENSION) if m is None else None
        if m is not None or raw:
            text = m.group(1) if m is not None else bytes(raw).decode("utf-8", "replace").strip()
            if 0 < (schema_id := decimal(text) or 0) < 2**31:
                return cls(None, None, schema_id, digest, name)
        raise SchemaReferenceError(
            f"message {env.message_id} names no registered schema (schema_url {url[:200]!r})",
            path="schema.schema_url",
            hint="the producer or the worker's enrich stage must stamp a registry schema (subject version or id)")


class SchemaResolver:
    """Registry-backed `PayloadSchema`s by subject version and by id, cached (module docs).

    Positive entries are immutable in the registry (a version's content never changes), so
    they are kept until evicted (LRU, `max_entries`); failures for `negative_ttl_s`."""

    def __init__(self, registry_url: str, *, max_entries: int = 256, negative_ttl_s: float = 30.0,
                 timeout_s: float = 5.0) -> None:
        self.registry_url = registry_url.rstrip("/")
        self.max_entries = max(1, max_entries)
        self.negative_ttl_s = negative_ttl_s
        self.timeout_s = timeout_s
        self._cache: OrderedDict[tuple[Any, ...], PayloadSchema] = OrderedDict()
        self._failed: OrderedDict[tuple[Any, ...], tuple[float, str]] = OrderedDict()
        self._lock = asyncio.Lock()
        #: registry GETs made (tests and the curious: the cache at work)
        self.fetches = 0

    # -- cache -----------------------------------------------------------------------------------------
    def _hit(self, key: tuple[Any, ...]) -> PayloadSchema | None:
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        failed = self._failed.get(key)
        if failed is not None:
            if time.monotonic() < failed[0]:
                raise SchemaReferenceError(failed[1], path="schema.schema_url")
            del self._failed[key]
        return None

    def _put(self, key: tuple[Any, ...], schema: PayloadSchema) -> None:
        self._cache[key] = schema
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)

    def _fail(self, key: tuple[Any, ...], message: str) -> SchemaReferenceError:
        self._failed[key] = (time.monotonic() + self.negative_ttl_s, message)
        while len(self._failed) > self.max_entries:
            self._failed.popitem(last=False)
        return SchemaReferenceError(message, path="schema.schema_url",
                                    hint="the envelope references a schema this registry does not hold for "
                                         "this topic; ack() (drop) or nack() the message")

    def _get_json(self, path: str) -> Any:
        from ..schema.resolve import _http_json

        self.fetches += 1
        return _http_json(self.registry_url + path, timeout=self.timeout_s)

    def _fetch_version(self, subject: str, version: str) -> Any:
        """A referenced subject version, for `build_resolved` (called in a worker thread)."""
        q = urllib.parse.quote(subject, safe="")
        return self._get_json(f"/v1/subjects/{q}/versions/{urllib.parse.quote(version, safe='')}")

    async def _cached(self, key: tuple[Any, ...], fetch: Callable[[], Awaitable[PayloadSchema]]) -> PayloadSchema:
        """The cached schema under `key`, else `fetch()`'s (one fetch at a time: a reference many
        messages share costs one registry call), cached under `key` and under its schema id."""
        hit = self._hit(key)
        if hit is not None:
            return hit
        async with self._lock:
            hit = self._hit(key)
            if hit is not None:
                return hit
            schema = await fetch()
            self._put(key, schema)
            if schema.schema_id is not None:
                self._put(("id", schema.schema_id), schema)
            return schema

    # -- lookups ---------------------------------------------------------------------------------------
    async def get(self, subject: str, version: int) -> PayloadSchema:
        """`version` of `subject` (a number: versions never change, so the answer is cached)."""
        key = ("sv", subject, int(version))

        async def fetch() -> PayloadSchema:
            q = urllib.parse.quote(subject, safe="")
            try:
                doc = await asyncio.to_thread(self._get_json, f"/v1/subjects/{q}/versions/{int(version)}")
                resolved = await asyncio.to_thread(
                    build_resolved, doc["schema"], doc["format"], url=f"{subject}/{version}",
                    version=f"v{doc['version']}", references=doc.get("references"), fetch=self._fetch_version,
                    root=(subject, int(doc["version"])))
                schema = PayloadSchema(resolved, subject=subject, version=int(doc["version"]),
                                       schema_id=int(doc["id"]))
                schema.registry_hash = str(doc.get("hash", ""))
            except (SchemaResolutionError, KeyError, TypeError, ValueError, AttributeError) as exc:
                raise self._fail(key, f"schema {subject!r} version {version} cannot be read from the registry: "
                                      f"{str(exc)[:300]}") from None
            return schema

        return await self._cached(key, fetch)

    async def by_id(self, schema_id: int) -> PayloadSchema:
        """The schema with this id, and the subject versions it is registered under (checked by
        :meth:`for_envelope` against the message's subject)."""
        key = ("id", int(schema_id))

        async def fetch() -> PayloadSchema:
            try:
                doc = await asyncio.to_thread(self._get_json, f"/v1/schemas/{int(schema_id)}")
                where = await asyncio.to_thread(self._get_json, f"/schemas/ids/{int(schema_id)}/versions")
                first = where[0] if where else {}
                # /v1/schemas/{id} does not list references; the Confluent route does
                refs = (await asyncio.to_thread(self._get_json, f"/schemas/ids/{int(schema_id)}")).get("references")
                resolved = await asyncio.to_thread(
                    build_resolved, doc["schema"], doc["format"], url=f"ids/{schema_id}",
                    version=f"v{first.get('version', '')}", references=refs, fetch=self._fetch_version)
                schema = PayloadSchema(resolved,
                                       subject=str(first.get("subject", "")), version=first.get("version"),
                                       schema_id=int(schema_id))
                schema.registered_as = frozenset((str(w["subject"]), int(w["version"])) for w in where)
                schema.registry_hash = str(doc.get("hash", ""))
            except (SchemaResolutionError, KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
                raise self._fail(key, f"schema id {schema_id} cannot be read from the registry: "
                                      f"{str(exc)[:300]}") from None
            return schema

        return await self._cached(key, fetch)

    async def for_envelope(self, env: Any, *, subjects: Iterable[str] | None = None) -> PayloadSchema:
        """The schema `env` references, checked (module docs). `subjects`: the subjects the
        consumer accepts (default: the envelope's topic and `<topic>-value`)."""
        ref = SchemaRef.of(env)
        allowed = set(subjects) if subjects is not None else {env.topic, f"{env.topic}-value"}
        if ref.subject is not None:
            if ref.subject not in allowed:
                raise SchemaReferenceError(
                    f"message {env.message_id} on topic {env.topic!r} references subject {ref.subject[:200]!r}, "
                    f"not one of {sorted(allowed)}", path="schema.schema_url",
                    hint="a message may only be decoded by its own topic's schema; pass subject= if the topic's "
                         "subject has another name")
            assert ref.version is not None
            schema = await self.get(ref.subject, ref.version)
        else:
            assert ref.schema_id is not None
            schema = await self.by_id(ref.schema_id)
            if not any(s in allowed for s, _ in schema.registered_as):
                raise SchemaReferenceError(
                    f"message {env.message_id} on topic {env.topic!r} references schema id {ref.schema_id}, which "
                    f"is not registered under {sorted(allowed)}", path="schema.schema_url",
                    hint="pass subject= if the topic's subject has another name")
        if ref.hash and not schema.accepts_hash(ref.hash):
            raise SchemaReferenceError(
                f"message {env.message_id} claims schema hash {ref.hash[:80]!r}, but {schema!r} hashes to "
                f"{schema.hash}", path="schema.schema_hash",
                hint="the envelope's schema context was altered, or names another registry's schema")
        return schema


# --------------------------------------------------------------------------------------------- publish


class SchemaRequirement:
    """`require_schema` at publish (module docs): the namespace's policy, cached for `ttl_s`,
    and whether the topic's subject has a live version (cached once seen: it stays registered)."""

    def __init__(self, registry_url: str, *, ttl_s: float = 60.0, timeout_s: float = 2.0) -> None:
        self.registry_url = registry_url.rstrip("/")
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._policy: dict[str, tuple[float, bool]] = {}
        self._registered: dict[str, float] = {}
        self._lock = asyncio.Lock()
        self._warned = False

    def _get(self, path: str) -> Any:
        from ..schema.resolve import _http_json

        return _http_json(self.registry_url + path, timeout=self.timeout_s)

    async def _required(self, namespace: str) -> bool:
        now = time.monotonic()
        hit = self._policy.get(namespace)
        if hit is not None and now < hit[0]:
            return hit[1]
        async with self._lock:
            hit = self._policy.get(namespace)
            if hit is not None and time.monotonic() < hit[0]:
                return hit[1]
            q = urllib.parse.quote(f"ns:{namespace}", safe="")
            try:
                doc = await asyncio.to_thread(self._get, f"/v1/policies/{q}")
                required = isinstance(doc, dict) and doc.get("require_schema") is True
                self._policy[namespace] = (time.monotonic() + self.ttl_s, required)
            except SchemaResolutionError as exc:
                # Never stop production traffic on the registry's uptime: publish, say so once,
                # ask again after a short pause.
                (log.debug if self._warned else log.warning)(
                    "cannot read the schema policy of namespace %r (%s); publishing without the require_schema "
                    "check", namespace, exc)
                self._warned = True
                self._policy[namespace] = (time.monotonic() + min(self.ttl_s, 5.0), False)
                required = False
            return required

    async def check(self, namespace: str, topic: str) -> None:
        """Raise `SchemaRequiredError` when `namespace` requires a schema and `topic` has none."""
        now = time.monotonic()
        seen = self._registered.get(topic)
        if seen is not None and now < seen:
            return
        if not await self._required(namespace):
            return
        q = urllib.parse.quote(topic, safe="")
        try:
            await asyncio.to_thread(self._get, f"/v1/subjects/{q}/versions/latest")
        except SchemaResolutionError as exc:
            if "404" not in str(exc):  # unreachable, not "no such subject": do not block (see _required)
                log.warning("cannot check the subject of %r in the registry (%s); publishing", topic, exc)
                return
            raise SchemaRequiredError(
                f"namespace {namespace!r} requires a schema for every topic (registry policy require_schema), and "
                f"topic {topic!r} has no registered subject; nothing was published", path="publish(topic=)",
                hint=f"register it first: prism schema register --file <schema> --topic {topic}") from None
        self._registered[topic] = time.monotonic() + self.ttl_s


__all__ = ["MASK", "MAX_DEPTH", "PayloadSchema", "SchemaRef", "SchemaRequirement", "SchemaResolver"]
