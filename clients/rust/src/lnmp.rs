//! LNMP messages (LNMP Envelope Specification v1.0, strict mode), read and written as the
//! Python worker does (`app/formats/lnmp.py`, `app/formats/lnmp_envelope.py`, docs/formats.md),
//! and mapped to and from Prism envelopes:
//!
//! * a binary container: `"LNMP"` | version `0x01` | mode | flags u16 BE | metadata_length
//!   u32 BE, the metadata (the mode's fixed metadata, then a TLV chain when flags bit 15 is
//!   set), then the record;
//! * a text message: an optional first line `#ENVELOPE timestamp=… source=… trace_id=… sequence=…`;
//! * a bare record (neither).
//!
//! Why strict only: a consumer of untrusted input must not guess. The Python worker's loose
//! mode (recovering damaged containers with notes) stays in the worker. Every refusal is
//! [`PrismError::Lnmp`] (`bad_lnmp`, as in Python). The limits are the format's own (a TLV value
//! fits in u16, integers in u64, a publish time in 1..2^63-1); the record is a borrowed slice of
//! the input, so nothing is allocated in proportion to a hostile length field.

use crate::error::{err, PrismError, Result};
use crate::gen::v1;
use crate::model::{self, Envelope, Payload};

/// The container's magic bytes.
pub const MAGIC: &[u8; 4] = b"LNMP";
/// The only container version this reader knows.
pub const CONTAINER_VERSION: u8 = 0x01;
/// Container header length: magic, version, mode, flags, metadata_length.
pub const HEADER_LEN: usize = 12;
/// Flags bit 0: the record carries a checksum (kept, not interpreted).
pub const FLAG_CHECKSUM: u16 = 0x0001;
/// Flags bit 15: a TLV chain follows the mode's fixed metadata.
pub const FLAG_EXT_METADATA: u16 = 0x8000;
const KNOWN_FLAGS: u16 = FLAG_CHECKSUM | FLAG_EXT_METADATA;
/// The binary mode, the default when writing.
pub const MODE_BINARY: u8 = 0x02;
/// The first word of a text header line.
pub const TEXT_KEYWORD: &str = "#ENVELOPE";

/// TLV types of the envelope entries (spec 4.2).
pub const TLV_TIMESTAMP: u8 = 0x10;
pub const TLV_SOURCE: u8 = 0x11;
pub const TLV_TRACE_ID: u8 = 0x12;
pub const TLV_SEQUENCE: u8 = 0x13;

/// Content types the mapping writes (`app/formats/lnmp_envelope.py`).
pub const CONTENT_TYPE_BINARY: &str = "application/lnmp";
pub const CONTENT_TYPE_TEXT: &str = "text/lnmp";
/// Extension keys that carry what the Prism header has no field for, so that
/// LNMP -> Prism -> LNMP is exact.
pub const EXT_SEQUENCE: &str = "lnmp.sequence";
pub const EXT_TRACE_ID: &str = "lnmp.trace_id";
pub const EXT_MODE: &str = "lnmp.mode";
pub const EXT_FLAGS: &str = "lnmp.flags";
pub const EXT_MODE_METADATA: &str = "lnmp.mode_metadata";
pub const EXT_TLV: &str = "lnmp.tlv";
pub const EXT_TEXT_KEYS: &str = "lnmp.text_keys";

/// Largest publish time the mapping accepts (`published_at_ms` is an int64).
const MAX_MS: u64 = i64::MAX as u64;

fn mode_metadata_length(mode: u8) -> usize {
    match mode {
        0x03 => 6,  // Stream
        0x04 => 10, // Delta
        _ => 0,
    }
}

fn known_mode(mode: u8) -> bool {
    (0x01..=0x05).contains(&mode)
}

fn bad(what: impl Into<String>, at: impl Into<String>, hint: impl Into<String>) -> PrismError {
    err!(Lnmp, what, at, hint)
}

/// The LNMP envelope metadata; `None` fields are absent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LnmpEnvelope {
    pub timestamp: Option<u64>,
    pub source: Option<String>,
    pub trace_id: Option<String>,
    pub sequence: Option<u64>,
    /// TLV entries this implementation does not interpret, kept verbatim, ascending type.
    pub extra_tlv: Vec<(u8, Vec<u8>)>,
    /// `#ENVELOPE` keys this implementation does not interpret, sorted by key.
    pub extra_keys: Vec<(String, String)>,
}

