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

/// Decompress `data` written with `encoding`, at most `max` bytes of output.
pub fn decompress(data: &[u8], encoding: &str, max: usize) -> Result<Vec<u8>> {
    match encoding {
        e if is_identity(e) => Ok(data.to_vec()),
        // MultiGzDecoder reads a gzip container; Python's decoder (wbits 47) also takes zlib
        "gzip" if data.starts_with(&[0x1f, 0x8b]) => bounded(flate2::read::MultiGzDecoder::new(data), "gzip", max),
        "gzip" => bounded(flate2::read::ZlibDecoder::new(data), "gzip", max),
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
            let dec = ruzstd::decoding::StreamingDecoder::new(data).map_err(|e| invalid("zstd", e))?;
            bounded(dec, "zstd", max)
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
}
