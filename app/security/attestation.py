"""DLQ identity attestations: how a replayed record keeps the identity its token proved.

The problem: the authenticate stage verifies a producer's JWT and then strips it (memo-031
Recommendation 5), and the DLQ copy of a message has its token masked. A record that failed
*after* authentication (a policy, a schema, a sink) and is replayed with `prism dlq replay`
therefore has no usable token, and failed authentication again (`malformed_token`).

The fix: when a message that carries a verified identity goes to the DLQ, the worker adds one
header, `prism-dlq-attestation`, a small statement signed with the worker's Ed25519 key (the
one that re-signs outputs):

    base64url(canonical JSON) "." base64url(Ed25519 signature over DOMAIN + those JSON bytes)

The JSON names the verified identity (publisher id/team, the kept token claims, the token's
key id and algorithm - never the token), the message id, the source topic/partition/offset the
record was read from, SHA-256 digests of the DLQ record's value and of its key + headers (the
`prism.errors.*` context headers and the attestation itself excluded: replay removes the first
and keeps the second), the issue time, and the worker key id.

On replay the authenticate stage takes the identity from the attestation *instead of* the
token, but only when (a) the signature verifies with a key on the trusted list (by default the
worker's own key; rotated-out worker keys can be listed with their public half), (b) digests,
message id and topic match the record it arrived on, and (c) it is not older than the maximum
age. Anything else is a DLQ reason of its own (`attestation_invalid`, `_untrusted_key`,
`_mismatch`, `_expired`). A record without a valid attestation is authenticated by its token
as before, so a replayed record without either still fails.

Why it is sound: only the worker holds the private key; the signature covers every field, so
an identity edited after signing breaks it; the digests bind it to one record, so moving it
onto another payload (or another record's headers) is refused; DOMAIN separates these
signatures from the worker's envelope signatures. A replay of the same genuine record (also
by someone with DLQ read access) yields the same message id, which the dedup stage catches
once the message was emitted; the maximum age bounds how long such a record stays usable.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from app.errors import (
    AttestationError,
    AttestationExpiredError,
    AttestationMismatchError,
    AttestationUntrustedKeyError,
    ConfigError,
)
from app.security.jwt_auth import Identity
from app.security.signing import ED25519, SigningKey, SigningKeyring
from app.untrusted_json import loads_untrusted

HEADER = "prism-dlq-attestation"
VERSION = 1
#: Prefixed to what is signed, so an attestation signature can never pass as an envelope
#: signature by the same key, or the other way round.
DOMAIN = b"prism-dlq-attestation/v1\n"
#: Headers excluded from the record digest: the DLQ context (removed by replay) and the attestation.
ERROR_HEADER_PREFIX = "prism.errors."
MAX_HEADER_BYTES = 16 * 1024
DEFAULT_MAX_AGE_S = 7 * 24 * 3600
#: How far an attestation's issue time may lie in the future (clock skew between workers).
MAX_FUTURE_SKEW_S = 300

_FIELDS = {"v": int, "kid": str, "iat_ms": int, "message_id": str, "topic": str, "partition": int, "offset": int,
           "value_sha256": str, "record_sha256": str, "publisher_id": str, "publisher_team": (str, type(None)),
           "claims": dict, "token_kid": str, "token_alg": str}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text or any(c not in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_" for c in text):
        raise AttestationError("attestation is not base64url", path=f"header {HEADER}")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise AttestationError("attestation is not base64url", path=f"header {HEADER}") from None


def value_digest(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()


def record_digest(key: bytes | None, headers: Iterable[tuple[str, bytes | None]]) -> str:
    """SHA-256 over the record key and its headers, in order, each length-prefixed (no two
    different lists hash alike), skipping the DLQ context headers and the attestation."""
    h = hashlib.sha256()
    if key is None:
        h.update(b"\x00")
    else:
        h.update(b"\x01" + len(key).to_bytes(8, "big") + key)
    for name, val in headers:
        if val is None or name.startswith(ERROR_HEADER_PREFIX) or name == HEADER:
            continue
        raw = name.encode("utf-8", errors="surrogatepass")
        h.update(len(raw).to_bytes(8, "big") + raw + len(val).to_bytes(8, "big") + val)
    return h.hexdigest()


def _canonical(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _json_safe(value: Any, depth: int = 0) -> Any:
    """Claims as plain JSON (they came from a JWT payload, so they already are; this guards
    against a mapping proxy or a tuple)."""
    if depth > 8:
        raise ValueError("claims nest too deeply")
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v, depth + 1) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


@dataclass(frozen=True, slots=True)
class Attestation:
    """A verified attestation: who the worker had authenticated, for which record."""

    identity: Identity
    message_id: str
    topic: str
    partition: int
    offset: int
    issued_at_ms: int
    key_id: str


class Attester:
    """Signs attestations with the worker's Ed25519 key (built once per worker)."""

    def __init__(self, key: SigningKey) -> None:
        if key.algorithm != ED25519 or key.private_key is None:
            raise ConfigError(f"DLQ attestations are signed with Ed25519; worker key {key.key_id!r} is {key.algorithm}",
                              path="outputs.signing_key_id",
                              hint="give the worker an Ed25519 key in the keyring (`worker_key`)")
        self.key = key

    def header(self, identity: Identity, *, message_id: str, topic: str, partition: int, offset: int,
               key: bytes | None, value: bytes, headers: Iterable[tuple[str, bytes | None]],
               now: float | None = None) -> tuple[str, bytes]:
        """The `(name, value)` header attesting `identity` for the DLQ record (key, value, headers)."""
        doc = {
            "v": VERSION, "kid": self.key.key_id, "iat_ms": int((time.time() if now is None else now) * 1000),
            "message_id": message_id, "topic": topic, "partition": int(partition), "offset": int(offset),
            "value_sha256": value_digest(value), "record_sha256": record_digest(key, headers),
            "publisher_id": identity.publisher_id, "publisher_team": identity.publisher_team,
            "claims": _json_safe(identity.claims), "token_kid": identity.key_id, "token_alg": identity.algorithm,
        }
        body = _canonical(doc)
        assert self.key.private_key is not None
        sig = self.key.private_key.sign(DOMAIN + body)
        return HEADER, f"{_b64(body)}.{_b64(sig)}".encode("ascii")