impl LnmpEnvelope {
    /// True when no entry is present.
    pub fn is_empty(&self) -> bool {
        self.timestamp.is_none()
            && self.source.is_none()
            && self.trace_id.is_none()
            && self.sequence.is_none()
            && self.extra_tlv.is_empty()
            && self.extra_keys.is_empty()
    }
}

/// A decoded binary container; `record` borrows the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container<'a> {
    pub record: &'a [u8],
    /// `None` without flags bit 15.
    pub envelope: Option<LnmpEnvelope>,
    pub mode: u8,
    /// The flags without bit 15 (derived from `envelope` when writing).
    pub flags: u16,
    /// The mode's fixed metadata, or the whole opaque metadata block without bit 15.
    pub mode_metadata: Vec<u8>,
}

/// A text message: the optional `#ENVELOPE` metadata and the record after the header line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextMessage<'a> {
    pub envelope: Option<LnmpEnvelope>,
    pub record: &'a [u8],
}

/// Which of the three LNMP forms a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// A binary container.
    Binary,
    /// A text message with an `#ENVELOPE` header line.
    Text,
    /// A record with neither (its metadata, if any, came in transport headers).
    Bare,
}

impl Form {
    /// The name the conformance suite uses ("binary", "text", "bare").
    pub fn name(self) -> &'static str {
        match self {
            Form::Binary => "binary",
            Form::Text => "text",
            Form::Bare => "bare",
        }
    }
}

/// The form of `data`, from its first bytes only.
pub fn form_of(data: &[u8]) -> Form {
    if is_container(data) {
        Form::Binary
    } else if has_text_header(data) {
        Form::Text
    } else {
        Form::Bare
    }
}

/// A container: at least 12 bytes, the magic, version 0x01 and a known mode. Anything else is
/// read as text or a bare record, as Python does (a record may begin with "LNMP").
pub fn is_container(data: &[u8]) -> bool {
    data.len() >= HEADER_LEN && &data[..4] == MAGIC && data[4] == CONTAINER_VERSION && known_mode(data[5])
}

fn be_u16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// Parse a TLV chain strictly: ascending types, each at most once, 8-byte timestamp and
/// sequence, UTF-8 strings, unknown types kept.
pub fn decode_tlv(block: &[u8]) -> Result<LnmpEnvelope> {
    let mut env = LnmpEnvelope::default();
    let mut pos = 0usize;
    let mut last: i32 = -1;
    while pos < block.len() {
        let at = format!("metadata byte {pos}");
        let left = block.len() - pos;
        if left < 3 {
            return Err(bad(
                format!("TLV header truncated: {left} byte(s) left, 3 needed"),
                at,
                "metadata_length must cover whole TLV entries",
            ));
        }
        let t = block[pos];
        let length = be_u16(&block[pos + 1..]) as usize;
        let start = pos + 3;
        if length > block.len() - start {
            return Err(bad(
                "TLV claims more bytes than remain",
                at,
                "the metadata block is truncated or corrupted",
            ));
        }
        if i32::from(t) == last {
            return Err(bad(
                format!("TLV type 0x{t:02x} appears twice"),
                at,
                "each type may appear at most once (spec 4.2 rule 2)",
            ));
        }
        if i32::from(t) < last {
            return Err(bad(
                format!("TLV type 0x{t:02x} out of order"),
                at,
                "entries must be in ascending type order (spec 4.2 rule 1)",
            ));
        }
        last = i32::from(t);
        let value = &block[start..start + length];
        match t {
            TLV_TIMESTAMP | TLV_SEQUENCE => {
                if length != 8 {
                    return Err(bad(
                        format!("timestamp/sequence TLV is {length} bytes, must be 8"),
                        at,
                        "encode it as a u64 big-endian",
                    ));
                }
                let v = be_u64(value);
                if t == TLV_TIMESTAMP {
                    env.timestamp = Some(v);
                } else {
                    env.sequence = Some(v);
                }
            }
            TLV_SOURCE | TLV_TRACE_ID => {
                let s = std::str::from_utf8(value)
                    .map_err(|_| bad("source/trace_id TLV is not valid UTF-8", at, "it is a UTF-8 string"))?
                    .to_owned();
                if t == TLV_SOURCE {
                    env.source = Some(s);
                } else {
                    env.trace_id = Some(s);
                }
            }
            _ => env.extra_tlv.push((t, value.to_vec())),
        }
        pos = start + length;
    }
    Ok(env)
}

