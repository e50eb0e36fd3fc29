//! Signing in every scope and layout, verified by this crate's verifier (which the
//! conformance vectors pin to docs/signing.md), plus the hostile edits a verifier must catch.

use prism_client::codec::{decode_view, Layout, Limits};
use prism_client::signing::{self, SigningKey, VerificationKeys, SCOPE_BATCH, SCOPE_LEGACY, SCOPE_PAIR, SCOPE_V2};
use prism_client::{Envelope, PrismError};

fn keys() -> Vec<SigningKey> {
    vec![
        SigningKey::hmac_sha256("h1", &[7u8; 32]).unwrap(),
        SigningKey::ed25519_from_seed("e1", &[9u8; 32]).unwrap(),
    ]
}

fn env(i: usize) -> Envelope {
    Envelope::builder("orders.created", "orders")
        .json(&serde_json::json!({"order": i}))
        .unwrap()
        .data_classification("restricted")
        .contains_pii(true)
        .extension("a", b"1".to_vec())
        .build()
        .unwrap()
}

fn verifier(k: &SigningKey) -> VerificationKeys {
    VerificationKeys::new([k.verification_key()])
}

/// Flip the classification in received bytes without touching the signature.
fn tamper(bytes: &[u8]) -> Vec<u8> {
    let pos = bytes.windows(10).position(|w| w == b"restricted").unwrap();
    let mut out = bytes.to_vec();
    out[pos..pos + 10].copy_from_slice(b"RESTRICTED");
    out
}

