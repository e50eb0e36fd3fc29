"""LNMP input for `prism envelope inspect` / `validate`.

The envelope commands read files a producer wrote. Prism envelopes are protobuf; LNMP
messages (a binary container, or text with an optional `#ENVELOPE` first line) are not, and
used to fail as "malformed envelope". This module recognizes LNMP with the pipeline's own shape
detection (`app.formats.detect`), decodes it with the pipeline's own LNMP decoders
(`app.formats.lnmp`, `app.formats.lnmp_envelope`) in strict or loose mode, and reports both
the LNMP metadata and the Prism envelope it maps to. No second parser: what inspect shows is
what the normalize stage would read.

Errors are `LnmpError`s whose location is prefixed with the file name, so the CLI's one-line
`error [bad_lnmp] what (at FILE byte 8); fix: how` says where.
"""

from __future__ import annotations

import base64
import struct
import time
from dataclasses import dataclass
from typing import Any

from google.protobuf.json_format import MessageToDict

from app.errors import LnmpError
from app.formats import lnmp
from app.formats import lnmp_envelope as lnmp_env
from app.formats.detect import InputShape, detect

#: LNMP §3.1 length recommendations ("SHOULD"): reported by validate as warnings, not failures.
SOURCE_SHOULD_MAX = 64
TRACE_ID_SHOULD_MAX = 128


@dataclass(slots=True)
class LnmpReading:
    """One LNMP message as the pipeline reads it."""

    form: str  # "binary" (container) or "text"
    strict: bool
    metadata: lnmp.LnmpEnvelope | None
    record: bytes
    mapped: lnmp_env.Mapped
    container: lnmp.Container | None = None
    #: The container header as written: (version, mode, flags, declared metadata_length).
    header: tuple[int, int, int, int] | None = None

    @property
    def warnings(self) -> list[str]:
        return self.mapped.notes


def is_lnmp(data: bytes) -> bool:
    """LNMP by the pipeline's detection, or anything that starts with the container magic.

    The magic alone is enough here (unlike in the pipeline, which must also accept arbitrary
    payloads): a file starting with ``LNMP`` but with a bad version or mode is a broken
    container, and the container decoder says precisely what is wrong with it.
    """
    return detect(data) in (InputShape.LNMP_BINARY, InputShape.LNMP_TEXT) or data[:4] == lnmp.MAGIC


def read(data: bytes, *, source: str, strict: bool = True) -> LnmpReading:
    """Decode an LNMP message; `source` (a file name) prefixes the location of any error."""
    try:
        if data[:4] == lnmp.MAGIC:
            c = lnmp.decode_container(data, strict=strict)
            mapped = lnmp_env.from_container(c, strict=strict)
            version, mode, flags, mlen = struct.unpack_from(">BBHI", data, 4)
            return LnmpReading("binary", strict, c.envelope, bytes(c.record), mapped, c, (version, mode, flags, mlen))
        t = lnmp.decode_text(data, strict=strict)
        mapped = lnmp_env.from_text(t, strict=strict)
        return LnmpReading("text", strict, t.envelope, bytes(t.record), mapped)
    except LnmpError as exc:
        where = f"{source} {exc.path}" if exc.path else source
        hint = exc.hint or "re-send the message as the producer wrote it"
        if strict and (exc.path or "").startswith(("metadata", "byte 8", "#ENVELOPE", "line 1")):
            hint += " (--loose ignores a malformed LNMP envelope, or recovers one whose length is wrong)"
        raise LnmpError(exc.message, path=where, hint=hint) from None


def _metadata_doc(meta: lnmp.LnmpEnvelope | None) -> dict[str, Any] | None:
    if meta is None:
        return None
    doc: dict[str, Any] = {}
    if meta.timestamp is not None:
        doc["timestamp"] = meta.timestamp
        if 0 < meta.timestamp < 253402300800000:  # before year 10000: printable as a date
            doc["timestamp_utc"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(meta.timestamp / 1000)) + \
                f".{meta.timestamp % 1000:03d}Z"
    for name in ("source", "trace_id", "sequence"):
        value = getattr(meta, name)
        if value is not None:
            doc[name] = value
    if meta.extra_tlv:
        doc["unknown_tlv"] = [{"type": f"0x{t:02x}", "length": len(v), "hex": v.hex()} for t, v in meta.extra_tlv]
    if meta.extra_keys:
        doc["unknown_keys"] = dict(meta.extra_keys)
    return doc


