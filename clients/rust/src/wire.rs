//! A small protobuf wire-format walker (the Rust twin of `app/envelope/wire.py`).
//!
//! Three things need the records themselves rather than a decoded message: the header-only
//! parse (skip the payload record by its length prefix and borrow it), the signature scopes
//! (the signed bytes are cut from the received bytes, never re-serialized: docs/signing.md),
//! and layout detection (the two layouts differ in field numbers and wire types).

use crate::error::{err, Result};

pub const VARINT: u8 = 0;
pub const I64: u8 = 1;
pub const LEN: u8 = 2;
pub const I32: u8 = 5;
const MAX_FIELD: u64 = (1 << 29) - 1;

/// One record: `buf[start..end]` is the whole record (tag included); for LEN records
/// `buf[value_start..end]` is the value, for the others `value_start` is just past the tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub field: u32,
    pub wire_type: u8,
    pub start: usize,
    pub value_start: usize,
    pub end: usize,
}

/// Why a walk over records stopped, with the numbers as read (varints up to their full 70 bits,
/// not saturated): each SDK words the failure in its own error type from these, so the Rust
/// client ([`scan`], [`PrismError`](crate::PrismError)) and the Python worker's native scan
/// (`clients/rust/python`, raising the same `PrismError` classes and texts as
/// `app/envelope/wire.py`) share one walker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireFault {
    /// A varint runs past the end; `at` is where the input ended.
    VarintPastEnd { at: usize },
    /// Ten bytes, all with the continuation bit; `at` is just past the tenth.
    VarintTooLong { at: usize },
    /// Field number 0 or above 2^29-1; `at` is the record's start.
    InvalidField { at: usize, field: u128 },
    /// A LEN record claims more bytes than remain after its length prefix.
    LengthPastEnd {
        at: usize,
        field: u32,
        length: u128,
        remaining: usize,
    },
    /// A fixed-width (I32/I64) value runs past the end.
    FixedPastEnd { at: usize, field: u32 },
    /// A group or an invalid wire type (3, 4, 6, 7).
    BadWireType { at: usize, field: u32, wire_type: u8 },
}

fn saturated(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

impl From<WireFault> for crate::PrismError {
    fn from(f: WireFault) -> Self {
        const CUT: &str = "the message was truncated or corrupted in transit";
        match f {
            WireFault::VarintPastEnd { at } => err!(
                Truncated,
                "varint runs past the end of the input",
                format!("byte {at}"),
                CUT
            ),
            WireFault::VarintTooLong { at } => err!(
                Malformed,
                "varint longer than 10 bytes",
                format!("byte {at}"),
                "the bytes are not protobuf"
            ),
            WireFault::InvalidField { at, field } => err!(
                Malformed,
                // the number as the saturating reader gave it (the key saturated, then shifted)
                format!("invalid field number {}", saturated(field << 3 | 7) >> 3),
                format!("byte {at}"),
                "the bytes are not protobuf"
            ),
            WireFault::LengthPastEnd {
                at,
                field,
                length,
                remaining,
            } => err!(
                Truncated,
                format!(
                    "field {field} claims {} bytes but only {remaining} remain",
                    saturated(length)
                ),
                format!("byte {at}"),
                CUT
            ),
            WireFault::FixedPastEnd { at, field } => err!(
                Truncated,
                format!("fixed-width field {field} runs past the end"),
                format!("byte {at}"),
                CUT
            ),
            WireFault::BadWireType { at, field, wire_type } => err!(
                Malformed,
                format!("wire type {wire_type} (group or invalid) for field {field} is not supported"),
                format!("byte {at}"),
                "the bytes are not an envelope"
            ),
        }
    }
}

/// A base-128 varint at `pos`, no further than `end`, with all of its up to 70 bits;
/// returns (value, position after it).
pub fn read_varint_wide(buf: &[u8], mut pos: usize, end: usize) -> std::result::Result<(u128, usize), WireFault> {
    let end = end.min(buf.len());
    let mut result: u128 = 0;
    for i in 0..10 {
        if pos >= end {
            return Err(WireFault::VarintPastEnd { at: pos });
        }
        let b = buf[pos];
        pos += 1;
        result |= u128::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok((result, pos));
        }
    }
    Err(WireFault::VarintTooLong { at: pos })
}

