"""Algorithm registry and policy: approved list, deprecated names, FIPS mode, allowlists."""

from __future__ import annotations

import logging

import pytest

from app._gen.prism.envelope.v1 import envelope_pb2 as pb
from app.errors import AlgorithmError, SecurityError
from app.security.algorithms import (
    APPROVED,
    DEFAULT_POLICY,
    FIPS_POLICY,
    AlgorithmPolicy,
    fips_module_active,
    lookup,
    normalize,
)

CANONICAL = {
    "aes-256-gcm": ("symmetric", pb.ENCRYPTION_TYPE_SYMMETRIC, "symmetric-256"),
    "chacha20-poly1305": ("symmetric", pb.ENCRYPTION_TYPE_SYMMETRIC, "symmetric-256"),
    "rsa-oaep-3072": ("asymmetric", pb.ENCRYPTION_TYPE_ASYMMETRIC, "rsa-3072"),
    "rsa-oaep-4096": ("asymmetric", pb.ENCRYPTION_TYPE_ASYMMETRIC, "rsa-4096"),
    "ml-kem-768": ("post_quantum", pb.ENCRYPTION_TYPE_POST_QUANTUM, "ml-kem-768"),
    "ml-kem-1024": ("post_quantum", pb.ENCRYPTION_TYPE_POST_QUANTUM, "ml-kem-1024"),
    "x25519-ml-kem-1024": ("hybrid", pb.ENCRYPTION_TYPE_HYBRID, "x25519-ml-kem-1024"),
}


def test_registry_holds_exactly_the_canonical_algorithms() -> None:
    assert set(APPROVED) == set(CANONICAL)


@pytest.mark.parametrize("name", sorted(CANONICAL))
def test_canonical_names_resolve_to_pattern_type_and_key_type(name: str) -> None:
    spec = lookup(name)
    assert (spec.pattern, spec.encryption_type, spec.key_type) == CANONICAL[name]
    assert spec.name == name and not spec.is_legacy


@pytest.mark.parametrize("spelling", ["AES-256-GCM", " aes_256_gcm ", "Aes-256-Gcm"])
def test_spellings_are_normalised(spelling: str) -> None:
    assert normalize(spelling) == "aes-256-gcm"
    assert lookup(spelling).name == "aes-256-gcm"


@pytest.mark.parametrize(
    ("name", "replacement"),
    [
        ("aes-128-gcm", "aes-256-gcm"),
        ("AES-128", "aes-256-gcm"),
        ("rsa-2048", "rsa-oaep-4096"),
        ("rsa-oaep-2048", "rsa-oaep-4096"),
        ("RSA_1024", "rsa-oaep-4096"),
        ("rsa-oaep-3000", "rsa-oaep-4096"),
        ("rsa2048-kyber768", "rsa-oaep-4096"),
        ("3des", "aes-256-gcm"),
        ("des", "aes-256-gcm"),
        ("rc4", "chacha20-poly1305"),
        ("md5", "sha-256"),
        ("sha-1", "sha-256"),
        ("SHA1", "sha-256"),
    ],
)
def test_deprecated_algorithms_are_rejected_with_their_replacement(name: str, replacement: str) -> None:
    for decrypt in (False, True):
        with pytest.raises(AlgorithmError) as info:
            lookup(name, decrypt=decrypt)
        err = info.value
        assert "deprecated" in err.message
        assert err.hint == f"use {replacement} instead"
        assert err.code == "algorithm_not_allowed" and isinstance(err, SecurityError)


@pytest.mark.parametrize("name", ["x25519-chacha20-poly1305", "ed25519", "rsa4096-kyber768", "aes-192-gcm", "rot13"])
def test_unknown_algorithms_are_rejected_listing_the_supported_ones(name: str) -> None:
    with pytest.raises(AlgorithmError) as info:
        lookup(name, decrypt=True)
    assert "not supported" in info.value.message
    assert "aes-256-gcm" in (info.value.hint or "")


def test_empty_algorithm_is_rejected() -> None:
    with pytest.raises(AlgorithmError, match="no encryption algorithm"):
        lookup("  ")


