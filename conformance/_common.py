"""Shared pieces of the conformance generators: the plain-JSON form of an envelope, the error
kinds, and writing/checking the files.

The JSON form is what a Go or Rust runner compares its own decoder's result with, so it is
specified in conformance/README.md ("The JSON form of a message") and must not change
without regenerating every file and telling the other implementations.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from app.envelope import Envelope, Layout
from app.envelope.layouts import unknown_records
from app.envelope.model import Payload, get_content_encoding, get_content_type
from app.envelope.wire import LEN, scan
from app.errors import PrismError

ROOT = Path(__file__).resolve().parent

#: TEST KEYS ONLY: every key in this suite is derived from a published label.
TEST_KEYS_NOTE = "TEST KEYS ONLY - derived from published labels, never use them for anything but these vectors."

#: The language-neutral error kinds and the Python `PrismError.code`s that count as each
#: (app/errors.py). A runner in another language maps its own errors onto these names.
ERROR_KINDS: dict[str, dict[str, Any]] = {
    "truncated": {
        "meaning": "the input ends inside a top-level record: a tag, a length, a length-delimited value or a "
                   "fixed-width value runs past the end of the bytes (a nested message cut inside a correctly "
                   "framed record is malformed)",
        "python_codes": ["truncated", "bad_length"],
    },
    "malformed": {
        "meaning": "bytes that are not an envelope: field number 0, a group or invalid wire type (3, 4, 6, 7), a "
                   "varint longer than 10 bytes, a payload record that is not length-delimited, a nested message "
                   "that is not valid protobuf, a string that is not UTF-8 (any other known field with the wrong "
                   "wire type is kept as an unknown field, as protobuf does)",
        "python_codes": ["malformed_envelope", "wire_type", "bad_length", "bad_utf8"],
    },
    "unknown_layout": {
        "meaning": "empty input: neither layout",
        "python_codes": ["unknown_layout"],
    },
    "too_large": {
        "meaning": "the message or its header (everything but the payload record) is over the vector's `limits`",
        "python_codes": ["too_large"],
    },
    "bad_signature": {
        "meaning": "the signature does not verify over the bytes its scope names (tampered field, relabelled "
                   "scope, wrong sibling digest or audit path)",
        "python_codes": ["bad_signature"],
    },
    "legacy_signature_scope": {
        "meaning": "no signature_scope (the legacy scope) and the verifier does not accept the legacy scope",
        "python_codes": ["legacy_signature_scope"],
    },
    "unsupported_signature_scope": {
        "meaning": "a signature_scope value the verifier does not know; never read as another scope",
        "python_codes": ["unsupported_signature_scope"],
    },
    "ambiguous_envelope": {
        "meaning": "a signed envelope whose meaning depends on the parser: a repeated top-level context record, "
                   "or a security field written twice or with another wire type",
        "python_codes": ["ambiguous_envelope"],
    },
    "ambiguous_map_entry": {
        "meaning": "a layout conversion (or reading a draft header, which is one) of an envelope whose top-level "
                   "extensions map holds an entry with more than a key and a value (a third field, or a key or "
                   "value of another wire type): protobuf runtimes read such an entry differently",
        "python_codes": ["ambiguous_map_entry"],
    },
    "decryption_failed": {
        "meaning": "the payload does not decrypt: tampered ciphertext, tag, iv, aad, encapsulated key or "
                   "parameters, the AAD does not match the envelope, or the envelope is not encrypted",
        "python_codes": ["decryption_failed"],
    },
    "key_not_usable": {
        "meaning": "the key cannot be used for this envelope: its algorithm_params.key_wrap names a key service the "
                   "decrypting side has no provider for",
        "python_codes": ["key_not_usable"],
    },
    "bad_lnmp": {
        "meaning": "an LNMP container or #ENVELOPE header that breaks the LNMP envelope spec (strict mode)",
        "python_codes": ["bad_lnmp"],
    },
}

_CODE_TO_KINDS: dict[str, set[str]] = {}
for _kind, _doc in ERROR_KINDS.items():
    for _code in _doc["python_codes"]:
        _CODE_TO_KINDS.setdefault(_code, set()).add(_kind)


def counts_as(code: str, kind: str) -> bool:
    """True when Python's error `code` counts as the language-neutral error `kind`."""
    return kind in _CODE_TO_KINDS.get(code, set())


# --------------------------------------------------------------------------- the JSON form


