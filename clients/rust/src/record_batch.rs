//! Kafka's v2 record batch (magic 2, uncompressed), written exactly as aiokafka's compiled
//! `DefaultRecordBatchBuilder` writes it - the same bytes for the same records and producer state.
//!
//! Why it is here: the Python worker writes two output records per message, each through
//! aiokafka's `BatchBuilder.append` (a Python wrapper over the Cython builder), ~2 µs per record
//! of CPU. `app/worker/batch_send.py` hands each partition's records to this writer in one
//! `prism_native` call instead and gives aiokafka the finished batch (issue 29).
//!
//! The rules kept from aiokafka (`aiokafka/record/_crecords/default_records.pyx`):
//!
//! * a record's timestamp delta is taken from the batch's first record's timestamp; the first
//!   record is the one appended while the first timestamp is still unset (-1);
//! * a record that would make the batch reach its `batch_size` (`size + record >= batch_size`)
//!   is refused, except the batch's first one, which always goes in;
//! * the producer id, epoch and base sequence are not known when the batch is written (the
//!   producer sets them when it drains the batch), so they and the CRC are written by [`seal`].
//!
//! A record's last fields can also be written ahead of the batch, as a [`Tail`]: the bytes the
//! writer's [`Fields`] would write for them, which [`BatchWriter::tail`] then appends as they
//! are. Why: the worker measures every output record right after it is signed, while its header
//! objects are still in the CPU's caches, and sends it a batch later, when reading them again (a
//! dozen small Python objects per record) missed the caches (~1.7-2 µs per record by the wall
//! clock, ~0.5 with the headers written ahead; ~2 µs per message of the worker's CPU): its
//! headers written ahead are one contiguous tail, read at the speed of a copy (issue 29). The sizes of a
//! record's fields ([`field_size`] for the key and the value, the tail's length for the headers)
//! plus [`ESTIMATE_OVERHEAD`] are aiokafka's `estimate_size_in_bytes` of the record, so the same
//! call measures it.
//!
//! Layout (KIP-98): base offset i64, length i32, partition leader epoch i32, magic i8, CRC-32C
//! u32 (over everything after it), attributes i16, last offset delta i32, first and max
//! timestamps i64, producer id i64, producer epoch i16, base sequence i32, record count i32;
//! then each record: length varint, attributes i8, timestamp delta varlong, offset delta varint,
//! key and value as length-prefixed bytes (-1 for null), header count, and each header's key
//! and value the same way. Every varint is zigzag-encoded.

/// The batch header's size: the first record starts here.
pub const HEADER_LEN: usize = 61;
const LENGTH_AT: usize = 8;
const LEADER_EPOCH_AT: usize = 12;
const MAGIC_AT: usize = 16;
const CRC_AT: usize = 17;
const ATTRIBUTES_AT: usize = 21;
const LAST_OFFSET_DELTA_AT: usize = 23;
const FIRST_TIMESTAMP_AT: usize = 27;
const MAX_TIMESTAMP_AT: usize = 35;
const PRODUCER_ID_AT: usize = 43;
const PRODUCER_EPOCH_AT: usize = 51;
const BASE_SEQUENCE_AT: usize = 53;
const RECORD_COUNT_AT: usize = 57;
/// The attributes' transactional bit (compression and timestamp type stay 0 here).
const TRANSACTIONAL: i16 = 0x10;
/// "Not set" for the first and max timestamps, as aiokafka keeps them.
const UNSET: i64 = -1;
/// aiokafka's `DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)` is the
/// size of a record's key, value and headers fields (as a [`Tail`] of all three would hold them)
/// plus this: a batch header and `MAX_RECORD_OVERHEAD` (21, the most the length, attributes and
/// the two deltas can take).
pub const ESTIMATE_OVERHEAD: usize = HEADER_LEN + 21;

