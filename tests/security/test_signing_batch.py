"""The batch scope (scope 4): one signature for every message of a worker batch.

Each message's leaf is `SHA-256(0x00 || D(draft) || D(reviewed))` (the pair scope's digests,
with the tree fields cut too); the leaves form an RFC 9162 Merkle tree; the worker signs
`context || tree_size || root` once; each copy carries the signature, its sibling's digest,
its leaf index, the tree size and its audit path (docs/signing.md, "batch"). These tests
check each copy verifies alone with Prism's verifier and the independent spec
implementation, every covered field is covered in both layouts with both algorithms, the
tree fields cannot be edited, moved or repeated, the audit paths are RFC 9162's, and the
verification cache stores successes only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from app.envelope import Layout, decode
from app.errors import AmbiguousEnvelopeError, SignatureError, SignatureScopeError
from app.security import signing
from app.security.signing import (
    MAX_TREE_SIZE,
    SCOPE_BATCH,
    SCOPE_BATCH_CONTEXT,
    SCOPE_PAIR,
    VerificationKey,
    VerificationKeys,
    merkle_tree,
    root_from_path,
    sign,
    sign_batch,
    sign_layouts,
    signed_message,
    verify,
)
from tests.security import spec_signing
from tests.security.test_signing import (
    ED_KEY,
    HMAC_KEY,
    KEYS,
    LAYOUTS,
    LEGACY_OK,
    MUTATIONS,
    SIGNERS,
    SPEC_KEYS,
    _record,
    _reencode,
    assert_every_flip_detected,
    rich_envelope,
)
from tests.security.test_signing_pair import _cut_digest, _inner, _security, _with_security_value
from tests.strategies import envelopes

BOTH = (Layout.DRAFT, Layout.REVIEWED)
N = 5


def _envelopes(n: int = N, tag: str = "a"):
    out = []
    for i in range(n):
        env = rich_envelope()
        env.header.metadata.correlation_id = f"corr-{tag}-{i}"
        out.append(env)
    return out


def _batch(key, n: int = N, tag: str = "a") -> list[dict[Layout, bytes]]:
    return [dict(zip(BOTH, copies, strict=True)) for copies in sign_batch(_envelopes(n, tag), key, BOTH)]


# --------------------------------------------------------------------------- the tree itself


def _mth(d: list[bytes]) -> bytes:
    """RFC 9162 §2.1.1 MTH, as written there (leaves are already leaf hashes here)."""
    if len(d) == 1:
        return d[0]
    k = 1
    while k * 2 < len(d):
        k *= 2
    return hashlib.sha256(b"\x01" + _mth(d[:k]) + _mth(d[k:])).digest()


def _path(m: int, d: list[bytes]) -> list[bytes]:
    """RFC 9162 §2.1.3.1 PATH(m, D[n]), as written there."""
    if len(d) == 1:
        return []
    k = 1
    while k * 2 < len(d):
        k *= 2
    if m < k:
        return [*_path(m, d[:k]), _mth(d[k:])]
    return [*_path(m - k, d[k:]), _mth(d[:k])]


@pytest.mark.parametrize("n", range(1, 18))
def test_root_and_audit_paths_are_rfc_9162(n):
    leaves = [hashlib.sha256(b"\x00" + os.urandom(64)).digest() for _ in range(n)]
    root, paths = merkle_tree(leaves)
    assert root == _mth(leaves)
    for m in range(n):
        assert paths[m] == b"".join(_path(m, leaves)), m
        assert root_from_path(leaves[m], m, n, paths[m]) == root
        assert spec_signing.path_root(leaves[m], m, n, _path(m, leaves)) == root
        # any other index, a wrong size or a changed path leads elsewhere or is refused
        for other in range(n):
            if other != m:
                with contextlib.suppress(SignatureError):
                    assert root_from_path(leaves[m], other, n, paths[m]) != root
        if paths[m]:
            flipped = bytes([paths[m][0] ^ 1]) + paths[m][1:]
            assert root_from_path(leaves[m], m, n, flipped) != root
            with pytest.raises(SignatureError, match="shorter"):
                root_from_path(leaves[m], m, n, paths[m][:-32])
        with pytest.raises(SignatureError, match="longer"):
            root_from_path(leaves[m], m, n, paths[m] + bytes(32))
        with pytest.raises(SignatureError, match="multiple"):
            root_from_path(leaves[m], m, n, paths[m] + b"\x00")
    with pytest.raises(SignatureError, match="not below"):
        root_from_path(leaves[0], n, n, paths[0])


def test_tree_size_limit():
    with pytest.raises(SignatureError, match="outside"):
        root_from_path(bytes(32), 0, MAX_TREE_SIZE + 1, bytes(32 * 17))
    with pytest.raises(SignatureError, match="outside"):
        root_from_path(bytes(32), 0, 0, b"")


# --------------------------------------------------------------------------- signing and verifying


@SIGNERS
def test_one_signature_for_the_batch_each_copy_verifiable_alone(key):
    batch = _batch(key)
    sigs = set()
    leaves = []
    for i, copies in enumerate(batch):
        draft, reviewed = (decode(copies[lay]).security for lay in BOTH)
        assert reviewed.sibling_digest == _cut_digest_batch(copies[Layout.DRAFT], Layout.DRAFT)
        assert draft.sibling_digest == _cut_digest_batch(copies[Layout.REVIEWED], Layout.REVIEWED)
        leaves.append(hashlib.sha256(b"\x00" + reviewed.sibling_digest + draft.sibling_digest).digest())
        for lay, data in copies.items():
            sec = decode(data).security
            assert (sec.signature_scope, sec.tree_index, sec.tree_size) == (SCOPE_BATCH, i, N)
            sigs.add(sec.signature)
            assert verify(data, KEYS, layout=lay).scope == SCOPE_BATCH
            assert spec_signing.verify(data, SPEC_KEYS) == "valid"
            assert spec_signing.signed_message(data)[2] == signed_message(data).joined()
    assert len(sigs) == 1
    statement = SCOPE_BATCH_CONTEXT + N.to_bytes(8, "big") + _mth(leaves)
    assert {signed_message(c[lay]).joined() for c in batch for lay in BOTH} == {statement}


def _cut_digest_batch(data: bytes, layout: Layout) -> bytes:
    """The copy's digest with the tree fields cut as well, written out from docs/signing.md."""
    sec = _security(data, layout)
    value, inner = _inner(data, layout)
    kept = b"".join(value[r.start:r.end] for r in inner if r.field not in (3, 4, 11, 12, 13, 14))
    return hashlib.sha256(data[:sec.start] + _record(layout.security_field, kept) + data[sec.end:]).digest()


