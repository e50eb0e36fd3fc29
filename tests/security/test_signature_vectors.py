"""The language-neutral signature vectors (conformance/signatures/*.json, docs/signing.md):
every vector gives the stated verdict with Prism's verifier and with the independent spec
implementation, the signed message matches byte for byte, and the generator reproduces the
committed files exactly (so a change of the scope cannot slip in unnoticed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from app.errors import PrismError
from app.security.signing import (
    ED25519,
    HMAC_SHA256,
    SCOPE_BATCH_CONTEXT,
    SCOPE_PAIR_CONTEXT,
    SCOPE_V2_CONTEXT,
    SigningKey,
    VerificationKey,
    VerificationKeys,
    signed_message,
    verify,
)
from conformance import generate_signatures as generate
from tests.security import spec_signing

VECTOR_DIR = Path(__file__).resolve().parents[2] / "conformance" / "signatures"
FILES = sorted(VECTOR_DIR.glob("*.json"))
DOCS = {f.name: json.loads(f.read_text()) for f in FILES}
CASES = [(name, v) for name, doc in DOCS.items() for v in doc["vectors"]]


def _keyring(doc: dict, accept_legacy: bool) -> VerificationKeys:
    k = doc["key"]
    if k["algorithm"] == HMAC_SHA256:
        key: VerificationKey = SigningKey.hmac_sha256(k["key_id"], bytes.fromhex(k["secret_hex"])).verification_key()
    else:
        key = VerificationKey(k["key_id"], ED25519,
                              public_key=Ed25519PublicKey.from_public_bytes(bytes.fromhex(k["public_key_hex"])))
    return VerificationKeys.of([key], accept_legacy_scope=accept_legacy)


def _spec_keys(doc: dict) -> dict[str, tuple[str, bytes]]:
    k = doc["key"]
    material = k["secret_hex"] if k["algorithm"] == HMAC_SHA256 else k["public_key_hex"]
    return {k["key_id"]: (k["algorithm"], bytes.fromhex(material))}


def _prism_verdict(data: bytes, keys: VerificationKeys) -> str:
    try:
        verify(data, keys)
    except PrismError as exc:
        return exc.code
    return "valid"


def test_the_vector_files_cover_what_issue_13_asks() -> None:
    v2_docs = [doc for name, doc in DOCS.items() if name.startswith("scope-v2-")]
    assert {d["key"]["algorithm"] for d in v2_docs} == {HMAC_SHA256, ED25519}
    for doc in v2_docs:
        names = {v["name"] for v in doc["vectors"]}
        for layout in ("draft", "reviewed"):
            for case in ("valid", "tampered-classification", "tampered-pii", "tampered-publisher", "legacy-scope",
                         "second-security-record", "duplicated-metadata"):
                assert f"{layout}/{case}" in names
        verdicts = {v["expected"] for v in doc["vectors"]}
        assert verdicts == {"valid", "bad_signature", "legacy_signature_scope", "ambiguous_envelope",
                            "unsupported_signature_scope"}
        assert {k: bytes.fromhex(v) for k, v in doc["scope_v2_context_hex"].items()} == {
            lay.value: ctx for lay, ctx in SCOPE_V2_CONTEXT.items()}


def test_the_pair_vector_files_cover_both_layouts_and_the_sibling_digest() -> None:
    pair_docs = [doc for name, doc in DOCS.items() if name.startswith("scope-pair-")]
    assert {d["key"]["algorithm"] for d in pair_docs} == {HMAC_SHA256, ED25519}
    for doc in pair_docs:
        assert bytes.fromhex(doc["scope_pair_context_hex"]) == SCOPE_PAIR_CONTEXT
        names = {v["name"] for v in doc["vectors"]}
        for layout in ("draft", "reviewed"):
            for case in ("valid", "tampered-classification", "tampered-pii", "tampered-publisher", "tampered-payload",
                         "tampered-sibling-digest", "missing-sibling-digest", "swapped-sibling", "relabelled-v2",
                         "duplicated-sibling-digest", "mistyped-sibling-digest"):
                assert f"{layout}/{case}" in names
        for v in doc["vectors"]:
            if v["expected"] == "valid":  # the statement: context, draft digest, reviewed digest
                message = bytes.fromhex(v["signed_message_hex"])
                assert len(message) == len(SCOPE_PAIR_CONTEXT) + 64 and message.startswith(SCOPE_PAIR_CONTEXT)
        valid = {v["layout"]: bytes.fromhex(v["signed_message_hex"]) for v in doc["vectors"]
                 if v["name"].endswith("/valid")}
        assert valid["draft"] == valid["reviewed"]  # both copies rebuild the one signed statement


def test_the_batch_vector_files_cover_the_tree_fields() -> None:
    batch_docs = [doc for name, doc in DOCS.items() if name.startswith("scope-batch-")]
    assert {d["key"]["algorithm"] for d in batch_docs} == {HMAC_SHA256, ED25519}
    for doc in batch_docs:
        assert bytes.fromhex(doc["scope_batch_context_hex"]) == SCOPE_BATCH_CONTEXT
        size = doc["batch_size"]
        assert size & (size - 1)  # not a power of two: the tree is unbalanced
        names = {v["name"] for v in doc["vectors"]}
        for layout in ("draft", "reviewed"):
            for case in ("valid", "valid-last-leaf", "tampered-classification", "tampered-pii", "tampered-publisher",
                         "tampered-encryption-key", "tampered-payload", "tampered-sibling-digest",
                         "tampered-tree-index", "tampered-tree-size", "index-out-of-range", "flipped-path-hash",
                         "truncated-path", "ragged-path", "moved-to-other-batch", "relabelled-pair",
                         "duplicated-tree-index", "duplicated-tree-size", "mistyped-tree-path"):
                assert f"{layout}/{case}" in names
        valid = [bytes.fromhex(v["signed_message_hex"]) for v in doc["vectors"] if v["expected"] == "valid"]
        # every valid copy, of either layout and either message, rebuilds the one signed statement
        assert len(valid) == 6 and len(set(valid)) == 1
        assert valid[0] == SCOPE_BATCH_CONTEXT + size.to_bytes(8, "big") + valid[0][-32:]
        assert len(valid[0]) == len(SCOPE_BATCH_CONTEXT) + 8 + 32


@pytest.mark.parametrize(("file", "vector"), CASES, ids=[f"{f}:{v['name']}" for f, v in CASES])
def test_vector(file: str, vector: dict) -> None:
    doc = DOCS[file]
    data = bytes.fromhex(vector["envelope_hex"])
    assert _prism_verdict(data, _keyring(doc, False)) == vector["expected"]
    assert _prism_verdict(data, _keyring(doc, True)) == vector["expected_accept_legacy_scope"]
    spec_keys = _spec_keys(doc)
    assert spec_signing.verify(data, spec_keys) == vector["expected"]
    assert spec_signing.verify(data, spec_keys, accept_legacy_scope=True) == vector["expected_accept_legacy_scope"]
    if "signed_message_hex" in vector:
        message = bytes.fromhex(vector["signed_message_hex"])
        assert signed_message(data).joined() == message
        assert spec_signing.signed_message(data)[2] == message
    else:  # (a pair- or batch-scope copy without a usable sibling_digest, or a batch copy whose
        # tree fields cannot describe a leaf of the tree, has no statement to rebuild)
        assert vector["expected"] in {"ambiguous_envelope", "unsupported_signature_scope"} or \
            vector["name"].endswith(("/missing-sibling-digest", "/index-out-of-range", "/truncated-path",
                                     "/ragged-path"))


def test_vector_keys_are_the_documented_derivation() -> None:
    for doc in DOCS.values():
        k = doc["key"]
        if k["algorithm"] == ED25519:
            seed = bytes.fromhex(k["private_seed_hex"])
            assert Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw().hex() == k["public_key_hex"]


def test_regenerating_gives_the_committed_files() -> None:
    built = generate.build()
    assert sorted(built) == [f.name for f in FILES]
    for name, text in built.items():
        assert (VECTOR_DIR / name).read_text() == text, f"{name} is stale: run python -m conformance.generate"