class AttestationVerifier:
    """Checks a replayed record's attestation against the worker keys trusted for it."""

    def __init__(self, keys: Mapping[str, Ed25519PublicKey], *, max_age_s: float = DEFAULT_MAX_AGE_S) -> None:
        if not keys:
            raise ConfigError("no key is trusted for DLQ attestations", path="dlq.attestation.trusted_keys",
                              hint="the worker needs an Ed25519 worker key in its keyring")
        self.keys = dict(keys)
        self.max_age_s = float(max_age_s)

    def verify(self, raw: bytes, *, message_id: str, topic: str, key: bytes | None, value: bytes,
               headers: Iterable[tuple[str, bytes | None]], now: float | None = None) -> Attestation:
        """The attestation in header value `raw`, verified for this record; raises an
        `AttestationError` subclass naming what is wrong (never echoing the header)."""
        where = f"header {HEADER}"
        if len(raw) > MAX_HEADER_BYTES:
            raise AttestationError(f"attestation is {len(raw)} bytes, over the {MAX_HEADER_BYTES}-byte limit",
                                   path=where)
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            raise AttestationError("attestation is not ASCII", path=where) from None
        parts = text.split(".")
        if len(parts) != 2:
            raise AttestationError("attestation must be two base64url segments joined by '.'", path=where)
        body, sig = _unb64(parts[0]), _unb64(parts[1])
        try:
            doc = loads_untrusted(body, what=where, max_bytes=4096)
        except ValueError:  # JsonInputError (syntax, size, depth) is a ValueError
            raise AttestationError("attestation body is not JSON", path=where) from None
        if not isinstance(doc, dict) or set(doc) != set(_FIELDS):
            raise AttestationError("attestation body does not have exactly the expected fields", path=where)
        for name, kind in _FIELDS.items():
            if not isinstance(doc[name], kind) or (kind is int and isinstance(doc[name], bool)):
                raise AttestationError(f"attestation field {name!r} has the wrong type", path=where)
        if doc["v"] != VERSION:
            raise AttestationError(f"attestation version {doc['v']} is not supported (expected {VERSION})",
                                   path=where)
        kid = doc["kid"]
        public = self.keys.get(kid)
        if public is None:
            raise AttestationUntrustedKeyError(f"attestation is signed by key {kid[:64]!r}, which is not trusted "
                                               "for DLQ attestations", path=where,
                                               hint="list the worker key in dlq.attestation.trusted_keys if it is "
                                                    "a genuine (rotated) worker key")
        try:
            public.verify(sig, DOMAIN + body)
        except InvalidSignature:
            raise AttestationError("attestation signature does not verify (forged or altered)", path=where,
                                   hint="only records dead-lettered by a trusted worker can be replayed "
                                        "with their identity") from None
        # Signed by a trusted worker: now the content can be compared with the record.
        if doc["topic"] != topic:
            raise AttestationMismatchError(f"attestation is for source topic {doc['topic']!r}, not {topic!r}",
                                           path=where, hint="replay a DLQ record into its own source topic")
        if doc["value_sha256"] != value_digest(value):
            raise AttestationMismatchError("attestation is for another payload (value digest differs)", path=where,
                                           hint="replay DLQ records unchanged")
        if doc["record_sha256"] != record_digest(key, headers):
            raise AttestationMismatchError("attestation is for another record (key/header digest differs)",
                                           path=where, hint="replay DLQ records unchanged")
        if message_id and doc["message_id"] != message_id:
            raise AttestationMismatchError("attestation is for another message id", path=where,
                                           hint="replay DLQ records unchanged")
        t = time.time() if now is None else now
        age = t - doc["iat_ms"] / 1000
        if age > self.max_age_s:
            raise AttestationExpiredError(f"attestation is {age:.0f} s old, over the {self.max_age_s:.0f} s maximum",
                                          path=where, hint="raise dlq.attestation.max_age_s, or have the producer "
                                                           "re-send the message with a fresh token")
        if age < -MAX_FUTURE_SKEW_S:
            raise AttestationExpiredError(f"attestation is issued {-age:.0f} s in the future", path=where,
                                          hint="check the clocks of the workers")
        identity = Identity(doc["publisher_id"], doc["publisher_team"], MappingProxyType(doc["claims"]),
                            doc["token_kid"], doc["token_alg"])
        if not identity.publisher_id:
            raise AttestationError("attestation names an empty publisher id", path=where)
        return Attestation(identity, doc["message_id"], doc["topic"], doc["partition"], doc["offset"],
                           doc["iat_ms"], kid)