def message_json(msg: Message) -> dict[str, Any]:
    """A protobuf message as plain JSON (README, "The JSON form of a message"): the fields
    present on the wire, by their .proto names, in field-number order; bytes as lowercase hex;
    enums as numbers; 64-bit integers as JSON numbers; maps as objects; unknown fields as the
    hex of their wire records under `_unknown`."""
    out: dict[str, Any] = {}
    for fd, value in msg.ListFields():
        out[fd.name] = _field_json(fd, value)
    unknown = unknown_records(msg)
    if unknown:
        out["_unknown"] = unknown.hex()
    return out


def _scalar(fd: FieldDescriptor, value: Any) -> Any:
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return bytes(value).hex()
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        return message_json(value)
    return value


def _field_json(fd: FieldDescriptor, value: Any) -> Any:
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        vfd = fd.message_type.fields_by_name["value"]
        return {k: _scalar(vfd, v) for k, v in sorted(value.items())}
    if fd.is_repeated:
        return [_scalar(fd, v) for v in value]
    return _scalar(fd, value)


def message_from_json(msg: Message, data: Mapping[str, Any]) -> Message:
    """Fill `msg` from the JSON form (the inverse of `message_json`): what a runner does to
    build an envelope from a vector's `model`."""
    fields = msg.DESCRIPTOR.fields_by_name
    for name, value in data.items():
        if name == "_unknown":
            msg.MergeFromString(bytes.fromhex(value))
            continue
        fd = fields[name]
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            vfd = fd.message_type.fields_by_name["value"]
            target = getattr(msg, name)
            for k, v in value.items():
                target[k] = bytes.fromhex(v) if vfd.type == FieldDescriptor.TYPE_BYTES else v
        elif fd.is_repeated:
            getattr(msg, name).extend(value)
        elif fd.message_type is not None:
            sub = getattr(msg, name)
            sub.SetInParent()
            message_from_json(sub, value)
        elif fd.type == FieldDescriptor.TYPE_BYTES:
            setattr(msg, name, bytes.fromhex(value))
        else:
            setattr(msg, name, value)
    return msg


def envelope_from_model(model: Mapping[str, Any]) -> Envelope:
    """An envelope from a vector's `model` (the reviewed layout plus `payload`)."""
    from app._gen.prism.envelope.v1 import envelope_pb2 as vpb
    header = dict(model)
    payload = header.pop("payload", None)
    env = Envelope(message_from_json(vpb.PrismEnvelope(), header))  # type: ignore[arg-type]
    env.payload = Payload.absent() if payload is None else Payload(
        bytes.fromhex(payload.get("value", "")), payload.get("type_url", ""))
    return env


def payload_json(env: Envelope) -> dict[str, Any] | None:
    """The payload `Any` in the JSON form, or None when there is no payload record."""
    if not env.payload.present:
        return None
    out: dict[str, Any] = {}
    if env.payload.type_url:
        out["type_url"] = env.payload.type_url
    if len(env.payload.value):
        out["value"] = bytes(env.payload.value).hex()
    return out


def model_json(env: Envelope) -> dict[str, Any]:
    """The reviewed-layout model of a decoded envelope (either layout) in the JSON form, with
    the payload under `payload` (absent when the envelope has no payload record)."""
    out = message_json(env.header)
    p = payload_json(env)
    if p is not None:
        out["payload"] = p
    return out


def effective_json(env: Envelope) -> dict[str, Any]:
    """What readers derive from the model: the content type as a MIME string (enum or custom
    string), the content encoding name, and the priority with its default of 5."""
    md = env.header.metadata
    return {"content_type": get_content_type(md), "content_encoding": get_content_encoding(md),
            "priority": env.priority}


def payload_location(data: bytes, layout: Layout) -> dict[str, int] | None:
    """Where the payload is in the buffer: the payload record, the `Any` inside it and the
    `Any.value` bytes inside that, as offsets into `data` (None without a payload record, or
    when the payload field occurs more than once)."""
    records = [r for r in scan(data) if r[0] == layout.payload_field]
    if len(records) != 1:
        return None
    _, _, start, vstart, end = records[0]
    out = {"record_offset": start, "record_length": end - start, "any_offset": vstart, "any_length": end - vstart}
    try:
        value = [r for r in scan(data, vstart, end) if r[0] == 2 and r[1] == LEN]
    except PrismError:  # not an Any (header-only vectors): only the record is located
        value = []
    if value:
        out["value_offset"], out["value_length"] = value[-1][3], value[-1][4] - value[-1][3]
    return out


# --------------------------------------------------------------------------- files


def dump(doc: Mapping[str, Any]) -> str:
    """The committed text of one vector file (stable: insertion order, one-space indent)."""
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def doc(kind: str, note: str, vectors: list[dict[str, Any]], **extra: Any) -> str:
    """A vector file: its kind, a note, anything file-wide (keys, limits), the vectors."""
    return dump({"kind": kind, "note": note, **extra, "vectors": vectors})