/// The canonical TLV chain of `env` (ascending types).
pub fn encode_tlv(env: &LnmpEnvelope) -> Result<Vec<u8>> {
    let mut entries: Vec<(u8, Vec<u8>)> = Vec::new();
    if let Some(ts) = env.timestamp {
        entries.push((TLV_TIMESTAMP, ts.to_be_bytes().to_vec()));
    }
    if let Some(s) = &env.source {
        entries.push((TLV_SOURCE, s.as_bytes().to_vec()));
    }
    if let Some(s) = &env.trace_id {
        entries.push((TLV_TRACE_ID, s.as_bytes().to_vec()));
    }
    if let Some(seq) = env.sequence {
        entries.push((TLV_SEQUENCE, seq.to_be_bytes().to_vec()));
    }
    for (t, v) in &env.extra_tlv {
        if (TLV_TIMESTAMP..=TLV_SEQUENCE).contains(t) || entries.iter().any(|(u, _)| u == t) {
            return Err(bad(
                format!("TLV type 0x{t:02x} given twice"),
                "extra_tlv",
                "each type appears at most once; known types belong in their fields",
            ));
        }
        entries.push((*t, v.clone()));
    }
    entries.sort_by_key(|(t, _)| *t);
    let mut out = Vec::new();
    for (t, v) in entries {
        let len = u16::try_from(v.len()).map_err(|_| {
            bad(
                format!("TLV 0x{t:02x} value is {} bytes, over 65535", v.len()),
                "extra_tlv",
                "shorten the value",
            )
        })?;
        out.push(t);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&v);
    }
    Ok(out)
}

/// Parse a container strictly; the record borrows `data`.
pub fn decode_container(data: &[u8]) -> Result<Container<'_>> {
    if data.len() < HEADER_LEN {
        return Err(bad(
            "LNMP container is shorter than its 12-byte header",
            "byte 0",
            "the message was truncated",
        ));
    }
    if &data[..4] != MAGIC {
        return Err(bad("not an LNMP container: magic is not 'LNMP'", "byte 0", ""));
    }
    if data[4] != CONTAINER_VERSION {
        return Err(bad(
            format!("unsupported LNMP container version 0x{:02x}", data[4]),
            "byte 4",
            "this reader supports container version 0x01",
        ));
    }
    let mode = data[5];
    if !known_mode(mode) {
        return Err(bad(
            format!("unknown LNMP mode 0x{mode:02x}"),
            "byte 5",
            "modes are 0x01-0x05",
        ));
    }
    let flags = be_u16(&data[6..]);
    let mlen = u32::from_be_bytes([data[8], data[9], data[10], data[11]]) as u64;
    if mlen > (data.len() - HEADER_LEN) as u64 {
        return Err(bad(
            format!(
                "metadata_length {mlen} runs past the end ({} bytes follow the header)",
                data.len() - HEADER_LEN
            ),
            "byte 8",
            "the message was truncated or metadata_length is wrong",
        ));
    }
    if flags & !KNOWN_FLAGS != 0 {
        return Err(bad(
            format!("reserved container flag bits are set (0x{flags:04x})"),
            "byte 6",
            "only bit 0 (checksum) and bit 15 (has_ext_metadata) are defined",
        ));
    }
    let mlen = mlen as usize;
    let block = &data[HEADER_LEN..HEADER_LEN + mlen];
    let mut c = Container {
        record: &data[HEADER_LEN + mlen..],
        envelope: None,
        mode,
        flags: flags & !FLAG_EXT_METADATA,
        mode_metadata: block.to_vec(),
    };
    if flags & FLAG_EXT_METADATA != 0 {
        let fixed = mode_metadata_length(mode);
        if mlen < fixed {
            return Err(bad(
                format!("metadata_length {mlen} is shorter than the mode's {fixed}-byte fixed metadata"),
                "byte 8",
                "the TLV chain follows the fixed mode metadata",
            ));
        }
        c.mode_metadata = block[..fixed].to_vec();
        c.envelope = Some(decode_tlv(&block[fixed..])?);
    }
    Ok(c)
}

