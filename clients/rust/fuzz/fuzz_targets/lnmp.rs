//! Any bytes read as an LNMP message map to an envelope or a PrismError, never a panic; what
//! maps writes back and reads back the same.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    prism_client::fuzzing::lnmp_all(data);
});