@SIGNERS
def test_a_batch_of_one_has_no_path_and_matches_sign(key):
    [copies] = _batch(key, 1)
    for lay in BOTH:
        sec = decode(copies[lay]).security
        assert sec.tree_size == 1 and not sec.tree_path
        assert verify(copies[lay], KEYS).scope == SCOPE_BATCH
        # `sign` with the batch scope writes the same copy as a batch of one
        assert sign(_envelopes(1)[0], key, lay, scope=SCOPE_BATCH) == copies[lay]
    # sign_layouts with the batch scope is a batch of one
    env = _envelopes(1)[0]
    assert sign_layouts(env, key, BOTH, scope=SCOPE_BATCH) == list(copies.values())
    # the pair scope's digest differs (signature_scope is hashed), so neither scope's leaf or
    # digest can be presented as the other's
    pair = sign_layouts(_envelopes(1)[0], key, BOTH, scope=SCOPE_PAIR)
    assert _cut_digest(pair[0], Layout.DRAFT) != _cut_digest_batch(copies[Layout.DRAFT], Layout.DRAFT)


@SIGNERS
@LAYOUTS
@pytest.mark.parametrize("field", list(MUTATIONS))
def test_changing_any_covered_field_fails(key, layout, field):
    data = _batch(key)[3][layout]
    assert verify(_reencode(data, layout, None), KEYS).key_id == key.key_id  # re-encoding alone is fine
    tampered = _reencode(data, layout, MUTATIONS[field])
    assert tampered != data
    with pytest.raises(SignatureError):
        verify(tampered, LEGACY_OK)
    assert spec_signing.verify(tampered, SPEC_KEYS, accept_legacy_scope=True) != "valid"


@SIGNERS
@LAYOUTS
def test_every_flipped_bit_outside_signature_and_token_is_detected(key, layout):
    data = _batch(key)[3][layout]
    sec = _security(data, layout)
    _, inner = _inner(data, layout)
    # sibling digest and tree fields are outside the digest but inside the statement (via
    # the leaf and the root): flipping them must fail as well
    skipped = [range(sec.value_start + r.value_start, sec.value_start + r.end) for r in inner if r.field in (3, 4)]
    assert_every_flip_detected(data, skipped)


