"""One redacted JSON view of an envelope (either layout), for `prism envelope inspect` and
`prism dlq show`.

Why shared: `dlq show` used to print the first 512 bytes of a DLQ value decoded as UTF-8 -
protobuf bytes with replacement characters, useless to a person. It now shows the same document
`prism envelope inspect` prints for the bytes `prism dlq show --export FILE` writes, so the two
views of one record can never disagree. The auth token is always `<redacted>` (a DLQ copy has it
masked already; a file given to `inspect` may not), and a payload is masked for JWTs and bearer
credentials before it is shown (`app.agents.dlq.mask_secrets`).
"""

from __future__ import annotations

import base64
from typing import Any

from app.errors import PrismError
from app.untrusted_json import loads_untrusted

REDACTED = "<redacted>"


def envelope_doc(data: bytes, *, payload: bool = False) -> dict[str, Any]:
    """`data` decoded as an envelope: header fields (auth token redacted), the layout, and the
    payload's type and size - with `payload`, its content too (JSON or base64, secrets masked;
    an encrypted payload is never shown). Raises the codec's `PrismError` for other bytes."""
    from google.protobuf.json_format import MessageToDict

    from app.agents.dlq import mask_secrets
    from app.envelope import decode, detect_layout

    env = decode(data)
    doc: dict[str, Any] = MessageToDict(env.header, preserving_proto_field_name=True)
    if doc.get("security", {}).get("auth_token"):
        doc["security"]["auth_token"] = REDACTED
    doc["layout"] = detect_layout(data).value
    doc["payload"] = {"type_url": env.payload.type_url, "bytes": len(env.payload)}
    if payload and not env.is_encrypted:
        body = mask_secrets(env.payload_bytes())
        try:
            doc["payload"]["json"] = loads_untrusted(body, what="payload", max_bytes=len(body))
        except ValueError:  # not JSON, or nested too deep to show as a tree (JsonInputError)
            doc["payload"]["base64"] = base64.b64encode(body).decode()
    return doc


def value_doc(value: bytes, *, preview: int = 512) -> dict[str, Any]:
    """What a record value is, for a person: a decoded envelope when it is one (`kind:
    envelope`), else a LNMP message, JSON or text, else a hex preview - secrets masked in all:
    JWTs and bearer credentials (`mask_secrets`), then every string shown through the log
    redaction's rules (`redact_patterns`: a URL's `user:password@`, `Basic` credentials,
    `password=...`), and a hex preview of the bytes masked by the same rules.
    Never raises: a DLQ holds exactly the values that did not decode. Every kind but
    `envelope` and `lnmp` says why it is not an envelope (`not_an_envelope`); JSON is parsed
    bounded (app/untrusted_json.py), so a deeply nested value is shown as text."""
    from app.observability.redaction import redact_shown

    return redact_shown(_value_doc(value, preview))  # type: ignore[no-any-return]


def _hex(data: bytes) -> str:
    """`data` as hex, masked by the redaction's rules first (a URL with a password in a value that
    is not text is still a URL with a password; read byte for byte as Latin-1)."""
    from app.observability.redaction import redact_patterns

    return redact_patterns(data.decode("latin-1")).encode("latin-1", errors="replace").hex()


def _value_doc(value: bytes, preview: int) -> dict[str, Any]:
    from app.agents.dlq import mask_secrets
    from app.cli import lnmp_inspect

    if lnmp_inspect.is_lnmp(value):
        try:
            reading = lnmp_inspect.read(value, source="value", strict=False)
            return {"kind": "lnmp", "lnmp": lnmp_inspect.inspect_doc(reading)}
        except PrismError as exc:
            return {"kind": "bytes", "not_an_envelope": f"LNMP that does not decode: [{exc.code}] {exc}",
                    "hex": _hex(value[:preview]), "shown_bytes": min(len(value), preview)}
        except Exception as exc:  # a decoder bug must not hide the record from the operator
            return {"kind": "bytes", "not_an_envelope": f"LNMP that does not decode: {type(exc).__name__}: {exc}",
                    "hex": _hex(value[:preview]), "shown_bytes": min(len(value), preview)}
    try:
        return {"kind": "envelope", "envelope": envelope_doc(value, payload=True)}
    except PrismError as exc:
        why = f"[{exc.code}] {exc}"
    except Exception as exc:  # a codec bug must not hide the record from the operator
        why = f"{type(exc).__name__}: {exc}"
    masked = mask_secrets(value)
    try:
        return {"kind": "json", "json": loads_untrusted(masked, what="record value", max_bytes=len(masked)),
                "not_an_envelope": why}
    except ValueError as exc:  # not JSON, or nested too deep to show as a tree (JsonInputError): shown as text
        if masked[:1] in (b"{", b"["):
            why = f"{why}; not shown as JSON: {exc.message if isinstance(exc, PrismError) else exc}"
    try:
        text = masked[:preview].decode("utf-8")
    except UnicodeDecodeError:
        return {"kind": "bytes", "not_an_envelope": why, "hex": _hex(masked[:preview]),
                "shown_bytes": min(len(value), preview)}
    if all(c.isprintable() or c in "\n\r\t" for c in text):
        return {"kind": "text", "not_an_envelope": why, "text": text, "shown_bytes": min(len(value), preview)}
    return {"kind": "bytes", "not_an_envelope": why, "hex": _hex(masked[:preview]),
            "shown_bytes": min(len(value), preview)}
