"""Protobuf schemas in Confluent's *serialized* form: base64 of a ``FileDescriptorProto``.

Confluent's clients (confluent-kafka's ``ProtobufSerializer``, the Java/Go serdes) register a
protobuf schema as ``base64(FileDescriptorProto)`` - the descriptor compiled into the
producer's generated code - not as ``.proto`` text, and their deserializers fetch schemas
with ``?format=serialized`` and parse the answer back into a descriptor. Confluent stores
text: it renders the descriptor as ``.proto`` source. We do the same, so lookups,
compatibility, PII checks and hashing see one form whichever way a schema arrived:

- :func:`parse_serialized` recognises the serialized form (strict base64 that decodes to a
  descriptor declaring at least one message, enum or service; ``.proto`` text can never be
  strict base64 - it contains spaces or ``;``);
- :func:`render_proto` renders it as ``.proto`` text, fully-qualified type names (``.pkg.Msg``)
  so no name resolution can differ;
- :func:`same_schema` compares the descriptor protoc builds from that text with the one the
  client sent: the registry refuses (42201) a descriptor it cannot render faithfully instead
  of storing a different schema;
- :func:`serialize` is the way back for ``?format=serialized``.

Not rendered (refused with a clear message): proto2 groups, editions, and custom options
other than Prism's own ``(prism.pii)``/``(prism.encrypt)``/``(prism.index)``.
"""

from __future__ import annotations

import base64
import binascii
import math
import re

from google.protobuf import descriptor_pb2, text_format
from google.protobuf.message import DecodeError, Message

from app.schema.model import SchemaError

FDP = descriptor_pb2.FileDescriptorProto
F = descriptor_pb2.FieldDescriptorProto

_B64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_MAX_FIELD = 536870911  # 2^29 - 1: "max" in reserved / extensions ranges
#: Prism's FieldOptions extensions (app/schema/proto/prism/annotations.proto), all strings.
_PRISM_FIELD_OPTIONS = {50430: "prism.pii", 50431: "prism.encrypt", 50432: "prism.index"}

_SCALARS = {
    F.TYPE_DOUBLE: "double", F.TYPE_FLOAT: "float", F.TYPE_INT64: "int64", F.TYPE_UINT64: "uint64",
    F.TYPE_INT32: "int32", F.TYPE_FIXED64: "fixed64", F.TYPE_FIXED32: "fixed32", F.TYPE_BOOL: "bool",
    F.TYPE_STRING: "string", F.TYPE_BYTES: "bytes", F.TYPE_UINT32: "uint32", F.TYPE_SFIXED32: "sfixed32",
    F.TYPE_SFIXED64: "sfixed64", F.TYPE_SINT32: "sint32", F.TYPE_SINT64: "sint64",
}


def parse_serialized(text: str) -> FDP | None:
    """The descriptor if ``text`` is Confluent's serialized form, else ``None`` (plain text)."""
    stripped = text.strip()
    if len(stripped) < 4 or len(stripped) % 4 or not _B64.fullmatch(stripped):
        return None
    try:
        raw = base64.b64decode(stripped, validate=True)
        fdp = FDP()
        fdp.ParseFromString(raw)
    except (binascii.Error, DecodeError, ValueError):
        return None
    if not (fdp.message_type or fdp.enum_type or fdp.service):
        return None
    return fdp


def serialize(fdp: FDP) -> str:
    """base64 of the descriptor without source info - what Confluent's ``format=serialized`` returns."""
    out = FDP()
    out.CopyFrom(fdp)
    out.ClearField("source_code_info")
    return base64.standard_b64encode(out.SerializeToString(deterministic=True)).decode("ascii")


def _default_json_name(name: str) -> str:
    out, upper = [], False
    for ch in name:
        if ch == "_":
            upper = True
        elif upper:
            out.append(ch.upper())
            upper = False
        else:
            out.append(ch)
    return "".join(out)


def _normalized(fdp: FDP) -> FDP:
    out = FDP()
    out.CopyFrom(fdp)
    out.ClearField("name")
    out.ClearField("source_code_info")

    def walk(msgs: list[descriptor_pb2.DescriptorProto]) -> None:
        for m in msgs:
            for fld in [*m.field, *m.extension]:
                if fld.json_name == _default_json_name(fld.name):
                    fld.ClearField("json_name")
            walk(list(m.nested_type))

    walk(list(out.message_type))
    for fld in out.extension:
        if fld.json_name == _default_json_name(fld.name):
            fld.ClearField("json_name")
    if out.syntax == "proto2":
        out.ClearField("syntax")
    return out


def same_schema(a: FDP, b: FDP) -> bool:
    """Equal as schemas: ignoring the file name, source info and default ``json_name``s."""
    return _normalized(a).SerializeToString(deterministic=True) == _normalized(b).SerializeToString(deterministic=True)


