//! The fuzz seed corpus, replayed on stable in `make test`: every input of the conformance
//! suite (LNMP inputs included: every decoder gets every input), its truncations and bit flips, through every decoder (`prism_client::fuzzing`),
//! then property tests (proptest) on generated and mutated inputs. A decoder of untrusted
//! bytes returns a value or a `PrismError`: a panic fails the test.
//!
//! `PRISM_WRITE_CORPUS=1 cargo test --test fuzz_corpus` also writes the seeds to
//! `fuzz/corpus/<target>/` for `cargo +nightly fuzz run <target>`.

use std::path::Path;

use prism_client::codec::Layout;
use prism_client::fuzzing::{decode_all, decrypt_all, lnmp_all, verify_all};
use proptest::prelude::*;
use serde_json::Value;

/// (kind, input) of every vector whose input is envelope bytes.
fn seeds() -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance");
    let manifest: Value = serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let mut out = Vec::new();
    for f in manifest["files"].as_array().unwrap() {
        let kind = f["kind"].as_str().unwrap();
        let file: Value =
            serde_json::from_slice(&std::fs::read(dir.join(f["path"].as_str().unwrap())).unwrap()).unwrap();
        for v in file["vectors"].as_array().unwrap() {
            for field in ["envelope_hex", "input_hex"] {
                if let Some(h) = v.get(field).and_then(|h| h.as_str()) {
                    out.push((kind.to_owned(), hex::decode(h).unwrap()));
                }
            }
        }
    }
    assert!(out.len() > 250, "seed corpus is {} inputs", out.len());
    // compressed payloads, so mutations reach the gzip, snappy and zstd decoders
    // (`decode_all` reads every payload as a consumer does, decompressed)
    let doc = serde_json::json!({"order_id": 42, "note": "hello prism ".repeat(40)});
    for enc in ["gzip", "snappy", "zstd"] {
        let env = prism_client::Envelope::builder("orders.created", "order-events")
            .content_encoding(enc)
            .json(&doc)
            .unwrap()
            .build()
            .unwrap();
        for lay in [Layout::Draft, Layout::Reviewed] {
            out.push(("envelope".to_owned(), prism_client::codec::encode(&env, lay)));
        }
    }
    out
}

fn all(data: &[u8]) {
    decode_all(data);
    verify_all(data);
    lnmp_all(data);
}

#[test]
fn corpus_replays_without_panics() {
    let seeds = seeds();
    if std::env::var_os("PRISM_WRITE_CORPUS").is_some() {
        for target in ["decode", "verify", "decrypt", "lnmp"] {
            let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
            std::fs::create_dir_all(&d).unwrap();
            for (i, (_, s)) in seeds.iter().enumerate() {
                std::fs::write(d.join(format!("conformance-{i:04}")), s).unwrap();
            }
        }
    }
    for (kind, s) in &seeds {
        all(s);
        if kind == "encryption" || kind == "key_wrap" {
            decrypt_all(s);
        }
        // truncations: every length near both ends, and a spread in between
        let n = s.len();
        let cuts = (0..n.min(24))
            .chain((n.saturating_sub(24))..n)
            .chain((0..n).step_by(n / 16 + 1));
        for cut in cuts {
            all(&s[..cut]);
        }
        // bit flips spread over the input
        for pos in (0..n).step_by(n / 32 + 1) {
            let mut m = s.clone();
            m[pos] ^= 0x80;
            all(&m);
            m[pos] ^= 0x81;
            all(&m);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        all(&data);
        decrypt_all(&data);
    }

    #[test]
    fn mutated_seeds_never_panic(pick in any::<prop::sample::Index>(),
                                 edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8)) {
        let seeds = SEEDS.with(|s| s.clone());
        let (kind, mut data) = seeds[pick.index(seeds.len())].clone();
        for (at, byte, op) in edits {
            if data.is_empty() { break; }
            let i = at.index(data.len());
            match op {
                0 => data[i] = byte,
                1 => { data.insert(i, byte); }
                _ => { data.remove(i); }
            }
        }
        all(&data);
        if kind == "encryption" || kind == "key_wrap" {
            decrypt_all(&data);
        }
    }
}

thread_local! {
    static SEEDS: Vec<(String, Vec<u8>)> = seeds();
}
