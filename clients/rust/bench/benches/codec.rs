//! Metadata-only access (memo-031 "Question 2"): the header-only parse that borrows the
//! payload against a full protobuf decode that copies it, for payloads from 1 KB to 10 MB,
//! plus signing and verification. BENCHMARKS.md, "Rust client", records the results.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use prism_client::codec::{decode_view, encode, Layout, Limits};
use prism_client::gen::v1;
use prism_client::signing::{self, SigningKey, VerificationKeys, SCOPE_V2};
use prism_client::Envelope;
use prost::Message;

fn envelope(size: usize) -> Envelope {
    Envelope::builder("orders.created", "order-events")
        .bytes(vec![b'x'; size])
        .content_type("application/json")
        .correlation_id("corr-1")
        .label("team", "commerce")
        .data_classification("internal")
        .build()
        .unwrap()
}

fn metadata_access(c: &mut Criterion) {
    let limits = Limits {
        max_message_bytes: 64 * 1024 * 1024,
        max_header_bytes: 256 * 1024,
    };
    let mut g = c.benchmark_group("metadata_access");
    for size in [1024usize, 10 * 1024, 100 * 1024, 1024 * 1024, 10 * 1024 * 1024] {
        let bytes = encode(&envelope(size), Layout::Reviewed);
        g.bench_with_input(BenchmarkId::new("header_only", size), &bytes, |b, bytes| {
            b.iter(|| {
                let v = decode_view(black_box(bytes), Some(Layout::Reviewed), &limits).unwrap();
                let m = v.header.metadata.as_ref().unwrap();
                black_box((
                    m.message_id.len(),
                    m.topic.len(),
                    v.payload.map(|p| p.value().map(<[u8]>::len).unwrap_or(0)),
                ))
            })
        });
        g.bench_with_input(BenchmarkId::new("full_decode", size), &bytes, |b, bytes| {
            b.iter(|| {
                let e = v1::PrismEnvelope::decode(black_box(bytes.as_slice())).unwrap();
                let m = e.metadata.as_ref().unwrap();
                black_box((m.message_id.len(), m.topic.len(), e.payload.map(|p| p.value.len())))
            })
        });
    }
    g.finish();
}

fn signatures(c: &mut Criterion) {
    let env = envelope(1024);
    for key in [
        SigningKey::hmac_sha256("h", &[7u8; 32]).unwrap(),
        SigningKey::ed25519_from_seed("e", &[9u8; 32]).unwrap(),
    ] {
        let keys = VerificationKeys::new([key.verification_key()]);
        let signed = signing::sign(&env, &key, Layout::Reviewed, SCOPE_V2).unwrap();
        c.bench_function(&format!("sign_v2_{}", key.algorithm()), |b| {
            b.iter(|| signing::sign(black_box(&env), &key, Layout::Reviewed, SCOPE_V2).unwrap())
        });
        c.bench_function(&format!("verify_v2_{}", key.algorithm()), |b| {
            b.iter(|| signing::verify(black_box(&signed), &keys, None, None).unwrap())
        });
    }
}

criterion_group!(benches, metadata_access, signatures);
criterion_main!(benches);
