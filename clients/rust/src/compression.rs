//! Payload compression per `metadata.content_encoding` (gzip, snappy raw block, zstd), the Rust
//! twin of `app/envelope/compression.py`. Decompression is bounded while it runs, so a small
//! "zip bomb" cannot exhaust memory: gzip and zstd stop one byte past the limit, snappy's
//! preamble (the declared length) is checked before any work.

use std::io::Read;

use crate::error::{err, PrismError, Result};

/// Python's `DEFAULT_MAX_DECOMPRESSED`: 64 MiB.
pub const DEFAULT_MAX_DECOMPRESSED: usize = 64 * 1024 * 1024;

fn is_identity(encoding: &str) -> bool {
    matches!(encoding, "" | "none" | "identity")
}

fn unsupported(encoding: &str) -> PrismError {
    err!(
        Payload,
        format!("unsupported content_encoding {encoding:?}"),
        "metadata.content_encoding",
        "use one of gzip, none, snappy, zstd"
    )
}

fn invalid(encoding: &str, e: impl std::fmt::Display) -> PrismError {
    err!(
        Payload,
        format!("payload is not valid {encoding} data: {e}"),
        "payload",
        "check the producer's content_encoding matches how it compressed the payload"
    )
}

fn too_big(encoding: &str, max: usize) -> PrismError {
    err!(
        Payload,
        format!("{encoding} payload inflates beyond the {max}-byte limit"),
        "payload",
        "raise the limit if this size is legitimate"
    )
}

/// Compress for `encoding` (gzip level 6 in a gzip container, snappy raw block, zstd).
pub fn compress(data: &[u8], encoding: &str) -> Result<Vec<u8>> {
    match encoding {
        e if is_identity(e) => Ok(data.to_vec()),
        "gzip" => {
            let mut out = Vec::new();
            let mut enc = flate2::read::GzEncoder::new(data, flate2::Compression::new(6));
            enc.read_to_end(&mut out).map_err(|e| invalid("gzip", e))?;
            Ok(out)
        }
        "snappy" => snap::raw::Encoder::new()
            .compress_vec(data)
            .map_err(|e| invalid("snappy", e)),
        "zstd" => Ok(ruzstd::encoding::compress_to_vec(
            data,
            ruzstd::encoding::CompressionLevel::Fastest,
        )),
        other => Err(unsupported(other)),
    }
}

fn bounded(mut r: impl Read, encoding: &str, max: usize) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    (&mut r)
        .take(max as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| invalid(encoding, e))?;
    if out.len() > max {
        return Err(too_big(encoding, max));
    }
    Ok(out)
}

/// Nothing of the input may be left after the compressed data: `rest` is what remains of the
/// slice the decoder read from (the `bufread` decoders and ruzstd take exactly what they use).
fn nothing_after(rest: &[u8], encoding: &str) -> Result<()> {
    if rest.is_empty() {
        return Ok(());
    }
    Err(err!(
        Payload,
        format!(
            "{encoding} payload has {} bytes after its compressed data (a second member or frame, or garbage)",
            rest.len()
        ),
        "payload",
        "compress the payload as one gzip member or one zstd frame"
    ))
}

