"""Conversion between the RFC-031 draft layout and the reviewed (memo-031) layout.

Both layouts carry the same information with different field numbers and types; the
mapping below is lossless for every field both have. What the other side cannot hold is
listed in the returned `dropped` list (never silently lost):

* draft -> reviewed: sub-millisecond precision of `published_at`;
* reviewed -> draft: explicit presence of zero values (`priority=0`, `ttl_seconds=0`,
  `contains_pii=false`, an empty `aad`, ...), which proto3 plain fields cannot tell from
  "unset".

Evolution signals (RFC-031 "Backward Compatibility"; docs/formats.md, "Envelope evolution"):

* **Unknown fields survive.** A newer producer's fields that this build does not know, in the
  top level, metadata, security or encryption message, have no counterpart in the other layout
  (the same number means something else there), so they are never re-emitted on their numbers
  in the other layout. They travel as their exact wire records in the extension
  `prism.unknown.<layout>[.<message path>]` (e.g. `prism.unknown.draft.metadata`) and are put
  back on their own numbers when the envelope is converted back to the layout they came from:
  draft -> reviewed -> draft (what the worker does for every `.v2` copy) keeps them byte for
  byte. Restoring only ever adds fields the target message does not know, so such an extension
  cannot set a known field. Observability and schema contexts have the same numbering in both
  layouts and are copied through their wire bytes, unknown fields included.
* **A newer `envelope_version`** (> `KNOWN_ENVELOPE_VERSION`) is read on a best-effort basis:
  every field this build knows is converted, unknown ones are kept as above, and the producer's
  version is recorded in the extension `prism.producer_envelope_version` (decimal text), which
  the normalize stage counts and warns about once per version. The draft the worker writes
  is always `envelope_version = 1`: it writes the layout it knows.

* **An `extensions` entry with more than a key and a value** (a third field, a key or value of
  another wire type) is refused by a conversion, `AmbiguousMapEntryError`
  (`refuse_odd_map_entries`): protobuf runtimes disagree on what it says, so it can neither be
  dropped nor written back on the map's number (docs/formats.md).

The revision-2 encryption fields the draft lacks (`encryption_type`, `public_key_id`,
`encapsulated_key`, `algorithm_params`) are carried in draft `extensions` under
`prism.enc.*` keys and restored on the way back, so a `.v2` consumer using Prism can still
decrypt post-quantum and hybrid payloads. Observability and schema contexts have the same
numbering in both layouts and are copied through their wire bytes, unknown fields included.
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.timestamp_pb2 import Timestamp
from google.protobuf.unknown_fields import UnknownFieldSet

from .._gen.prism.envelope.draft import envelope_pb2 as dpb
from .._gen.prism.envelope.v1 import envelope_pb2 as vpb
from ..errors import AmbiguousMapEntryError, EnvelopeError
from .model import (
    get_content_encoding,
    get_content_type,
    set_content_encoding,
    set_content_type,
)
from .wire import I32, I64, LEN, VARINT, scan

#: The draft `envelope_version` this build writes and fully understands.
KNOWN_ENVELOPE_VERSION = 1
#: Extension holding a newer producer's `envelope_version` (decimal text), set on decode.
PRODUCER_VERSION_EXT = "prism.producer_envelope_version"
#: Prefix of the extensions that carry unknown fields across a layout change.
UNKNOWN_EXT_PREFIX = "prism.unknown."
_DRAFT_UNKNOWN = UNKNOWN_EXT_PREFIX + "draft"
_REVIEWED_UNKNOWN = UNKNOWN_EXT_PREFIX + "reviewed"
#: message paths whose unknown fields are carried (observability/schema are copied as wire bytes)
_CARRIED_PATHS = ("", ".metadata", ".security", ".security.encryption")

ENC_EXT_PREFIX = "prism.enc."
_ENC_TYPE_KEY = ENC_EXT_PREFIX + "encryption_type"
_ENC_PUB_KEY = ENC_EXT_PREFIX + "public_key_id"
_ENC_ENCAP_KEY = ENC_EXT_PREFIX + "encapsulated_key"
_ENC_PARAMS_KEY = ENC_EXT_PREFIX + "algorithm_params"
_ENC_KEYS = (_ENC_TYPE_KEY, _ENC_PUB_KEY, _ENC_ENCAP_KEY, _ENC_PARAMS_KEY)

_SEC_STRINGS = ("publisher_id", "publisher_team", "auth_token", "signature_algorithm",
                "data_classification", "signature_key_id")


def _wire_types(fd: FieldDescriptor) -> tuple[int, ...]:
    """The wire types a field is read with: anything else on its number is an unknown field."""
    if fd.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE):
        return (LEN,)
    if fd.type in (FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64, FieldDescriptor.TYPE_DOUBLE):
        scalar = I64
    elif fd.type in (FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_SFIXED32, FieldDescriptor.TYPE_FLOAT):
        scalar = I32
    else:
        scalar = VARINT
    return (scalar, LEN) if fd.is_repeated else (scalar,)  # a repeated scalar may be packed


def unknown_records(msg: object, *, header_of: str | None = None) -> bytes:
    """The wire records of `msg`'s unknown fields, exactly as received ("" when none): fields
    this build does not know, and known fields written with a wire type they are not read with
    (protobuf keeps those as unknown too; dropping them would lose bytes silently). Only
    serializes once `UnknownFieldSet` said there are some: that costs a little.
    `header_of`: `msg` is the top-level header of that layout, whose odd `extensions` entries
    are refused (`refuse_odd_map_entries`, with the same `UnknownFieldSet`)."""
    unknown = UnknownFieldSet(msg)  # type: ignore[arg-type]
    if not len(unknown):
        return b""
    if header_of is not None:
        refuse_odd_map_entries(msg, header_of, unknown)
    raw = msg.SerializeToString()  # type: ignore[attr-defined]
    known = msg.DESCRIPTOR.fields_by_number  # type: ignore[attr-defined]
    return b"".join(raw[r[2]:r[4]] for r in scan(raw)
                    if r[0] not in known or r[1] not in _wire_types(known[r[0]]))



#: the top-level `extensions` map's field number in each layout
_EXT_FIELD = {"draft": 99, "reviewed": 97}


def refuse_odd_map_entries(msg: object, layout: str, unknown: UnknownFieldSet | None = None) -> None:
    """Raise `AmbiguousMapEntryError` when `msg` (a top-level header of `layout`) holds an
    `extensions` entry with more than a key and a value. upb keeps such an entry, whole, among
    the message's unknown fields on the map's own number (and LEN wire type), where the
    unknown-field carry cannot take it: its number is a known one. Converting would drop it,
    or - written back on a map number - hand a reader that stores odd entries (Go's, Java's
    runtime) a key Python never saw; the conversion is refused instead (docs/formats.md).
    A conversion calls it through `unknown_records`, on the `UnknownFieldSet` the carry builds
    anyway, so a header without unknown fields costs nothing more."""
    if unknown is None:
        unknown = UnknownFieldSet(msg)  # type: ignore[arg-type]
    if not len(unknown):
        return
    field = _EXT_FIELD[layout]
    n = sum(1 for f in unknown if f.field_number == field and f.wire_type == LEN)
    if n:
        raise AmbiguousMapEntryError(
            f"{n} entr{'y' if n == 1 else 'ies'} of the extensions map hold more than a key and a value "
            f"(a third field, or a key or value of another wire type): protobuf runtimes read such an entry "
            f"differently, so the envelope is not converted from the {layout} layout",
            path=f"extensions (field {field})")


def _sub(msg: object, path: str) -> object | None:
    """The nested message at `path` (".security.encryption"), or None when it is not set."""
    for name in path.split(".")[1:]:
        if not msg.HasField(name):  # type: ignore[attr-defined]
            return None
        msg = getattr(msg, name)
    return msg


def _carry_unknown(src: object, prefix: str, ext: dict[str, bytes], layout: str) -> None:
    """Put `src`'s unknown fields (top level, metadata, security, encryption) into `ext` under
    `<prefix><path>`: they cannot be written on their numbers in the other layout. An odd
    `extensions` entry of `src` (a `layout` header) cannot be carried: refused."""
    for path in _CARRIED_PATHS:
        msg = _sub(src, path)
        if msg is not None:
            records = unknown_records(msg, header_of=None if path else layout)
            if records:
                ext[prefix + path] = records


def _restore_unknown(dst: object, prefix: str, ext: dict[str, bytes]) -> None:
    """Put fields carried by `_carry_unknown` back on their own numbers in `dst` (the layout
    they came from) and remove their extensions. Only records that cannot set a known field
    are merged - numbers `dst` does not know, and known numbers with a wire type they are not
    read with (protobuf keeps those as unknown) - so an extension can never set a known field
    (a producer could otherwise smuggle, say, a classification past the fields it is read
    from). Records refused that way stay in the extension, and a malformed value stays where
    it is, an extension like any other: nothing is dropped."""
    for path in _CARRIED_PATHS:
        key = prefix + path
        raw = ext.get(key)
        if raw is None:
            continue
        msg = dst
        for name in path.split(".")[1:]:
            msg = getattr(msg, name)
        known = msg.DESCRIPTOR.fields_by_number  # type: ignore[attr-defined]
        try:
            records = scan(raw)
        except EnvelopeError:
            continue
        keep, refused = [], []
        for r in records:
            settable = r[0] in known and r[1] in _wire_types(known[r[0]])
            (refused if settable else keep).append(raw[r[2]:r[4]])
        if path:
            msg.SetInParent()  # type: ignore[attr-defined]
        msg.MergeFromString(b"".join(keep))  # type: ignore[attr-defined]
        if refused:
            ext[key] = b"".join(refused)
        else:
            del ext[key]


def _zero_presence(msg: object, path: str, dropped: list[str]) -> None:
    """Report optional scalars explicitly set to their zero value: the draft's plain proto3
    fields cannot tell those from unset."""
    for fd, value in msg.ListFields():  # type: ignore[attr-defined]
        if fd.message_type is not None:
            if fd.is_repeated:
                continue
            _zero_presence(value, f"{path}.{fd.name}", dropped)
        elif fd.has_presence and value == fd.default_value and fd.name != "content_encoding":
            # (content_encoding NONE travels as the string "none", so it keeps its presence)
            dropped.append(f"{path}.{fd.name}: explicit {value!r} is indistinguishable from unset in the draft layout")


def draft_to_reviewed(d: dpb.PrismEnvelope) -> tuple[vpb.PrismEnvelope, list[str]]:
    """Map a draft header (its payload is handled by the codec) to the reviewed model."""
    dropped: list[str] = []
    v = vpb.PrismEnvelope()

    if d.HasField("metadata"):
        dm, vm = d.metadata, v.metadata
        vm.message_id, vm.topic, vm.namespace = dm.message_id, dm.topic, dm.namespace
        if dm.HasField("published_at"):
            ts = dm.published_at
            vm.published_at_ms = ts.seconds * 1000 + ts.nanos // 1_000_000
            if ts.nanos % 1_000_000:
                dropped.append(f"metadata.published_at: sub-millisecond part ({ts.nanos % 1_000_000} ns)")
        else:
            vm.SetInParent()
        if dm.content_type:
            set_content_type(vm, dm.content_type)
        if dm.content_encoding:
            set_content_encoding(vm, dm.content_encoding)
        if dm.priority:
            vm.priority = dm.priority
        if dm.ttl_seconds:
            vm.ttl_seconds = dm.ttl_seconds
        if dm.correlation_id:
            vm.correlation_id = dm.correlation_id
        if dm.causality_parent:
            vm.causality_parent = dm.causality_parent
        if dm.producer_sdk_version:
            vm.producer_sdk_version = dm.producer_sdk_version

    ext = dict(d.extensions)
    if d.HasField("security"):
        ds, vs = d.security, v.security
        vs.SetInParent()
        for name in _SEC_STRINGS:
            val = getattr(ds, name)
            if val:
                setattr(vs, name, val)
        if ds.signature:
            vs.signature = ds.signature
        if ds.contains_pii:
            vs.contains_pii = True
        if ds.signature_scope:
            vs.signature_scope = ds.signature_scope  # same numbers in both layouts' enums
        if ds.sibling_digest:
            vs.sibling_digest = ds.sibling_digest
        if ds.tree_size:  # batch scope: index, size and path travel together
            vs.tree_index, vs.tree_size = ds.tree_index, ds.tree_size
            if ds.tree_path:
                vs.tree_path = ds.tree_path
        if ds.HasField("encryption"):
            de, ve = ds.encryption, vs.encryption
            ve.key_id, ve.algorithm = de.key_id, de.algorithm
            if de.iv:
                ve.iv = de.iv
            if de.aad:
                ve.aad = de.aad
            if _ENC_TYPE_KEY in ext:
                ve.encryption_type = _enc_type_value(ext[_ENC_TYPE_KEY].decode())
            if _ENC_PUB_KEY in ext:
                ve.public_key_id = ext[_ENC_PUB_KEY].decode()
            if _ENC_ENCAP_KEY in ext:
                ve.encapsulated_key = ext[_ENC_ENCAP_KEY]
            if _ENC_PARAMS_KEY in ext:
                ve.algorithm_params = ext[_ENC_PARAMS_KEY].decode()
    for k in _ENC_KEYS:
        ext.pop(k, None)
    _carry_unknown(d, _DRAFT_UNKNOWN, ext, "draft")  # refuses odd extensions entries
    if any(k.startswith(_REVIEWED_UNKNOWN) for k in ext):
        _restore_unknown(v, _REVIEWED_UNKNOWN, ext)
    if d.envelope_version > KNOWN_ENVELOPE_VERSION:
        ext[PRODUCER_VERSION_EXT] = str(d.envelope_version).encode()
        dropped.append(f"envelope_version: {d.envelope_version} is newer than {KNOWN_ENVELOPE_VERSION}; read on a "
                       f"best-effort basis (kept in extensions[{PRODUCER_VERSION_EXT!r}])")
    elif d.envelope_version < 0:
        dropped.append(f"envelope_version: {d.envelope_version} is not a version (read as {KNOWN_ENVELOPE_VERSION})")
    v.extensions.update(ext)

    if d.HasField("observability"):
        v.observability.MergeFromString(d.observability.SerializeToString())
        v.observability.SetInParent()
    if d.HasField("schema"):
        v.schema.MergeFromString(d.schema.SerializeToString())
        v.schema.SetInParent()
    return v, dropped


def reviewed_to_draft(v: vpb.PrismEnvelope, *, report: bool = True) -> tuple[dpb.PrismEnvelope, list[str]]:
    """Map the reviewed model's header to a draft header (`envelope_version` = 1).

    `report=False` skips working out what was dropped: the encoder's hot path (every `.v2`
    record the worker writes) does not read the report, and building it costs more than
    the conversion itself.
    """
    dropped: list[str] = []
    d = dpb.PrismEnvelope(envelope_version=KNOWN_ENVELOPE_VERSION)
    if report:
        _zero_presence(v.metadata, "metadata", dropped)
        if v.HasField("security"):
            _zero_presence(v.security, "security", dropped)

    if v.HasField("metadata"):
        d.metadata.CopyFrom(draft_metadata(v.metadata))

    d.extensions.update(v.extensions)
    if v.HasField("security"):
        vs, ds = v.security, d.security
        ds.SetInParent()
        for name in _SEC_STRINGS:
            setattr(ds, name, getattr(vs, name))
        ds.signature = vs.signature
        ds.contains_pii = vs.contains_pii
        ds.signature_scope = vs.signature_scope
        ds.sibling_digest = vs.sibling_digest
        ds.tree_index, ds.tree_size, ds.tree_path = vs.tree_index, vs.tree_size, vs.tree_path
        if vs.HasField("encryption"):
            ve, de = vs.encryption, ds.encryption
            de.SetInParent()
            de.key_id, de.algorithm, de.iv, de.aad = ve.key_id, ve.algorithm, ve.iv, ve.aad
            if ve.encryption_type:
                d.extensions[_ENC_TYPE_KEY] = _enc_type_name(ve.encryption_type).encode()
            if ve.HasField("public_key_id"):
                d.extensions[_ENC_PUB_KEY] = ve.public_key_id.encode()
            if ve.HasField("encapsulated_key"):
                d.extensions[_ENC_ENCAP_KEY] = ve.encapsulated_key
            if ve.HasField("algorithm_params"):
                d.extensions[_ENC_PARAMS_KEY] = ve.algorithm_params.encode()
    carried: dict[str, bytes] = {}
    _carry_unknown(v, _REVIEWED_UNKNOWN, carried, "reviewed")  # refuses odd extensions entries
    if carried:
        d.extensions.update(carried)
    if any(k.startswith(_DRAFT_UNKNOWN) for k in d.extensions):
        ext = dict(d.extensions)
        _restore_unknown(d, _DRAFT_UNKNOWN, ext)
        d.ClearField("extensions")
        d.extensions.update(ext)

    if v.HasField("observability"):
        d.observability.MergeFromString(v.observability.SerializeToString())
        d.observability.SetInParent()
    if v.HasField("schema"):
        d.schema.MergeFromString(v.schema.SerializeToString())
        d.schema.SetInParent()
    return d, dropped


def _enc_type_name(value: int) -> str:
    """`prism.enc.encryption_type` for an `EncryptionType`: its name, or the bare number when this
    build does not know it (proto3 keeps unknown enum numbers; `Name` would raise ValueError and
    the draft encoder would crash on a value a reviewed producer sent)."""
    return vpb.EncryptionType.Name(value) if value in vpb.EncryptionType.values() else str(value)


def _enc_type_value(text: str) -> int:
    """The inverse of `_enc_type_name`: a name, or a number (an unknown name raises ValueError,
    which the decoder reports as a `DecodeError`)."""
    return int(text) if text.isascii() and text.isdigit() else vpb.EncryptionType.Value(text)


def draft_metadata(vm: vpb.PrismMetadata) -> dpb.PrismMetadata:
    """The draft metadata for reviewed metadata: the one mapping, used by `reviewed_to_draft`
    and by the fast draft encoder (`app.envelope.codec.draft_split`). Unknown fields are not
    written here (their numbers mean nothing in the other layout): `reviewed_to_draft` carries
    them in extensions, and `draft_split` leaves such a header to it."""
    ms = vm.published_at_ms
    return dpb.PrismMetadata(
        message_id=vm.message_id, topic=vm.topic, namespace=vm.namespace,
        published_at=Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000),
        content_type=get_content_type(vm), content_encoding=get_content_encoding(vm),
        priority=vm.priority, ttl_seconds=vm.ttl_seconds, correlation_id=vm.correlation_id,
        causality_parent=vm.causality_parent, producer_sdk_version=vm.producer_sdk_version)


def draft_security_as_is(vs: vpb.SecurityContext) -> bool:
    """True when the reviewed security context's bytes read as a draft `SecurityContext` give
    exactly `reviewed_to_draft`'s security: no encryption (its nested message differs between the
    layouts) and no unknown fields (the mapping drops them). Fields 1-5 and 7-14 have the same
    numbers and wire types in both, and a zero value read into a plain proto3 field is not written
    again, as the field-by-field copy does not write it."""
    return not vs.HasField("encryption") and not len(UnknownFieldSet(vs))


def has_unknown_metadata(vm: vpb.PrismMetadata) -> bool:
    """True when reviewed metadata holds fields this build does not know: `draft_metadata`
    would drop them, so the fast draft encoder leaves the header to `reviewed_to_draft`."""
    return bool(len(UnknownFieldSet(vm)))
