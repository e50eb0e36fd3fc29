//! Signature verification of untrusted bytes: a verdict or a PrismError, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    prism_client::fuzzing::verify_all(data);
});