/// Decompress `data` written with `encoding`, at most `max` bytes of output.
///
/// A gzip payload is one gzip member, or one zlib stream (Python's decoder, wbits 47, takes
/// both), and a zstd payload one frame, with nothing after it: a second member or frame, or
/// trailing bytes, are refused. Runtimes disagree on them (Python reads the first member or
/// frame and ignores the rest; Rust's multi-member reader concatenated gzip members; Go's
/// readers concatenate both), so the same signed payload could read as two values.
pub fn decompress(data: &[u8], encoding: &str, max: usize) -> Result<Vec<u8>> {
    let mut rest = data;
    match encoding {
        e if is_identity(e) => Ok(data.to_vec()),
        "gzip" if data.starts_with(&[0x1f, 0x8b]) => {
            let out = bounded(flate2::bufread::GzDecoder::new(&mut rest), "gzip", max)?;
            nothing_after(rest, "gzip").map(|_| out)
        }
        "gzip" => {
            let out = bounded(flate2::bufread::ZlibDecoder::new(&mut rest), "gzip", max)?;
            nothing_after(rest, "gzip").map(|_| out)
        }
        "snappy" => {
            let declared = snap::raw::decompress_len(data).map_err(|e| invalid("snappy", e))?;
            if declared > max {
                return Err(err!(
                    Payload,
                    format!("snappy payload declares {declared} bytes, over the {max}-byte limit"),
                    "payload",
                    "raise the limit if this size is legitimate"
                ));
            }
            snap::raw::Decoder::new()
                .decompress_vec(data)
                .map_err(|e| invalid("snappy", e))
        }
        "zstd" => {
            let dec = ruzstd::decoding::StreamingDecoder::new(&mut rest).map_err(|e| invalid("zstd", e))?;
            let out = bounded(dec, "zstd", max)?;
            nothing_after(rest, "zstd").map(|_| out)
        }
        other => Err(unsupported(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `app.envelope.compression.compress(b"hello prism " * 50, enc)` from the Python SDK.
    const PY: [(&str, &str); 3] = [
        (
            "gzip",
            "1f8b0800000000000003cb48cdc9c9572828ca2cce55c818658fb2a9c40600a16607b258020000",
        ),
        (
            "snappy",
            "d8042c68656c6c6f20707269736d20fe0c00fe0c00fe0c00fe0c00fe0c00fe0c00fe0c00fe0c00fe0c002e0c00",
        ),
        ("zstd", "28b52ffd6058019d00006068656c6c6f20707269736d200100495e9524"),
    ];

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn reads_what_python_writes_and_round_trips() {
        let plain = b"hello prism ".repeat(50);
        for (enc, hex) in PY {
            assert_eq!(decompress(&unhex(hex), enc, 1 << 20).unwrap(), plain, "{enc}");
            assert_eq!(
                decompress(&compress(&plain, enc).unwrap(), enc, 1 << 20).unwrap(),
                plain,
                "{enc}"
            );
            assert!(decompress(&unhex(hex), enc, 100).is_err(), "{enc}: the limit holds");
            assert!(decompress(&unhex(hex)[..8], enc, 1 << 20).is_err(), "{enc}: truncated");
        }
        assert!(decompress(b"x", "brotli", 10).is_err());
    }

    /// Python's `compress(b"AAAA" / b"BBBB", "gzip" / "zstd")` and `zlib.compress(b"AAAA")`.
    const GZIP_A: &str = "1f8b0800000000000003737474740400f1080d9b04000000";
    const GZIP_B: &str = "1f8b08000000000000037372727202003f1bda3904000000";
    const ZLIB_A: &str = "789c737474740400028e0105";
    const ZSTD_A: &str = "28b52ffd200421000041414141";
    const ZSTD_B: &str = "28b52ffd200421000042424242";

    /// A payload is one gzip member (or zlib stream) or one zstd frame and nothing after it:
    /// the multi-member reader read gzip(A)+gzip(B) as AAAABBBB where Python reads AAAA (and Go
    /// read both zstd frames where Python and Rust read one), so one signed payload had two
    /// values; trailing bytes are refused now.
    #[test]
    fn refuses_bytes_after_the_first_member_or_frame() {
        for (enc, hex) in [("gzip", GZIP_A), ("gzip", ZLIB_A), ("zstd", ZSTD_A)] {
            assert_eq!(decompress(&unhex(hex), enc, 1 << 20).unwrap(), b"AAAA", "{enc} {hex}");
        }
        for (what, enc, hex) in [
            ("two gzip members", "gzip", format!("{GZIP_A}{GZIP_B}")),
            ("gzip then a byte", "gzip", format!("{GZIP_A}00")),
            ("zlib then garbage", "gzip", format!("{ZLIB_A}6a756e6b")),
            ("two zstd frames", "zstd", format!("{ZSTD_A}{ZSTD_B}")),
            ("zstd then garbage", "zstd", format!("{ZSTD_A}6a756e6b")),
        ] {
            let e = decompress(&unhex(&hex), enc, 1 << 20).unwrap_err();
            assert!(e.to_string().contains("after its compressed data"), "{what}: {e}");
        }
    }

    /// The trailing-data check never refuses a whole frame: Python's zstd frame with a content
    /// checksum (`ZstdCompressor(write_checksum=True)`, `b"hello prism " * 20000`), and what this
    /// crate writes over several blocks.
    #[test]
    fn whole_frames_with_checksums_and_many_blocks_decode() {
        let checked =
            "28b52ffda480a90300a400006068656c6c6f20707269736d200100f1ffcf4b124d0000086901007ca93910027df1a2cd";
        assert_eq!(
            decompress(&unhex(checked), "zstd", 1 << 20).unwrap(),
            b"hello prism ".repeat(20000)
        );
        let plain: Vec<u8> = (0..700_000u32)
            .map(|i| (i.wrapping_mul(7) as u8) ^ ((i >> 9) as u8))
            .collect();
        for enc in ["gzip", "snappy", "zstd"] {
            assert_eq!(
                decompress(&compress(&plain, enc).unwrap(), enc, 1 << 20).unwrap(),
                plain,
                "{enc}"
            );
        }
    }
}