fn put_varint(out: &mut Vec<u8>, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn varint_len(n: i64) -> usize {
    let z = ((n << 1) ^ (n >> 63)) as u64;
    (64 - (z | 1).leading_zeros() as usize).div_ceil(7)
}

/// The bytes a length-prefixed field of `len` bytes takes in a record (None: null, one byte).
pub fn field_size(len: Option<usize>) -> usize {
    match len {
        None => 1,
        Some(n) => varint_len(n as i64) + n,
    }
}

fn put_field(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => put_varint(out, -1),
        Some(b) => {
            put_varint(out, b.len() as i64);
            out.extend_from_slice(b);
        }
    }
}

/// Where a record's key, value and headers are written, in this order: the key and the value
/// ([`Fields::bytes`]), the header count ([`Fields::count`]), then each header's key and value
/// ([`Fields::bytes`]). A [`BatchWriter`] writes them into its record, a [`Tail`] ahead of it.
pub trait Fields {
    /// The record's next length-prefixed field: key, value, a header's key or value (None: null).
    fn bytes(&mut self, b: Option<&[u8]>);
    /// The record's header count (after its value, before its headers).
    fn count(&mut self, n: usize);
}

/// A record's last fields written ahead of its batch (module docs; the worker's: its header
/// count and headers): give [`Tail::as_bytes`] to [`BatchWriter::tail`] once the fields before
/// them are written. One `Tail` can write record after record ([`Tail::clear`]), keeping its
/// buffer.
#[derive(Debug, Default)]
pub struct Tail {
    buf: Vec<u8>,
}

impl Tail {
    /// Empty again; the buffer is kept.
    pub fn clear(&mut self) {
        self.buf.clear();
    }

    /// The fields written so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }
}

impl Fields for Tail {
    fn bytes(&mut self, b: Option<&[u8]>) {
        put_field(&mut self.buf, b);
    }

    fn count(&mut self, n: usize) {
        put_varint(&mut self.buf, n as i64);
    }
}

/// One partition's batch being written: [`BatchWriter::begin`] a record, write its fields in
/// order ([`Fields`]; or all at once, [`BatchWriter::tail`]), then [`BatchWriter::commit`] it, which
/// says whether it fitted; [`BatchWriter::finish`] gives the batch for [`seal`]. One writer can
/// write batch after batch ([`BatchWriter::restart`]), keeping its buffers: a batch is up to the
/// producer's batch size (256 KiB for the worker), and fresh buffers that large are fresh pages
/// from the kernel every time, which cost more than writing the records into them.
#[derive(Debug)]
pub struct BatchWriter {
    buf: Vec<u8>,
    body: Vec<u8>,
    batch_size: usize,
    attributes: i16,
    first_timestamp: i64,
    max_timestamp: i64,
    timestamp: i64,
    records: i32,
}

impl BatchWriter {
    /// An empty batch that refuses a record reaching `batch_size` bytes (its first excepted);
    /// `transactional` sets the attributes' transactional bit.
    pub fn new(batch_size: usize, transactional: bool) -> Self {
        BatchWriter {
            buf: vec![0; HEADER_LEN],
            body: Vec::new(),
            batch_size,
            attributes: if transactional { TRANSACTIONAL } else { 0 },
            first_timestamp: UNSET,
            max_timestamp: UNSET,
            timestamp: 0,
            records: 0,
        }
    }

    /// Empty again, for a batch of this size and kind; the buffers are kept.
    pub fn restart(&mut self, batch_size: usize, transactional: bool) {
        self.buf.clear();
        self.buf.resize(HEADER_LEN, 0);
        self.batch_size = batch_size;
        self.attributes = if transactional { TRANSACTIONAL } else { 0 };
        self.first_timestamp = UNSET;
        self.max_timestamp = UNSET;
        self.records = 0;
    }

    /// Records committed so far.
    pub fn records(&self) -> usize {
        self.records as usize
    }

    /// Start a record with this millisecond timestamp; what an earlier `begin` left
    /// uncommitted is dropped.
    pub fn begin(&mut self, timestamp: i64) {
        self.timestamp = timestamp;
        let delta = if self.first_timestamp == UNSET {
            0
        } else {
            timestamp.wrapping_sub(self.first_timestamp)
        };
        self.body.clear();
        self.body.push(0); // record attributes: unused
        put_varint(&mut self.body, delta);
        put_varint(&mut self.body, i64::from(self.records)); // offset delta
    }

