//! The quick start of docs/sdk-rust.md, compiled by `cargo test` so the page stays true.

use prism_client::codec::{decode_view, encode, Layout, Limits};
use prism_client::signing::{self, SigningKey, VerificationKeys, SCOPE_V2};
use prism_client::{Envelope, PrismError};

fn main() -> Result<(), PrismError> {
    // Build: a UUIDv7 id, now as published_at_ms, this SDK's version; JSON payload.
    let env = Envelope::builder("orders.created", "order-events")
        .json(&serde_json::json!({"order_id": 42}))?
        .correlation_id("order-42")
        .data_classification("internal")
        .build()?;

    // Sign (scope v2) and serialize in the reviewed layout (`<topic>.v3`); Layout::Draft for `.v2`.
    let key = SigningKey::hmac_sha256("orders-producer-1", &[7u8; 32])?;
    let bytes = signing::sign(&env, &key, Layout::Reviewed, SCOPE_V2)?;

    // Consumer: verify the received bytes first, then read the header; the payload is borrowed.
    let keys = VerificationKeys::new([key.verification_key()]);
    let info = signing::verify(&bytes, &keys, None, None)?;
    let view = decode_view(&bytes, None, &Limits::default())?;
    let md = view.metadata().expect("metadata");
    println!("{} {} signed by {}", md.topic, md.message_id, info.key_id);

    // The payload only when needed: copy it out and parse it.
    let order: serde_json::Value = view.to_envelope()?.payload_json()?;
    assert_eq!(order["order_id"], 42);
    let _ = encode(&view.to_envelope()?, Layout::Draft); // the same message in the draft layout
    Ok(())
}
