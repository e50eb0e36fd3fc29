"""Protobuf compatibility rules, judged by what a binary wire-format reader tolerates.

Input is two compiled descriptor sets (see :mod:`app.schema.protoparse`), so nested types,
imports, proto3 ``optional`` and ``reserved`` are exactly what protoc resolved. Messages and
enums are matched by their name relative to the package (so a package rename is reported
once, not as "every message removed").

Wire groups (a reader can decode a value written as any type of the same group):

=============  ==============================================  ============================
group          types                                           note
=============  ==============================================  ============================
varint         int32 int64 uint32 uint64 bool enum             truncation / sign: warning
zigzag         sint32 sint64
fixed32        fixed32 sfixed32 (float is its own group)
fixed64        fixed64 sfixed64 (double is its own group)
length         string bytes (message <-> bytes)                UTF-8 / nesting: warning
=============  ==============================================  ============================

See docs/schema-registry.md for how these rules differ from ``buf breaking`` (WIRE,
WIRE_JSON) and Confluent Schema Registry, and why.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from google.protobuf import descriptor_pb2 as d

from app.schema.compat.base import Change
from app.schema.protoparse import ProtoSchema

F = d.FieldDescriptorProto
_GROUP = {
    F.TYPE_INT32: "varint", F.TYPE_INT64: "varint", F.TYPE_UINT32: "varint", F.TYPE_UINT64: "varint",
    F.TYPE_BOOL: "varint", F.TYPE_ENUM: "varint",
    F.TYPE_SINT32: "zigzag", F.TYPE_SINT64: "zigzag",
    F.TYPE_FIXED32: "fixed32", F.TYPE_SFIXED32: "fixed32",
    F.TYPE_FIXED64: "fixed64", F.TYPE_SFIXED64: "fixed64",
    F.TYPE_FLOAT: "float", F.TYPE_DOUBLE: "double",
    F.TYPE_STRING: "length", F.TYPE_BYTES: "length", F.TYPE_MESSAGE: "length",
    F.TYPE_GROUP: "group",
}
_PACKABLE_GROUPS = {"varint", "zigzag", "fixed32", "fixed64", "float", "double"}
_TYPE_NAME = {v: k[len("TYPE_"):].lower() for k, v in F.Type.items()}


@dataclass
class _Field:
    name: str
    number: int
    type: int
    type_name: str  # relative to the package, e.g. "OrderCreated.Item"
    label: int
    oneof: str | None  # real oneof only (proto3 `optional` synthetic oneofs are presence, not oneof)
    proto3_optional: bool
    map_entry: bool = False

    @property
    def group(self) -> str:
        return _GROUP[self.type]

    @property
    def repeated(self) -> bool:
        return self.label == F.LABEL_REPEATED

    @property
    def required(self) -> bool:
        return self.label == F.LABEL_REQUIRED

    def type_label(self) -> str:
        base = self.type_name if self.type in (F.TYPE_MESSAGE, F.TYPE_ENUM, F.TYPE_GROUP) else _TYPE_NAME[self.type]
        if self.map_entry:
            return f"map<{base}>"
        return f"repeated {base}" if self.repeated else base


@dataclass
class _Message:
    name: str
    fields: dict[int, _Field] = field(default_factory=dict)
    reserved_ranges: list[tuple[int, int]] = field(default_factory=list)  # inclusive
    reserved_names: set[str] = field(default_factory=set)
    is_map_entry: bool = False

    def reserved(self, number: int) -> bool:
        return any(lo <= number <= hi for lo, hi in self.reserved_ranges)

    def signature(self) -> tuple[tuple[int, int, str], ...]:
        return tuple(sorted((n, f.type, f.name) for n, f in self.fields.items()))


@dataclass
class _Enum:
    name: str
    values: dict[int, str] = field(default_factory=dict)
    reserved_ranges: list[tuple[int, int]] = field(default_factory=list)
    closed: bool = False  # proto2 enums are closed: unknown numbers go to unknown fields

    def reserved(self, number: int) -> bool:
        return any(lo <= number <= hi for lo, hi in self.reserved_ranges)


@dataclass
class _Model:
    package: str
    syntax: str
    messages: dict[str, _Message] = field(default_factory=dict)
    enums: dict[str, _Enum] = field(default_factory=dict)


def _rel(full: str, package: str) -> str:
    full = full.lstrip(".")
    if package and full.startswith(package + "."):
        return full[len(package) + 1:]
    return full


def _build(schema: ProtoSchema) -> _Model:
    main = schema.main
    model = _Model(package=main.package, syntax=main.syntax or "proto2")
    for fd in schema.user_files():
        pkg = fd.package
        closed = (fd.syntax or "proto2") == "proto2"

        def add_enum(e: d.EnumDescriptorProto, prefix: str, pkg: str = pkg, closed: bool = closed) -> None:
            name = _rel(f"{pkg}.{prefix}{e.name}" if pkg else f"{prefix}{e.name}", main.package)
            model.enums[name] = _Enum(
                name, {v.number: v.name for v in e.value},
                [(r.start, r.end) for r in e.reserved_range], closed,
            )

        def add_msg(m: d.DescriptorProto, prefix: str, pkg: str = pkg) -> None:
            full = f"{pkg}.{prefix}{m.name}" if pkg else f"{prefix}{m.name}"
            name = _rel(full, main.package)
            msg = _Message(
                name,
                reserved_ranges=[(r.start, r.end - 1) for r in m.reserved_range],  # end is exclusive
                reserved_names=set(m.reserved_name),
                is_map_entry=m.options.map_entry,
            )
            nested = {f"{full}.{n.name}": n for n in m.nested_type}
            for f in m.field:
                oneof = None
                if f.HasField("oneof_index") and not f.proto3_optional:
                    oneof = m.oneof_decl[f.oneof_index].name
                type_full = f.type_name.lstrip(".")
                is_map = f.type == F.TYPE_MESSAGE and nested.get(type_full) is not None and \
                    nested[type_full].options.map_entry
                msg.fields[f.number] = _Field(
                    f.name, f.number, f.type, _rel(f.type_name, main.package) if f.type_name else "",
                    f.label, oneof, f.proto3_optional, is_map,
                )
            model.messages[name] = msg
            for n in m.nested_type:
                add_msg(n, f"{prefix}{m.name}.")
            for e in m.enum_type:
                add_enum(e, f"{prefix}{m.name}.")

        for m in fd.message_type:
            add_msg(m, "")
        for e in fd.enum_type:
            add_enum(e, "")
    return model


def diff(old: ProtoSchema, new: ProtoSchema, *, implicit_presence_is_required: bool = True) -> list[Change]:
    """All wire-relevant changes from ``old`` to ``new``.

    ``implicit_presence_is_required``: RFC-030 treats a new proto3 scalar declared without
    ``optional`` as a *required* field (its absence in old data is indistinguishable from a
    real zero value, e.g. ``payment_method == ""``), so adding one breaks BACKWARD. Pass
    False for plain wire semantics (what buf and Confluent do).
    """
    a, b = _build(old), _build(new)
    out: list[Change] = []
    if a.package != b.package:
        out.append(Change(
            "PACKAGE_CHANGED", b.package or "<root>",
            f"package renamed from '{a.package}' to '{b.package}': fully-qualified names change, so "
            "Any type URLs (the envelope payload), JSON '@type' and type-name routing break",
            "keep the package; publish the renamed schema on a new topic",
            breaks_backward=True, breaks_forward=True,
        ))
    if a.syntax != b.syntax:
        out.append(Change(
            "SYNTAX_CHANGED", "<file>", f"syntax changed from {a.syntax} to {b.syntax}: presence, "
            "packing defaults and enum openness change", "keep the syntax (or editions features) stable",
        ))
    renamed = _renamed_messages(a, b)
    for old_name, msg in a.messages.items():
        if old_name in b.messages:
            out += _diff_message(msg, b.messages[old_name], a, b, renamed, implicit_presence_is_required)
        elif old_name in renamed:
            new_name = renamed[old_name]
            out.append(Change(
                "MESSAGE_RENAMED", old_name, f"message '{old_name}' renamed to '{new_name}': binary layout "
                "is unchanged but Any type URLs and JSON '@type' use the name",
                f"keep the name '{old_name}' (a rename is a new topic)", breaks_backward=True, breaks_forward=True,
            ))
            out += _diff_message(msg, b.messages[new_name], a, b, renamed, implicit_presence_is_required)
        elif not msg.is_map_entry:  # a vanished map entry is reported as the map field's change
            out.append(Change(
                "MESSAGE_REMOVED", old_name, f"message '{old_name}' was removed; data of that type can no "
                "longer be read with the new schema", "keep the message and mark it deprecated",
                breaks_backward=True,
            ))
    for old_name, en in a.enums.items():
        if old_name in b.enums:
            out += _diff_enum(en, b.enums[old_name])
        else:
            out.append(Change(
                "ENUM_REMOVED", old_name, f"enum '{old_name}' was removed",
                "keep the enum; a field that used it is reported separately",
            ))
    return out


def _renamed_messages(a: _Model, b: _Model) -> dict[str, str]:
    """Pair removed and added messages whose fields are identical (number, type, name)."""
    removed = [n for n in a.messages if n not in b.messages and not a.messages[n].is_map_entry]
    added = {b.messages[n].signature(): n for n in b.messages if n not in a.messages}
    out = {}
    for n in removed:
        sig = a.messages[n].signature()
        if sig and sig in added:
            out[n] = added.pop(sig)
    return out


def _oneof_groups(src: _Message, dst: _Message) -> Iterable[tuple[str, list[_Field]]]:
    """For each oneof of ``dst``, the members that already existed in ``src``."""
    by_oneof: dict[str, list[_Field]] = {}
    for f in dst.fields.values():
        if f.oneof and f.number in src.fields:
            by_oneof.setdefault(f.oneof, []).append(f)
    return by_oneof.items()


def _origin(src: _Message, number: int) -> str:
    f = src.fields[number]
    return f"oneof:{f.oneof}" if f.oneof else f"field:{number}"


def _diff_message(
    old: _Message, new: _Message, a: _Model, b: _Model, renamed: dict[str, str], strict_presence: bool,
) -> list[Change]:
    out: list[Change] = []
    m = new.name
    for num, f in old.fields.items():
        path = f"{m}.{f.name}"
        g = new.fields.get(num)
        if g is None:
            if f.required:
                out.append(Change(
                    "REQUIRED_FIELD_REMOVED", path, f"required field '{f.name}' (#{num}) removed: old readers "
                    "reject messages without it", "make it optional in a FORWARD-compatible step first",
                    breaks_forward=True,
                ))
            if f.oneof and f.oneof in {x.oneof for x in new.fields.values()}:
                out.append(Change(
                    "ONEOF_FIELD_REMOVED", path, f"field '{f.name}' (#{num}) removed from oneof '{f.oneof}': "
                    "old data that set it reads as 'oneof not set'", "keep the member and deprecate it",
                    breaks_backward=True,
                ))
            if new.reserved(num):
                if f.name not in new.reserved_names:
                    out.append(Change(
                        "FIELD_NAME_NOT_RESERVED", path, f"field '{f.name}' removed with number {num} reserved "
                        "but not its name; reusing the name breaks the JSON mapping",
                        f'add reserved "{f.name}";',
                    ))
            else:
                out.append(Change(
                    "FIELD_REMOVED_NOT_RESERVED", path, f"field '{f.name}' (#{num}) removed without "
                    f"'reserved {num}': a later version may reuse the number with another type and "
                    "misread old data", f'add `reserved {num}; reserved "{f.name}";` to {m}',
                    breaks_backward=True,
                ))
            continue
        out += _diff_field(f, g, path, renamed)
        if g.required and not f.required:
            out.append(Change(
                "FIELD_MADE_REQUIRED", path, f"field '{g.name}' became required: old data may lack it",
                "keep it optional", breaks_backward=True,
            ))
        if f.required and not g.required:
            out.append(Change(
                "FIELD_NO_LONGER_REQUIRED", path, f"field '{g.name}' is no longer required: old readers reject "
                "new messages without it", "keep it required until every reader is upgraded", breaks_forward=True,
            ))
    for num, g in new.fields.items():
        if num in old.fields:
            continue
        path = f"{m}.{g.name}"
        if old.reserved(num):
            out.append(Change(
                "RESERVED_NUMBER_REUSED", path, f"field '{g.name}' uses number {num}, which {m} reserved: "
                "data from before the reservation decodes into the wrong field",
                "pick a number that was never used", breaks_backward=True, breaks_forward=True,
            ))
        elif g.name in old.reserved_names:
            out.append(Change(
                "RESERVED_NAME_REUSED", path, f"field name '{g.name}' was reserved in {m}",
                "pick another name (JSON readers of old data would bind it)",
            ))
        if g.required:
            out.append(Change(
                "REQUIRED_FIELD_ADDED", path, f"added required field '{g.name}' (#{num}): old data lacks it",
                "make the field optional, or publish on a new topic", breaks_backward=True,
            ))
        elif strict_presence and a.syntax == "proto3" == b.syntax and not (
            g.proto3_optional or g.repeated or g.oneof or g.type in (F.TYPE_MESSAGE, F.TYPE_GROUP)
        ):
            out.append(Change(
                "REQUIRED_FIELD_ADDED", path, f"added required field '{g.name}' (#{num}) without `optional`: "
                "old data reads as the zero value, indistinguishable from a real one",
                f"declare it `optional {g.type_label()} {g.name} = {num};` or publish on a new topic",
                breaks_backward=True,
            ))
        else:
            out.append(Change(
                "FIELD_ADDED", path, f"added optional field '{g.name}' (#{num}); old readers skip it",
                "safe: consumers that need it can upgrade when ready",
            ))
    # oneof moves, both directions: members of one oneof must come from at most one origin.
    for oneof, members in _oneof_groups(old, new):
        origins = {_origin(old, f.number) for f in members}
        if len(origins) > 1:
            names = ", ".join(f.name for f in members)
            out.append(Change(
                "FIELDS_MOVED_INTO_ONEOF", f"{m}.{oneof}", f"independent fields ({names}) now share oneof "
                f"'{oneof}': old data that sets several keeps only the last",
                "move at most one existing field into a new oneof", breaks_backward=True,
            ))
    for oneof, members in _oneof_groups(new, old):
        origins = {_origin(new, f.number) for f in members}
        if len(origins) > 1:
            names = ", ".join(f.name for f in members)
            out.append(Change(
                "FIELDS_MOVED_OUT_OF_ONEOF", f"{m}.{oneof}", f"fields ({names}) left oneof '{oneof}': new data "
                "may set several, old readers keep only the last", "keep the oneof", breaks_forward=True,
            ))
    for lo, hi in old.reserved_ranges:
        for n in range(lo, min(hi, lo + 1000) + 1):
            if not new.reserved(n) and n not in new.fields:
                out.append(Change(
                    "RESERVED_RANGE_REMOVED", m, f"reserved number(s) {lo}-{hi} are no longer reserved",
                    "keep reservations forever",
                ))
                break
    return out


def _diff_field(f: _Field, g: _Field, path: str, renamed: dict[str, str]) -> list[Change]:
    out: list[Change] = []
    num = f.number
    same_type = f.type == g.type and (
        f.type_name == g.type_name or renamed.get(f.type_name) == g.type_name
    )
    if f.group != g.group or (
        {f.type, g.type} == {F.TYPE_MESSAGE, F.TYPE_STRING}
    ):
        if f.name != g.name:
            out.append(Change(
                "FIELD_NUMBER_REUSED", path, f"number {num} was '{f.name}' ({f.type_label()}) and is now "
                f"'{g.name}' ({g.type_label()}): readers decode one as the other",
                f"restore '{f.name}' or `reserved {num};` and give '{g.name}' a new number",
                breaks_backward=True, breaks_forward=True,
            ))
        else:
            out.append(Change(
                "FIELD_WIRE_INCOMPATIBLE_TYPE", path, f"type changed from {f.type_label()} to {g.type_label()}: "
                "different wire encodings, readers drop or misread the value",
                "add a new field with the new type and deprecate this one",
                breaks_backward=True, breaks_forward=True,
            ))
        return out
    if f.name != g.name:
        out.append(Change(
            "FIELD_RENAMED", path, f"field #{num} renamed from '{f.name}' to '{g.name}': binary is unchanged, "
            "the JSON mapping and generated code are not", f"keep the name '{f.name}'",
        ))
    if not same_type:
        if f.type == g.type == F.TYPE_MESSAGE:
            out.append(Change(
                "FIELD_MESSAGE_TYPE_CHANGED", path, f"message type changed from {f.type_name} to {g.type_name}",
                "add a new field with the new message type", breaks_backward=True, breaks_forward=True,
            ))
        elif f.type == g.type == F.TYPE_ENUM:
            out.append(Change(
                "FIELD_ENUM_TYPE_CHANGED", path, f"enum type changed from {f.type_name} to {g.type_name}: "
                "numbers are read as-is, meanings may differ", "keep the enum type",
            ))
        else:
            out.append(Change(
                "FIELD_WIRE_COMPATIBLE_TYPE", path, f"type changed from {f.type_label()} to {g.type_label()}: "
                "same wire encoding, but values may be truncated, change sign or fail UTF-8 checks",
                "prefer a new field unless every value fits both types",
            ))
    if f.repeated != g.repeated and not (f.map_entry or g.map_entry):
        out.append(_cardinality_change(f, g, path))
    elif f.map_entry != g.map_entry:
        out.append(Change(
            "FIELD_CARDINALITY_CHANGED", path, f"'{path}' (#{num}) changed from {f.type_label()} to "
            f"{g.type_label()}: a map and a non-map field read each other's data as the wrong shape",
            f"keep '{f.name}' and add a new field with a new number instead", breaks_backward=True, breaks_forward=True,
        ))
    if f.proto3_optional != g.proto3_optional and not f.repeated:
        out.append(Change(
            "FIELD_PRESENCE_CHANGED", path, f"'{g.name}' {'gained' if g.proto3_optional else 'lost'} explicit "
            "presence (`optional`): wire-compatible, but has_field() semantics change", "",
        ))
    if (f.oneof is None) != (g.oneof is None) and f.oneof != g.oneof:
        pass  # reported per oneof in _diff_message (one field moving alone is fine)
    return out


def _cardinality_change(f: _Field, g: _Field, path: str) -> Change:
    """Singular <-> repeated: breaking in both directions, for every field type (buf WIRE).

    buf's ``FIELD_WIRE_COMPATIBLE_CARDINALITY`` lets only two cardinality changes pass:
    implicit <-> explicit presence and repeated <-> map. Everything else fails, numeric
    scalars included. What goes wrong depends on the direction and the type:

    - a singular reader of repeated data keeps only the last string/bytes/number element and
      *merges* all message elements into one: silent data loss;
    - a singular numeric reader of packed repeated data (proto3's default) sees a
      length-delimited record where it expects a varint/fixed value and drops the field;
    - a repeated reader of singular data decodes a one-element list on the binary wire, but the
      JSON mapping changes from a value to an array, and the writer on the other side of the
      pair (repeated -> singular) still loses data.

    Protobuf's own guide calls string/bytes/message singular -> repeated "compatible" because
    the parse succeeds; the lost elements make it breaking for Prism, as for buf.
    """
    old_t, new_t = f.type_label(), g.type_label()
    singular_reader_of = "new" if f.repeated else "old"  # which side reads repeated data singularly
    if f.type in (F.TYPE_MESSAGE, F.TYPE_GROUP):
        loss = "merges all elements into one message"
    elif f.group in _PACKABLE_GROUPS:
        loss = ("drops packed elements (a length-delimited record where it expects a single value) and keeps "
                "only the last unpacked one")
    else:
        loss = "keeps only the last element and drops the others"
    moved = ""
    if f.oneof or g.oneof:  # a oneof member is always singular: the field left or joined it
        moved = f"; it also {'left' if f.oneof else 'joined'} oneof '{f.oneof or g.oneof}'"
    return Change(
        "FIELD_CARDINALITY_CHANGED", path,
        f"'{path}' (#{f.number}) changed from {old_t} to {new_t}: the {singular_reader_of} singular reader of "
        f"repeated data {loss} (data loss), and the JSON mapping changes between a value and an array{moved} "
        "(buf WIRE: FIELD_WIRE_COMPATIBLE_CARDINALITY)",
        f"keep '{f.name}' as `{old_t} {f.name} = {f.number};` and add a new field with a new number for the "
        f"{'singular' if f.repeated else 'repeated'} form (e.g. `{new_t} {g.name}_v2 = <unused number>;`), "
        "then deprecate the old one",
        breaks_backward=True, breaks_forward=True,
    )


def _diff_enum(old: _Enum, new: _Enum) -> list[Change]:
    out: list[Change] = []
    for num, name in old.values.items():
        path = f"{old.name}.{name}"
        if num not in new.values:
            if new.reserved(num):
                continue
            out.append(Change(
                "ENUM_VALUE_REMOVED", path, f"enum value {name} = {num} removed: old data carrying it is an "
                "unknown value for new readers", f"keep the value (deprecate it) or `reserved {num};`",
                breaks_backward=True,
            ))
        elif new.values[num] != name:
            out.append(Change(
                "ENUM_VALUE_RENAMED", path, f"enum value {num} renamed from {name} to {new.values[num]}: binary "
                "is unchanged, JSON uses the name", f"keep the name {name}",
            ))
    for num, name in new.values.items():
        if num not in old.values:
            if old.reserved(num):
                out.append(Change(
                    "RESERVED_NUMBER_REUSED", f"{new.name}.{name}", f"enum value {name} reuses reserved number "
                    f"{num}", "pick a new number", breaks_backward=True, breaks_forward=True,
                ))
            elif old.closed:
                out.append(Change(
                    "ENUM_VALUE_ADDED", f"{new.name}.{name}", f"value {name} = {num} added to closed (proto2) "
                    "enum: old readers move the field to unknown fields (it reads as unset)",
                    "roll out readers first (BACKWARD order)", breaks_forward=True,
                ))
            else:
                out.append(Change(
                    "ENUM_VALUE_ADDED", f"{new.name}.{name}", f"value {name} = {num} added: old readers see an "
                    "unrecognized number", "make sure consumers handle unknown values",
                ))
    return out