    /// The begun record's next fields as a [`Tail`] wrote them, instead of writing them field
    /// by field.
    pub fn tail(&mut self, tail: &[u8]) {
        self.body.extend_from_slice(tail);
    }

    /// Append the record begun last if it fits (module docs); false leaves the batch as it was.
    pub fn commit(&mut self) -> bool {
        let len = self.body.len();
        let size = len + varint_len(len as i64);
        if self.records != 0 && self.buf.len() + size >= self.batch_size {
            return false;
        }
        if self.first_timestamp == UNSET {
            self.first_timestamp = self.timestamp;
            self.max_timestamp = self.timestamp;
        } else if self.max_timestamp < self.timestamp {
            self.max_timestamp = self.timestamp;
        }
        put_varint(&mut self.buf, len as i64);
        self.buf.extend_from_slice(&self.body);
        self.records += 1;
        true
    }

    /// The batch with its header written, except the producer state and the CRC: [`seal`] it.
    pub fn finish(&mut self) -> &mut [u8] {
        let len = self.buf.len();
        let h = &mut self.buf;
        h[..LENGTH_AT].copy_from_slice(&0i64.to_be_bytes()); // base offset: the broker's
        h[LENGTH_AT..LEADER_EPOCH_AT].copy_from_slice(&((len - LEADER_EPOCH_AT) as i32).to_be_bytes());
        h[LEADER_EPOCH_AT..MAGIC_AT].copy_from_slice(&(-1i32).to_be_bytes());
        h[MAGIC_AT] = 2;
        h[ATTRIBUTES_AT..LAST_OFFSET_DELTA_AT].copy_from_slice(&self.attributes.to_be_bytes());
        let last = (self.records - 1).max(0);
        h[LAST_OFFSET_DELTA_AT..FIRST_TIMESTAMP_AT].copy_from_slice(&last.to_be_bytes());
        h[FIRST_TIMESTAMP_AT..MAX_TIMESTAMP_AT].copy_from_slice(&self.first_timestamp.to_be_bytes());
        h[MAX_TIMESTAMP_AT..PRODUCER_ID_AT].copy_from_slice(&self.max_timestamp.to_be_bytes());
        h[RECORD_COUNT_AT..HEADER_LEN].copy_from_slice(&self.records.to_be_bytes());
        &mut self.buf
    }
}

impl Fields for BatchWriter {
    fn bytes(&mut self, b: Option<&[u8]>) {
        put_field(&mut self.body, b);
    }

    fn count(&mut self, n: usize) {
        put_varint(&mut self.body, n as i64);
    }
}

