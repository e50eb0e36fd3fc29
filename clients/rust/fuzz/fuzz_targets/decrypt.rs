//! Decryption of untrusted envelopes: plaintext or a PrismError, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    prism_client::fuzzing::decrypt_all(data);
});