/// Decode a base-128 varint at `pos`, no further than `end`; returns (value, position after it).
///
/// At most 10 bytes are read. Bits beyond 64 (a 10th byte above 1) saturate the value to
/// `u64::MAX`, so a caller that compares the value (a signature scope, a tree size) sees a
/// number out of every range instead of a wrapped small one.
pub fn read_varint(buf: &[u8], pos: usize, end: usize) -> Result<(u64, usize)> {
    let (v, p) = read_varint_wide(buf, pos, end)?;
    Ok((saturated(v), p))
}

/// All records of one message in `buf[start..end]`, without copying anything. Rejects
/// groups and wire types 6/7, field 0 and fields above 2^29-1, varints over 10 bytes and
/// lengths that run past `end` (docs/signing.md, step 1).
pub fn scan(buf: &[u8], start: usize, end: usize) -> Result<Vec<Record>> {
    Ok(walk(buf, start, end)?)
}

/// [`scan`] with the failure as a [`WireFault`] (its numbers unsaturated), for callers that
/// word it themselves: the Python binding, whose texts must be `app/envelope/wire.py`'s.
pub fn walk(buf: &[u8], start: usize, end: usize) -> std::result::Result<Vec<Record>, WireFault> {
    walk_while(buf, start, end, |_| true).map(|(out, _)| out)
}

/// [`walk`] that asks `more` after each record whether to go on: it returns the records so far
/// and `false` as soon as `more` says no (the codec's header limit, checked while walking), or
/// every record and `true`.
pub fn walk_while(
    buf: &[u8],
    start: usize,
    end: usize,
    mut more: impl FnMut(&Record) -> bool,
) -> std::result::Result<(Vec<Record>, bool), WireFault> {
    let end = end.min(buf.len());
    let mut pos = start;
    let mut out = Vec::with_capacity(8);
    while pos < end {
        let rec_start = pos;
        let (key, p) = read_varint_wide(buf, pos, end)?;
        pos = p;
        let field = key >> 3;
        let wt = (key & 7) as u8;
        if field == 0 || field > MAX_FIELD as u128 {
            return Err(WireFault::InvalidField { at: rec_start, field });
        }
        let field = field as u32;
        match wt {
            LEN => {
                let (len, vs) = read_varint_wide(buf, pos, end)?;
                let remaining = end - vs;
                if len > remaining as u128 {
                    return Err(WireFault::LengthPastEnd {
                        at: rec_start,
                        field,
                        length: len,
                        remaining,
                    });
                }
                pos = vs + len as usize;
                out.push(Record {
                    field,
                    wire_type: wt,
                    start: rec_start,
                    value_start: vs,
                    end: pos,
                });
            }
            VARINT => {
                let (_, p) = read_varint_wide(buf, pos, end)?;
                out.push(Record {
                    field,
                    wire_type: wt,
                    start: rec_start,
                    value_start: pos,
                    end: p,
                });
                pos = p;
            }
            I64 | I32 => {
                let n = if wt == I64 { 8 } else { 4 };
                if end - pos < n {
                    return Err(WireFault::FixedPastEnd { at: rec_start, field });
                }
                out.push(Record {
                    field,
                    wire_type: wt,
                    start: rec_start,
                    value_start: pos,
                    end: pos + n,
                });
                pos += n;
            }
            _ => {
                return Err(WireFault::BadWireType {
                    at: rec_start,
                    field,
                    wire_type: wt,
                })
            }
        }
        if !more(&out[out.len() - 1]) {
            return Ok((out, false));
        }
    }
    Ok((out, true))
}