/// Write the producer state (id, epoch, base sequence; -1, -1, 0 for a producer without one)
/// into a batch from [`BatchWriter::finish`] and its CRC-32C over everything after the CRC.
/// False, and nothing written, if `batch` is shorter than a batch header.
#[must_use]
pub fn seal(batch: &mut [u8], producer_id: i64, producer_epoch: i16, base_sequence: i32) -> bool {
    if batch.len() < HEADER_LEN {
        return false;
    }
    batch[PRODUCER_ID_AT..PRODUCER_EPOCH_AT].copy_from_slice(&producer_id.to_be_bytes());
    batch[PRODUCER_EPOCH_AT..BASE_SEQUENCE_AT].copy_from_slice(&producer_epoch.to_be_bytes());
    batch[BASE_SEQUENCE_AT..RECORD_COUNT_AT].copy_from_slice(&base_sequence.to_be_bytes());
    let crc = crc32c::crc32c(&batch[ATTRIBUTES_AT..]);
    batch[CRC_AT..ATTRIBUTES_AT].copy_from_slice(&crc.to_be_bytes());
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    type Header<'a> = (&'a str, Option<&'a [u8]>);

    fn fields(w: &mut impl Fields, key: Option<&[u8]>, value: Option<&[u8]>, headers: &[Header]) {
        w.bytes(key);
        w.bytes(value);
        header_fields(w, headers);
    }

    fn header_fields(w: &mut impl Fields, headers: &[Header]) {
        w.count(headers.len());
        for (k, v) in headers {
            w.bytes(Some(k.as_bytes()));
            w.bytes(*v);
        }
    }

    fn record(w: &mut BatchWriter, ts: i64, key: Option<&[u8]>, value: Option<&[u8]>, headers: &[Header]) -> bool {
        w.begin(ts);
        fields(w, key, value, headers);
        w.commit()
    }

    /// The same record with all its fields written ahead in a [`Tail`].
    fn record_from_tail(
        w: &mut BatchWriter,
        ts: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[Header],
    ) -> bool {
        let mut t = Tail::default();
        fields(&mut t, key, value, headers);
        w.begin(ts);
        w.tail(t.as_bytes());
        w.commit()
    }

    /// The same record with its headers written ahead, as the worker writes them: the key and
    /// the value field by field, then the headers' tail.
    fn record_from_header_tail(
        w: &mut BatchWriter,
        ts: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[Header],
    ) -> bool {
        let mut t = Tail::default();
        header_fields(&mut t, headers);
        w.begin(ts);
        w.bytes(key);
        w.bytes(value);
        w.tail(t.as_bytes());
        w.commit()
    }

    #[test]
    fn varints_match_their_lengths() {
        for n in [0i64, 1, -1, 63, 64, -64, -65, 8191, 8192, i64::MAX, i64::MIN, 1 << 40] {
            let mut out = Vec::new();
            put_varint(&mut out, n);
            assert_eq!(out.len(), varint_len(n), "{n}");
        }
        let mut out = Vec::new();
        put_varint(&mut out, 300);
        assert_eq!(out, [0xd8, 0x04]);
    }

    /// aiokafka 0.14's compiled builder, for these records and producer state:
    /// `b = DefaultRecordBatchBuilder(2, 0, 1, 7, 3, 11, 1 << 20)`,
    /// `b.append(0, 1000, b"k", b"v", [("h", b"x"), ("n", None)])`, `b.append(1, 990, None, b"", [])`,
    /// `b.build().hex()`.
    #[test]
    fn the_bytes_are_aiokafkas() {
        let mut w = BatchWriter::new(1 << 20, true);
        // a new writer, the same one restarted, and the records from tails written ahead: the
        // same bytes
        for (restarted, write) in [
            (false, record as Writes),
            (true, record),
            (true, record_from_tail),
            (true, record_from_header_tail),
        ] {
            if restarted {
                w.restart(1 << 20, true);
            }
            assert!(write(
                &mut w,
                1000,
                Some(b"k"),
                Some(b"v"),
                &[("h", Some(b"x")), ("n", None)]
            ));
            assert!(write(&mut w, 990, None, Some(b""), &[]));
            let batch = w.finish();
            assert!(seal(batch, 7, 3, 11));
            assert_eq!(hex::encode(batch), AIOKAFKA);
        }
    }

    type Writes = fn(&mut BatchWriter, i64, Option<&[u8]>, Option<&[u8]>, &[Header]) -> bool;

    /// aiokafka's `estimate_size_in_bytes(b"k", b"v", [("h", b"x"), ("n", None)])` is 94 and
    /// `estimate_size_in_bytes(None, b"", [])` 85; a 200-byte value takes a two-byte length.
    #[test]
    fn a_tail_and_the_overhead_are_aiokafkas_estimate() {
        let mut t = Tail::default();
        for (key, value, headers, estimate) in [
            (
                Some(&b"k"[..]),
                Some(&b"v"[..]),
                &[("h", Some(&b"x"[..])), ("n", None)][..],
                94,
            ),
            (None, Some(&b""[..]), &[][..], 85),
            (None, Some(&[0u8; 200][..]), &[][..], 286),
        ] {
            t.clear();
            fields(&mut t, key, value, headers);
            assert_eq!(t.as_bytes().len() + ESTIMATE_OVERHEAD, estimate);
            // the key's and the value's sizes, then the headers' tail: the same sum
            t.clear();
            fields(&mut t, None, None, headers);
            let split = field_size(key.map(<[u8]>::len)) + field_size(value.map(<[u8]>::len)) + t.as_bytes().len() - 2;
            assert_eq!(split + ESTIMATE_OVERHEAD, estimate);
        }
    }

    const AIOKAFKA: &str = "000000000000000000000048ffffffff027f24d0b500100000000100000000000003e800000000000003e8000000000000000700030000000b000000021e000000026b02760402680278026e010c001302010000";

    #[test]
    fn a_record_reaching_the_limit_is_refused_but_never_the_first() {
        let value = [7u8; 100];
        let mut w = BatchWriter::new(10, false);
        assert!(record(&mut w, 5, None, Some(&value), &[])); // the first always goes in
        assert!(!record(&mut w, 5, None, Some(&value), &[]));
        assert_eq!(w.records(), 1);
        // one record's size: 2 length + 1 attrs + 1 delta + 1 offset + 1 null key + 2 + 100 value + 1 count
        let one = 109;
        let mut w = BatchWriter::new(HEADER_LEN + 2 * one + 1, false);
        assert!(record(&mut w, 5, None, Some(&value), &[]));
        assert!(record(&mut w, 5, None, Some(&value), &[])); // ends one byte short of the limit
        assert!(!record(&mut w, 5, None, Some(&[]), &[]));
        let mut w = BatchWriter::new(HEADER_LEN + 2 * one, false);
        assert!(record(&mut w, 5, None, Some(&value), &[]));
        assert!(!record(&mut w, 5, None, Some(&value), &[])); // would reach it exactly
        assert_eq!(w.finish().len(), HEADER_LEN + one);
        w.restart(10, false);
        assert_eq!(w.records(), 0);
        assert!(record(&mut w, 5, None, Some(&value), &[]));
    }

    #[test]
    fn the_crc_covers_everything_after_it() {
        let mut w = BatchWriter::new(1 << 20, false);
        assert!(record(&mut w, 1, Some(b"a"), None, &[]));
        let mut batch = w.finish().to_vec();
        assert!(seal(&mut batch, -1, -1, 0));
        let crc = u32::from_be_bytes(batch[CRC_AT..ATTRIBUTES_AT].try_into().unwrap());
        assert_eq!(crc, crc32c::crc32c(&batch[ATTRIBUTES_AT..]));
        let before = batch.clone();
        assert!(seal(&mut batch, 5, 0, 0));
        assert!(!seal(&mut batch[..HEADER_LEN - 1], 5, 0, 0));
        assert_ne!(batch[CRC_AT..ATTRIBUTES_AT], before[CRC_AT..ATTRIBUTES_AT]);
    }

    proptest::proptest! {
        /// Any records, written field by field, from tails of all their fields or from tails of
        /// their headers written ahead, in batches of any size: the same batch, byte for byte,
        /// the same records taken.
        #[test]
        fn a_record_from_its_tail_is_the_record(
            records in proptest::collection::vec((
                proptest::prelude::any::<i64>(),
                proptest::option::of(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)),
                proptest::option::of(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)),
                proptest::collection::vec(("[a-zé]{0,8}", proptest::option::of(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40))), 0..5),
            ), 1..10),
            batch_size in 0usize..2000,
        ) {
            let mut by_field = BatchWriter::new(batch_size, false);
            let mut by_tail = BatchWriter::new(batch_size, false);
            let mut by_header_tail = BatchWriter::new(batch_size, false);
            for (ts, key, value, headers) in &records {
                let headers: Vec<Header> = headers.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
                let a = record(&mut by_field, *ts, key.as_deref(), value.as_deref(), &headers);
                let b = record_from_tail(&mut by_tail, *ts, key.as_deref(), value.as_deref(), &headers);
                let c = record_from_header_tail(&mut by_header_tail, *ts, key.as_deref(), value.as_deref(), &headers);
                proptest::prop_assert_eq!(a, b);
                proptest::prop_assert_eq!(a, c);
            }
            proptest::prop_assert_eq!(by_field.records(), by_tail.records());
            proptest::prop_assert_eq!(by_field.records(), by_header_tail.records());
            let want = by_field.finish().to_vec();
            proptest::prop_assert_eq!(&want, &by_tail.finish().to_vec());
            proptest::prop_assert_eq!(&want, &by_header_tail.finish().to_vec());
        }
    }
}