/// Serialize canonically: bit 15 and the TLV chain only when the envelope has entries.
pub fn encode_container(c: &Container<'_>) -> Result<Vec<u8>> {
    if c.flags & FLAG_EXT_METADATA != 0 {
        return Err(bad(
            "flags must not carry bit 15",
            "flags",
            "bit 15 (has_ext_metadata) is derived from the envelope",
        ));
    }
    let tlv = match &c.envelope {
        Some(e) => encode_tlv(e)?,
        None => Vec::new(),
    };
    let mut flags = c.flags;
    if !tlv.is_empty() {
        flags |= FLAG_EXT_METADATA;
        if c.mode_metadata.len() != mode_metadata_length(c.mode) {
            return Err(bad(
                "the mode needs its fixed metadata before the TLV chain",
                "mode_metadata",
                "Stream takes 6 bytes, Delta 10, other modes none",
            ));
        }
    }
    let meta_len = c.mode_metadata.len() + tlv.len();
    let meta_len =
        u32::try_from(meta_len).map_err(|_| bad("metadata over 4 GiB", "mode_metadata", "shorten the metadata"))?;
    let mut out = Vec::with_capacity(HEADER_LEN + meta_len as usize + c.record.len());
    out.extend_from_slice(MAGIC);
    out.push(CONTAINER_VERSION);
    out.push(c.mode);
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&meta_len.to_be_bytes());
    out.extend_from_slice(&c.mode_metadata);
    out.extend_from_slice(&tlv);
    out.extend_from_slice(c.record);
    Ok(out)
}

// ---------------------------------------------------------------- text

/// The first line is an `#ENVELOPE` header (not, say, an `#ENVELOPES` comment).
pub fn has_text_header(data: &[u8]) -> bool {
    let k = TEXT_KEYWORD.as_bytes();
    if data.len() < k.len() || &data[..k.len()] != k {
        return false;
    }
    matches!(data.get(k.len()), None | Some(b' ' | b'\n' | b'\r'))
}

/// Split an optional `#ENVELOPE` first line from the record.
pub fn decode_text(data: &[u8]) -> Result<TextMessage<'_>> {
    if !has_text_header(data) {
        return Ok(TextMessage {
            envelope: None,
            record: data,
        });
    }
    let (line, record) = match data.iter().position(|&b| b == b'\n') {
        Some(nl) => (&data[..nl], &data[nl + 1..]),
        None => (data, &data[data.len()..]),
    };
    let line = std::str::from_utf8(line).map_err(|_| {
        bad(
            "#ENVELOPE line is not valid UTF-8",
            "line 1",
            "write the header as UTF-8 text",
        )
    })?;
    let line = line.strip_suffix('\r').unwrap_or(line);
    Ok(TextMessage {
        envelope: Some(parse_text_header(line)?),
        record,
    })
}

const TEXT_KEYS: [&str; 4] = ["timestamp", "source", "trace_id", "sequence"];

/// Parse one `#ENVELOPE` line strictly (without its newline).
pub fn parse_text_header(line: &str) -> Result<LnmpEnvelope> {
    let rest = match line.strip_prefix(TEXT_KEYWORD) {
        Some(r) if r.is_empty() || r.starts_with(' ') => r,
        _ => return Err(bad("line does not start with '#ENVELOPE '", "line 1", "")),
    };
    let mut env = LnmpEnvelope::default();
    let mut seen: Vec<String> = Vec::new();
    for (key, value) in tokenize(rest)? {
        if key.is_empty() {
            return Err(bad(
                "#ENVELOPE has a pair with an empty key",
                "#ENVELOPE",
                "write key=value with a non-empty key",
            ));
        }
        if seen.contains(&key) {
            return Err(bad(
                format!("#ENVELOPE key {key:?} appears twice"),
                format!("#ENVELOPE {key}"),
                "give each key once",
            ));
        }
        seen.push(key.clone());
        match key.as_str() {
            "timestamp" => env.timestamp = Some(u64_text(&key, &value)?),
            "sequence" => env.sequence = Some(u64_text(&key, &value)?),
            "source" => env.source = Some(value),
            "trace_id" => env.trace_id = Some(value),
            _ => env.extra_keys.push((key, value)),
        }
    }
    env.extra_keys.sort();
    Ok(env)
}

fn u64_text(key: &str, value: &str) -> Result<u64> {
    let refuse = || {
        bad(
            format!("#ENVELOPE {key} is not an unsigned 64-bit decimal"),
            format!("#ENVELOPE {key}"),
            format!("write {key} as digits only"),
        )
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(refuse());
    }
    value.parse::<u64>().map_err(|_| refuse())
}

