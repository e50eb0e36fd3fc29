//! One metadata-only access, repeated, for an instruction count under
//! `valgrind --tool=callgrind` (BENCHMARKS.md, "Rust client"): instructions do not depend on
//! what else the shared machine runs, unlike criterion's wall-clock times.
//!
//! `metadata_icount header_only|full_decode SIZE ITERATIONS`

use std::hint::black_box;

use prism_client::codec::{decode_view, encode, Layout, Limits};
use prism_client::gen::v1;
use prism_client::Envelope;
use prost::Message;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mode, size, n) = match args.as_slice() {
        [_, m, s, n] => (m.clone(), s.parse().unwrap_or(0usize), n.parse().unwrap_or(0usize)),
        _ => {
            eprintln!("usage: metadata_icount header_only|full_decode SIZE ITERATIONS");
            std::process::exit(2);
        }
    };
    let env = Envelope::builder("orders.created", "order-events")
        .bytes(vec![b'x'; size])
        .content_type("application/json")
        .correlation_id("corr-1")
        .label("team", "commerce")
        .data_classification("internal")
        .build()
        .expect("envelope");
    let bytes = encode(&env, Layout::Reviewed);
    let limits = Limits {
        max_message_bytes: 64 * 1024 * 1024,
        max_header_bytes: 256 * 1024,
    };
    for _ in 0..n {
        if mode == "header_only" {
            let v = decode_view(black_box(&bytes), Some(Layout::Reviewed), &limits).expect("decode");
            let m = v.header.metadata.as_ref().expect("metadata");
            black_box((
                m.message_id.len(),
                m.topic.len(),
                v.payload.map(|p| p.value().map(<[u8]>::len).unwrap_or(0)),
            ));
        } else {
            let e = v1::PrismEnvelope::decode(black_box(bytes.as_slice())).expect("decode");
            let m = e.metadata.as_ref().expect("metadata");
            black_box((m.message_id.len(), m.topic.len(), e.payload.map(|p| p.value.len())));
        }
    }
}