/// The value of a VARINT record (saturated past 64 bits, see [`read_varint`]).
pub fn varint_value(buf: &[u8], rec: &Record) -> Result<u64> {
    Ok(read_varint(buf, rec.value_start, rec.end)?.0)
}

/// Append the minimal varint encoding of `v`.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The minimal tag bytes of a LEN record of `field`.
pub fn len_tag(out: &mut Vec<u8>, field: u32) {
    put_varint(out, (u64::from(field) << 3) | u64::from(LEN));
}

/// Append a whole LEN record (`tag`, `len`, `value`).
pub fn put_len_record(out: &mut Vec<u8>, field: u32, value: &[u8]) {
    len_tag(out, field);
    put_varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_round_trip_and_saturation() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64 + 2, u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            assert_eq!(read_varint(&b, 0, b.len()).unwrap(), (v, b.len()));
        }
        // 10th byte carrying more than the 64th bit: saturates instead of wrapping
        let b = [0x82, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x7f];
        assert_eq!(read_varint(&b, 0, b.len()).unwrap().0, u64::MAX);
        let eleven = [0x80u8; 11];
        assert!(matches!(
            read_varint(&eleven, 0, 11),
            Err(crate::PrismError::Malformed(_))
        ));
    }

    #[test]
    fn walk_reports_faults_with_unsaturated_numbers() {
        // a 70-bit key: field number beyond 2^64, reported whole (scan saturates it)
        let key = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
        let WireFault::InvalidField { at: 0, field } = walk(&key, 0, 10).unwrap_err() else {
            panic!("not an invalid field")
        };
        assert_eq!(field, ((1u128 << 70) - 1) >> 3);
        match scan(&key, 0, 10).unwrap_err() {
            crate::PrismError::Malformed(d) => {
                assert_eq!(d.what, format!("invalid field number {}", u64::MAX >> 3))
            }
            other => panic!("{other:?}"),
        }
        // a LEN record claiming 2^64 + 1 bytes
        let mut b = vec![0x0a];
        b.extend_from_slice(&[0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02]);
        assert_eq!(
            walk(&b, 0, b.len()).unwrap_err(),
            WireFault::LengthPastEnd {
                at: 0,
                field: 1,
                length: (1u128 << 64) + 1,
                remaining: 0
            }
        );
        assert_eq!(
            walk(&[0x80; 11], 0, 11).unwrap_err(),
            WireFault::VarintTooLong { at: 10 }
        );
        assert_eq!(walk(&[0x0a], 0, 1).unwrap_err(), WireFault::VarintPastEnd { at: 1 });
        assert_eq!(
            walk(&[0x0d, 1, 2], 0, 3).unwrap_err(),
            WireFault::FixedPastEnd { at: 0, field: 1 }
        );
        assert_eq!(
            walk(&[0x0f], 0, 1).unwrap_err(),
            WireFault::BadWireType {
                at: 0,
                field: 1,
                wire_type: 7
            }
        );
        // `end` past the buffer is cut to it; a range inside it walks that range alone
        assert_eq!(walk(&[0x08, 0x01], 0, 99).unwrap().len(), 1);
        assert_eq!(walk(&[0x08, 0x01, 0x10, 0x02], 2, 4).unwrap()[0].field, 2);
    }

    #[test]
    fn scan_rejects_groups_field_zero_and_overlong_lengths() {
        assert!(scan(&[0x0b], 0, 1).is_err()); // group start
        assert!(scan(&[0x02, 0x00], 0, 2).is_err()); // field 0
        assert!(scan(&[0x0a, 0x05, 1, 2], 0, 4).is_err()); // length past the end
        assert!(scan(&[0x09, 1, 2, 3], 0, 4).is_err()); // fixed64 truncated
        let recs = scan(&[0x08, 0x01, 0x12, 0x01, 0x41], 0, 5).unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(
            recs[1],
            Record {
                field: 2,
                wire_type: LEN,
                start: 2,
                value_start: 4,
                end: 5
            }
        );
    }
}