fn tokenize(body: &str) -> Result<Vec<(String, String)>> {
    let b = body.as_bytes();
    let n = b.len();
    let mut pairs = Vec::new();
    let mut i = 0usize;
    loop {
        while i < n && b[i] == b' ' {
            i += 1;
        }
        if i >= n {
            return Ok(pairs);
        }
        let eq = b[i..].iter().position(|&c| c == b'=');
        let sp = b[i..].iter().position(|&c| c == b' ');
        let eq = match (eq, sp) {
            (Some(e), Some(s)) if s < e => None,
            (e, _) => e,
        };
        let Some(eq) = eq.map(|e| e + i) else {
            return Err(bad(
                "#ENVELOPE token has no '='",
                format!("#ENVELOPE char {i}"),
                "write key=value pairs separated by spaces",
            ));
        };
        let key = &body[i..eq];
        if key.contains('"') {
            return Err(bad(
                "#ENVELOPE key contains a quote",
                format!("#ENVELOPE char {i}"),
                "keys are bare words; only values may be quoted",
            ));
        }
        i = eq + 1;
        let value = if i < n && b[i] == b'"' {
            let mut v: Vec<u8> = Vec::new();
            i += 1;
            loop {
                if i >= n {
                    return Err(bad(
                        format!("unterminated quoted value for {key:?}"),
                        format!("#ENVELOPE char {}", eq + 1),
                        "close the value with a double quote",
                    ));
                }
                match b[i] {
                    b'\\' => {
                        if i + 1 >= n || (b[i + 1] != b'\\' && b[i + 1] != b'"') {
                            return Err(bad(
                                format!("bad escape in the value of {key:?}"),
                                format!("#ENVELOPE char {i}"),
                                r#"only \\ and \" are escapes in #ENVELOPE values"#,
                            ));
                        }
                        v.push(b[i + 1]);
                        i += 2;
                    }
                    b'"' => {
                        i += 1;
                        break;
                    }
                    c => {
                        v.push(c);
                        i += 1;
                    }
                }
            }
            if i < n && b[i] != b' ' {
                return Err(bad(
                    format!("text after the closing quote of {key:?}"),
                    format!("#ENVELOPE char {i}"),
                    "separate pairs with a space",
                ));
            }
            // Only ASCII escapes were removed from valid UTF-8, so this cannot fail; mapped
            // to an error anyway rather than unwrapped.
            String::from_utf8(v).map_err(|_| bad("quoted value is not UTF-8", format!("#ENVELOPE {key}"), ""))?
        } else {
            let end = b[i..].iter().position(|&c| c == b' ').map_or(n, |e| e + i);
            let v = body[i..end].to_owned();
            i = end;
            v
        };
        pairs.push((key.to_owned(), value));
    }
}

fn quote_value(v: &str) -> String {
    if !v.contains(' ') && !v.starts_with('"') {
        return v.to_owned();
    }
    format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))
}

fn check_line(name: &str, v: &str) -> Result<()> {
    if v.contains(['\r', '\n']) {
        return Err(bad(
            format!("{name} contains a line break"),
            name.to_owned(),
            "the #ENVELOPE header is one line; remove CR/LF from the value",
        ));
    }
    Ok(())
}

/// The canonical `#ENVELOPE` line (no newline); `""` when `env` is empty.
pub fn encode_text_header(env: &LnmpEnvelope) -> Result<String> {
    if env.is_empty() {
        return Ok(String::new());
    }
    let mut parts = vec![TEXT_KEYWORD.to_owned()];
    if let Some(ts) = env.timestamp {
        parts.push(format!("timestamp={ts}"));
    }
    if let Some(s) = &env.source {
        check_line("source", s)?;
        parts.push(format!("source={}", quote_value(s)));
    }
    if let Some(s) = &env.trace_id {
        check_line("trace_id", s)?;
        parts.push(format!("trace_id={}", quote_value(s)));
    }
    if let Some(seq) = env.sequence {
        parts.push(format!("sequence={seq}"));
    }
    let mut extra = env.extra_keys.clone();
    extra.sort();
    let mut seen: Vec<&str> = Vec::new();
    for (k, v) in &extra {
        if k.is_empty()
            || k.contains([' ', '=', '"', '\r', '\n'])
            || TEXT_KEYS.contains(&k.as_str())
            || seen.contains(&k.as_str())
        {
            return Err(bad(
                format!("extra key {k:?} is empty, duplicated, known, or has a space, '=', quote or line break"),
                "extra_keys",
                "extra keys are bare words, each once",
            ));
        }
        seen.push(k);
        check_line(k, v)?;
        parts.push(format!("{k}={}", quote_value(v)));
    }
    Ok(parts.join(" "))
}

