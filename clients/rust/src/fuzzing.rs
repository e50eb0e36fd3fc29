//! Entry points shared by the cargo-fuzz targets (`fuzz/`), the corpus replay and the
//! property tests (`tests/fuzz_corpus.rs`): each runs one untrusted input through every
//! decoder of its kind. They return nothing; the harness's check is that nothing panics, and
//! the assertions below check the invariants every result must keep.

use std::sync::OnceLock;

use crate::codec::{self, Layout, Limits};
use crate::{encryption, lnmp, signing};

/// Small limits too, so the size checks run on small inputs.
const LIMITS: [Limits; 2] = [
    Limits {
        max_message_bytes: 16 * 1024 * 1024,
        max_header_bytes: 256 * 1024,
    },
    Limits {
        max_message_bytes: 512,
        max_header_bytes: 64,
    },
];

/// Decode, header-only parse, conversion both ways, re-encode and decode again.
pub fn decode_all(data: &[u8]) {
    let _ = codec::detect_layout(data);
    for limits in &LIMITS {
        for layout in [None, Some(Layout::Draft), Some(Layout::Reviewed)] {
            if let Ok(view) = codec::decode_view(data, layout, limits) {
                if let Some(Ok(value)) = view.payload.as_ref().map(|p| p.value()) {
                    // the payload is a slice of the input: zero-copy
                    let base = data.as_ptr() as usize;
                    let at = value.as_ptr() as usize;
                    assert!(value.is_empty() || (at >= base && at + value.len() <= base + data.len()));
                }
                let env = view.to_envelope().unwrap_or_else(|_| view.header_envelope());
                // the payload as a consumer reads it: decompressed per content_encoding (gzip,
                // snappy, zstd decoders of untrusted bytes), bounded, or an error
                let _ = env.payload_bytes();
                for lay in [Layout::Draft, Layout::Reviewed] {
                    let bytes = codec::encode(&env, lay);
                    // what this crate writes, it reads back (limits aside)
                    let back = codec::decode_view(
                        &bytes,
                        Some(lay),
                        &Limits {
                            max_message_bytes: usize::MAX,
                            max_header_bytes: usize::MAX,
                        },
                    );
                    assert!(back.is_ok(), "re-encoded envelope does not decode: {back:?}");
                }
            }
        }
        for to in [Layout::Draft, Layout::Reviewed] {
            let _ = codec::convert(data, to, limits);
        }
    }
}

fn fuzz_keys() -> &'static signing::VerificationKeys {
    static KEYS: OnceLock<signing::VerificationKeys> = OnceLock::new();
    KEYS.get_or_init(make_fuzz_keys)
}

fn make_fuzz_keys() -> signing::VerificationKeys {
    let h = signing::SigningKey::hmac_sha256("fuzz-hmac", &[1u8; 32]).map(|k| k.verification_key());
    let e = signing::SigningKey::ed25519_from_seed("fuzz-ed", &[2u8; 32]).map(|k| k.verification_key());
    signing::VerificationKeys::new(h.into_iter().chain(e))
}

/// Verify with both algorithms, the legacy scope refused and accepted; the signed message.
pub fn verify_all(data: &[u8]) {
    let keys = fuzz_keys();
    for accept in [None, Some(true)] {
        let _ = signing::verify(data, keys, None, accept);
    }
    let _ = signing::signed_message(data, None);
    let _ = signing::check_unambiguous(data, None);
}

/// Decode, then decrypt with a keyring of every supported type.
pub fn decrypt_all(data: &[u8]) {
    let Ok(env) = codec::decode(data, &Limits::default()) else {
        return;
    };
    static KEYS: OnceLock<encryption::Keyring> = OnceLock::new();
    let keys = KEYS.get_or_init(|| {
        encryption::Keyring::new(
            [
                encryption::Key::symmetric("conf-aes-1", &[3u8; 32]),
                encryption::Key::ml_kem_1024_from_seed("conf-mlkem-1", &[4u8; 64]),
                encryption::Key::hybrid_from_private("conf-hybrid-1", &[5u8; 32], &[6u8; 64]),
                encryption::Key::ml_kem_768_from_seed("conf-mlkem768-1", &[7u8; 64]),
            ]
            .into_iter()
            .flatten(),
        )
    });
    let _ = encryption::decrypt_envelope(&env, keys);
}

/// Map any bytes as an LNMP message and write what maps back as LNMP: a value or a
/// `PrismError`, never a panic. Reading the re-encoding back is exercised too, but not required
/// to give the same envelope: as in Python, an `#ENVELOPE` line without pairs is dropped on
/// writing (its record may then read as a bare binary record, or begin with another header),
/// so LNMP text is not a fixed point - tests/clients/test_rust_client.py holds Rust to Python's
/// answers on such inputs instead.
pub fn lnmp_all(data: &[u8]) {
    let _ = lnmp::form_of(data);
    if let Ok(env) = lnmp::to_envelope(data) {
        if let Ok(out) = lnmp::from_envelope(&env) {
            if let Ok(back) = lnmp::to_envelope(&out) {
                let _ = lnmp::from_envelope(&back);
            }
        }
    }
}
