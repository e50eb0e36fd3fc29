"""Envelope signatures (HMAC-SHA256, Ed25519) that any language can verify without
re-serializing.

Protobuf encodings are not canonical across implementations, so a verifier never
re-encodes: it computes the signed message from the bytes it received. Which bytes are
signed is named on the wire by `security.signature_scope` (docs/signing.md specifies both
byte by byte; `conformance/signatures/` holds language-neutral test vectors):

* scope v2 (`SIGNATURE_SCOPE_V2`, what Prism signs by default): a context string naming
  the scope and layout, then the received bytes with the one security record re-framed
  without its `signature` and `auth_token` records. Every other security field -
  publisher identity, classification, PII flag, encryption metadata, key id, the scope
  itself - is covered.
* pair (`SCOPE_PAIR`, what the worker signs its `.v2`/`.v3` copies with): one signature
  over a context string and the SHA-256 digests of both layouts' copies of a message, each
  digest over what scope v2 would sign minus the context string and `sibling_digest`. Each
  copy carries the other's digest in `security.sibling_digest`, so a reader of one layout
  recomputes its own digest and verifies once - and the worker signs once, not twice.
* batch (`SCOPE_BATCH`, the worker's default): one signature per worker batch, over the
  root of an RFC 9162 Merkle tree whose leaves are the pair digests of every message of the
  batch. Each copy carries the signature, its sibling's digest, its leaf index, the tree size
  and its audit path, so a reader rebuilds the root from one copy; a consumer verifies the
  batch's signature once (`_VERIFIED`, a cache of successful verifications).
* legacy (field absent, memo-031 Option 2): the received bytes minus every security
  record. The security context is NOT covered, so a verifier accepts it only when told to
  (`accept_legacy_scope`): that is a downgrade an attacker can exploit on any
  legacy-signed envelope by rewriting its classification or publisher.

Before either, the record layout must be unambiguous: at most one record of each singular
top-level field and of each security-context field, each with its declared wire type.
Otherwise protobuf would merge the duplicates and what was signed could differ from what
is read (`AmbiguousEnvelopeError`).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from google.protobuf.unknown_fields import UnknownFieldSet

from .. import native as _native
from .._gen.prism.envelope.draft import envelope_pb2 as dpb
from .._gen.prism.envelope.v1 import envelope_pb2 as vpb
from ..envelope.codec import (
    DEFAULT_LIMITS,
    Layout,
    Limits,
    _detect,
    check_message_size,
    decode_records,
    draft_split,
    layout_header,
    payload_parts,
    scan_records,
    security_bytes,
    split_header,
)
from ..envelope.model import Envelope, SecurityContext
from ..envelope.wire import LEN, VARINT, encode_varint, read_varint, scan
from ..errors import (
    AlgorithmError,
    AmbiguousEnvelopeError,
    ConfigError,
    DecodeError,
    LegacySignatureScopeError,
    PrismError,
    SignatureError,
    SignatureScopeError,
    UnknownKeyError,
)

HMAC_SHA256 = "hmac-sha256"
ED25519 = "ed25519"
ALGORITHMS = frozenset({HMAC_SHA256, ED25519})
MIN_HMAC_KEY_BYTES = 32

#: `security.signature_scope` values (the same numbers in both layouts' enums).
SCOPE_LEGACY = 0
SCOPE_V2 = 2
SCOPE_PAIR = 3
SCOPE_BATCH = 4
SCOPE_NAMES = {SCOPE_LEGACY: "legacy", SCOPE_V2: "v2", SCOPE_PAIR: "pair", SCOPE_BATCH: "batch"}
#: What `sign` uses unless told otherwise.
DEFAULT_SCOPE = SCOPE_V2

#: Scope v2's signed message starts with this context string, so a signature made for one
#: scope or layout can never be presented as one for another (docs/signing.md).
SCOPE_V2_CONTEXT = {lay: b"prism-envelope-signature/v2/" + lay.value.encode() + b"\x00" for lay in Layout}
#: The pair scope's signed message: this context string, then the SHA-256 digests of the
#: draft and of the reviewed copy of one message, in that order (docs/signing.md). The
#: string differs from both v2 strings, so neither scope's signature passes as the other's.
SCOPE_PAIR_CONTEXT = b"prism-envelope-signature/pair\x00"
#: The batch scope's signed message: this context string, the tree size as 8 bytes big
#: endian, then the Merkle root (docs/signing.md, "Batch scope").
SCOPE_BATCH_CONTEXT = b"prism-envelope-signature/batch\x00"
#: Largest batch one batch-scope signature may cover: bounds the audit path (16 hashes,
#: 512 bytes per copy) and the work a verifier does on a forged `tree_size`.
MAX_TREE_SIZE = 65_536
#: Length of `security.sibling_digest` (SHA-256), and of each audit-path hash.
DIGEST_BYTES = 32
#: RFC 9162 domain separation: a leaf hash and an interior node hash can never be confused.
_LEAF_PREFIX, _NODE_PREFIX = b"\x00", b"\x01"

_REVIEWED_LAYOUT = Layout.REVIEWED  # a module global: an Enum attribute costs ~50 ns per message
_SEC_AUTH_TOKEN, _SEC_SIGNATURE, _SEC_SCOPE, _SEC_SIBLING = 3, 4, 10, 11
_SEC_TREE_INDEX, _SEC_TREE_SIZE, _SEC_TREE_PATH = 12, 13, 14
#: Fields the signed message leaves out of the security record: scope v2 cuts `auth_token`
#: and `signature`; the pair scope's digests also cut `sibling_digest`, which names the
#: other copy and is bound by the signed message itself.
_CUT_V2 = frozenset({_SEC_AUTH_TOKEN, _SEC_SIGNATURE})
_CUT_PAIR = frozenset({_SEC_AUTH_TOKEN, _SEC_SIGNATURE, _SEC_SIBLING})
#: The batch scope's digests also cut the tree fields: they are bound through the root.
_CUT_BATCH = _CUT_PAIR | {_SEC_TREE_INDEX, _SEC_TREE_SIZE, _SEC_TREE_PATH}
#: SecurityContext fields and their wire types (identical in both layouts). A signed
#: envelope may hold each at most once, with this wire type.
_SEC_WIRE = {1: LEN, 2: LEN, 3: LEN, 4: LEN, 5: LEN, 6: LEN, 7: VARINT, 8: LEN, 9: LEN, 10: VARINT, 11: LEN,
             12: VARINT, 13: VARINT, 14: LEN}
_SEC_NAMES = {1: "publisher_id", 2: "publisher_team", 3: "auth_token", 4: "signature", 5: "signature_algorithm",
              6: "encryption", 7: "contains_pii", 8: "data_classification", 9: "signature_key_id",
              10: "signature_scope", 11: "sibling_digest", 12: "tree_index", 13: "tree_size", 14: "tree_path"}
#: Singular top-level fields per layout (name, wire type). `extensions` is a map (repeated)
#: and unknown fields are covered as bytes, so neither is limited.
_TOP_SINGULAR = {
    Layout.DRAFT: {1: ("envelope_version", VARINT), 2: ("metadata", LEN), 3: ("payload", LEN),
                   4: ("security", LEN), 5: ("observability", LEN), 6: ("schema", LEN)},
    Layout.REVIEWED: {1: ("metadata", LEN), 2: ("security", LEN), 3: ("observability", LEN),
                      4: ("schema", LEN), 99: ("payload", LEN)},
}


def _check_hmac_secret(key_id: str, secret: bytes | None) -> None:
    """The one rule for HMAC secrets, signing and verifying alike: at least 32 bytes. Anyone
    can compute HMAC under an empty or short secret (an unset environment variable, say), so a
    verification key holding one would accept forged signatures; the Go and Rust clients
    refuse such a key too (bad keyring / key not usable)."""
    size = 0 if secret is None else len(secret)
    if size < MIN_HMAC_KEY_BYTES:
        raise AlgorithmError(f"HMAC key {key_id!r} is {size} bytes; at least {MIN_HMAC_KEY_BYTES} required",
                             path="security.signature_key_id",
                             hint="generate 32 random bytes (e.g. `openssl rand -base64 32`)")


@dataclass(frozen=True, slots=True)
class SigningKey:
    """A key that signs. Never serialized; only `key_id` ever leaves the process."""

    key_id: str
    algorithm: str
    secret: bytes | None = None
    private_key: Ed25519PrivateKey | None = None

    @classmethod
    def hmac_sha256(cls, key_id: str, secret: bytes) -> SigningKey:
        _check_hmac_secret(key_id, secret)
        return cls(key_id, HMAC_SHA256, secret=secret)

    @classmethod
    def ed25519(cls, key_id: str, private_key: Ed25519PrivateKey) -> SigningKey:
        return cls(key_id, ED25519, private_key=private_key)

    def verification_key(self) -> VerificationKey:
        if self.algorithm == HMAC_SHA256:
            return VerificationKey(self.key_id, HMAC_SHA256, secret=self.secret)
        assert self.private_key is not None
        return VerificationKey(self.key_id, ED25519, public_key=self.private_key.public_key())

    def __repr__(self) -> str:
        return f"SigningKey({self.key_id!r}, {self.algorithm!r})"


@dataclass(frozen=True, slots=True)
class VerificationKey:
    key_id: str
    algorithm: str
    secret: bytes | None = None
    public_key: Ed25519PublicKey | None = None

    def __post_init__(self) -> None:
        # built directly (not from `SigningKey.hmac_sha256`), a key could hold a secret no
        # signing key may have; it is refused here, where it is built, never at a verdict
        if self.algorithm == HMAC_SHA256:
            _check_hmac_secret(self.key_id, self.secret)

    def __repr__(self) -> str:
        return f"VerificationKey({self.key_id!r}, {self.algorithm!r})"


@dataclass(slots=True)
class VerificationKeys:
    """The keys a verifier trusts, by key id (a namespace's keyring).

    `accept_legacy_scope` is the verifier's default for legacy-scope signatures (see the
    module docs): off, because such a signature leaves publisher, classification, PII flag
    and encryption metadata unprotected. Turn it on only while old producers migrate.
    """

    keys: dict[str, VerificationKey] = field(default_factory=dict)
    accept_legacy_scope: bool = False

    @classmethod
    def of(cls, keys: Iterable[VerificationKey | SigningKey], *, accept_legacy_scope: bool = False
           ) -> VerificationKeys:
        out = cls(accept_legacy_scope=accept_legacy_scope)
        for k in keys:
            out.add(k.verification_key() if isinstance(k, SigningKey) else k)
        return out

    def add(self, key: VerificationKey) -> None:
        if key.algorithm == HMAC_SHA256:  # a key whose secret was swapped after it was built
            _check_hmac_secret(key.key_id, key.secret)
        self.keys[key.key_id] = key

    def candidates(self, key_id: str, algorithm: str) -> list[VerificationKey]:
        if key_id:
            k = self.keys.get(key_id)
            if k is None:
                raise UnknownKeyError(f"signature key {key_id!r} is not in the verifier's keyring",
                                      path="security.signature_key_id",
                                      hint="add the producer's verification key to the namespace keyring")
            if k.algorithm != algorithm:
                raise SignatureError(f"key {key_id!r} is a {k.algorithm} key but the envelope says {algorithm}",
                                     path="security.signature_algorithm")
            return [k]
        found = [k for k in self.keys.values() if k.algorithm == algorithm]
        if not found:
            raise UnknownKeyError(f"no {algorithm} key configured and the envelope names none",
                                  path="security.signature_key_id")
        return found


@dataclass(frozen=True, slots=True)
class SignatureInfo:
    key_id: str
    algorithm: str
    scope: int = SCOPE_V2


#: The `SignatureInfo`s verifications returned, by value: it is frozen, so one object can be
#: every message's (a frozen dataclass costs ~0.3 µs to build). Keyed by a trusted key's id
#: (never a name the input chose), a known algorithm and scope: bounded by the keyrings.
_INFOS: dict[tuple[str, str, int], SignatureInfo] = {}


def _signature_info(key_id: str, alg: str, scope: int) -> SignatureInfo:
    info = _INFOS.get((key_id, alg, scope))
    if info is None:
        if len(_INFOS) >= 4096:  # keyrings reloaded many times over: start afresh
            _INFOS.clear()
        info = _INFOS[(key_id, alg, scope)] = SignatureInfo(key_id, alg, scope)
    return info


@functools.lru_cache(maxsize=256)
def _hmac_state(secret: bytes) -> hmac.HMAC:
    # The keyed inner/outer pad state, computed once per key; each message copies it.
    return hmac.new(secret, digestmod=hashlib.sha256)


def _mac(secret: bytes, parts: list[bytes | memoryview]) -> bytes:
    m = _hmac_state(secret).copy()
    for p in parts:
        m.update(p)
    return m.digest()


def begin_signature(env: Envelope, key: SigningKey, scope: int = DEFAULT_SCOPE) -> SecurityContext:
    """Record algorithm, key id and scope in `env.security` and clear any old signature:
    the state in which the signed message is computed."""
    if key.algorithm not in ALGORITHMS:
        raise AlgorithmError(f"signature algorithm {key.algorithm!r} is not supported",
                             hint=f"use one of {sorted(ALGORITHMS)}")
    if scope not in SCOPE_NAMES:
        raise SignatureScopeError(f"signature scope {scope} is not one Prism signs with",
                                  hint=f"use SCOPE_V2 ({SCOPE_V2}), SCOPE_PAIR ({SCOPE_PAIR}) or SCOPE_BATCH ({SCOPE_BATCH})")
    sec = env.ensure_security()
    sec.signature_algorithm = key.algorithm
    sec.signature_key_id = key.key_id
    if scope == SCOPE_LEGACY:
        sec.ClearField("signature_scope")  # absent on the wire: what legacy producers emit
    else:
        sec.signature_scope = scope
    sec.ClearField("signature")
    for name in _SIGNING_OUTPUT_FIELDS:
        sec.ClearField(name)
    return sec


#: What a signer writes after computing the signature (besides `signature`): cleared first.
_SIGNING_OUTPUT_FIELDS = ("sibling_digest", "tree_index", "tree_size", "tree_path")


def signature_over(key: SigningKey, parts: list[bytes | memoryview]) -> bytes:
    """The signature of the concatenation of `parts` (HMAC streams them; Ed25519 needs one buffer)."""
    if key.algorithm == HMAC_SHA256:
        assert key.secret is not None
        return _mac(key.secret, parts)
    assert key.private_key is not None
    return key.private_key.sign(b"".join(parts))


def scope_v2_security(record: bytes | memoryview, layout: Layout, cut: frozenset[int] = _CUT_V2) -> bytes:
    """A serialized security record (tag, length, value) as scope v2 signs it: the records
    of `signature` and `auth_token` removed (and `sibling_digest` with `cut=_CUT_PAIR`, as
    the pair scope's digests need), the rest kept byte for byte in their order, re-framed
    with the minimal tag and length varints."""
    view = memoryview(record)
    recs = scan(view)
    if len(recs) != 1 or recs[0][0] != layout.security_field or recs[0][1] != LEN:
        raise DecodeError("expected exactly one security record", path="security")
    _, _, _, vstart, end = recs[0]
    return _reframe(view, scan(view, vstart, end), vstart, end, layout, cut)


def _reframe(view: memoryview, inner: list[tuple[int, int, int, int, int]], vstart: int, end: int,
             layout: Layout, cut: frozenset[int] = _CUT_V2) -> bytes:
    kept: list[memoryview] = []
    run = vstart
    for fno, _, start, _, rend in inner:
        if fno in cut:
            if start > run:
                kept.append(view[run:start])
            run = rend
    if run < end:
        kept.append(view[run:end])
    body = b"".join(kept)
    return encode_varint((layout.security_field << 3) | LEN) + encode_varint(len(body)) + body


def signed_parts(layout: Layout, scope: int, head: bytes | memoryview, security: bytes | memoryview,
                 payload: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """The signed message of an envelope written as `head + security + payload` (what every
    Prism encoder emits), for the producer side."""
    if scope == SCOPE_LEGACY:
        return [head, *payload]
    if scope == SCOPE_V2:
        return [SCOPE_V2_CONTEXT[layout], head, scope_v2_security(security, layout), *payload]
    if scope in (SCOPE_PAIR, SCOPE_BATCH):
        raise SignatureScopeError(f"the {SCOPE_NAMES[scope]} scope signs both layouts of a message at once",
                                  path="security.signature_scope", hint="use sign / sign_layouts with SCOPE_PAIR")
    raise SignatureScopeError(f"signature scope {scope} is not supported", path="security.signature_scope")


def sign(env: Envelope, key: SigningKey, layout: Layout = Layout.REVIEWED, *, scope: int = DEFAULT_SCOPE) -> bytes:
    """Sign the envelope with `key` and return the wire bytes in `layout`.

    Also records algorithm, key id and scope in `env.security` (the signature value itself
    is only in the returned bytes' security record, and in `env` afterwards). `scope`
    defaults to v2; `SCOPE_LEGACY` exists for tests and for feeding old verifiers.
    `SCOPE_PAIR` works out the other layout's digest too (`sign_layouts`), so writing both
    layouts of one message should use `sign_layouts` and sign once.
    """
    if scope in (SCOPE_PAIR, SCOPE_BATCH):
        return sign_layouts(env, key, (layout,), scope=scope)[0]
    sec = begin_signature(env, key, scope)
    header = layout_header(env, layout)  # converted once for the draft layout
    head, sec_record = split_header(header, layout)
    payload = payload_parts(env, layout)
    sig = signature_over(key, signed_parts(layout, scope, head, sec_record, payload))
    sec.signature = sig
    header.security.signature = sig
    return b"".join([head, security_bytes(header.security, layout), *payload])


def sign_layouts(env: Envelope, key: SigningKey, layouts: Sequence[Layout], *, scope: int = DEFAULT_SCOPE
                 ) -> list[bytes]:
    """`[sign(env, key, layout, scope=scope) for layout in layouts]`, byte for byte the same
    (and the same `env.security` afterwards), for a writer of several layouts (the worker's
    publisher writes every message as `.v2` and `.v3`).

    What `sign` would repeat per layout is done once (`begin_signature`), and scope v2's
    re-framing of the security record is skipped when it cannot change a byte: the record
    was just serialized from a message whose `signature` is cleared, with minimal tag and
    length varints, so unless it holds an `auth_token` - or, reviewed layout only, unknown
    fields that `_reframe` might cut (a mistyped field 3 or 4 from an input) - it already
    is the scope-v2 form. Otherwise `scope_v2_security` re-frames it as `sign` does.

    With `SCOPE_PAIR`, the one signature covers both layouts (`_sign_pair`); `layouts`
    then picks which copies are returned (the statement always names both). With
    `SCOPE_BATCH` the message is signed as a batch of one (`sign_batch`); a writer of many
    messages should use `sign_batch` (or `prepare_batch` / `finish_batch`) and sign once.
    """
    if scope == SCOPE_BATCH:
        return sign_batch([env], key, layouts)[0]
    sec = begin_signature(env, key, scope)
    if scope == SCOPE_PAIR:
        return _sign_pair(env, key, sec, layouts)
    out: list[bytes] = []
    sig = b""
    for layout in layouts:
        header = layout_header(env, layout)  # the model itself for the reviewed layout
        head, sec_record = split_header(header, layout)
        payload = payload_parts(env, layout)
        hsec = header.security
        if scope == SCOPE_V2:
            v2_sec = sec_record if _as_is(hsec, layout) else scope_v2_security(sec_record, layout)
            parts = [SCOPE_V2_CONTEXT[layout], head, v2_sec, *payload]
        else:
            parts = signed_parts(layout, scope, head, sec_record, payload)
        sig = signature_over(key, parts)
        hsec.signature = sig
        out.append(b"".join([head, security_bytes(hsec, layout), *payload]))
        if layout is Layout.REVIEWED:
            sec.ClearField("signature")  # the next layout is converted from the unsigned model
    if out:
        sec.signature = sig  # as after the last `sign`
    return out


def _as_is(hsec: vpb.SecurityContext | dpb.SecurityContext, layout: Layout) -> bool:
    """True when a security record just serialized from `hsec` (signature and sibling digest
    cleared) needs no cutting: no token, and - reviewed model only, the draft is built from
    known fields - no unknown fields (which could be a mistyped field 3, 4 or 11)."""
    if layout is Layout.REVIEWED:
        return not hsec.HasField("auth_token") and not len(UnknownFieldSet(hsec))
    return not hsec.auth_token


_Copy = tuple[Layout, "vpb.SecurityContext | dpb.SecurityContext", bytes, list[bytes | memoryview]]


def _py_pair_copies(env: Envelope, cut_fields: frozenset[int]) -> tuple[list[_Copy], bytes, bytes]:
    """Both layouts' copies of a message whose signing fields are cleared (`begin_signature`),
    serialized up to the security record, and each copy's digest: SHA-256 over exactly what
    scope v2 would sign minus the context string and the `cut_fields` (`_as_is`: the fresh
    record already is the cut form unless it holds a token or unknown fields, then it is cut
    explicitly). The pair (`_CUT_PAIR`) and batch (`_CUT_BATCH`) scopes share this."""
    copies: list[_Copy] = []
    digests: list[bytes] = []
    reviewed = env.header
    head_r, sec_r = split_header(reviewed, Layout.REVIEWED)
    fast = draft_split(reviewed, head_r)  # the draft copy from the reviewed bytes, when it can
    if fast is not None:
        head_d, sec_d = fast
        draft = (head_d, security_bytes(sec_d, Layout.DRAFT), sec_d)
    else:
        header_d = layout_header(env, Layout.DRAFT)
        draft = (*split_header(header_d, Layout.DRAFT), header_d.security)
    for layout, (head, sec_record, hsec) in ((Layout.DRAFT, draft), (Layout.REVIEWED, (head_r, sec_r, reviewed.security))):
        payload = payload_parts(env, layout)
        cut = sec_record if _as_is(hsec, layout) else scope_v2_security(sec_record, layout, cut_fields)
        h = hashlib.sha256(head)
        h.update(cut)
        for part in payload:
            h.update(part)
        copies.append((layout, hsec, head, payload))
        digests.append(h.digest())
    return copies, digests[0], digests[1]


_pair_copies = _py_pair_copies
#: The compiled batch finish (`prism_native.finish_batch`), or None: `finish_batch` then
#: builds the tree and writes every copy in Python.
_native_finish_batch: Any = None


#: The compiled `pair_copies`' answer: head_reviewed, head_draft, security_draft, digest_draft,
#: digest_reviewed, the Kafka binding's envelope headers (or None) and whether a tracestate
#: entry is still to be checked (`prism_native.pair_copies`).
_Pieces = tuple[bytes, bytes, bytes, bytes, bytes, "list[tuple[str, bytes]] | None", bool]


def _compiled_pieces(env: Envelope, batch: bool) -> tuple[bytes, bytes | None, _Pieces] | None:
    """The compiled `pair_copies` of a message whose signing fields are cleared: (reviewed
    header serialized, payload `Any` bytes or None, `_Pieces`), or None without the compiled
    module or for a header it does not convert (the Python path then does)."""
    return None


def _copies_from_pieces(env: Envelope, head_r: bytes, head_d: bytes, sec_d: bytes) -> list[_Copy]:
    """The protobuf copies `_py_pair_copies` gives, from the compiled call's bytes: the draft
    security context parsed from its bytes, the reviewed one the model's own."""
    return [(Layout.DRAFT, dpb.SecurityContext.FromString(sec_d), head_d, payload_parts(env, Layout.DRAFT)),
            (Layout.REVIEWED, env.header.security, head_r, payload_parts(env, Layout.REVIEWED))]


if _native.module is not None:
    _native_pair_copies = _native.module.pair_copies
    _native_finish_batch = _native.module.finish_batch
    _PAIR_CUTS = {_CUT_PAIR: False, _CUT_BATCH: True}

    def _compiled_pieces(env: Envelope, batch: bool) -> tuple[bytes, bytes | None, _Pieces] | None:
        """`prism_native.pair_copies` (prism-client's `pair::pair_copies`): the reviewed header
        is serialized once here and everything else - the cut of its security record, the draft
        head with its metadata converted, the draft security context, both digests - is worked
        out from those bytes in one call, where Python builds the draft metadata as a protobuf
        message and serializes, parses and hashes piece by piece. The same copies and digests
        byte for byte (tests/envelope/test_layouts_native.py). The same call reads the Kafka
        binding's envelope headers from those bytes (`PreparedMessage.headers`). A header the compiled shortcut
        does not convert (encryption, observability maps, unknown fields, several extension
        entries, ...) gets None back and takes the Python path, which also words every error;
        the compiled side has none to report."""
        full = env.header.SerializeToString()
        payload = env.payload.wire() if env.payload.present else None
        try:
            got = _native_pair_copies(full, payload, batch)
        except _WireFault as exc:  # only a caught panic: the shortcut reports no faults
            raise DecodeError(f"the compiled pair copies failed ({exc.args[0]})", path="security",
                              hint=f"set {_native.ENV}=0 to use the pure-Python path, and report this input"
                              ) from None
        return None if got is None else (full, payload, got)

    def _pair_copies(env: Envelope, cut_fields: frozenset[int]) -> tuple[list[_Copy], bytes, bytes]:
        """`_py_pair_copies`, compiled where it can be (`_compiled_pieces`)."""
        batch = _PAIR_CUTS.get(cut_fields)
        got = None if batch is None else _compiled_pieces(env, batch)
        if got is None:
            return _py_pair_copies(env, cut_fields)
        head_r, head_d, sec_d, digest_d, digest_r, _, _ = got[2]
        return _copies_from_pieces(env, head_r, head_d, sec_d), digest_d, digest_r


def _sign_pair(env: Envelope, key: SigningKey, sec: SecurityContext, layouts: Sequence[Layout]) -> list[bytes]:
    """One signature for both layouts of a message (scope `pair`, docs/signing.md).

    The statement `SCOPE_PAIR_CONTEXT || D(draft) || D(reviewed)` is signed once; each copy
    then carries the signature and the other copy's digest, so a reader of either layout
    alone can rebuild the statement. One Ed25519 signature instead of two is ~36 µs less per
    published message.
    """
    copies, draft_digest, reviewed_digest = _pair_copies(env, _CUT_PAIR)
    sig = signature_over(key, [SCOPE_PAIR_CONTEXT + draft_digest + reviewed_digest])
    written: dict[Layout, bytes] = {}
    for layout, hsec, head, payload in copies:
        hsec.signature = sig
        hsec.sibling_digest = reviewed_digest if layout is Layout.DRAFT else draft_digest
        written[layout] = b"".join([head, security_bytes(hsec, layout), *payload])
    # (the reviewed `hsec` is `sec`: the model now holds what encoding it as reviewed gives)
    return [written[layout] for layout in layouts]


# --------------------------------------------------------------------------- batch scope


def leaf_hash(draft_digest: bytes, reviewed_digest: bytes) -> bytes:
    """A message's Merkle leaf: `SHA-256(0x00 || D(draft) || D(reviewed))` (RFC 9162 leaf prefix)."""
    return hashlib.sha256(_LEAF_PREFIX + draft_digest + reviewed_digest).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(_NODE_PREFIX + left + right).digest()


def merkle_tree(leaves: Sequence[bytes]) -> tuple[bytes, list[bytes]]:
    """The RFC 9162 §2.1.1 root over `leaves` (already leaf hashes) and every leaf's §2.1.3
    audit path, each path its hashes concatenated, nearest the leaf first.

    One recursion computes both (each node hash once, O(n log n) bytes of paths), rather than
    one PATH recursion per leaf, which would recompute the subtrees n times."""
    n = len(leaves)
    if n == 0:
        raise ValueError("a Merkle tree needs at least one leaf")
    paths: list[list[bytes]] = [[] for _ in range(n)]

    def mth(lo: int, hi: int) -> bytes:
        if hi - lo == 1:
            return leaves[lo]
        k = 1 << ((hi - lo - 1).bit_length() - 1)  # the largest power of two < hi - lo
        left, right = mth(lo, lo + k), mth(lo + k, hi)
        for i in range(lo, lo + k):
            paths[i].append(right)
        for i in range(lo + k, hi):
            paths[i].append(left)
        return _node(left, right)

    root = mth(0, n)
    return root, [b"".join(p) for p in paths]


def root_from_path(leaf: bytes, index: int, size: int, path: bytes | memoryview) -> bytes:
    """The root that `path` proves `leaf` (at `index` of a tree of `size`) belongs to: RFC
    9162 §2.1.3.2's verification algorithm, returning the computed root instead of comparing
    it (the batch statement signs the root, so the signature check is the comparison).
    Raises `SignatureError` for an index outside the tree, a size over `MAX_TREE_SIZE`, a path
    that is not whole hashes, or one of the wrong length for (index, size)."""
    if not 0 < size <= MAX_TREE_SIZE:
        raise _tree_fault("tree_size", size)
    if index >= size:
        raise _tree_fault("tree_index", index, size)
    if len(path) % DIGEST_BYTES:
        raise _tree_fault("path_not_whole", len(path))
    fn, sn, r = index, size - 1, leaf
    for off in range(0, len(path), DIGEST_BYTES):
        p = bytes(path[off:off + DIGEST_BYTES])
        if sn == 0:
            raise _tree_fault("path_too_long")
        if fn & 1 or fn == sn:
            r = _node(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = _node(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise _tree_fault("path_too_short")
    return r


def _tree_fault(kind: str, a: int | None = None, b: int | None = None) -> SignatureError:
    """The error for a batch-scope tree field that leads to no root: one wording for the
    Python walk up the path and the compiled one (`prism_native.signed_message`)."""
    if kind == "tree_size":
        return SignatureError(f"batch-scope tree_size {a} is outside 1..{MAX_TREE_SIZE}", path="security.tree_size")
    if kind == "tree_index":
        return SignatureError(f"batch-scope tree_index {a} is not below tree_size {b}", path="security.tree_index")
    if kind == "path_not_whole":
        return SignatureError(f"batch-scope tree_path is {a} bytes, not a multiple of {DIGEST_BYTES}",
                              path="security.tree_path")
    if kind == "path_too_long":
        return SignatureError("batch-scope tree_path is longer than the tree is deep", path="security.tree_path")
    if kind == "path_too_short":
        return SignatureError("batch-scope tree_path is shorter than the tree is deep", path="security.tree_path")
    return SignatureError(f"the compiled signed-message check failed ({kind})", path="security",
                          hint=f"set {_native.ENV}=0 to use the pure-Python check, and report this input")


def batch_statement(size: int, root: bytes) -> bytes:
    """What a batch-scope signature signs: context string, tree size (8 bytes, big endian), root."""
    return SCOPE_BATCH_CONTEXT + size.to_bytes(8, "big") + root


@dataclass(slots=True)
class PreparedMessage:
    """One message's copies in both layouts, serialized and hashed but not yet signed
    (`prepare_batch`); `finish_batch` signs a whole batch of them at once.

    Either `copies` holds the protobuf security contexts the final bytes are serialized from
    (the Python path), or `compiled` holds the compiled `pair_copies`' bytes, which
    `finish_batch` splices the batch fields into without any protobuf work: `(layout codes,
    head_draft, security_draft, head_reviewed, reviewed header, payload)`. Nothing is
    encoded twice either way. `env` is kept for a copy the splice leaves to Python."""

    copies: list[_Copy] | None
    draft_digest: bytes
    reviewed_digest: bytes
    layouts: tuple[Layout, ...]
    env: Envelope | None = None
    compiled: tuple[bytes, bytes, bytes, bytes, bytes, bytes | None] | None = None
    #: The Kafka binding's envelope headers (`app.bindings.kafka._envelope_headers` but
    #: `tracestate`), read by the compiled call from the bytes it already had, so the binding
    #: reads no metadata field in Python; None: not read (the binding builds them itself).
    headers: list[tuple[str, bytes]] | None = None
    #: With `headers`: a `traceparent` is among them and a `w3c.tracestate` extension entry
    #: may exist, whose value the binding still checks (`tracestate_of`).
    tracestate_pending: bool = False

    @property
    def leaf(self) -> bytes:
        return leaf_hash(self.draft_digest, self.reviewed_digest)

    def protobuf_copies(self) -> list[_Copy]:
        """`copies`, made from the compiled bytes when the message took the compiled path."""
        if self.copies is None:
            assert self.env is not None and self.compiled is not None
            _, head_d, sec_d, head_r, _, _ = self.compiled
            self.copies = _copies_from_pieces(self.env, head_r, head_d, sec_d)
        return self.copies


@functools.lru_cache(maxsize=64)
def _layout_codes(layouts: tuple[Layout, ...]) -> bytes:
    """`layouts` as `prism_native.finish_batch` takes them: one byte per copy, 1 for reviewed."""
    return bytes(lay is Layout.REVIEWED for lay in layouts)


def prepare_batch(env: Envelope, key: SigningKey, layouts: Sequence[Layout]) -> PreparedMessage:
    """Everything of a batch-scope signature that depends on this message alone: algorithm,
    key id and scope recorded (`begin_signature`), both copies serialized, their digests.
    Encoding errors surface here, per message, before the batch is signed."""
    begin_signature(env, key, SCOPE_BATCH)
    lays = tuple(layouts)
    got = _compiled_pieces(env, True)
    if got is not None:
        full, payload, (head_r, head_d, sec_d, digest_d, digest_r, headers, pending) = got
        return PreparedMessage(None, digest_d, digest_r, lays, env,
                               (_layout_codes(lays), head_d, sec_d, head_r, full, payload), headers, pending)
    copies, draft_digest, reviewed_digest = _py_pair_copies(env, _CUT_BATCH)
    return PreparedMessage(copies, draft_digest, reviewed_digest, lays)


def finish_batch(prepared: Sequence[PreparedMessage], key: SigningKey) -> list[list[bytes]]:
    """Sign prepared messages with ONE signature (scope `batch`, docs/signing.md) and return
    each message's copies in its requested layouts.

    Why: an Ed25519 signature is ~36 µs of fixed cost; a batch of 500 shares one, and each
    message pays a leaf and ~log2(n) node hashes of 64-65 bytes instead. Each copy gets the
    signature, its sibling's digest, its leaf index, the tree size and its audit path,
    inserted into the security record without changing any other byte.

    Compiled (`prism_native.finish_batch`, prism-client's `finish`): the tree, and for each
    message prepared on the compiled path its copies, the batch fields spliced into the
    security context's bytes where the protobuf encoder would put them - in one call per
    batch, the signature made here through a callback. The same bytes as setting the fields
    on the protobuf contexts and serializing them again (tests/security/test_finish_native.py);
    a message it cannot splice exactly comes back as its audit path and is written here. (The
    compiled path leaves the envelopes' own security contexts as `prepare_batch` left them;
    the Python path sets the batch fields on the reviewed one as it writes. Nothing reads
    them after the batch is finished: the copies are the output.)"""
    n = len(prepared)
    if n == 0:
        return []
    if n > MAX_TREE_SIZE:
        raise SignatureError(f"a batch-scope signature covers at most {MAX_TREE_SIZE} messages, not {n}",
                             hint="sign smaller batches")
    if _native_finish_batch is not None:
        try:
            sig, done = _native_finish_batch([(p.draft_digest, p.reviewed_digest, p.compiled) for p in prepared],
                                             lambda statement: signature_over(key, [statement]))
        except _WireFault as exc:  # only a caught panic: the splice reports no faults
            raise SignatureError(f"the compiled batch finish failed ({exc.args[0]})", path="security",
                                 hint=f"set {_native.ENV}=0 to use the pure-Python path, and report this input"
                                 ) from None
        return [got if type(got) is list else _written(p, i, n, sig, got)
                for i, (p, got) in enumerate(zip(prepared, done, strict=True))]
    root, paths = merkle_tree([p.leaf for p in prepared])
    sig = signature_over(key, [batch_statement(n, root)])
    return [_written(p, i, n, sig, path) for i, (p, path) in enumerate(zip(prepared, paths, strict=True))]


def _written(p: PreparedMessage, index: int, size: int, sig: bytes, path: bytes) -> list[bytes]:
    """A message's copies in its layouts the protobuf way: the batch fields set on each copy's
    security context, which is serialized again (`security_bytes`) between head and payload."""
    written: dict[Layout, bytes] = {}
    for layout, hsec, head, payload in p.protobuf_copies():
        hsec.signature = sig
        hsec.sibling_digest = p.reviewed_digest if layout is Layout.DRAFT else p.draft_digest
        hsec.tree_index = index
        hsec.tree_size = size
        if path:  # absent rather than empty: an empty optional field would still be written
            hsec.tree_path = path
        written[layout] = b"".join([head, security_bytes(hsec, layout), *payload])
    return [written[layout] for layout in p.layouts]


def sign_batch(envs: Sequence[Envelope], key: SigningKey, layouts: Sequence[Layout]) -> list[list[bytes]]:
    """Sign every envelope of a batch in `layouts` with one batch-scope signature; per
    envelope, its copies in `layouts` order (`prepare_batch` each, then `finish_batch`)."""
    return finish_batch([prepare_batch(env, key, layouts) for env in envs], key)


@dataclass(frozen=True, slots=True)
class SignedMessage:
    """What a signature on received bytes covers: `parts` concatenated is the signed message."""

    layout: Layout
    scope: int
    parts: list[bytes | memoryview]

    def joined(self) -> bytes:
        return b"".join(self.parts)


def signed_message(data: bytes | memoryview, *, layout: Layout | None = None,
                   limits: Limits = DEFAULT_LIMITS) -> SignedMessage:
    """The signed message of received envelope bytes, per the scope they declare (what a
    verifier in any language must reproduce; docs/signing.md). Raises like `verify` does
    for unsigned, ambiguous or unsupported-scope envelopes, and walks the bytes as `verify`
    does: with `limits.max_header_bytes` applied while walking (`SizeLimitError`)."""
    view = memoryview(data)
    records = scan_records(view, layout, limits)
    lay = layout or _detect(records)
    sec_rec, inner, scope = _security_record(view, records, lay)
    return SignedMessage(lay, scope, _message_parts(view, sec_rec, inner, lay, scope))


def check_unambiguous(data: bytes | memoryview, *, layout: Layout | None = None,
                      records: list[_Rec] | None = None, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise `AmbiguousEnvelopeError` if the bytes repeat a singular top-level field or a
    security-context field, or give one of them the wrong wire type (also for unsigned
    envelopes: a verifier that reads the merged parse could be fooled about whether and
    by whom the envelope was signed). `records` and `limits`: as for `verify`."""
    view = memoryview(data)
    if records is None:
        records = scan_records(view, layout, limits)
    lay = layout or _detect(records)
    _security_record(view, records, lay, required=False)


def verify(data: bytes | memoryview, keys: VerificationKeys, *, layout: Layout | None = None,
           accept_legacy_scope: bool | None = None, records: list[_Rec] | None = None,
           security: vpb.SecurityContext | dpb.SecurityContext | None = None,
           limits: Limits = DEFAULT_LIMITS) -> SignatureInfo:
    """Verify the signature on received envelope bytes. Raises `SignatureError` if it is
    missing, malformed or wrong (comparison is constant-time), `UnknownKeyError` if the
    named key is not trusted, `AmbiguousEnvelopeError` if the record layout is ambiguous,
    `LegacySignatureScopeError` for a legacy-scope signature unless `accept_legacy_scope`
    (default: `keys.accept_legacy_scope`), `SignatureScopeError` for an unknown scope.

    The bytes come from producers: without `records` they are walked as `decode` walks them,
    with `limits.max_header_bytes` applied while walking (`codec.scan_records`, `SizeLimitError`
    near the limit), so a flood of tiny records - or one huge security record of them, whose
    inner records were walked next - is refused before it becomes millions of tuples.
    `records`, when given, must be that bounded walk of these very bytes (`scan_records`, or
    `wire.scan` of input no longer than the header limit): a caller that already walked them
    (the worker's normalize stage) saves the second walk, and `limits` is then not read. Every
    check below still runs on them. `security`, when given, must be the security context a
    protobuf parse of these very bytes' header gave (either layout's, or the reviewed one a
    draft header was converted to: the fields read here - signature, algorithm, key id -
    are copied as they are): the worker's normalize stage parsed it, and the record is
    then not parsed a second time. The ambiguity checks still run first, so a context
    protobuf merged from two records is never trusted."""
    view = memoryview(data)
    if records is None:
        records = scan_records(view, layout, limits)
    lay = layout or _detect(records)
    if security is not None and _native_security_span is not None:
        return _verify_parsed(data, lay, security, keys, accept_legacy_scope)
    sec_rec, inner, scope = _security_record(view, records, lay)
    sec = security if security is not None else _parse_security(view[sec_rec[3]:sec_rec[4]], lay)
    return _verify_scoped(view, sec_rec, inner, scope, lay, sec, keys, accept_legacy_scope)


def verify_and_decode(
    data: bytes | memoryview, keys: VerificationKeys, *, layout: Layout | None = None, limits: Limits = DEFAULT_LIMITS,
    accept_legacy_scope: bool | None = None,
) -> tuple[Envelope, SignatureInfo]:
    """Decode and verify in one pass over the records (what a consumer normally wants).
    `limits` apply as in `decode`: the message size first, the header size when decoding."""
    check_message_size(len(data), limits)
    view = memoryview(data)
    records = scan_records(view, layout, limits)
    lay = layout or _detect(records)
    sec_rec, inner, scope = _security_record(view, records, lay)
    env = decode_records(view, records, lay, limits)
    sec = env.security
    if sec is None:  # pragma: no cover - _security_record found the record
        raise _not_signed("envelope is not signed (no security context)")
    return env, _verify_scoped(view, sec_rec, inner, scope, lay, sec, keys, accept_legacy_scope)


_Rec = tuple[int, int, int, int, int]


def _repeated_field(lay: Layout, field: int, at: int) -> AmbiguousEnvelopeError:
    return AmbiguousEnvelopeError(
        f"{_TOP_SINGULAR[lay][field][0]} (field {field}) appears more than once in the envelope; protobuf would merge "
        "the copies, so what was signed and what is read could differ", path=f"byte {at}",
        hint="a producer writes each context once; a second copy was appended or the encoder is broken")


def _wrong_wire_type(lay: Layout, field: int, wire_type: int, expected: int, at: int) -> AmbiguousEnvelopeError:
    return AmbiguousEnvelopeError(f"{_TOP_SINGULAR[lay][field][0]} (field {field}) has wire type {wire_type}, "
                                  f"not {expected}", path=f"byte {at}",
                                  hint="the bytes are not an envelope of this layout")


def _repeated_security_field(field: int, at: int) -> AmbiguousEnvelopeError:
    return AmbiguousEnvelopeError(f"security.{_SEC_NAMES[field]} appears more than once in the security context",
                                  path=f"byte {at}", hint="each security field is written once")


def _wrong_security_wire_type(field: int, wire_type: int, expected: int, at: int) -> AmbiguousEnvelopeError:
    return AmbiguousEnvelopeError(f"security.{_SEC_NAMES[field]} has wire type {wire_type}, not {expected}",
                                  path=f"byte {at}", hint="the security context is malformed")


def _located(found: tuple[_Rec, list[_Rec], int] | None, required: bool) -> tuple[_Rec, list[_Rec], int]:
    if found is None:
        if required:
            raise _not_signed("envelope is not signed (no security context)")
        return (0, 0, 0, 0, 0), [], SCOPE_LEGACY
    return found


def _py_security_record(view: memoryview, records: list[_Rec], lay: Layout, *, required: bool = True
                        ) -> tuple[_Rec, list[_Rec], int]:
    """The one security record, its inner records and the declared scope, after the
    ambiguity checks. The scope is read from the wire as an unsigned varint (not through
    the int32 enum, which would wrap 2**32 + 2 to 2), as docs/signing.md says."""
    singular = _TOP_SINGULAR[lay]
    seen: dict[int, _Rec] = {}
    for rec in records:
        spec = singular.get(rec[0])
        if spec is None:
            continue
        if rec[0] in seen:
            raise _repeated_field(lay, rec[0], rec[2])
        if rec[1] != spec[1]:
            raise _wrong_wire_type(lay, rec[0], rec[1], spec[1], rec[2])
        seen[rec[0]] = rec
    sec_rec = seen.get(lay.security_field)
    if sec_rec is None:
        return _located(None, required)
    inner = scan(view, sec_rec[3], sec_rec[4])
    fields: set[int] = set()
    scope = SCOPE_LEGACY
    for fno, wt, start, _, rend in inner:
        expected = _SEC_WIRE.get(fno)
        if expected is None:
            continue  # an unknown (newer) field: covered byte for byte in scope v2
        if fno in fields:
            raise _repeated_security_field(fno, start)
        if wt != expected:
            raise _wrong_security_wire_type(fno, wt, expected, start)
        fields.add(fno)
        if fno == _SEC_SCOPE:
            scope = read_varint(view, read_varint(view, start, rend)[1], rend)[0]
    return sec_rec, inner, scope


_security_record = _py_security_record

if _native.module is not None:
    _native_security_record = _native.module.security_record
    _WireFault = _native.module.WireFault
    _SecurityFault = _native.module.SecurityFault

    def _security_fault(lay: Layout, kind: str, field: int, wire_type: int | None, expected: int | None,
                        at: int) -> AmbiguousEnvelopeError:
        """The `AmbiguousEnvelopeError` the Python check raises for a fault the compiled one reported."""
        if kind == "repeated_field":
            return _repeated_field(lay, field, at)
        if kind == "wrong_wire_type":
            return _wrong_wire_type(lay, field, wire_type or 0, expected or 0, at)
        if kind == "repeated_security_field":
            return _repeated_security_field(field, at)
        if kind == "wrong_security_wire_type":
            return _wrong_security_wire_type(field, wire_type or 0, expected or 0, at)
        return AmbiguousEnvelopeError(f"the compiled security-record check failed ({kind})", path=f"byte {at}",
                                      hint=f"set {_native.ENV}=0 to use the pure-Python check, and report this input")

    def _security_record(view: memoryview, records: list[_Rec], lay: Layout, *, required: bool = True
                         ) -> tuple[_Rec, list[_Rec], int]:
        """`_py_security_record`, compiled (`prism_native.security_record`, prism-client's
        `locate_security_record`): the same records and scope, the same errors. `records` are
        the caller's walk of these bytes; the compiled check walks them again (cheaper than
        handing the tuples across)."""
        try:
            found = _native_security_record(view, lay is Layout.REVIEWED)
        except _WireFault as exc:
            raise _native.scan_fault(exc.args) from None
        except _SecurityFault as exc:
            raise _security_fault(lay, *exc.args) from None
        return _located(found, required)


#: `prism_native.security_span` when the compiled hot path is active (`verify` with a parsed
#: security context), else None.
_native_security_span: Any = None

if _native.module is not None:
    _native_security_span = _native.module.security_span

    def _security_span(data: bytes | memoryview, lay: Layout, secret: bytes | None
                       ) -> tuple[int, int, int, bytes | None]:
        """`_security_record`'s checks, faults and not-signed error, compiled, giving only the
        record's (value_start, end, scope) - no tuple is built per inner record - and, for a
        `secret` and scope v2 or legacy, the MAC `_check_mac` would compute with it."""
        try:
            found = _native_security_span(data, lay is _REVIEWED_LAYOUT, secret)
        except _WireFault as exc:
            raise _native.scan_fault(exc.args) from None
        except _SecurityFault as exc:
            raise _security_fault(lay, *exc.args) from None
        except _StatementFault as exc:  # pragma: no cover - v2 and legacy messages always form
            raise _tree_fault(exc.args[0]) from None
        if found is None:
            raise _not_signed("envelope is not signed (no security context)")
        return found  # type: ignore[no-any-return]

    def _verify_parsed(data: bytes | memoryview, lay: Layout, sec: vpb.SecurityContext | dpb.SecurityContext,
                       keys: VerificationKeys, accept_legacy_scope: bool | None) -> SignatureInfo:
        """`verify` given the parsed context, compiled: one call locates and checks the record
        and - for an HMAC signature with one candidate key - computes the MAC `_check_mac`
        would (scopes v2 and legacy), from the same walk. The verdict and every error, in
        their order, are `_verify_scoped`'s: the key is only looked up early, and a lookup
        that fails is left for `_verify_scoped` to raise in its place, after the record's
        checks, the not-signed and the legacy-scope errors."""
        key: VerificationKey | None = None
        signature = sec.signature
        if signature and sec.signature_algorithm == HMAC_SHA256:
            try:
                found = keys.candidates(sec.signature_key_id, HMAC_SHA256)
            except PrismError:
                found = []
            if len(found) == 1:
                key = found[0]
        _, _, scope, mac = _security_span(data, lay, None if key is None else key.secret)
        if mac is None or key is None:
            # the compiled message parts (`_message_parts`) read neither the record nor its
            # inner records for a known scope; an unknown one is refused before they are read
            return _verify_scoped(data, None, None, scope, lay, sec, keys, accept_legacy_scope)  # type: ignore[arg-type]
        _refuse_legacy(scope, keys, accept_legacy_scope)
        if hmac.compare_digest(mac, signature):
            return _signature_info(key.key_id, HMAC_SHA256, scope)
        raise _forged()


def _parse_security(value: memoryview, lay: Layout) -> vpb.SecurityContext | dpb.SecurityContext:
    # The two layouts' SecurityContext share field numbers 1-10 but not the nested
    # EncryptionMetadata, so each is read with its own class.
    sec = vpb.SecurityContext() if lay is Layout.REVIEWED else dpb.SecurityContext()
    try:
        sec.MergeFromString(value)
    except Exception as exc:
        raise DecodeError("security context is not valid protobuf", path="security") from exc
    return sec


def _unsupported_scope(scope: int) -> SignatureScopeError:
    return SignatureScopeError(f"signature scope {scope} is not supported by this verifier",
                               path="security.signature_scope",
                               hint=f"supported: {', '.join(f'{v} ({n})' for v, n in SCOPE_NAMES.items())}; "
                                    "upgrade the verifier or have the producer sign with scope v2")


def _py_message_parts(view: memoryview, sec_rec: _Rec | None, inner: list[_Rec] | None, lay: Layout, scope: int
                      ) -> list[bytes | memoryview]:
    if scope not in SCOPE_NAMES:  # before the record is read: `verify`'s compiled path passes none
        raise _unsupported_scope(scope)
    assert sec_rec is not None and inner is not None  # every caller with a known scope has them
    _, _, start, vstart, end = sec_rec
    if scope == SCOPE_PAIR:
        return _pair_statement(view, sec_rec, inner, lay)
    if scope == SCOPE_BATCH:
        return _batch_statement(view, sec_rec, inner, lay)
    parts: list[bytes | memoryview] = []
    if scope == SCOPE_V2:
        parts.append(SCOPE_V2_CONTEXT[lay])
    if start > 0:
        parts.append(view[:start])
    if scope == SCOPE_V2:
        parts.append(_reframe(view, inner, vstart, end, lay))
    if end < len(view):
        parts.append(view[end:])
    return parts


def _no_sibling(scope: str) -> SignatureError:
    return SignatureError(f"{scope}-scope signature without a {DIGEST_BYTES}-byte sibling_digest",
                          path="security.sibling_digest",
                          hint="the envelope was changed after signing, or its producer is broken")


def _copy_digests(view: memoryview, sec_rec: _Rec, inner: list[_Rec], lay: Layout, cut: frozenset[int],
                  sibling: memoryview | None, scope: str) -> tuple[bytes, bytes]:
    """(this copy's digest, its sibling's from `sibling_digest`), for the pair and batch scopes:
    the copy as received with the `cut` fields of its security record left out."""
    if sibling is None or len(sibling) != DIGEST_BYTES:
        raise _no_sibling(scope)
    _, _, start, vstart, end = sec_rec
    h = hashlib.sha256(view[:start])
    h.update(_reframe(view, inner, vstart, end, lay, cut))
    h.update(view[end:])
    return h.digest(), bytes(sibling)


_message_parts = _py_message_parts
#: `prism_native.signed_mac` when the compiled hot path is active (`_check_mac`), else None.
_native_mac: Any = None

if _native.module is not None:
    _native_signed_message = _native.module.signed_message
    _native_mac = _native.module.signed_mac
    _StatementFault = _native.module.StatementFault
    _KNOWN_SCOPES = frozenset({SCOPE_LEGACY, SCOPE_V2, SCOPE_PAIR, SCOPE_BATCH})

    def _message_parts(view: memoryview, sec_rec: _Rec | None, inner: list[_Rec] | None, lay: Layout, scope: int
                       ) -> list[bytes | memoryview]:
        """`_py_message_parts`, compiled (`prism_native.signed_message`, prism-client's
        `signed_statement`): the same message as one bytes object (the digests, the re-framed
        security record and the Merkle path worked out in Rust), the same errors. An unknown
        scope is refused here, with the Python wording, before crossing."""
        if scope not in _KNOWN_SCOPES:
            return _py_message_parts(view, sec_rec, inner, lay, scope)
        try:
            return [_native_signed_message(view, lay is Layout.REVIEWED)]
        except _StatementFault as exc:
            kind, a, b, scope_name = exc.args
            raise (_no_sibling(scope_name) if kind == "no_sibling" else _tree_fault(kind, a, b)) from None
        except _WireFault as exc:
            raise _native.scan_fault(exc.args) from None
        except _SecurityFault as exc:
            raise _security_fault(lay, *exc.args) from None


def _pair_statement(view: memoryview, sec_rec: _Rec, inner: list[_Rec], lay: Layout) -> list[bytes | memoryview]:
    """The pair scope's signed message for received bytes of one layout: this copy's digest
    is recomputed, the sibling's is taken from `sibling_digest`, and both are put in layout
    order. A wrong sibling digest only yields a statement the key never signed."""
    sibling = next((view[r[3]:r[4]] for r in inner if r[0] == _SEC_SIBLING), None)
    own, other = _copy_digests(view, sec_rec, inner, lay, _CUT_PAIR, sibling, "pair")
    return [SCOPE_PAIR_CONTEXT, own, other] if lay is Layout.DRAFT else [SCOPE_PAIR_CONTEXT, other, own]


def _batch_statement(view: memoryview, sec_rec: _Rec, inner: list[_Rec], lay: Layout) -> list[bytes | memoryview]:
    """The batch scope's signed message for received bytes of one layout: this copy's digest
    (cut of `_CUT_BATCH`), the sibling's from `sibling_digest`, the leaf of both in layout
    order, then the root its audit path leads to (`root_from_path`). Any wrong tree field only
    yields a root, and so a statement, that the key never signed."""
    sibling: memoryview | None = None
    index, size, path = 0, 0, memoryview(b"")
    for fno, _, rstart, vs, rend in inner:
        if fno == _SEC_SIBLING:
            sibling = view[vs:rend]
        elif fno == _SEC_TREE_INDEX:
            index = read_varint(view, read_varint(view, rstart, rend)[1], rend)[0]
        elif fno == _SEC_TREE_SIZE:
            size = read_varint(view, read_varint(view, rstart, rend)[1], rend)[0]
        elif fno == _SEC_TREE_PATH:
            path = view[vs:rend]
    own, other = _copy_digests(view, sec_rec, inner, lay, _CUT_BATCH, sibling, "batch")
    leaf = leaf_hash(own, other) if lay is Layout.DRAFT else leaf_hash(other, own)
    return [batch_statement(size, root_from_path(leaf, index, size, path))]


#: Successful batch-scope verifications: (algorithm, key id named by the envelope, statement,
#: signature) -> the key object that verified it. A batch's copies all share one statement and
#: one signature, so a consumer pays one Ed25519 verify per batch, not per message. Only
#: successes are stored, and only under everything that was checked; a hit also requires the
#: very same key object to still be a candidate, so a reloaded or removed key re-verifies.
_VERIFIED: OrderedDict[tuple[str, str, bytes, bytes], VerificationKey] = OrderedDict()
_VERIFIED_MAX = 1024
_VERIFIED_LOCK = threading.Lock()


def _cached_key(entry: tuple[str, str, bytes, bytes], candidates: list[VerificationKey]) -> VerificationKey | None:
    with _VERIFIED_LOCK:
        k = _VERIFIED.get(entry)
        if k is None or not any(c is k for c in candidates):
            return None
        _VERIFIED.move_to_end(entry)
        return k


def _remember(entry: tuple[str, str, bytes, bytes], k: VerificationKey) -> None:
    with _VERIFIED_LOCK:
        _VERIFIED[entry] = k
        _VERIFIED.move_to_end(entry)
        while len(_VERIFIED) > _VERIFIED_MAX:
            _VERIFIED.popitem(last=False)


def clear_verification_cache() -> None:
    """Forget every cached batch-scope verification (tests; a keyring swap needs no call,
    since a hit must be verified by the same key object)."""
    with _VERIFIED_LOCK:
        _VERIFIED.clear()


def _verify_scoped(view: memoryview, sec_rec: _Rec | None, inner: list[_Rec] | None, scope: int, lay: Layout,
                   sec: vpb.SecurityContext | dpb.SecurityContext, keys: VerificationKeys,
                   accept_legacy_scope: bool | None) -> SignatureInfo:
    if not sec.signature:
        raise _not_signed("envelope is not signed")
    _refuse_legacy(scope, keys, accept_legacy_scope)
    if _native_mac is not None and scope in (SCOPE_V2, SCOPE_LEGACY) and sec.signature_algorithm == HMAC_SHA256:
        return _check_mac(view, lay, sec.signature, sec.signature_key_id, keys, scope)
    parts = _message_parts(view, sec_rec, inner, lay, scope)
    return _check(sec.signature, sec.signature_algorithm, sec.signature_key_id, parts, keys, scope)


def _refuse_legacy(scope: int, keys: VerificationKeys, accept_legacy_scope: bool | None) -> None:
    if scope == SCOPE_LEGACY and not (keys.accept_legacy_scope if accept_legacy_scope is None
                                      else accept_legacy_scope):
        raise LegacySignatureScopeError(
            "envelope is signed with the legacy scope, which does not cover its security context "
            "(publisher, classification, PII flag, encryption metadata could have been changed)",
            path="security.signature_scope",
            hint="sign with scope v2 (Prism SDK default), or set verify_signature.accept_legacy_scope "
                 "while old producers migrate (a downgrade risk: docs/signing.md)")


def _check_mac(view: memoryview, lay: Layout, signature: bytes, key_id: str, keys: VerificationKeys, scope: int
               ) -> SignatureInfo:
    """`_check` of an HMAC signature in scope v2 or legacy, with the message and its MAC
    computed in one compiled call per candidate key (`prism_native.signed_mac`). These scopes'
    messages cannot fail to form, so the errors and their order are `_check`'s: unknown key,
    key of another algorithm, then no match."""
    reviewed = lay is Layout.REVIEWED
    for k in keys.candidates(key_id, HMAC_SHA256):
        assert k.secret is not None and _native_mac is not None
        try:
            mac = _native_mac(view, reviewed, k.secret)
        except _WireFault as exc:
            raise _native.scan_fault(exc.args) from None
        except _SecurityFault as exc:
            raise _security_fault(lay, *exc.args) from None
        except _StatementFault as exc:
            raise _tree_fault(exc.args[0]) from None
        if hmac.compare_digest(mac, signature):
            return _signature_info(k.key_id, HMAC_SHA256, scope)
    raise _forged()


def _forged() -> SignatureError:
    return SignatureError("signature does not match the envelope (forged or tampered)", path="security.signature",
                          hint="the bytes changed after signing, or the producer used a different key")


def _not_signed(message: str) -> SignatureError:
    return SignatureError(message, path="security.signature",
                          hint="sign it in the producer, or set the namespace's signature policy to optional")


def _check(signature: bytes, alg: str, key_id: str, signed: list[bytes | memoryview], keys: VerificationKeys,
           scope: int) -> SignatureInfo:
    if not signature:
        raise _not_signed("envelope is not signed")
    if alg not in ALGORITHMS:
        raise AlgorithmError(f"signature algorithm {alg!r} is not supported", path="security.signature_algorithm",
                             hint=f"use one of {sorted(ALGORITHMS)}")
    candidates = keys.candidates(key_id, alg)
    entry: tuple[str, str, bytes, bytes] | None = None
    if scope == SCOPE_BATCH:
        entry = (alg, key_id, b"".join(signed), bytes(signature))
        hit = _cached_key(entry, candidates)
        if hit is not None:
            return _signature_info(hit.key_id, alg, scope)
    for k in candidates:
        ok = False
        if alg == HMAC_SHA256:
            assert k.secret is not None
            ok = hmac.compare_digest(_mac(k.secret, signed), signature)
        else:
            assert k.public_key is not None
            try:
                k.public_key.verify(signature, b"".join(signed))
                ok = True
            except InvalidSignature:
                pass
        if ok:
            if entry is not None:
                _remember(entry, k)
            return _signature_info(k.key_id, alg, scope)
    raise _forged()


# --------------------------------------------------------------------------- keyring files


@dataclass(frozen=True, slots=True)
class KeyPublisher:
    """The publisher a signing key belongs to (a keyring entry's `publisher_id`/`publisher_team`):
    what a signature verified with that key proves about who sent the message."""

    publisher_id: str
    publisher_team: str | None = None


#: The development keyring's producer key belongs to the demo's order service (`write_dev_keyring`).
DEV_PRODUCER = KeyPublisher("svc-orders", "commerce")


@dataclass(slots=True)
class SigningKeyring:
    """Signature keys from a file: who may sign for which namespace, and the worker's own key.

    File format (YAML or JSON)::

        keys:
          - id: orders-producer-1
            algorithm: hmac-sha256
            secret_b64: <32+ random bytes, base64>
            namespaces: [order-events]      # optional: restrict to these namespaces
            publisher_id: svc-orders        # optional: the publisher this key belongs to
            publisher_team: commerce        # optional (needs publisher_id)
          - id: prism-worker-1
            algorithm: ed25519
            private_key_b64: <32-byte Ed25519 seed>   # or public_key_b64 to verify only
        worker_key: prism-worker-1                     # optional: what the worker re-signs with

    `publisher_id` binds a key to one publisher: a signature that verifies with it establishes
    that publisher's identity (method `key`, app/agents/identity.py), as a verified JWT does.
    A key without it proves only that a holder of the key signed, not who that is.
    """

    verify_all: VerificationKeys
    by_namespace: dict[str, VerificationKeys]
    unrestricted: VerificationKeys
    signing: dict[str, SigningKey]
    worker_key_id: str | None = None
    #: key id -> the publisher the key is bound to (`publisher_id`/`publisher_team` in the file)
    publishers: dict[str, KeyPublisher] = field(default_factory=dict)
    _merged: dict[str, VerificationKeys] = field(default_factory=dict, repr=False)

    def keys_for(self, namespace: str) -> VerificationKeys:
        """Keys allowed to vouch for `namespace`: a producer key scoped to namespace A never
        verifies a message that claims namespace B. (Memoized: called once per message.)"""
        cached = self._merged.get(namespace)
        if cached is not None:
            return cached
        scoped = self.by_namespace.get(namespace)
        merged = self.unrestricted
        if scoped is not None:
            merged = VerificationKeys(dict(self.unrestricted.keys))
            merged.keys.update(scoped.keys)
        self._merged[namespace] = merged
        return merged

    def worker_key(self) -> SigningKey | None:
        if self.worker_key_id is None:
            return None
        return self.signing[self.worker_key_id]


def load_signing_keyring(path: str | Path) -> SigningKeyring:
    """Load and validate a signing keyring file; every problem is one `ConfigError`."""
    import base64
    import binascii

    from ..config_files import read_config

    path = Path(path)
    doc = read_config(path, what="signing keyring", by_suffix=False,
                      missing_hint="generate one with `prism keys init` or point the topology at an existing file")
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ConfigError("signing keyring must be a mapping with a `keys` list", path=str(path),
                          hint="point the topology at a keyring file `prism keys init` wrote (docs/signing.md, "
                               "\"Keyring files\")")
    problems: list[str] = []
    all_keys, unrestricted = VerificationKeys(), VerificationKeys()
    by_ns: dict[str, VerificationKeys] = {}
    signing: dict[str, SigningKey] = {}
    publishers: dict[str, KeyPublisher] = {}
    for i, raw in enumerate(doc["keys"]):
        where = f"keys[{i}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or not raw["id"]:
            problems.append(f"{where}: needs a non-empty `id`")
            continue
        kid, alg = raw["id"], raw.get("algorithm")
        where = f"keys[{i}] ({kid})"
        if kid in all_keys.keys:
            problems.append(f"{where}: duplicate key id")
            continue
        try:
            if alg == HMAC_SHA256:
                sk = SigningKey.hmac_sha256(kid, base64.b64decode(raw["secret_b64"], validate=True))
                signing[kid] = sk
                vk = sk.verification_key()
            elif alg == ED25519:
                if "private_key_b64" in raw:
                    seed = base64.b64decode(raw["private_key_b64"], validate=True)
                    sk = SigningKey.ed25519(kid, Ed25519PrivateKey.from_private_bytes(seed))
                    signing[kid] = sk
                    vk = sk.verification_key()
                else:
                    pub = base64.b64decode(raw["public_key_b64"], validate=True)
                    vk = VerificationKey(kid, ED25519, public_key=Ed25519PublicKey.from_public_bytes(pub))
            else:
                problems.append(f"{where}: algorithm must be {HMAC_SHA256!r} or {ED25519!r}, got {alg!r}")
                continue
        except KeyError as exc:
            problems.append(f"{where}: missing {exc.args[0]!r}")
            continue
        except (binascii.Error, ValueError) as exc:
            problems.append(f"{where}: key material is not valid base64 of the right length ({exc})")
            continue
        except AlgorithmError as exc:
            problems.append(f"{where}: {exc.message}")
            continue
        all_keys.add(vk)
        bound = _key_publisher(raw, where, problems)
        if bound is not None:
            publishers[kid] = bound
        namespaces = raw.get("namespaces")
        if namespaces is None:
            unrestricted.add(vk)
        elif isinstance(namespaces, list) and all(isinstance(n, str) for n in namespaces):
            for ns in namespaces:
                by_ns.setdefault(ns, VerificationKeys()).add(vk)
        else:
            problems.append(f"{where}: `namespaces` must be a list of names")
    worker = doc.get("worker_key")
    if worker is not None and worker not in signing:
        problems.append(f"worker_key: {worker!r} is not a key with private material in this file")
    if worker is not None and worker in publishers:
        # The worker key signs every output, whoever published it: bound to one publisher, the
        # worker's own output read back would claim that publisher's identity by key.
        problems.append(f"worker_key: {worker!r} is bound to publisher {publishers[worker].publisher_id!r}; "
                        "the worker key signs for every publisher - bind producer keys only")
    if problems:
        raise ConfigError(f"invalid signing keyring ({len(problems)} problem(s)): " + "; ".join(problems),
                          path=str(path), hint="see docs/signing.md (\"Keyring files\") for the format")
    return SigningKeyring(all_keys, by_ns, unrestricted, signing, worker, publishers)


def _key_publisher(raw: dict[str, Any], where: str, problems: list[str]) -> KeyPublisher | None:
    """A key entry's `publisher_id`/`publisher_team` binding; None when it has none (a problem
    is recorded when it is malformed: a half-stated binding must not silently mean none)."""
    pid, team = raw.get("publisher_id"), raw.get("publisher_team")
    if pid is None and team is None:
        return None
    if not isinstance(pid, str) or not pid.strip() or pid != pid.strip():
        problems.append(f"{where}: `publisher_id` must be a non-empty string without surrounding spaces"
                        + (" (publisher_team needs it)" if pid is None else ""))
        return None
    if team is not None and (not isinstance(team, str) or not team.strip() or team != team.strip()):
        problems.append(f"{where}: `publisher_team` must be a non-empty string without surrounding spaces")
        return None
    return KeyPublisher(pid, team)


def write_dev_keyring(path: str | Path, *, namespaces: Iterable[str] = (),
                      publisher: KeyPublisher | None = DEV_PRODUCER) -> SigningKeyring:
    """Create a development keyring: one HMAC producer key and the worker's Ed25519 key. The
    producer key is bound to `publisher` (the demo's order service, whose tokens the dev
    issuer mints), so what it signs carries a verified identity (method `key`)."""
    import json
    import os

    doc = dev_keyring_doc(namespaces=namespaces, publisher=publisher)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2))
    os.chmod(path, 0o600)
    return load_signing_keyring(path)


def dev_keyring_doc(*, namespaces: Iterable[str] = (), publisher: KeyPublisher | None = DEV_PRODUCER) -> dict[str, Any]:
    """A fresh keyring document (new random keys): one HMAC producer key bound to `publisher`
    and the worker's Ed25519 key. `prism keys init` and the development keys share it, so the
    shipped topology (which names `dev-producer-1` in `producers:`) works with either."""
    import base64
    import os

    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    seed = Ed25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return {
        "keys": [
            {"id": "dev-producer-1", "algorithm": HMAC_SHA256,
             "secret_b64": base64.b64encode(os.urandom(32)).decode(), **({"namespaces": list(namespaces)}
                                                                         if namespaces else {}),
             **({"publisher_id": publisher.publisher_id} if publisher is not None else {}),
             **({"publisher_team": publisher.publisher_team} if publisher is not None and publisher.publisher_team
                else {})},
            {"id": "prism-worker-1", "algorithm": ED25519, "private_key_b64": base64.b64encode(seed).decode()},
        ],
        "worker_key": "prism-worker-1",
    }