/// The header line, a newline and the record; the record alone without metadata.
pub fn encode_text(record: &[u8], env: &LnmpEnvelope) -> Result<Vec<u8>> {
    let h = encode_text_header(env)?;
    if h.is_empty() {
        return Ok(record.to_vec());
    }
    let mut out = Vec::with_capacity(h.len() + 1 + record.len());
    out.extend_from_slice(h.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(record);
    Ok(out)
}

// ---------------------------------------------------------------- mapping

/// A parsed W3C `traceparent` (the Python worker's `parse_traceparent` rules).
struct TraceParent {
    version: String,
    trace_id: String,
    parent_id: String,
    flags: u8,
}

fn is_hex_lc(s: &str) -> bool {
    s.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

const ZERO_TRACE: &str = "00000000000000000000000000000000";
const ZERO_SPAN: &str = "0000000000000000";

fn parse_traceparent(value: &str) -> Option<TraceParent> {
    if !value.is_ascii() {
        return None;
    }
    let text = value.trim_matches([' ', '\t']);
    let n = text.len();
    if !(55..=512).contains(&n) {
        return None;
    }
    let version = &text[0..2];
    let b = text.as_bytes();
    if b[2] != b'-' || !is_hex_lc(version) || version == "ff" || (version == "00" && n != 55) {
        return None;
    }
    let (tid, pid, flags) = (&text[3..35], &text[36..52], &text[53..55]);
    if b[35] != b'-' || b[52] != b'-' || (n > 55 && b[55] != b'-') {
        return None;
    }
    if !is_hex_lc(tid) || !is_hex_lc(pid) || !is_hex_lc(flags) || tid == ZERO_TRACE || pid == ZERO_SPAN {
        return None;
    }
    Some(TraceParent {
        version: version.to_owned(),
        trace_id: tid.to_owned(),
        parent_id: pid.to_owned(),
        flags: u8::from_str_radix(flags, 16).ok()?,
    })
}

impl TraceParent {
    fn propagated(&self) -> u8 {
        if self.version == "00" {
            self.flags & 0x03
        } else {
            self.flags & 0x01
        }
    }
    fn header(&self) -> String {
        format!("00-{}-{}-{:02x}", self.trace_id, self.parent_id, self.propagated())
    }
}

fn is_trace_id32(s: &str) -> bool {
    s.len() == 32 && is_hex_lc(s) && s != ZERO_TRACE
}

fn observability(env: &mut Envelope) -> &mut v1::ObservabilityContext {
    env.header.observability.get_or_insert_with(Default::default)
}

fn metadata_mut(env: &mut Envelope) -> &mut v1::PrismMetadata {
    env.header.metadata.get_or_insert_with(Default::default)
}

/// Copy LNMP envelope metadata onto `env` (the mapping table of docs/formats.md, strict mode).
pub fn apply_metadata(env: &mut Envelope, meta: &LnmpEnvelope) -> Result<()> {
    if let Some(ts) = meta.timestamp {
        if !(1..=MAX_MS).contains(&ts) {
            return Err(bad(
                format!("LNMP timestamp {ts} is not a usable publish time"),
                "timestamp",
                "send Unix epoch milliseconds between 1 and 2^63-1",
            ));
        }
        metadata_mut(env).published_at_ms = ts as i64;
    }
    if let Some(s) = meta.source.as_ref().filter(|s| !s.is_empty()) {
        env.security_mut().publisher_id = Some(s.clone());
    }
    if let Some(tid) = &meta.trace_id {
        let keep = if let Some(tp) = parse_traceparent(tid) {
            let o = observability(env);
            o.trace_id.clone_from(&tp.trace_id);
            o.span_id.clone_from(&tp.parent_id);
            o.trace_flags = i32::from(tp.propagated());
            tp.header() != *tid
        } else if is_trace_id32(tid) {
            observability(env).trace_id.clone_from(tid);
            false
        } else {
            true
        };
        if keep {
            env.header
                .extensions
                .insert(EXT_TRACE_ID.into(), tid.as_bytes().to_vec());
        }
    }
    if let Some(seq) = meta.sequence {
        env.header
            .extensions
            .insert(EXT_SEQUENCE.into(), seq.to_be_bytes().to_vec());
    }
    if !meta.extra_tlv.is_empty() {
        let tlv = encode_tlv(&LnmpEnvelope {
            extra_tlv: meta.extra_tlv.clone(),
            ..Default::default()
        })?;
        env.header.extensions.insert(EXT_TLV.into(), tlv);
    }
    if !meta.extra_keys.is_empty() {
        let line = encode_text_header(&LnmpEnvelope {
            extra_keys: meta.extra_keys.clone(),
            ..Default::default()
        })?;
        let keys = line.as_bytes()[TEXT_KEYWORD.len() + 1..].to_vec();
        env.header.extensions.insert(EXT_TEXT_KEYS.into(), keys);
    }
    Ok(())
}

fn with_record(record: &[u8], content_type: &str) -> Envelope {
    let mut env = Envelope {
        payload: Some(Payload {
            type_url: String::new(),
            value: record.to_vec(),
        }),
        ..Default::default()
    };
    model::set_content_type(metadata_mut(&mut env), content_type);
    env
}

/// Map any LNMP message - a container, an `#ENVELOPE` text, or a bare record - to a Prism
/// envelope, strictly (Python's `decode_message(strict=True)`). Topic, namespace and ids are
/// still to be filled by the caller.
pub fn to_envelope(data: &[u8]) -> Result<Envelope> {
    if is_container(data) {
        let c = decode_container(data)?;
        let mut env = with_record(c.record, CONTENT_TYPE_BINARY);
        if c.mode != MODE_BINARY {
            env.header.extensions.insert(EXT_MODE.into(), vec![c.mode]);
        }
        if c.flags != 0 {
            env.header
                .extensions
                .insert(EXT_FLAGS.into(), c.flags.to_be_bytes().to_vec());
        }
        if !c.mode_metadata.is_empty() {
            env.header
                .extensions
                .insert(EXT_MODE_METADATA.into(), c.mode_metadata.clone());
        }
        if let Some(meta) = &c.envelope {
            apply_metadata(&mut env, meta)?;
        }
        return Ok(env);
    }
    let t = decode_text(data)?;
    let mut env = with_record(t.record, CONTENT_TYPE_TEXT);
    match &t.envelope {
        Some(meta) => apply_metadata(&mut env, meta)?,
        None if std::str::from_utf8(data).is_err() => {
            // A bare binary record.
            model::set_content_type(metadata_mut(&mut env), CONTENT_TYPE_BINARY);
        }
        None => {}
    }
    Ok(env)
}

fn ext_u64(env: &Envelope, key: &str) -> Result<Option<u64>> {
    match env.header.extensions.get(key) {
        None => Ok(None),
        Some(raw) if raw.len() == 8 => Ok(Some(be_u64(raw))),
        Some(raw) => Err(bad(
            format!("extensions[{key:?}] is {} bytes, must be 8 (u64 big-endian)", raw.len()),
            format!("extensions.{key}"),
            "",
        )),
    }
}

fn ext_utf8<'e>(env: &'e Envelope, key: &str) -> Result<Option<&'e str>> {
    match env.header.extensions.get(key) {
        None => Ok(None),
        Some(raw) => std::str::from_utf8(raw).map(Some).map_err(|_| {
            bad(
                format!("extensions[{key:?}] is not UTF-8"),
                format!("extensions.{key}"),
                "",
            )
        }),
    }
}

