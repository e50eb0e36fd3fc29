"""Generate the whole conformance suite and its manifest (conformance/README.md).

    .venv/bin/python -m conformance.generate          # rewrite every vector file and manifest.json
    .venv/bin/python -m conformance.generate --check  # exit 1 if any committed file is stale or extra

Each kind has its own generator module (`generate_<kind>.py`, with a `build()` returning file
name -> text); this entry point runs them all, writes `manifest.json` last (it records every
file's SHA-256, so a runner can tell a hand-edited vector file from a generated one), and in
`--check` mode compares instead of writing. `make test` runs the check, so a change to Prism's
wire format, signing, encryption or LNMP mapping that does not regenerate the suite fails the
build - and a regenerated suite that changes a committed vector shows up in review and then in
the Go and Rust runners.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from collections.abc import Callable
from typing import Any

from . import (
    generate_bindings,
    generate_conversion,
    generate_encryption,
    generate_envelopes,
    generate_expiry,
    generate_key_wrap,
    generate_lnmp,
    generate_negative,
    generate_signatures,
)
from ._common import ERROR_KINDS, ROOT, TEST_KEYS_NOTE, dump

#: (folder, kind of its files, build function, what the folder holds)
GENERATORS: list[tuple[str, Callable[[], dict[str, str]], str]] = [
    ("signatures", generate_signatures.build, "signature scopes v2, pair and batch; HMAC-SHA256 and Ed25519; both "
     "layouts; tampered fields, relabelled scopes, ambiguous records"),
    ("envelopes", generate_envelopes.build, "decode/encode vectors for both layouts: every context present and "
     "absent, enum and custom content types, explicit zeros, unknown fields, payload location"),
    ("conversion", generate_conversion.build, "draft <-> reviewed conversion: output bytes (when deterministic), "
     "output fields, and the field paths reported as not carried; map entries holding more than a key and a "
     "value (refused in extensions, copied in trace labels and baggage)"),
    ("encryption", generate_encryption.build, "AES-256-GCM, ML-KEM-1024 and X25519+ML-KEM-1024 decrypt vectors "
     "with fixed test keys, and tampered, truncated, swapped and moved ciphertexts"),
    ("key-wrap", generate_key_wrap.build, "the key_wrap pattern (a key service's data key per message, AWS KMS): "
     "the service's answers as a table, the encryption context, wrapped keys swapped, flipped or missing, an "
     "unknown key service"),
    ("lnmp", generate_lnmp.build, "LNMP binary containers (TLV envelope) and #ENVELOPE text headers -> LNMP fields "
     "and envelope fields; strict-mode refusals"),
    ("negative", generate_negative.build, "truncation at every record boundary and inside every record, bad varints, "
     "wrong wire types, duplicated records, bad UTF-8, size limits, tampered and relabelled signed envelopes"),
    ("bindings", generate_bindings.build, "the Kafka binding's headers per envelope and layout: prism-* metadata "
     "copies, W3C traceparent (id and flag rules) and tracestate (Level 1, strict, re-formatted)"),
    ("expiry", generate_expiry.build, "TTL expiry: published_at_ms + ttl_seconds * 1000, the boundary expired, "
     "ttl 0 and negative never expiring, huge TTLs and timestamps at the int64 limits without overflow"),
]

#: What a conforming implementation does with each kind of vector (README.md has the details).
KINDS: dict[str, dict[str, Any]] = {
    "signature": {
        "file_fields": ["key"],
        "inputs": ["envelope_hex"],
        "expect": ["expected", "expected_accept_legacy_scope", "signed_message_hex"],
        "task": "Verify envelope_hex with the file's key. With the secure default (legacy scope refused) the "
                "verdict must be `expected`; with the legacy scope accepted, `expected_accept_legacy_scope`. A "
                "verdict is 'valid' or an error kind. Where signed_message_hex is present, the bytes the "
                "envelope's declared scope covers (docs/signing.md) must equal it.",
    },
    "envelope": {
        "file_fields": [],
        "inputs": ["envelope_hex", "layout"],
        "expect": ["wire", "model", "effective", "payload_location", "canonical"],
        "task": "Decode envelope_hex. Its layout must be detected as `layout`. Parsed with the layout's own "
                ".proto message it must equal `wire`; converted to the reviewed-layout model it must equal `model`; "
                "the derived values must equal `effective`; the payload must be found at `payload_location` "
                "without parsing it. Where `canonical` is true, encoding `model` in `layout` must give "
                "envelope_hex byte for byte.",
    },
    "conversion": {
        "file_fields": [],
        "inputs": ["input_hex", "from", "to"],
        "expect": ["output_hex", "output_wire", "output_model", "not_carried", "expected", "same_layout_hex"],
        "task": "Convert input_hex from layout `from` to layout `to`. The output parsed with the `to` layout's "
                "message must equal output_wire (where given), decoded into the model output_model, and where output_hex is "
                "present it must equal it byte for byte. The field paths reported as not carried must be exactly "
                "not_carried (a set). Where `expected` is given (an error kind) the conversion must fail with it "
                "instead (no output fields are given); where same_layout_hex is given, decoding input_hex and "
                "encoding it again in layout `from` must give it byte for byte.",
    },
    "encryption": {
        "file_fields": ["keys"],
        "inputs": ["envelope_hex"],
        "expect": ["expected", "plaintext_hex", "aad_hex", "ml_kem_shared_secret_hex", "x25519_shared_secret_hex",
                   "aead_key_hex"],
        "task": "Decode envelope_hex and decrypt its payload with the file's keys, AAD required (docs/encryption.md). "
                "The outcome must be `expected`: 'plaintext' with exactly plaintext_hex, or the error kind. The AAD "
                "recomputed from the envelope must equal aad_hex; where given, the intermediate secrets and the "
                "AEAD key must match. Encryption is randomized: what an implementation encrypts must decrypt in "
                "Python (and the other way round) in the cross-language test.",
    },
    "key_wrap": {
        "file_fields": ["wrap_name", "provider_context", "data_keys"],
        "inputs": ["envelope_hex"],
        "expect": ["expected", "plaintext_hex", "aad_hex", "encryption_context"],
        "task": "Decrypt envelope_hex through the implementation's key_wrap (key service) path, AAD required, with "
                "a key service named wrap_name whose provider context is provider_context and which unwraps a "
                "wrapped key only when its key id, bytes and full encryption context equal an entry of data_keys "
                "(otherwise it refuses: decryption_failed). The outcome must be `expected`: 'plaintext' with "
                "exactly plaintext_hex, or the error kind; the AAD recomputed from the envelope must equal aad_hex; "
                "for a plaintext outcome the context sent to the service must equal encryption_context.",
    },
    "lnmp": {
        "file_fields": [],
        "inputs": ["input_hex", "strict"],
        "expect": ["expected", "form", "lnmp", "record_hex", "model", "reencoded_hex"],
        "task": "Decode input_hex as an LNMP message (container, #ENVELOPE text, or bare record) in strict mode. "
                "The outcome must be `expected` ('ok' or 'bad_lnmp'). On success the message's form, its LNMP "
                "envelope fields, its record and the envelope fields it maps to must equal form, lnmp, record_hex "
                "and model; writing model back as LNMP must give reencoded_hex.",
    },
    "negative": {
        "file_fields": ["key"],
        "inputs": ["input_hex", "limits"],
        "expect": ["expected_decode", "model", "expected_payload", "payload_location", "expected_verify"],
        "task": "Decode input_hex (with `limits` where given): the outcome must be expected_decode ('ok', then the "
                "model must equal `model`, or an error kind). Decode and verify it with the file's key, legacy scope "
                "refused, checking in the README's order: the outcome must be expected_verify. Where expected_payload "
                "is given (header-only vectors), `model` is the header alone, the payload record must be at "
                "payload_location, and only reading the payload fails, with expected_payload.",
    },
    "kafka_headers": {
        "file_fields": [],
        "inputs": ["envelope_hex", "layout"],
        "expect": ["headers"],
        "task": "Decode envelope_hex (layout `layout`) and build the Kafka binding's own headers for it in that "
                "layout (docs/bindings.md, the Kafka table). They must equal `headers` exactly: the same [name, "
                "value] pairs in the same order, each value the UTF-8 bytes of the JSON string.",
    },
    "expiry": {
        "file_fields": [],
        "inputs": ["envelope_hex", "layout", "now_ms"],
        "expect": ["published_at_ms", "ttl_seconds", "expires_at_ms", "expired"],
        "task": "Decode envelope_hex (layout `layout`). Its metadata.published_at_ms and ttl_seconds must equal "
                "published_at_ms and ttl_seconds (decimal strings; null: absent). The message is expired at now_ms "
                "exactly when `expired` is true: now_ms >= published_at_ms + ttl_seconds * 1000, computed without "
                "overflow, and never when ttl_seconds is absent, 0 or negative. expires_at_ms is that exact sum "
                "(it may lie beyond int64: an expiry past 2^63-1 is after every int64 now_ms), null when there is "
                "none. int64 values are decimal strings.",
    },
}


def build() -> dict[str, str]:
    """Relative path (under conformance/) -> text, every vector file and the manifest."""
    files: dict[str, str] = {}
    entries = []
    for folder, make, what in GENERATORS:
        for name, text in sorted(make().items()):
            path = f"{folder}/{name}"
            parsed = json.loads(text)
            kind = parsed["kind"]
            if kind not in KINDS:
                raise AssertionError(f"{path}: kind {kind!r} is not described in the manifest")
            files[path] = text
            entries.append({"path": path, "kind": kind, "vectors": len(parsed["vectors"]),
                            "sha256": hashlib.sha256(text.encode()).hexdigest(), "folder_holds": what})
    manifest = {
        "format": 1,
        "note": "The Prism conformance suite: every implementation (Python app/, Go clients/go, Rust clients/rust) "
                "runs every vector of every file listed here. conformance/README.md specifies the contract. "
                "Generated by python -m conformance.generate; do not edit by hand. " + TEST_KEYS_NOTE,
        "error_kinds": ERROR_KINDS,
        "kinds": KINDS,
        "files": entries,
    }
    files["manifest.json"] = dump(manifest)
    return files


def stale_files(built: dict[str, str]) -> list[str]:
    """Committed files that differ from `built`, are missing, or are JSON files no generator
    writes any more (a stale file left behind would still be run by the other languages)."""
    stale = [path for path, text in built.items()
             if not (ROOT / path).exists() or (ROOT / path).read_text(encoding="utf-8") != text]
    extra = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.json") if str(p.relative_to(ROOT)) not in built]
    return sorted(stale + extra)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed file differs from a fresh build")
    args = ap.parse_args(argv)
    # The hybrid vectors use x25519-ml-kem-1024 on purpose: its once-per-policy non-FIPS warning is noise here.
    logging.getLogger("prism.security").setLevel(logging.ERROR)
    built = build()
    if args.check:
        stale = stale_files(built)
        if stale:
            print(f"conformance suite is stale: {', '.join(stale)}; run python -m conformance.generate and "
                  "commit the result (the Go and Rust runners read these files)", file=sys.stderr)
            return 1
        print(f"conformance suite is current: {len(built)} files")
        return 0
    for path, text in built.items():
        target = ROOT / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
