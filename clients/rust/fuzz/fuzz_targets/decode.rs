//! Every decoder of untrusted envelope bytes returns a value or a PrismError, never panics.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    prism_client::fuzzing::decode_all(data);
});