/// The LNMP envelope metadata of a Prism envelope (the inverse of [`apply_metadata`]).
pub fn metadata(env: &Envelope) -> Result<LnmpEnvelope> {
    let mut out = LnmpEnvelope::default();
    let ts = env.metadata().map_or(0, |m| m.published_at_ms);
    if ts != 0 {
        out.timestamp = Some(u64::try_from(ts).map_err(|_| {
            bad(
                "published_at_ms is negative: not an LNMP timestamp",
                "metadata.published_at_ms",
                "",
            )
        })?);
    }
    out.source = env
        .security()
        .and_then(|s| s.publisher_id.clone())
        .filter(|s| !s.is_empty());
    if let Some(t) = ext_utf8(env, EXT_TRACE_ID)? {
        out.trace_id = Some(t.to_owned());
    } else if let Some(o) = &env.header.observability {
        let flags = u8::try_from(o.trace_flags).ok();
        let valid_span = o.span_id.len() == 16 && is_hex_lc(&o.span_id) && o.span_id != ZERO_SPAN;
        if let (Some(flags), true, true) = (flags, is_trace_id32(&o.trace_id), valid_span) {
            let tp = TraceParent {
                version: "00".into(),
                trace_id: o.trace_id.clone(),
                parent_id: o.span_id.clone(),
                flags,
            };
            out.trace_id = Some(tp.header());
        } else if !o.trace_id.is_empty() {
            out.trace_id = Some(o.trace_id.clone());
        }
    }
    out.sequence = ext_u64(env, EXT_SEQUENCE)?;
    if let Some(raw) = env.header.extensions.get(EXT_TLV) {
        out.extra_tlv = decode_tlv(raw)?.extra_tlv;
    }
    if let Some(keys) = ext_utf8(env, EXT_TEXT_KEYS)? {
        out.extra_keys = parse_text_header(&format!("{TEXT_KEYWORD} {keys}"))?.extra_keys;
    }
    Ok(out)
}

