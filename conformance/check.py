"""Prism's answer for one input, for the Go and Rust cross-language tests.

    python -m conformance.check decode  HEX                 # {"outcome": "ok", "layout", "model", "effective"}
                                                            # (+ "payload_error" when the payload is not an Any)
    python -m conformance.check verify  HEX                 # {"outcome": "valid" | error kind}
    python -m conformance.check decrypt HEX                 # {"outcome": "plaintext", "plaintext_hex"} | error kind
    python -m conformance.check encrypt ALGORITHM HEX       # {"outcome": "ok", "envelope_hex"}: HEX encrypted
    python -m conformance.check encode  LAYOUT MODEL_JSON   # {"outcome": "ok", "envelope_hex"}: the canonical bytes

HEX may be `-` to read it from stdin. The answer is one JSON line on stdout. Every failure on
the input is an outcome - an error kind from conformance/README.md, with Python's
`python_code` and message - so the exit status is 0 whenever an answer was given; non-zero,
with the reason on stderr, means the command line (or the model JSON) was not usable.

Why: encryption is randomized, so the suite cannot hold byte-for-byte encryption vectors.
A client in another language shows that what it encrypts decrypts in Python (`decrypt`), and
that it decrypts what Python encrypts (`encrypt`), with the suite's TEST keys
(`encryption/vectors.json`); `verify` uses the signature keys of `signatures/`, and
`decode`/`encode` let it compare any envelope it writes or reads with Python's reading.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from typing import Any

from app.envelope import Layout, decode, detect_layout, encode, new_envelope
from app.errors import PrismError
from app.security.encryption import decrypt_envelope, encrypt_envelope
from app.security.signing import VerificationKeys, verify_and_decode

from . import generate_signatures
from ._common import ERROR_KINDS, ROOT, effective_json, envelope_from_model, message_json, model_json


def error_kind(exc: PrismError) -> str:
    """The README's error kind for a Python error (`bad_length` is `malformed` only for an
    over-long varint; otherwise a length ran past the end: `truncated`)."""
    if exc.code in ERROR_KINDS:
        return exc.code
    if exc.code == "bad_length":
        return "malformed" if "longer than 10 bytes" in str(exc) else "truncated"
    for kind, spec in ERROR_KINDS.items():
        if exc.code in spec["python_codes"]:
            return kind
    return exc.code  # not one of the suite's kinds: reported as Python's code


def _failure(exc: PrismError) -> dict[str, Any]:
    return {"outcome": error_kind(exc), "python_code": exc.code, "message": str(exc)}


def _keys() -> dict[str, dict[str, str]]:
    return json.loads((ROOT / "encryption" / "vectors.json").read_text(encoding="utf-8"))["keys"]


def cmd_decode(data: bytes) -> dict[str, Any]:
    """The model; when the header decodes but the payload is not an `Any`, the header alone
    and `payload_error` (decoding is header-only: the payload is read only on demand)."""
    env = decode(data)
    out: dict[str, Any] = {"outcome": "ok", "layout": detect_layout(data).value}
    try:
        out["model"] = model_json(env)
    except PrismError as exc:
        out["model"], out["payload_error"] = message_json(env.header), error_kind(exc)
    out["effective"] = effective_json(env)
    return out


def cmd_verify(data: bytes) -> dict[str, Any]:
    keys = VerificationKeys.of([k.verification_key() for k in generate_signatures.keys().values()])
    _, info = verify_and_decode(data, keys)
    return {"outcome": "valid", "key_id": info.key_id, "scope": info.scope}


def cmd_decrypt(data: bytes) -> dict[str, Any]:
    from .generate_encryption import keyring
    return {"outcome": "plaintext", "plaintext_hex": decrypt_envelope(decode(data), keyring(_keys())).hex()}


def cmd_encrypt(algorithm: str, plaintext: bytes, layout: str = "reviewed") -> dict[str, Any]:
    from .generate_encryption import HYB, PQ, SYM, keyring
    key_id = {"aes-256-gcm": SYM, "ml-kem-1024": PQ, "x25519-ml-kem-1024": HYB}.get(algorithm)
    if key_id is None:
        raise SystemExit(f"encrypt: algorithm must be aes-256-gcm, ml-kem-1024 or x25519-ml-kem-1024, not {algorithm!r}")
    env = new_envelope("orders.created", plaintext, namespace="order-events", content_type="application/json",
                       data_classification="restricted")
    encrypt_envelope(env, keyring(_keys()), key_id=key_id, algorithm=algorithm)
    return {"outcome": "ok", "envelope_hex": encode(env, Layout(layout)).hex()}


def cmd_encode(layout: str, model: dict[str, Any]) -> dict[str, Any]:
    try:
        env = envelope_from_model(model)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SystemExit(f"encode: the model is not in the JSON form of conformance/README.md: {exc!r}") from None
    return {"outcome": "ok", "envelope_hex": encode(env, Layout(layout)).hex()}


def _hex(text: str) -> bytes:
    raw = sys.stdin.read() if text == "-" else text
    try:
        return bytes.fromhex(raw.strip())
    except ValueError:
        raise SystemExit("input is not hex") from None


def answer(argv: list[str]) -> dict[str, Any]:
    """The JSON answer for one command line (what `main` prints)."""
    ap = argparse.ArgumentParser(prog="python -m conformance.check", description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("decode", "verify", "decrypt"):
        sub.add_parser(name).add_argument("hex")
    enc = sub.add_parser("encrypt")
    enc.add_argument("algorithm")
    enc.add_argument("hex")
    enc.add_argument("--layout", choices=[lay.value for lay in Layout], default="reviewed")
    en = sub.add_parser("encode")
    en.add_argument("layout", choices=[lay.value for lay in Layout])
    en.add_argument("model", help="the model in the JSON form, or - for stdin")
    args = ap.parse_args(argv)
    run: Callable[[], dict[str, Any]]
    if args.cmd == "encrypt":
        run = lambda: cmd_encrypt(args.algorithm, _hex(args.hex), args.layout)  # noqa: E731
    elif args.cmd == "encode":
        model = json.loads(sys.stdin.read() if args.model == "-" else args.model)
        run = lambda: cmd_encode(args.layout, model)  # noqa: E731
    else:
        data = _hex(args.hex)
        run = lambda: {"decode": cmd_decode, "verify": cmd_verify, "decrypt": cmd_decrypt}[args.cmd](data)  # noqa: E731
    try:
        return run()
    except PrismError as exc:
        return _failure(exc)


def main(argv: list[str] | None = None) -> int:
    logging.getLogger("prism.security").setLevel(logging.ERROR)
    logging.getLogger("prism.audit").setLevel(logging.ERROR)
    print(json.dumps(answer(sys.argv[1:] if argv is None else argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