def _record_doc(record: bytes, payload: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {"bytes": len(record)}
    if payload:
        try:
            doc["text"] = record.decode("utf-8")
        except UnicodeDecodeError:
            doc["base64"] = base64.b64encode(record).decode()
    return doc


def inspect_doc(r: LnmpReading, *, payload: bool = False) -> dict[str, Any]:
    """What `prism envelope inspect` prints for an LNMP message."""
    lnmp_doc: dict[str, Any] = {}
    if r.header is not None and r.container is not None:
        version, mode, flags, mlen = r.header
        try:
            mode_name = lnmp.Mode(mode).name.lower()
        except ValueError:  # pragma: no cover - decode_container rejects unknown modes
            mode_name = f"0x{mode:02x}"
        lnmp_doc["container"] = {
            "version": version, "mode": mode_name, "flags": f"0x{flags:04x}",
            "metadata_length": mlen, "has_ext_metadata": bool(flags & lnmp.FLAG_EXT_METADATA),
        }
        if r.container.mode_metadata:
            lnmp_doc["container"]["mode_metadata_hex"] = r.container.mode_metadata.hex()
    lnmp_doc["envelope"] = _metadata_doc(r.metadata)
    lnmp_doc["record"] = _record_doc(r.record, payload)
    env = r.mapped.envelope
    mapped = MessageToDict(env.header, preserving_proto_field_name=True)
    if mapped.get("security", {}).get("auth_token"):
        mapped["security"]["auth_token"] = "<redacted>"
    mapped["payload"] = {"type_url": env.payload.type_url, "bytes": len(env.payload)}
    return {
        "format": f"lnmp-{r.form}",
        "decoding": "strict" if r.strict else "loose",
        "lnmp": lnmp_doc,
        # topic, namespace and message id come from the transport when the pipeline reads it
        "maps_to": mapped,
        "warnings": list(r.warnings),
    }


def problems(r: LnmpReading, *, now_ms: int | None = None) -> tuple[list[str], list[str]]:
    """(failures, warnings) for `prism envelope validate`: LNMP §9.1 asks applications to
    validate metadata from untrusted sources - timestamps in the future or unrealistically
    old, identifiers with control characters - which is what the validate stage checks on the
    mapped envelope; §3.1's length recommendations are warnings."""
    from app.envelope import sanity_problems

    fails = [f"{p}" for p in sanity_problems(r.mapped.envelope, now_ms=now_ms)]
    warns = list(r.warnings)
    meta = r.metadata
    if meta is not None:
        if meta.source is not None and len(meta.source) > SOURCE_SHOULD_MAX:
            warns.append(f"source is {len(meta.source)} chars; LNMP §3.1 recommends at most {SOURCE_SHOULD_MAX}")
        if meta.trace_id is not None and len(meta.trace_id) > TRACE_ID_SHOULD_MAX:
            warns.append(f"trace_id is {len(meta.trace_id)} chars; LNMP §3.1 recommends at most {TRACE_ID_SHOULD_MAX}")
    return fails, warns


def summary(r: LnmpReading) -> str:
    """One line for a valid message: form, mode, which metadata fields, record size."""
    what = "LNMP binary container" if r.form == "binary" else "LNMP text message"
    if r.header is not None:
        what += f" (mode {lnmp.Mode(r.header[1]).name.lower()})"
    fields = [] if r.metadata is None else [
        n for n in ("timestamp", "source", "trace_id", "sequence") if getattr(r.metadata, n) is not None]
    meta = f"envelope: {', '.join(fields)}" if fields else "no envelope metadata"
    return f"valid {what}, {meta}, {len(r.record)}-byte record"