# -- rendering -----------------------------------------------------------------------------
def _quote(value: str | bytes) -> str:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    out = []
    for byte in raw:
        ch = chr(byte)
        if ch in "\"\\":
            out.append("\\" + ch)
        elif 0x20 <= byte < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _scalar(value: object, fd: object = None) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | bytes):
        return _quote(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, Message):
        return "{ " + text_format.MessageToString(value, as_one_line=True) + " }"
    enum_type = getattr(fd, "enum_type", None)
    if enum_type is not None and isinstance(value, int):
        v = enum_type.values_by_number.get(value)
        return v.name if v is not None else str(value)
    return str(value)


def _options(opts: Message, where: str) -> list[str]:
    """``name = value`` for every option set, custom ones in parentheses."""
    out = []
    for fd, value in opts.ListFields():
        name = f"({fd.full_name})" if fd.is_extension else fd.name
        if where == "message" and fd.name == "map_entry":
            continue
        values = value if getattr(fd, "is_repeated", False) or getattr(fd, "label", 0) == fd.LABEL_REPEATED else [value]
        out.extend(f"{name} = {_scalar(v, fd)}" for v in values)
    try:
        from google.protobuf import unknown_fields

        unknown = list(unknown_fields.UnknownFieldSet(opts))
    except (ImportError, AttributeError):  # older runtimes: nothing extra to render
        unknown = []
    for u in unknown:
        prism = _PRISM_FIELD_OPTIONS.get(u.field_number) if where == "field" else None
        if prism is None or u.wire_type != 2:
            raise SchemaError(f"custom {where} option number {u.field_number} cannot be converted to .proto "
                              "text by this registry; register the schema as .proto text instead")
        out.append(f"({prism}) = {_quote(bytes(u.data))}")
    return out


def _range(start: int, end_inclusive: int) -> str:
    if end_inclusive >= _MAX_FIELD:
        return f"{start} to max"
    return str(start) if start == end_inclusive else f"{start} to {end_inclusive}"