def trusted_keys(keyring: SigningKeyring, names: Iterable[str], *, default: str | None) -> dict[str, Ed25519PublicKey]:
    """The Ed25519 public keys of the worker key `default` and of `names` (e.g. rotated-out worker
    keys) in `keyring`. A producer key can never be trusted here: only keys named, only Ed25519."""
    wanted = list(dict.fromkeys([*([default] if default else []), *names]))
    out: dict[str, Ed25519PublicKey] = {}
    problems = []
    for kid in wanted:
        vk = keyring.verify_all.keys.get(kid)
        if vk is None:
            problems.append(f"{kid!r} is not in the keyring")
        elif vk.algorithm != ED25519 or vk.public_key is None:
            problems.append(f"{kid!r} is a {vk.algorithm} key, attestations are Ed25519")
        else:
            out[kid] = vk.public_key
    if problems:
        raise ConfigError("DLQ attestation keys: " + "; ".join(problems), path="dlq.attestation.trusted_keys",
                          hint="name Ed25519 worker keys of the signing keyring")
    return out


def describe(raw: bytes) -> dict[str, Any] | None:
    """The attestation's claims *without verifying them*, for display (`prism dlq list|show`);
    None when it does not parse. Only the worker's `AttestationVerifier` decides anything."""
    try:
        body = _unb64(raw.decode("ascii").split(".")[0])
        doc = loads_untrusted(body, what="attestation", max_bytes=4096)
    except (AttestationError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    return {k: doc.get(k) for k in ("publisher_id", "publisher_team", "message_id", "kid", "iat_ms")}


def verdict(raw: bytes, verifier: AttestationVerifier | None, *, topic: str, key: bytes | None, value: bytes,
            headers: Iterable[tuple[str, bytes | None]], unchecked: str = "no worker key here",
            now: float | None = None) -> str:
    """What a reader of the DLQ may believe of a record's attestation: ``"verified"`` when it
    verifies for this record as a replay would check it, else ``"NOT verified: <why>"``, or
    ``"not checked: <unchecked>"`` without a verifier.

    Why: `describe` reads the claims without checking them, and the attestation header is one
    anyone who can write the source or DLQ topic can set - a producer's forged
    ``publisher_id: admin`` was listed as the record's attested identity. Display decides
    nothing (the worker verifies again on replay), but an operator reads it to decide what to
    replay."""
    if verifier is None:
        return f"not checked: {unchecked}"
    try:
        verifier.verify(raw, message_id="", topic=topic, key=key, value=value, headers=headers, now=now)
    except AttestationError as exc:
        return f"NOT verified: {exc.message}"
    return "verified"


def header_value(headers: Iterable[tuple[str, bytes | None]]) -> bytes | None:
    """The attestation header's value; a record with two is refused (which one would count?)."""
    found = [v for k, v in headers if k == HEADER]
    if len(found) > 1:
        raise AttestationError("record carries more than one attestation header", path=f"header {HEADER}")
    return found[0] if found else None


__all__ = ["HEADER", "Attestation", "AttestationVerifier", "Attester", "describe", "header_value", "record_digest",
           "trusted_keys", "value_digest", "verdict"]