#[test]
fn v2_signs_and_verifies_in_both_layouts() {
    for k in keys() {
        for lay in [Layout::Draft, Layout::Reviewed] {
            let bytes = signing::sign(&env(1), &k, lay, SCOPE_V2).unwrap();
            let info = signing::verify(&bytes, &verifier(&k), None, None).unwrap();
            assert_eq!((info.key_id.as_str(), info.scope), (k.key_id(), SCOPE_V2));
            assert!(matches!(
                signing::verify(&tamper(&bytes), &verifier(&k), None, None),
                Err(PrismError::BadSignature(_))
            ));
            // the signed bytes still decode to the same envelope
            let view = decode_view(&bytes, None, &Limits::default()).unwrap();
            assert_eq!(view.layout, lay);
            assert_eq!(view.payload.unwrap().value().unwrap(), br#"{"order":1}"#);
        }
    }
}

#[test]
fn legacy_scope_is_refused_unless_accepted() {
    for k in keys() {
        let bytes = signing::sign(&env(1), &k, Layout::Reviewed, SCOPE_LEGACY).unwrap();
        assert!(matches!(
            signing::verify(&bytes, &verifier(&k), None, None),
            Err(PrismError::LegacySignatureScope(_))
        ));
        assert!(signing::verify(&bytes, &verifier(&k).accepting_legacy_scope(true), None, None).is_ok());
        // and the legacy scope does not cover the security context: the downgrade risk
        assert!(signing::verify(&tamper(&bytes), &verifier(&k), None, Some(true)).is_ok());
    }
}

#[test]
fn pair_signs_both_copies_once() {
    for k in keys() {
        let (d, r) = signing::sign_pair(&env(2), &k).unwrap();
        for b in [&d, &r] {
            assert_eq!(signing::verify(b, &verifier(&k), None, None).unwrap().scope, SCOPE_PAIR);
            assert!(signing::verify(&tamper(b), &verifier(&k), None, None).is_err());
        }
        let (_, _, md) = signing::signed_message(&d, None).unwrap();
        let (_, _, mr) = signing::signed_message(&r, None).unwrap();
        assert_eq!(md, mr);
        assert_eq!(md.len(), 94);
    }
}

#[test]
fn batch_signs_every_copy_of_every_size() {
    for k in keys() {
        for n in [1usize, 2, 3, 5, 8, 9] {
            let envs: Vec<_> = (0..n).map(env).collect();
            let copies = signing::sign_batch(&envs, &k).unwrap();
            let mut statements = std::collections::BTreeSet::new();
            for (d, r) in &copies {
                for b in [d, r] {
                    assert_eq!(
                        signing::verify(b, &verifier(&k), None, None).unwrap().scope,
                        SCOPE_BATCH,
                        "n={n}"
                    );
                    assert!(signing::verify(&tamper(b), &verifier(&k), None, None).is_err());
                    statements.insert(signing::signed_message(b, None).unwrap().2);
                }
            }
            assert_eq!(statements.len(), 1, "every copy of a batch rebuilds the same statement");
        }
        assert!(signing::sign_batch(&[], &k).is_err());
    }
}

#[test]
fn unknown_key_and_wrong_key() {
    let ks = keys();
    let bytes = signing::sign(&env(1), &ks[0], Layout::Reviewed, SCOPE_V2).unwrap();
    let other = SigningKey::hmac_sha256("h2", &[8u8; 32]).unwrap();
    assert!(matches!(
        signing::verify(&bytes, &verifier(&other), None, None),
        Err(PrismError::UnknownKey(_))
    ));
    let same_id_other_secret = SigningKey::hmac_sha256("h1", &[8u8; 32]).unwrap();
    assert!(matches!(
        signing::verify(&bytes, &verifier(&same_id_other_secret), None, None),
        Err(PrismError::BadSignature(_))
    ));
    assert!(SigningKey::hmac_sha256("short", &[1u8; 16]).is_err());
}

#[test]
fn appended_security_record_is_ambiguous() {
    let k = &keys()[1];
    let mut bytes = signing::sign(&env(1), k, Layout::Reviewed, SCOPE_V2).unwrap();
    bytes.extend_from_slice(&[0x12, 0x08, 0x42, 0x06]);
    bytes.extend_from_slice(b"public");
    assert!(matches!(
        signing::verify(&bytes, &verifier(k), None, None),
        Err(PrismError::AmbiguousEnvelope(_))
    ));
    assert!(signing::check_unambiguous(&bytes, None).is_err());
}

#[test]
fn compressed_payloads_round_trip_through_both_layouts() {
    for enc in ["gzip", "snappy", "zstd"] {
        let env = Envelope::builder("orders.created", "orders")
            .json(&serde_json::json!({"note": "x".repeat(500)}))
            .unwrap()
            .content_encoding(enc)
            .build()
            .unwrap();
        assert!(
            env.payload.as_ref().unwrap().value.len() < 200,
            "{enc} compressed at build"
        );
        for lay in [Layout::Draft, Layout::Reviewed] {
            let bytes = signing::sign(&env, &keys()[0], lay, SCOPE_V2).unwrap();
            let back = decode_view(&bytes, None, &Limits::default())
                .unwrap()
                .to_envelope()
                .unwrap();
            assert_eq!(back.content_encoding(), enc);
            let v: serde_json::Value = back.payload_json().unwrap();
            assert_eq!(v["note"].as_str().unwrap().len(), 500);
        }
    }
}

#[test]
fn batch_verification_is_cached_per_statement_and_never_for_failures() {
    let k = &keys()[1];
    let envs: Vec<_> = (0..4).map(env).collect();
    let copies = signing::sign_batch(&envs, k).unwrap();
    let mut v = verifier(k);
    for (d, r) in &copies {
        assert!(signing::verify(d, &v, None, None).is_ok());
        assert!(signing::verify(r, &v, None, None).is_ok()); // cache hits: same statement, same signature
        assert!(
            signing::verify(&tamper(d), &v, None, None).is_err(),
            "a tampered copy rebuilds another statement"
        );
    }
    // a new key set (here: the same id now bound to another key) forgets every cached success
    v.add(
        SigningKey::ed25519_from_seed("e1", &[1u8; 32])
            .unwrap()
            .verification_key(),
    );
    assert!(matches!(
        signing::verify(&copies[0].0, &v, None, None),
        Err(PrismError::BadSignature(_))
    ));
}

fn located(data: &[u8], lay: Layout) -> signing::SecurityRecord {
    let records = prism_client::wire::walk(data, 0, data.len()).unwrap();
    signing::locate_security_record(data, &records, lay).unwrap().unwrap()
}

#[test]
fn signed_statement_is_the_verifiers_message_in_every_scope_and_layout() {
    for k in keys() {
        let mut copies: Vec<Vec<u8>> = Vec::new();
        for lay in [Layout::Draft, Layout::Reviewed] {
            for scope in [SCOPE_V2, SCOPE_LEGACY] {
                copies.push(signing::sign(&env(1), &k, lay, scope).unwrap());
            }
        }
        let (d, r) = signing::sign_pair(&env(2), &k).unwrap();
        copies.extend([d, r]);
        for (d, r) in signing::sign_batch(&(0..5).map(env).collect::<Vec<_>>(), &k).unwrap() {
            copies.extend([d, r]);
        }
        for b in &copies {
            let (lay, _, expected) = signing::signed_message(b, None).unwrap();
            assert_eq!(signing::signed_statement(b, &located(b, lay), lay).unwrap(), expected);
        }
    }
    let k = &keys()[0];
    let b = signing::sign(&env(3), k, Layout::Reviewed, SCOPE_V2).unwrap();
    let sec = located(&b, Layout::Reviewed);
    let m = signing::signed_statement(&b, &sec, Layout::Reviewed).unwrap();
    let sig = sec.inner.iter().find(|r| r.field == 4).unwrap();
    assert_eq!(
        signing::hmac_sha256(&[7u8; 32], &m).as_slice(),
        &b[sig.value_start..sig.end]
    );
}

/// A reviewed-layout envelope that is only a security record of `body`.
fn security_only(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    prism_client::wire::len_tag(&mut out, Layout::Reviewed.security_field());
    prism_client::wire::put_varint(&mut out, body.len() as u64);
    out.extend_from_slice(body);
    out
}

fn varint_field(field: u8, v: u128) -> Vec<u8> {
    let mut out = vec![field << 3];
    let mut v = v;
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out
}

#[test]
fn signed_statement_faults_carry_the_full_numbers() {
    use signing::StatementFault as F;
    let sibling = [[0x5a, 32].as_slice(), &[3u8; 32]].concat();
    let fault = |parts: &[&[u8]]| {
        let b = security_only(&parts.concat());
        signing::signed_statement(&b, &located(&b, Layout::Reviewed), Layout::Reviewed).unwrap_err()
    };
    let wide = 1u128 << 69;
    assert_eq!(fault(&[&varint_field(10, 4)]), F::NoSibling { scope: "batch" });
    assert_eq!(
        fault(&[&varint_field(10, 3), &[0x5a, 1, 0]]),
        F::NoSibling { scope: "pair" }
    );
    assert_eq!(fault(&[&varint_field(10, 4), &sibling]), F::TreeSize { size: 0 });
    assert_eq!(
        fault(&[&varint_field(10, 4), &sibling, &varint_field(13, wide)]),
        F::TreeSize { size: wide }
    );
    assert_eq!(
        fault(&[
            &varint_field(10, 4),
            &sibling,
            &varint_field(13, 4),
            &varint_field(12, wide)
        ]),
        F::TreeIndex { index: wide, size: 4 }
    );
    assert_eq!(
        fault(&[
            &varint_field(10, 4),
            &sibling,
            &varint_field(13, 2),
            &[0x72, 31],
            &[0u8; 31]
        ]),
        F::PathNotWhole { len: 31 }
    );
    assert_eq!(
        fault(&[
            &varint_field(10, 4),
            &sibling,
            &varint_field(13, 1),
            &[0x72, 32],
            &[0u8; 32]
        ]),
        F::PathTooLong
    );
    assert_eq!(
        fault(&[&varint_field(10, 4), &sibling, &varint_field(13, 2)]),
        F::PathTooShort
    );
    assert_eq!(fault(&[&varint_field(10, 9)]), F::UnsupportedScope { scope: 9 });
    assert_eq!(fault(&[&varint_field(10, wide)]), F::UnsupportedScope { scope: wide });
}

/// `verify_and_decode` applies the header limit while it walks the records: 16 MiB of tiny
/// records ending in a truncated one is refused for its size before the walk reaches the end
/// (it walked all 5.6M records first, and answered `Truncated`).
#[test]
fn verify_and_decode_stops_the_walk_at_the_header_limit() {
    let key = SigningKey::hmac_sha256("k", &[9u8; 32]).unwrap();
    let keys = VerificationKeys::new([key.verification_key()]);
    let mut data = [0x90u8, 0x03, 0x00].repeat(Limits::default().max_message_bytes / 3 - 2);
    data.extend_from_slice(&[0x92, 0x03, 0x05]);
    let got = signing::verify_and_decode(&data, &keys, None, &Limits::default(), None);
    assert!(matches!(got, Err(PrismError::SizeLimit(_))), "{got:?}");
}

/// `VerificationKey::Hmac`'s fields are public, so a keyring can hold an HMAC key with an empty
/// or short secret (built without `SigningKey::hmac_sha256`); HMAC under the empty key is
/// anyone's to compute, and such a forged signature verified. It is `KeyNotUsable` now.
#[test]
fn a_short_hmac_verification_key_never_verifies() {
    let env = Envelope::builder("t", "ns").text("pay me").build().unwrap();
    let real = SigningKey::hmac_sha256("k", &[7u8; 32]).unwrap();
    let wire = signing::sign(&env, &real, Layout::Reviewed, SCOPE_V2).unwrap();
    let (_, _, m) = signing::signed_message(&wire, Some(Layout::Reviewed)).unwrap();
    let good = signing::hmac_sha256(&[7u8; 32], &m);
    let at = wire
        .windows(32)
        .position(|w| w == good)
        .expect("the signature in the wire bytes");
    for secret in [Vec::new(), b"short".to_vec()] {
        let mut forged = wire.clone();
        forged[at..at + 32].copy_from_slice(&signing::hmac_sha256(&secret, &m));
        let keys = VerificationKeys::new([signing::VerificationKey::Hmac {
            key_id: "k".into(),
            secret: secret.clone(),
        }]);
        let got = signing::verify(&forged, &keys, None, None);
        assert!(
            matches!(got, Err(PrismError::KeyNotUsable(_))),
            "{}-byte secret: {got:?}",
            secret.len()
        );
    }
}
