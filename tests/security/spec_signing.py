"""docs/signing.md written out again, independently of `app.security.signing` and
`app.envelope.wire`: what a verifier in another language implements. The tests check that
this and Prism's verifier agree on every vector, so the document, not just the code, is
what is tested.

Only the standard library and `cryptography` (for Ed25519) are used.
"""

from __future__ import annotations

import hashlib
import hmac

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

SINGULAR = {  # docs/signing.md "Step 2": top-level fields that may appear once, with wire types
    "draft": {1: 0, 2: 2, 3: 2, 4: 2, 5: 2, 6: 2},
    "reviewed": {1: 2, 2: 2, 3: 2, 4: 2, 99: 2},
}
SECURITY_FIELD = {"draft": 4, "reviewed": 2}
SECURITY_WIRE = {1: 2, 2: 2, 3: 2, 4: 2, 5: 2, 6: 2, 7: 0, 8: 2, 9: 2, 10: 0, 11: 2, 12: 0, 13: 0, 14: 2}
MAX_TREE_SIZE = 65536  # docs/signing.md, batch scope


class Reject(Exception):
    """The envelope is rejected; `reason` is one of the verdicts in the vectors."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise Reject("malformed")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _put_varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def records(buf: bytes) -> list[tuple[int, int, int, int, int]]:
    """(field, wire type, record start, value start, record end) of one message's records."""
    out, pos = [], 0
    while pos < len(buf):
        start = pos
        key, pos = _varint(buf, pos)
        field, wt = key >> 3, key & 7
        if field == 0 or field >= 1 << 29:
            raise Reject("malformed")
        if wt == 0:
            _, pos = _varint(buf, pos)
            vstart = start
        elif wt == 1 or wt == 5:
            pos += 8 if wt == 1 else 4
            vstart = start
        elif wt == 2:
            length, vstart = _varint(buf, pos)
            pos = vstart + length
        else:
            raise Reject("malformed")
        if pos > len(buf):
            raise Reject("malformed")
        out.append((field, wt, start, vstart, pos))
    return out


def layout_of(recs: list[tuple[int, int, int, int, int]]) -> str:
    for r in recs:
        if r[0] == 1:
            return "draft" if r[1] == 0 else "reviewed"
    return "draft" if {r[0] for r in recs} & {5, 6} else "reviewed"


def signed_message(envelope: bytes) -> tuple[str, int, bytes, bytes, str, str]:
    """(layout, scope, signed message, signature, algorithm, key id) - docs/signing.md steps 1-5."""
    recs = records(envelope)
    layout = layout_of(recs)
    seen: set[int] = set()
    sec = None
    for r in recs:
        wt = SINGULAR[layout].get(r[0])
        if wt is None:
            continue
        if r[0] in seen or r[1] != wt:
            raise Reject("ambiguous_envelope")
        seen.add(r[0])
        if r[0] == SECURITY_FIELD[layout]:
            sec = r
    if sec is None:
        raise Reject("not_signed")
    _, _, start, vstart, end = sec
    body = envelope[vstart:end]
    inner = records(body)
    fields: dict[int, bytes] = {}
    for f, wt, _, vs, e in inner:
        if f in SECURITY_WIRE:
            if f in fields or wt != SECURITY_WIRE[f]:
                raise Reject("ambiguous_envelope")
            fields[f] = body[vs:e]
    scope = _varint(fields[10], _varint(fields[10], 0)[1])[0] if 10 in fields else 0  # skip the tag, read the value
    signature = fields.get(4, b"")
    try:
        algorithm = fields.get(5, b"").decode()
        key_id = fields.get(9, b"").decode()
    except UnicodeDecodeError:
        raise Reject("malformed") from None  # protobuf strings are UTF-8
    if scope == 0:
        return layout, 0, envelope[:start] + envelope[end:], signature, algorithm, key_id
    if scope not in (2, 3, 4):
        raise Reject("unsupported_signature_scope")
    # pair: sibling_digest is left out of the digest too; batch: and the three tree fields
    cut = {2: (3, 4), 3: (3, 4, 11), 4: (3, 4, 11, 12, 13, 14)}[scope]
    kept = b"".join(body[s:e] for f, _, s, _, e in inner if f not in cut)
    tag = bytes([SECURITY_FIELD[layout] << 3 | 2])
    rest = envelope[:start] + tag + _put_varint(len(kept)) + kept + envelope[end:]
    if scope == 2:
        return layout, 2, b"prism-envelope-signature/v2/" + layout.encode() + b"\x00" + rest, signature, algorithm, \
            key_id
    sibling = fields.get(11, b"")  # docs/signing.md "Step 5", pair scope
    if len(sibling) != 32:
        raise Reject("bad_signature")
    own = hashlib.sha256(rest).digest()
    draft, reviewed = (own, sibling) if layout == "draft" else (sibling, own)
    if scope == 3:
        return layout, 3, b"prism-envelope-signature/pair\x00" + draft + reviewed, signature, algorithm, key_id
    # batch scope: the leaf, then the root its audit path leads to
    index = _varint(fields[12], _varint(fields[12], 0)[1])[0] if 12 in fields else 0
    size = _varint(fields[13], _varint(fields[13], 0)[1])[0] if 13 in fields else 0
    path = fields.get(14, b"")
    if not 1 <= size <= MAX_TREE_SIZE or index >= size or len(path) % 32:
        raise Reject("bad_signature")
    hashes = [path[i:i + 32] for i in range(0, len(path), 32)]
    root = path_root(hashlib.sha256(b"\x00" + draft + reviewed).digest(), index, size, hashes)
    return layout, 4, b"prism-envelope-signature/batch\x00" + size.to_bytes(8, "big") + root, signature, algorithm, \
        key_id


def path_root(leaf: bytes, m: int, n: int, path: list[bytes]) -> bytes:
    """The root that audit path `path` (nearest the leaf first) gives leaf `m` of `n`,
    following RFC 9162 §2.1.3.1's recursive definition of PATH(m, D[n]) backwards: with k
    the largest power of two below n, the last hash is the other subtree's root. A path of
    the wrong length is rejected."""
    if n == 1:
        if path:
            raise Reject("bad_signature")
        return leaf
    if not path:
        raise Reject("bad_signature")
    k = 1
    while k * 2 < n:
        k *= 2
    if m < k:
        return hashlib.sha256(b"\x01" + path_root(leaf, m, k, path[:-1]) + path[-1]).digest()
    return hashlib.sha256(b"\x01" + path[-1] + path_root(leaf, m - k, n - k, path[:-1])).digest()


def verify(envelope: bytes, keys: dict[str, tuple[str, bytes]], *, accept_legacy_scope: bool = False) -> str:
    """The verdict for `envelope`: "valid" or a rejection reason. `keys`: key id ->
    (algorithm, HMAC secret or raw Ed25519 public key)."""
    try:
        _, scope, message, signature, algorithm, key_id = signed_message(envelope)
    except Reject as r:
        return r.reason
    if not signature:
        return "not_signed"
    if scope == 0 and not accept_legacy_scope:
        return "legacy_signature_scope"
    if key_id not in keys:
        return "unknown_key"
    alg, material = keys[key_id]
    if alg != algorithm:
        return "bad_signature"
    if alg == "hmac-sha256":
        ok = hmac.compare_digest(hmac.new(material, message, hashlib.sha256).digest(), signature)
        return "valid" if ok else "bad_signature"
    try:
        Ed25519PublicKey.from_public_bytes(material).verify(signature, message)
        return "valid"
    except InvalidSignature:
        return "bad_signature"