/// Write an envelope as an LNMP message, canonically: the text form when its content type is
/// `text/lnmp` (or `text/x-lnmp`), else a container. The record is the plaintext payload
/// (decompressed); an encrypted payload is refused (decrypt first), so ciphertext never
/// leaves as an LNMP record.
pub fn from_envelope(env: &Envelope) -> Result<Vec<u8>> {
    let ct = env
        .content_type()
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let record = if env.payload.is_none() && !env.is_encrypted() {
        std::borrow::Cow::Borrowed(&[][..])
    } else {
        env.payload_bytes()?
    };
    let meta = metadata(env)?;
    if ct == CONTENT_TYPE_TEXT || ct == "text/x-lnmp" {
        return encode_text(&record, &meta);
    }
    let exts = &env.header.extensions;
    let mode = match exts.get(EXT_MODE) {
        None => MODE_BINARY,
        Some(raw) if raw.len() == 1 => raw[0],
        Some(_) => {
            return Err(bad(
                "extensions['lnmp.mode'] must be 1 byte",
                "extensions.lnmp.mode",
                "",
            ))
        }
    };
    let flags = match exts.get(EXT_FLAGS) {
        None => 0,
        Some(raw) if raw.len() == 2 => be_u16(raw),
        Some(_) => {
            return Err(bad(
                "extensions['lnmp.flags'] must be 2 bytes",
                "extensions.lnmp.flags",
                "",
            ))
        }
    };
    encode_container(&Container {
        record: &record,
        envelope: Some(meta),
        mode,
        flags,
        mode_metadata: exts.get(EXT_MODE_METADATA).cloned().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_of_a_built_message() {
        let meta = LnmpEnvelope {
            timestamp: Some(1_767_225_600_123),
            source: Some("svc \"o\" \\ x".into()),
            trace_id: Some("req-1".into()),
            sequence: Some(u64::MAX),
            extra_tlv: vec![(0x20, vec![1, 2])],
            extra_keys: vec![],
        };
        let bin = encode_container(&Container {
            record: b"F1=1",
            envelope: Some(meta.clone()),
            mode: MODE_BINARY,
            flags: 0,
            mode_metadata: vec![],
        })
        .unwrap();
        let env = to_envelope(&bin).unwrap();
        assert_eq!(from_envelope(&env).unwrap(), bin);
        let text = encode_text(
            b"F1=1\n",
            &LnmpEnvelope {
                extra_tlv: vec![],
                ..meta
            },
        )
        .unwrap();
        let env = to_envelope(&text).unwrap();
        assert_eq!(form_of(&text), Form::Text);
        assert_eq!(from_envelope(&env).unwrap(), text);
    }

    #[test]
    fn hostile_lengths_are_refused_not_allocated() {
        let mut c = b"LNMP\x01\x02\x80\x00\xff\xff\xff\xff".to_vec();
        c.extend_from_slice(&[0u8; 4]);
        assert!(matches!(to_envelope(&c), Err(PrismError::Lnmp(_))));
        let mut c = b"LNMP\x01\x02\x80\x00\x00\x00\x00\x03".to_vec();
        c.extend_from_slice(&[0x20, 0xff, 0xff]);
        assert!(matches!(to_envelope(&c), Err(PrismError::Lnmp(_))));
    }

    /// As in Python: an `#ENVELOPE` line without pairs carries nothing, so it is not written
    /// back, and the record alone may then read as another form (found by cargo fuzz).
    #[test]
    fn an_empty_header_line_is_not_written_back() {
        let data = b"#ENVELOPE \n#ENVELOPE source=x\nF1=1\n";
        let env = to_envelope(data).unwrap();
        assert_eq!(env.payload.as_ref().unwrap().value, b"#ENVELOPE source=x\nF1=1\n");
        let out = from_envelope(&env).unwrap();
        assert_eq!(out, b"#ENVELOPE source=x\nF1=1\n");
        let again = to_envelope(&out).unwrap();
        assert_eq!(again.security().unwrap().publisher_id.as_deref(), Some("x"));
    }

    #[test]
    fn encrypted_payload_is_not_written_as_a_record() {
        let mut env = to_envelope(b"F1=1").unwrap();
        env.security_mut().encryption = Some(Default::default());
        assert!(matches!(from_envelope(&env), Err(PrismError::Payload(_))));
    }
}