def _set(**fields):
    def change(env):
        for name, value in fields.items():
            if value is None:
                env.header.security.ClearField(name)
            else:
                setattr(env.header.security, name, value)
    return change


@SIGNERS
@LAYOUTS
def test_tree_field_edits_fail(key, layout):
    batch = _batch(key)
    data = batch[3][layout]
    sec = decode(data).security
    other = decode(_batch(key, tag="b")[3][layout]).security
    cases = {
        "index": _set(tree_index=2),
        "index-zero": _set(tree_index=None),
        "index-out-of-range": _set(tree_index=N),
        "size": _set(tree_size=6),
        "size-smaller": _set(tree_size=4),
        "size-missing": _set(tree_size=None),
        "size-too-large": _set(tree_size=MAX_TREE_SIZE + 1),
        "path-flipped": _set(tree_path=bytes([sec.tree_path[40] ^ 1]).join([sec.tree_path[:40], sec.tree_path[41:]])),
        "path-truncated": _set(tree_path=sec.tree_path[:-32]),
        "path-extended": _set(tree_path=sec.tree_path + bytes(32)),
        "path-ragged": _set(tree_path=sec.tree_path[:-1]),
        "path-missing": _set(tree_path=None),
        "path-of-another-leaf": _set(tree_path=decode(batch[2][layout]).security.tree_path),
        "sibling-of-another-message": _set(sibling_digest=decode(batch[2][layout]).security.sibling_digest),
        "moved-to-other-batch": _set(signature=other.signature, tree_size=other.tree_size, tree_path=other.tree_path),
        "relabelled-pair": _set(signature_scope=SCOPE_PAIR),
    }
    for name, change in cases.items():
        bad = _reencode(data, layout, change)
        assert bad != data, name
        with pytest.raises(SignatureError):
            verify(bad, LEGACY_OK)
        assert spec_signing.verify(bad, SPEC_KEYS, accept_legacy_scope=True) == "bad_signature", name


@SIGNERS
def test_the_other_layouts_copy_at_the_same_index_does_not_stand_in(key):
    """The reviewed copy wearing the draft copy's sibling digest claims leaf(D(v3), D(v3))."""
    copies = _batch(key)[1]
    draft = decode(copies[Layout.DRAFT]).security
    forged = _reencode(copies[Layout.REVIEWED], Layout.REVIEWED, _set(sibling_digest=draft.sibling_digest))
    with pytest.raises(SignatureError, match="forged or tampered"):
        verify(forged, KEYS)


@SIGNERS
@LAYOUTS
def test_tree_fields_repeated_or_mistyped_are_ambiguous(key, layout):
    data = _batch(key)[3][layout]
    value, inner = _inner(data, layout)
    rec = {r.field: value[r.start:r.end] for r in inner}
    cases = {
        "index-twice": value + rec[12],
        "size-twice": value + bytes([13 << 3, 4]),
        "path-twice": value + rec[14],
        "index-mistyped": value + _record(12, b"\x03"),
        "size-mistyped": value + _record(13, b"\x05"),
        "path-mistyped": value + bytes([14 << 3, 1]),
    }
    for name, inner_value in cases.items():
        bad = _with_security_value(data, layout, inner_value)
        with pytest.raises(AmbiguousEnvelopeError):
            verify(bad, LEGACY_OK)
        assert spec_signing.verify(bad, SPEC_KEYS, accept_legacy_scope=True) == "ambiguous_envelope", name


def test_unknown_scope_is_still_refused():
    data = _batch(HMAC_KEY, 2)[0][Layout.REVIEWED]
    value, inner = _inner(data, Layout.REVIEWED)
    scope = next(r for r in inner if r.field == 10)
    bad = _with_security_value(data, Layout.REVIEWED, value[:scope.start] + bytes([0x50, 0x05]) + value[scope.end:])
    with pytest.raises(SignatureScopeError):
        verify(bad, LEGACY_OK)
    assert spec_signing.verify(bad, SPEC_KEYS) == "unsupported_signature_scope"


def test_an_empty_or_oversized_batch():
    assert sign_batch([], ED_KEY, BOTH) == []
    with pytest.raises(SignatureError, match="at most"):
        signing.finish_batch([None] * (MAX_TREE_SIZE + 1), ED_KEY)  # type: ignore[list-item]


# --------------------------------------------------------------------------- the verification cache


