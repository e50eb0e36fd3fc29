//! Kafka's key hash, `murmur2`, exactly as the Java client's `Utils.murmur2` computes it - and
//! so as aiokafka's `aiokafka.partitioner.murmur2` and librdkafka's `murmur2` partitioner do.
//!
//! Why it is here: a keyed record's partition is `(murmur2(key) & 0x7fff_ffff) % partitions`
//! in every Kafka client that follows the Java one, and the same key must land on the same
//! partition whoever writes it. The Rust client's own producers let librdkafka hash
//! (`kafka.rs`, `murmur2_random`); the Python worker places its output records itself
//! (`app/worker/batch_send.py`), and aiokafka's pure-Python hash costs ~4 µs for a 36-byte key,
//! twice per message (`.v2` and `.v3`) - so it takes this one through `prism_native` (issue 29).

/// MurmurHash2 of `data` with Kafka's seed, as an unsigned 32-bit value: the Java client's
/// `Utils.murmur2` reinterpreted as `u32`, which is what aiokafka's `murmur2` returns.
/// Kafka's partitioners use `murmur2(key) & 0x7fff_ffff` (`Utils.toPositive`).
pub fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    // The mixing constants of MurmurHash2.
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;

    // Java takes the length as an `int`; a key is far below 4 GiB, so `as u32` is exact.
    let mut h = SEED ^ data.len() as u32;
    let mut blocks = data.chunks_exact(4);
    for b in &mut blocks {
        let mut k = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    // The last 1-3 bytes, as Java's fall-through switch takes them.
    let tail = blocks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

#[cfg(test)]
mod tests {
    use super::murmur2;

    /// Kafka's own vectors (the Java client's `UtilsTest.testMurmur2`), as the Java `int`s it
    /// asserts, and the short keys "1".."12345" (every length mod 4; Akka's Kafka-compatible
    /// `Murmur2Spec` checks the same values against the Java client).
    #[test]
    fn the_java_clients_vectors() {
        let cases: [(&[u8], i32); 11] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58_897_971),
            (b"abc", 479_470_107),
            (b"1", -1_993_445_489),
            (b"12", 126_087_238),
            (b"123", -267_702_483),
            (b"1234", -1_614_185_708),
            (b"12345", -1_188_365_604),
        ];
        for (key, java) in cases {
            assert_eq!(murmur2(key) as i32, java, "{}", String::from_utf8_lossy(key));
        }
    }

    /// Values aiokafka's `murmur2` returns (unsigned): the empty key, and bytes >= 0x80, which
    /// Java reads as negative `byte`s and masks (`& 0xff`) - a sign-extension slip shows here.
    #[test]
    fn aiokafkas_values_for_empty_and_high_bytes() {
        assert_eq!(murmur2(b""), 275_646_681);
        assert_eq!(murmur2(&[0xff]), 3_983_499_611);
        assert_eq!(murmur2(&[0x80, 0xff, 0xfe]), 810_766_165);
        assert_eq!(murmur2(&[0xff; 7]), 4_223_673_747);
    }
}