class _Renderer:
    def __init__(self, fdp: FDP) -> None:
        self.fdp = fdp
        self.syntax = fdp.syntax or "proto2"
        if self.syntax not in ("proto2", "proto3"):
            raise SchemaError(f"protobuf syntax {self.syntax!r} (editions) cannot be converted to .proto text "
                              "by this registry; register the schema as .proto text instead")
        self.lines: list[str] = []

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("  " * depth + line)

    def render(self) -> str:
        f = self.fdp
        self.emit(0, f'syntax = "{self.syntax}";')
        if f.package:
            self.emit(0, f"package {f.package};")
        for i, dep in enumerate(f.dependency):
            kind = "public " if i in f.public_dependency else "weak " if i in f.weak_dependency else ""
            self.emit(0, f"import {kind}{_quote(dep)};")
        for opt in _options(f.options, "file"):
            self.emit(0, f"option {opt};")
        for e in f.enum_type:
            self.enum(e, 0)
        for m in f.message_type:
            self.message(m, 0)
        self.extensions(list(f.extension), 0)
        for s in f.service:
            self.service(s)
        return "\n".join(self.lines) + "\n"

    def enum(self, e: descriptor_pb2.EnumDescriptorProto, depth: int) -> None:
        self.emit(depth, f"enum {e.name} {{")
        for opt in _options(e.options, "enum"):
            self.emit(depth + 1, f"option {opt};")
        for v in e.value:
            opts = _options(v.options, "enum value")
            self.emit(depth + 1, f"{v.name} = {v.number}" + (f" [{', '.join(opts)}]" if opts else "") + ";")
        if e.reserved_range:  # EnumReservedRange.end is inclusive
            self.emit(depth + 1, "reserved " + ", ".join(_range(r.start, r.end) for r in e.reserved_range) + ";")
        if e.reserved_name:
            self.emit(depth + 1, "reserved " + ", ".join(_quote(n) for n in e.reserved_name) + ";")
        self.emit(depth, "}")

    def _map_entries(self, m: descriptor_pb2.DescriptorProto) -> dict[str, descriptor_pb2.DescriptorProto]:
        return {n.name: n for n in m.nested_type if n.options.map_entry}

    def _type(self, fld: F) -> str:
        if fld.type == F.TYPE_GROUP:
            raise SchemaError(f"proto2 group field {fld.name!r} cannot be converted to .proto text by this "
                              "registry; register the schema as .proto text instead")
        if fld.type in (F.TYPE_MESSAGE, F.TYPE_ENUM):
            return fld.type_name
        return _SCALARS[fld.type]

    def field(self, fld: F, depth: int, entries: dict[str, descriptor_pb2.DescriptorProto],
              in_oneof: bool = False) -> None:
        entry = entries.get(fld.type_name.rsplit(".", 1)[-1]) if fld.type == F.TYPE_MESSAGE else None
        if entry is not None and fld.label == F.LABEL_REPEATED:
            k, v = sorted(entry.field, key=lambda x: x.number)
            head = f"map<{self._type(k)}, {self._type(v)}>"
        else:
            label = ""
            if not in_oneof:
                if fld.label == F.LABEL_REPEATED:
                    label = "repeated "
                elif fld.label == F.LABEL_REQUIRED:
                    label = "required "
                elif self.syntax == "proto2" or fld.proto3_optional:
                    label = "optional "
            head = label + self._type(fld)
        opts = []
        if fld.HasField("default_value"):
            dv = fld.default_value
            if fld.type == F.TYPE_STRING:
                dv = _quote(dv)
            elif fld.type == F.TYPE_BYTES:
                dv = '"' + dv + '"'  # already C-escaped by protoc
            opts.append(f"default = {dv}")
        if fld.HasField("json_name") and fld.json_name != _default_json_name(fld.name):
            opts.append(f"json_name = {_quote(fld.json_name)}")
        opts.extend(_options(fld.options, "field"))
        self.emit(depth, f"{head} {fld.name} = {fld.number}" + (f" [{', '.join(opts)}]" if opts else "") + ";")

    def extensions(self, exts: list[F], depth: int) -> None:
        by_extendee: dict[str, list[F]] = {}
        for x in exts:
            by_extendee.setdefault(x.extendee, []).append(x)
        for extendee, fields in by_extendee.items():
            self.emit(depth, f"extend {extendee} {{")
            for x in fields:
                self.field(x, depth + 1, {})
            self.emit(depth, "}")

    def message(self, m: descriptor_pb2.DescriptorProto, depth: int) -> None:
        self.emit(depth, f"message {m.name} {{")
        for opt in _options(m.options, "message"):
            self.emit(depth + 1, f"option {opt};")
        entries = self._map_entries(m)
        for e in m.enum_type:
            self.enum(e, depth + 1)
        # protoc appends nested types in source order, a map field's entry type at the field:
        # interleave so that the recompiled descriptor has the same nested_type order (the
        # message indexes in Confluent's wire framing count nested types).
        entry_field = {fld.type_name.rsplit(".", 1)[-1]: k for k, fld in enumerate(m.field)
                       if fld.label == F.LABEL_REPEATED and fld.type == F.TYPE_MESSAGE
                       and fld.type_name.rsplit(".", 1)[-1] in entries}
        real_oneofs = {f.oneof_index for f in m.field if f.HasField("oneof_index") and not f.proto3_optional}
        done_oneofs: set[int] = set()
        next_field = 0

        def fields_until(stop: int) -> None:
            nonlocal next_field
            while next_field < stop:
                self._member(m, next_field, depth + 1, entries, real_oneofs, done_oneofs)
                next_field += 1

        for n in m.nested_type:
            if n.name in entries:
                fields_until(entry_field.get(n.name, -1) + 1)
            else:
                self.message(n, depth + 1)
        fields_until(len(m.field))
        if m.extension_range:  # DescriptorProto.ExtensionRange.end is exclusive
            self.emit(depth + 1, "extensions " + ", ".join(_range(r.start, r.end - 1) for r in m.extension_range)
                      + ";")
        self.extensions(list(m.extension), depth + 1)
        if m.reserved_range:  # DescriptorProto.ReservedRange.end is exclusive
            self.emit(depth + 1, "reserved " + ", ".join(_range(r.start, r.end - 1) for r in m.reserved_range) + ";")
        if m.reserved_name:
            self.emit(depth + 1, "reserved " + ", ".join(_quote(n) for n in m.reserved_name) + ";")
        self.emit(depth, "}")

    def _member(self, m: descriptor_pb2.DescriptorProto, k: int, depth: int,
                entries: dict[str, descriptor_pb2.DescriptorProto], real_oneofs: set[int],
                done_oneofs: set[int]) -> None:
        """Field ``k`` of ``m``, or its whole oneof block when it is the oneof's first member."""
        fld = m.field[k]
        if not (fld.HasField("oneof_index") and fld.oneof_index in real_oneofs):
            self.field(fld, depth, entries)
            return
        idx = fld.oneof_index
        if idx in done_oneofs:
            return
        done_oneofs.add(idx)
        decl = m.oneof_decl[idx]
        self.emit(depth, f"oneof {decl.name} {{")
        for opt in _options(decl.options, "oneof"):
            self.emit(depth + 1, f"option {opt};")
        for member in m.field:
            if member.HasField("oneof_index") and member.oneof_index == idx:
                self.field(member, depth + 1, entries, in_oneof=True)
        self.emit(depth, "}")

    def service(self, s: descriptor_pb2.ServiceDescriptorProto) -> None:
        self.emit(0, f"service {s.name} {{")
        for opt in _options(s.options, "service"):
            self.emit(1, f"option {opt};")
        for meth in s.method:
            cs = "stream " if meth.client_streaming else ""
            ss = "stream " if meth.server_streaming else ""
            opts = _options(meth.options, "method")
            body = " {\n" + "".join(f"    option {o};\n" for o in opts) + "  }" if opts else ";"
            self.emit(1, f"rpc {meth.name} ({cs}{meth.input_type}) returns ({ss}{meth.output_type}){body}")
        self.emit(0, "}")


def render_proto(fdp: FDP) -> str:
    """``.proto`` source for a descriptor. Raises :class:`SchemaError` for what it cannot render."""
    return _Renderer(fdp).render()
