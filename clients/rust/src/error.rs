//! Every failure on bad input is a `PrismError`: what went wrong, where, and how to fix it.
//!
//! The variants mirror the Python SDK's `PrismError` subclasses (app/errors.py), and
//! [`PrismError::reason`] gives the same DLQ reason strings (`bad_signature`, ...), so a
//! Rust consumer and a Python one report a hostile envelope the same way.

use std::fmt;

/// What went wrong, where (a field path or byte offset) and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detail {
    pub what: String,
    pub at: String,
    pub hint: String,
}

impl Detail {
    pub fn new(what: impl Into<String>, at: impl Into<String>, hint: impl Into<String>) -> Self {
        Detail {
            what: what.into(),
            at: at.into(),
            hint: hint.into(),
        }
    }
}

impl fmt::Display for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)?;
        if !self.at.is_empty() {
            write!(f, " (at {})", self.at)?;
        }
        if !self.hint.is_empty() {
            write!(f, "; {}", self.hint)?;
        }
        Ok(())
    }
}

/// The one error type of the crate. No function of this crate panics on bad input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrismError {
    /// The bytes are not protobuf, or not an envelope (truncated, bad lengths, bad wire types).
    #[error("malformed envelope: {0}")]
    Malformed(Detail),
    /// The input ends inside a record (a varint, a length-delimited value or a fixed-width value).
    #[error("truncated envelope: {0}")]
    Truncated(Detail),
    /// Over `Limits` (message or header size).
    #[error("size limit: {0}")]
    SizeLimit(Detail),
    /// The layout cannot be told (empty input) or is not the one asked for.
    #[error("layout: {0}")]
    Layout(Detail),
    /// The payload cannot be read as asked (wrong type_url, bad JSON, encrypted, compressed).
    #[error("payload: {0}")]
    Payload(Detail),
    /// A required field is missing or out of range.
    #[error("invalid envelope: {0}")]
    Validation(Detail),
    /// Missing where required, or does not match (forged, or changed after signing).
    #[error("bad signature: {0}")]
    BadSignature(Detail),
    /// The named key is not trusted.
    #[error("unknown key: {0}")]
    UnknownKey(Detail),
    /// Legacy scope, not accepted by policy.
    #[error("legacy signature scope: {0}")]
    LegacySignatureScope(Detail),
    /// `signature_scope` other than 0, 2, 3 or 4.
    #[error("unsupported signature scope: {0}")]
    UnsupportedSignatureScope(Detail),
    /// Repeated or mistyped singular records (docs/signing.md steps 2 and 3).
    #[error("ambiguous envelope: {0}")]
    AmbiguousEnvelope(Detail),
    /// An entry of the top-level `extensions` map holds more than a key and a value (a third
    /// field, a key or value of another wire type): protobuf runtimes read it differently, so
    /// a layout change refuses it (docs/formats.md, "Map entries that hold more than a key and
    /// a value").
    #[error("ambiguous map entry: {0}")]
    AmbiguousMapEntry(Detail),
    /// Deprecated, unknown or disallowed algorithm (signing or encryption).
    #[error("algorithm: {0}")]
    Algorithm(Detail),
    /// Anything wrong with ciphertext, tag, iv, aad, encapsulated key, params or key material.
    #[error("decryption failed: {0}")]
    Decryption(Detail),
    /// The payload cannot be encrypted (already encrypted, bad key).
    #[error("encryption failed: {0}")]
    Encryption(Detail),
    /// A key that exists but cannot be used as asked (wrong type, public-only, bad length).
    #[error("key not usable: {0}")]
    KeyNotUsable(Detail),
    /// Classification clearance or another consumer policy refused the message.
    #[error("policy: {0}")]
    Policy(Detail),
    /// Configuration the caller gave is inconsistent (keyring files, options).
    #[error("config: {0}")]
    Config(Detail),
    /// A transport (Kafka, HTTP) failed.
    #[error("transport: {0}")]
    Transport(Detail),
    /// The schema registry refused or could not be reached.
    #[error("schema registry: {0}")]
    Registry(Detail),
    /// An LNMP container, `#ENVELOPE` header or mapping that breaks the LNMP envelope spec
    /// (strict mode, as the Python worker reads it).
    #[error("bad LNMP: {0}")]
    Lnmp(Detail),
}

impl PrismError {
    /// The DLQ reason string (`prism.errors.reason`) Python uses for the same failure.
    pub fn reason(&self) -> &'static str {
        match self {
            PrismError::Malformed(_) => "malformed_envelope",
            PrismError::Truncated(_) => "truncated",
            PrismError::SizeLimit(_) => "too_large",
            PrismError::Layout(_) => "unknown_layout",
            PrismError::Payload(_) => "payload_error",
            PrismError::Validation(_) => "invalid_envelope",
            PrismError::BadSignature(_) => "bad_signature",
            PrismError::UnknownKey(_) => "unknown_key",
            PrismError::LegacySignatureScope(_) => "legacy_signature_scope",
            PrismError::UnsupportedSignatureScope(_) => "unsupported_signature_scope",
            PrismError::AmbiguousEnvelope(_) => "ambiguous_envelope",
            PrismError::AmbiguousMapEntry(_) => "ambiguous_map_entry",
            PrismError::Algorithm(_) => "algorithm_not_allowed",
            PrismError::Decryption(_) => "decryption_failed",
            PrismError::Encryption(_) => "encryption_failed",
            PrismError::KeyNotUsable(_) => "key_not_usable",
            PrismError::Policy(_) => "policy_violation",
            PrismError::Config(_) => "bad_config",
            PrismError::Transport(_) => "broker_error",
            PrismError::Registry(_) => "schema_registry_error",
            PrismError::Lnmp(_) => "bad_lnmp",
        }
    }

    /// The detail (what, where, how to fix) of any variant.
    pub fn detail(&self) -> &Detail {
        match self {
            PrismError::Malformed(d)
            | PrismError::Truncated(d)
            | PrismError::SizeLimit(d)
            | PrismError::Layout(d)
            | PrismError::Payload(d)
            | PrismError::Validation(d)
            | PrismError::BadSignature(d)
            | PrismError::UnknownKey(d)
            | PrismError::LegacySignatureScope(d)
            | PrismError::UnsupportedSignatureScope(d)
            | PrismError::AmbiguousEnvelope(d)
            | PrismError::AmbiguousMapEntry(d)
            | PrismError::Algorithm(d)
            | PrismError::Decryption(d)
            | PrismError::Encryption(d)
            | PrismError::KeyNotUsable(d)
            | PrismError::Policy(d)
            | PrismError::Config(d)
            | PrismError::Transport(d)
            | PrismError::Registry(d)
            | PrismError::Lnmp(d) => d,
        }
    }
}

pub type Result<T> = std::result::Result<T, PrismError>;

macro_rules! err {
    ($variant:ident, $what:expr, $at:expr, $hint:expr) => {
        $crate::error::PrismError::$variant($crate::error::Detail::new($what, $at, $hint))
    };
}
pub(crate) use err;
