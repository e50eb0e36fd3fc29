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

/// Decode a base-128 varint at `pos`, no further than `end`; returns (value, position after it).
///
/// At most 10 bytes are read. Bits beyond 64 (a 10th byte above 1) saturate the value to
/// `u64::MAX`, so a caller that compares the value (a signature scope, a tree size) sees a
/// number out of every range instead of a wrapped small one.
pub fn read_varint(buf: &[u8], mut pos: usize, end: usize) -> Result<(u64, usize)> {
    let mut result: u64 = 0;
    let mut overflow = false;
    for i in 0..10 {
        if pos >= end || pos >= buf.len() {
            return Err(err!(
                Truncated,
                "varint runs past the end of the input",
                format!("byte {pos}"),
                "the message was truncated or corrupted in transit"
            ));
        }
        let b = buf[pos];
        pos += 1;
        let low = u64::from(b & 0x7f);
        if i == 9 && low > 1 {
            overflow = true;
        }
        result |= low.wrapping_shl(7 * i);
        if b & 0x80 == 0 {
            return Ok((if overflow { u64::MAX } else { result }, pos));
        }
    }
    Err(err!(
        Malformed,
        "varint longer than 10 bytes",
        format!("byte {pos}"),
        "the bytes are not protobuf"
    ))
}

/// All records of one message in `buf[start..end]`, without copying anything. Rejects
/// groups and wire types 6/7, field 0 and fields above 2^29-1, varints over 10 bytes and
/// lengths that run past `end` (docs/signing.md, step 1).
pub fn scan(buf: &[u8], start: usize, end: usize) -> Result<Vec<Record>> {
    let end = end.min(buf.len());
    let mut pos = start;
    let mut out = Vec::new();
    while pos < end {
        let rec_start = pos;
        let (key, p) = read_varint(buf, pos, end)?;
        pos = p;
        let field = key >> 3;
        let wt = (key & 7) as u8;
        if field == 0 || field > MAX_FIELD {
            return Err(err!(
                Malformed,
                format!("invalid field number {field}"),
                format!("byte {rec_start}"),
                "the bytes are not protobuf"
            ));
        }
        let field = field as u32;
        match wt {
            LEN => {
                let (len, vs) = read_varint(buf, pos, end)?;
                let remaining = (end - vs) as u64;
                if len > remaining {
                    return Err(err!(
                        Truncated,
                        format!("field {field} claims {len} bytes but only {remaining} remain"),
                        format!("byte {rec_start}"),
                        "the message was truncated or corrupted in transit"
                    ));
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
                let (_, p) = read_varint(buf, pos, end)?;
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
                    return Err(err!(
                        Truncated,
                        format!("fixed-width field {field} runs past the end"),
                        format!("byte {rec_start}"),
                        "the message was truncated or corrupted in transit"
                    ));
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
                return Err(err!(
                    Malformed,
                    format!("wire type {wt} (group or invalid) for field {field} is not supported"),
                    format!("byte {rec_start}"),
                    "the bytes are not an envelope"
                ));
            }
        }
    }
    Ok(out)
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