@pytest.mark.parametrize(("legacy", "canonical"), [("kyber768", "ml-kem-768"), ("kyber1024", "ml-kem-1024"),
                                                   ("x25519-kyber1024", "x25519-ml-kem-1024")])
def test_rfc_legacy_names_are_decrypt_only_aliases(legacy: str, canonical: str) -> None:
    spec = lookup(legacy, decrypt=True)
    assert spec.legacy_of == canonical and spec.is_legacy
    assert spec.encryption_type == APPROVED[canonical].encryption_type
    assert spec.key_type == APPROVED[canonical].key_type
    with pytest.raises(AlgorithmError, match="decrypt only") as info:
        lookup(legacy)
    assert canonical in (info.value.hint or "")


def test_fips_mode_admits_only_the_approved_list() -> None:
    assert FIPS_POLICY.allowed() == {"aes-256-gcm", "rsa-oaep-3072", "rsa-oaep-4096", "ml-kem-768", "ml-kem-1024"}
    assert DEFAULT_POLICY.allowed() == set(CANONICAL)


@pytest.mark.parametrize("name", ["chacha20-poly1305", "x25519-ml-kem-1024"])
def test_fips_mode_refuses_chacha20_and_the_x25519_hybrid(name: str) -> None:
    for decrypt in (False, True):
        with pytest.raises(AlgorithmError, match="not FIPS 140-3 approved") as info:
            FIPS_POLICY.check(name, decrypt=decrypt)
        assert "aes-256-gcm" in (info.value.hint or "")


def test_fips_mode_reads_legacy_kyber_but_not_the_legacy_hybrid() -> None:
    assert FIPS_POLICY.check("kyber1024", decrypt=True).legacy_of == "ml-kem-1024"
    with pytest.raises(AlgorithmError, match="not FIPS"):
        FIPS_POLICY.check("x25519-kyber1024", decrypt=True)


def test_allowlist_narrows_and_covers_legacy_spellings_of_allowed_algorithms() -> None:
    policy = AlgorithmPolicy(allowlist={"AES-256-GCM", "ml_kem_1024"})
    assert policy.allowlist == {"aes-256-gcm", "ml-kem-1024"}
    assert policy.check("aes-256-gcm").name == "aes-256-gcm"
    assert policy.check("kyber1024", decrypt=True).legacy_of == "ml-kem-1024"
    with pytest.raises(AlgorithmError, match="allowlist") as info:
        policy.check("chacha20-poly1305")
    assert "aes-256-gcm" in (info.value.hint or "")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"allowlist": {"aes-256-gcm", "aes-128-gcm"}}, "deprecated"),
        ({"allowlist": {"kyber1024"}}, "decrypt only"),
        ({"allowlist": {"blowfish"}}, "not supported"),
        ({"allowlist": set()}, "empty"),
        ({"fips_mode": True, "allowlist": {"aes-256-gcm", "chacha20-poly1305"}}, "fips_mode forbids"),
    ],
)
def test_contradictory_policy_configuration_fails_at_construction(kwargs: dict, match: str) -> None:
    with pytest.raises(AlgorithmError, match=match):
        AlgorithmPolicy(**kwargs)


def test_non_fips_algorithms_are_logged_once_per_policy(caplog: pytest.LogCaptureFixture) -> None:
    policy = AlgorithmPolicy()
    with caplog.at_level(logging.WARNING, logger="prism.security"):
        for _ in range(3):
            policy.check("chacha20-poly1305")
        policy.check("aes-256-gcm")
    warnings = [r for r in caplog.records if r.name == "prism.security"]
    assert len(warnings) == 1
    assert "chacha20-poly1305" in warnings[0].getMessage()
    quiet = AlgorithmPolicy(warn_non_fips=False)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="prism.security"):
        quiet.check("chacha20-poly1305")
    assert not caplog.records


def test_fips_policy_is_independent_of_the_openssl_fips_provider() -> None:
    # The wheel's OpenSSL normally runs without its FIPS provider; the policy still applies.
    assert isinstance(fips_module_active(), bool)
    with pytest.raises(AlgorithmError):
        AlgorithmPolicy(fips_mode=True).check("chacha20-poly1305")