class _CountingKey:
    """An Ed25519 public key that counts `verify` calls (wrapped around the real one)."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, 0

    def verify(self, signature: bytes, data: bytes) -> None:
        self.calls += 1
        self.inner.verify(signature, data)


def _counting_keys() -> tuple[VerificationKeys, _CountingKey]:
    vk = ED_KEY.verification_key()
    counter = _CountingKey(vk.public_key)
    return VerificationKeys.of([VerificationKey(vk.key_id, vk.algorithm, public_key=counter)]), counter  # type: ignore[arg-type]


def test_a_consumer_pays_one_verify_per_batch():
    signing.clear_verification_cache()
    keys, counter = _counting_keys()
    batch = _batch(ED_KEY, 7)
    for copies in batch:
        for lay in BOTH:
            assert verify(copies[lay], keys).scope == SCOPE_BATCH
    assert counter.calls == 1


def test_the_cache_never_stores_failures():
    signing.clear_verification_cache()
    keys, counter = _counting_keys()
    data = _batch(ED_KEY, 3)[1][Layout.REVIEWED]
    sec = decode(data).security
    wrong_sig = _reencode(data, Layout.REVIEWED, _set(signature=bytes([sec.signature[0] ^ 1]) + sec.signature[1:]))
    for _ in range(3):  # the same failing statement and signature, verified every time
        with pytest.raises(SignatureError):
            verify(wrong_sig, keys)
    assert counter.calls == 3
    assert not signing._VERIFIED
    # a success is cached; the tampered copy of the same batch still fails (another statement)
    assert verify(data, keys).scope == SCOPE_BATCH
    tampered = _reencode(data, Layout.REVIEWED, MUTATIONS["security.data_classification"])
    with pytest.raises(SignatureError):
        verify(tampered, keys)
    assert counter.calls == 5


def test_a_cached_success_needs_the_same_key_object():
    """A keyring reloaded without the key (or with another key under its id) re-verifies."""
    signing.clear_verification_cache()
    keys, counter = _counting_keys()
    data = _batch(ED_KEY, 2)[0][Layout.DRAFT]
    verify(data, keys)
    verify(data, keys)
    assert counter.calls == 1
    other = VerificationKeys.of([VerificationKey(ED_KEY.key_id, "ed25519",
                                                 public_key=ED_KEY.verification_key().public_key)])
    assert verify(data, other).scope == SCOPE_BATCH  # verified afresh with the new key object
    impostor = Ed25519PrivateKey.generate().public_key()
    impostor_keys = VerificationKeys.of([VerificationKey(ED_KEY.key_id, "ed25519", public_key=impostor)])
    with pytest.raises(SignatureError):
        verify(data, impostor_keys)


def test_the_cache_is_bounded():
    signing.clear_verification_cache()
    for i in range(signing._VERIFIED_MAX + 10):
        signing._remember(("ed25519", "k", i.to_bytes(4, "big"), b"s"), ED_KEY.verification_key())
    assert len(signing._VERIFIED) == signing._VERIFIED_MAX
    signing.clear_verification_cache()


# --------------------------------------------------------------------------- randomized agreement


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(envs=st.lists(envelopes(), min_size=1, max_size=9), key=st.sampled_from([HMAC_KEY, ED_KEY]),
       field=st.sampled_from(sorted(MUTATIONS)), layout=st.sampled_from(list(Layout)), pick=st.integers(0, 8))
def test_any_batch_verifies_with_both_implementations_and_any_covered_change_fails(envs, key, field, layout, pick):
    for env in envs:
        sec = env.ensure_security()
        sec.publisher_id = sec.publisher_id or "svc"
        sec.data_classification = sec.data_classification or "confidential"
    batch = [dict(zip(BOTH, c, strict=True)) for c in sign_batch(envs, key, BOTH)]
    statements = set()
    for copies in batch:
        for lay, data in copies.items():
            assert verify(data, KEYS, layout=lay).scope == SCOPE_BATCH
            assert spec_signing.verify(data, SPEC_KEYS) == "valid"
            statements.add(spec_signing.signed_message(data)[2])
    assert len(statements) == 1
    data = batch[pick % len(batch)][layout]
    try:  # some envelopes do not survive decode + encode byte for byte (empty draft payload)
        verify(_reencode(data, layout, None), KEYS)
    except SignatureError:
        assume(False)
    tampered = _reencode(data, layout, MUTATIONS[field])
    assume(tampered != _reencode(data, layout, None))
    with pytest.raises(SignatureError):
        verify(tampered, KEYS)
    assert spec_signing.verify(tampered, SPEC_KEYS) != "valid"
