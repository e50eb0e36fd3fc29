"""Conversion between the RFC-031 draft layout and the reviewed (memo-031) layout.

Both layouts carry the same information with different field numbers and types; the
mapping below is lossless for every field both have. What the other side cannot hold is
listed in the returned `dropped` list (never silently lost):

* draft -> reviewed: `envelope_version` other than 1 (the reviewed layout has no version
  field), sub-millisecond precision of `published_at`, unknown fields of the draft's
  top level / metadata / security / encryption (their numbers mean nothing in the other
  layout);
* reviewed -> draft: explicit presence of zero values (`priority=0`, `ttl_seconds=0`,
  `contains_pii=false`, an empty `aad`, ...), which proto3 plain fields cannot tell from
  "unset", and unknown fields as above.

The revision-2 encryption fields the draft lacks (`encryption_type`, `public_key_id`,
`encapsulated_key`, `algorithm_params`) are carried in draft `extensions` under
`prism.enc.*` keys and restored on the way back, so a `.v2` consumer using Prism can still
decrypt post-quantum and hybrid payloads. Observability and schema contexts have the same
numbering in both layouts and are copied through their wire bytes, unknown fields included.
"""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp
from google.protobuf.unknown_fields import UnknownFieldSet

from app._gen.prism.envelope.draft import envelope_pb2 as dpb
from app._gen.prism.envelope.v1 import envelope_pb2 as vpb
from app.envelope.model import (
    get_content_encoding,
    get_content_type,
    set_content_encoding,
    set_content_type,
)

ENC_EXT_PREFIX = "prism.enc."
_ENC_TYPE_KEY = ENC_EXT_PREFIX + "encryption_type"
_ENC_PUB_KEY = ENC_EXT_PREFIX + "public_key_id"
_ENC_ENCAP_KEY = ENC_EXT_PREFIX + "encapsulated_key"
_ENC_PARAMS_KEY = ENC_EXT_PREFIX + "algorithm_params"
_ENC_KEYS = (_ENC_TYPE_KEY, _ENC_PUB_KEY, _ENC_ENCAP_KEY, _ENC_PARAMS_KEY)

_SEC_STRINGS = ("publisher_id", "publisher_team", "auth_token", "signature_algorithm",
                "data_classification", "signature_key_id")


def _unknown(msg: object, path: str, dropped: list[str]) -> None:
    ufs = UnknownFieldSet(msg)  # type: ignore[arg-type]
    if len(ufs):
        numbers = sorted({f.field_number for f in ufs})
        dropped.append(f"{path}: unknown field(s) {numbers} have no counterpart in the other layout")


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
    if d.envelope_version not in (0, 1):
        dropped.append(f"envelope_version: {d.envelope_version} (the reviewed layout has no version field)")
    _unknown(d, "envelope", dropped)

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
        _unknown(dm, "metadata", dropped)

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
                ve.encryption_type = vpb.EncryptionType.Value(ext[_ENC_TYPE_KEY].decode())
            if _ENC_PUB_KEY in ext:
                ve.public_key_id = ext[_ENC_PUB_KEY].decode()
            if _ENC_ENCAP_KEY in ext:
                ve.encapsulated_key = ext[_ENC_ENCAP_KEY]
            if _ENC_PARAMS_KEY in ext:
                ve.algorithm_params = ext[_ENC_PARAMS_KEY].decode()
            _unknown(de, "security.encryption", dropped)
        _unknown(ds, "security", dropped)
    for k in _ENC_KEYS:
        ext.pop(k, None)
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
    d = dpb.PrismEnvelope(envelope_version=1)
    if report:
        _unknown(v, "envelope", dropped)
        _zero_presence(v.metadata, "metadata", dropped)
        if v.HasField("security"):
            _zero_presence(v.security, "security", dropped)

    if v.HasField("metadata"):
        vm = v.metadata
        d.metadata.CopyFrom(draft_metadata(vm))
        if report:
            _unknown(vm, "metadata", dropped)

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
                d.extensions[_ENC_TYPE_KEY] = vpb.EncryptionType.Name(ve.encryption_type).encode()
            if ve.HasField("public_key_id"):
                d.extensions[_ENC_PUB_KEY] = ve.public_key_id.encode()
            if ve.HasField("encapsulated_key"):
                d.extensions[_ENC_ENCAP_KEY] = ve.encapsulated_key
            if ve.HasField("algorithm_params"):
                d.extensions[_ENC_PARAMS_KEY] = ve.algorithm_params.encode()
            if report:
                _unknown(ve, "security.encryption", dropped)
        if report:
            _unknown(vs, "security", dropped)

    if v.HasField("observability"):
        d.observability.MergeFromString(v.observability.SerializeToString())
        d.observability.SetInParent()
    if v.HasField("schema"):
        d.schema.MergeFromString(v.schema.SerializeToString())
        d.schema.SetInParent()
    return d, dropped


def draft_metadata(vm: vpb.PrismMetadata) -> dpb.PrismMetadata:
    """The draft metadata for reviewed metadata: the one mapping, used by `reviewed_to_draft`
    and by the fast draft encoder (`app.envelope.codec.draft_split`). Unknown fields are not
    carried (their numbers mean nothing in the other layout)."""
    ms = vm.published_at_ms
    return dpb.PrismMetadata(
        message_id=vm.message_id, topic=vm.topic, namespace=vm.namespace,
        published_at=Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000),
        content_type=get_content_type(vm), content_encoding=get_content_encoding(vm),
        priority=vm.priority, ttl_seconds=vm.ttl_seconds, correlation_id=vm.correlation_id,
        causality_parent=vm.causality_parent)


def draft_security_as_is(vs: vpb.SecurityContext) -> bool:
    """True when the reviewed security context's bytes read as a draft `SecurityContext` give
    exactly `reviewed_to_draft`'s security: no encryption (its nested message differs between the
    layouts) and no unknown fields (the mapping drops them). Fields 1-5 and 7-14 have the same
    numbers and wire types in both, and a zero value read into a plain proto3 field is not written
    again, as the field-by-field copy does not write it."""
    return not vs.HasField("encryption") and not len(UnknownFieldSet(vs))
