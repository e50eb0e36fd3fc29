//! Envelope signatures: HMAC-SHA256 and Ed25519 in the v2, pair and batch scopes, and the
//! legacy scope refused unless explicitly accepted (docs/signing.md is the specification;
//! this is the Rust twin of `app/security/signing.py`).
//!
//! The signed message is always cut from the bytes exactly as received: nothing is decoded
//! and re-encoded, because protobuf encodings are not canonical.

use ed25519_dalek::{Signer, Verifier};
use hmac::{Hmac, Mac};
use prost::Message;
use sha2::{Digest, Sha256};

use crate::codec::{encode_parts, layout_of_records, Layout};
use crate::error::{err, PrismError, Result};
use crate::gen::{draft, v1};
use crate::model::Envelope;
use crate::wire::{self, Record, LEN, VARINT};

pub const SCOPE_LEGACY: u64 = 0;
pub const SCOPE_V2: u64 = 2;
pub const SCOPE_PAIR: u64 = 3;
pub const SCOPE_BATCH: u64 = 4;
pub const HMAC_SHA256: &str = "hmac-sha256";
pub const ED25519: &str = "ed25519";
/// HMAC secrets shorter than this are refused.
pub const MIN_HMAC_KEY_BYTES: usize = 32;
/// Largest batch one batch-scope signature may cover (a path of at most 16 hashes).
pub const MAX_TREE_SIZE: u64 = 65_536;
pub const DIGEST_BYTES: usize = 32;

pub const SCOPE_V2_CONTEXT_DRAFT: &[u8] = b"prism-envelope-signature/v2/draft\x00";
pub const SCOPE_V2_CONTEXT_REVIEWED: &[u8] = b"prism-envelope-signature/v2/reviewed\x00";
pub const SCOPE_PAIR_CONTEXT: &[u8] = b"prism-envelope-signature/pair\x00";
pub const SCOPE_BATCH_CONTEXT: &[u8] = b"prism-envelope-signature/batch\x00";

const F_AUTH_TOKEN: u32 = 3;
pub(crate) const F_SIGNATURE: u32 = 4;
const F_SCOPE: u32 = 10;
pub(crate) const F_SIBLING: u32 = 11;
pub(crate) const F_TREE_INDEX: u32 = 12;
pub(crate) const F_TREE_SIZE: u32 = 13;
pub(crate) const F_TREE_PATH: u32 = 14;
const CUT_V2: &[u32] = &[F_AUTH_TOKEN, F_SIGNATURE];
const CUT_PAIR: &[u32] = &[F_AUTH_TOKEN, F_SIGNATURE, F_SIBLING];
const CUT_BATCH: &[u32] = &[
    F_AUTH_TOKEN,
    F_SIGNATURE,
    F_SIBLING,
    F_TREE_INDEX,
    F_TREE_SIZE,
    F_TREE_PATH,
];

const SEC_NAMES: [&str; 15] = [
    "",
    "publisher_id",
    "publisher_team",
    "auth_token",
    "signature",
    "signature_algorithm",
    "encryption",
    "contains_pii",
    "data_classification",
    "signature_key_id",
    "signature_scope",
    "sibling_digest",
    "tree_index",
    "tree_size",
    "tree_path",
];

fn sec_wire_type(field: u32) -> Option<u8> {
    match field {
        1..=6 | 8 | 9 | 11 | 14 => Some(LEN),
        7 | 10 | 12 | 13 => Some(VARINT),
        _ => None,
    }
}

fn top_singular(lay: Layout, field: u32) -> Option<(&'static str, u8)> {
    match (lay, field) {
        (Layout::Draft, 1) => Some(("envelope_version", VARINT)),
        (Layout::Draft, 2) => Some(("metadata", LEN)),
        (Layout::Draft, 3) => Some(("payload", LEN)),
        (Layout::Draft, 4) => Some(("security", LEN)),
        (Layout::Draft, 5) => Some(("observability", LEN)),
        (Layout::Draft, 6) => Some(("schema", LEN)),
        (Layout::Reviewed, 1) => Some(("metadata", LEN)),
        (Layout::Reviewed, 2) => Some(("security", LEN)),
        (Layout::Reviewed, 3) => Some(("observability", LEN)),
        (Layout::Reviewed, 4) => Some(("schema", LEN)),
        (Layout::Reviewed, 99) => Some(("payload", LEN)),
        _ => None,
    }
}

/// A key that signs. Debug output never shows key material.
#[derive(Clone)]
pub enum SigningKey {
    Hmac {
        key_id: String,
        secret: Vec<u8>,
    },
    Ed25519 {
        key_id: String,
        key: ed25519_dalek::SigningKey,
    },
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({}, {})", self.key_id(), self.algorithm())
    }
}

impl SigningKey {
    /// An HMAC-SHA256 key; the secret must be at least 32 bytes.
    pub fn hmac_sha256(key_id: impl Into<String>, secret: &[u8]) -> Result<Self> {
        let key_id = key_id.into();
        if secret.len() < MIN_HMAC_KEY_BYTES {
            return Err(err!(
                Algorithm,
                format!(
                    "HMAC key {key_id:?} is {} bytes; at least {MIN_HMAC_KEY_BYTES} required",
                    secret.len()
                ),
                "key",
                "generate 32 random bytes"
            ));
        }
        Ok(SigningKey::Hmac {
            key_id,
            secret: secret.to_vec(),
        })
    }
    /// An Ed25519 key from its 32-byte seed (RFC 8032 private key).
    pub fn ed25519_from_seed(key_id: impl Into<String>, seed: &[u8]) -> Result<Self> {
        let seed: [u8; 32] = seed.try_into().map_err(|_| {
            err!(
                KeyNotUsable,
                format!("an Ed25519 seed is 32 bytes, not {}", seed.len()),
                "key",
                "pass the 32-byte seed"
            )
        })?;
        Ok(SigningKey::Ed25519 {
            key_id: key_id.into(),
            key: ed25519_dalek::SigningKey::from_bytes(&seed),
        })
    }
    pub fn key_id(&self) -> &str {
        match self {
            SigningKey::Hmac { key_id, .. } | SigningKey::Ed25519 { key_id, .. } => key_id,
        }
    }
    pub fn algorithm(&self) -> &'static str {
        match self {
            SigningKey::Hmac { .. } => HMAC_SHA256,
            SigningKey::Ed25519 { .. } => ED25519,
        }
    }
    pub fn verification_key(&self) -> VerificationKey {
        match self {
            SigningKey::Hmac { key_id, secret } => VerificationKey::Hmac {
                key_id: key_id.clone(),
                secret: secret.clone(),
            },
            SigningKey::Ed25519 { key_id, key } => VerificationKey::Ed25519 {
                key_id: key_id.clone(),
                key: key.verifying_key(),
            },
        }
    }
    fn sign_message(&self, m: &[u8]) -> Vec<u8> {
        match self {
            SigningKey::Hmac { secret, .. } => mac(secret, m),
            SigningKey::Ed25519 { key, .. } => key.sign(m).to_bytes().to_vec(),
        }
    }
}

fn mac(secret: &[u8], m: &[u8]) -> Vec<u8> {
    // new_from_slice accepts every key length (HMAC hashes long keys), so this never fails.
    let mut h = <Hmac<Sha256> as Mac>::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
    h.update(m);
    h.finalize().into_bytes().to_vec()
}

/// A key that verifies. Debug output never shows key material.
#[derive(Clone)]
pub enum VerificationKey {
    Hmac {
        key_id: String,
        secret: Vec<u8>,
    },
    Ed25519 {
        key_id: String,
        key: ed25519_dalek::VerifyingKey,
    },
}

impl std::fmt::Debug for VerificationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerificationKey({}, {})", self.key_id(), self.algorithm())
    }
}

impl VerificationKey {
    /// An Ed25519 public key (32 bytes).
    pub fn ed25519_public(key_id: impl Into<String>, public: &[u8]) -> Result<Self> {
        let bad = || {
            err!(
                KeyNotUsable,
                "not a valid 32-byte Ed25519 public key",
                "key",
                "pass the raw public key"
            )
        };
        let arr: [u8; 32] = public.try_into().map_err(|_| bad())?;
        let key = ed25519_dalek::VerifyingKey::from_bytes(&arr).map_err(|_| bad())?;
        Ok(VerificationKey::Ed25519 {
            key_id: key_id.into(),
            key,
        })
    }
    pub fn key_id(&self) -> &str {
        match self {
            VerificationKey::Hmac { key_id, .. } | VerificationKey::Ed25519 { key_id, .. } => key_id,
        }
    }
    pub fn algorithm(&self) -> &'static str {
        match self {
            VerificationKey::Hmac { .. } => HMAC_SHA256,
            VerificationKey::Ed25519 { .. } => ED25519,
        }
    }
    fn verifies(&self, m: &[u8], signature: &[u8]) -> bool {
        match self {
            VerificationKey::Hmac { secret, .. } => {
                let mut h = <Hmac<Sha256> as Mac>::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
                h.update(m);
                h.verify_slice(signature).is_ok() // constant time
            }
            VerificationKey::Ed25519 { key, .. } => match ed25519_dalek::Signature::from_slice(signature) {
                Ok(sig) => key.verify(m, &sig).is_ok(),
                Err(_) => false,
            },
        }
    }
}

/// The trusted keys of a verifier, and whether it accepts the legacy scope (default: no).
///
/// It also remembers successful batch-scope verifications (at most [`BATCH_CACHE_ENTRIES`]):
/// every copy of a worker batch rebuilds the same statement and carries the same signature, so
/// a consumer pays one signature check per batch, not per message (docs/signing.md, "The
/// verification cache"). An entry is keyed by everything verified (algorithm, the key id the
/// envelope names, the statement, the signature); only successes are stored, and changing the
/// keys (`add`) empties it.
#[derive(Debug, Default)]
pub struct VerificationKeys {
    keys: Vec<VerificationKey>,
    pub accept_legacy_scope: bool,
    verified: std::sync::Mutex<BatchCache>,
}

/// Entries of the batch verification cache (Python's is 1,024 too).
pub const BATCH_CACHE_ENTRIES: usize = 1024;

#[derive(Debug, Default)]
struct BatchCache {
    map: std::collections::HashMap<Vec<u8>, (String, u64)>,
    tick: u64,
}

impl BatchCache {
    fn get(&mut self, entry: &[u8]) -> Option<String> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(entry).map(|(k, t)| {
            *t = tick;
            k.clone()
        })
    }
    fn put(&mut self, entry: Vec<u8>, key_id: String) {
        self.tick += 1;
        if self.map.len() >= BATCH_CACHE_ENTRIES && !self.map.contains_key(&entry) {
            // evict the least recently used (a linear scan of 1,024 entries, only on a miss that fills)
            if let Some(old) = self.map.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| k.clone()) {
                self.map.remove(&old);
            }
        }
        self.map.insert(entry, (key_id, self.tick));
    }
}

impl Clone for VerificationKeys {
    fn clone(&self) -> Self {
        VerificationKeys {
            keys: self.keys.clone(),
            accept_legacy_scope: self.accept_legacy_scope,
            verified: Default::default(),
        }
    }
}

impl VerificationKeys {
    pub fn new(keys: impl IntoIterator<Item = VerificationKey>) -> Self {
        VerificationKeys {
            keys: keys.into_iter().collect(),
            accept_legacy_scope: false,
            verified: Default::default(),
        }
    }
    /// Accept legacy-scope signatures: a downgrade risk (docs/signing.md, `accept_legacy_scope`).
    pub fn accepting_legacy_scope(mut self, accept: bool) -> Self {
        self.accept_legacy_scope = accept;
        self
    }
    pub fn add(&mut self, key: VerificationKey) {
        self.keys.retain(|k| k.key_id() != key.key_id());
        self.keys.push(key);
        self.verified
            .get_mut()
            .map(|c| c.map.clear())
            .unwrap_or_else(|p| p.into_inner().map.clear());
    }
    fn candidates(&self, key_id: &str, algorithm: &str) -> Result<Vec<&VerificationKey>> {
        if !key_id.is_empty() {
            let k = self.keys.iter().find(|k| k.key_id() == key_id).ok_or_else(|| {
                err!(
                    UnknownKey,
                    format!("signature key {key_id:?} is not in the verifier's keyring"),
                    "security.signature_key_id",
                    "add the producer's verification key to the keyring"
                )
            })?;
            if k.algorithm() != algorithm {
                return Err(err!(
                    BadSignature,
                    format!(
                        "key {key_id:?} is a {} key but the envelope says {algorithm}",
                        k.algorithm()
                    ),
                    "security.signature_algorithm",
                    "the envelope was changed, or the key is misconfigured"
                ));
            }
            return Ok(vec![k]);
        }
        let found: Vec<_> = self.keys.iter().filter(|k| k.algorithm() == algorithm).collect();
        if found.is_empty() {
            return Err(err!(
                UnknownKey,
                format!("no {algorithm} key configured and the envelope names none"),
                "security.signature_key_id",
                "add a key of that algorithm"
            ));
        }
        Ok(found)
    }
}

/// Who signed, with what, in which scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureInfo {
    pub key_id: String,
    pub algorithm: String,
    pub scope: u64,
}

/// The security record of received bytes, after the ambiguity checks (steps 2 and 3).
struct SecRecord {
    rec: Record,
    inner: Vec<Record>,
    scope: u64,
}

fn ambiguous(what: String, at: usize, hint: &str) -> PrismError {
    err!(AmbiguousEnvelope, what, format!("byte {at}"), hint)
}

/// Why the security record of received bytes cannot be told unambiguously (docs/signing.md,
/// steps 1-3), with the numbers as read, so each SDK words it in its own error type: this crate
/// as `PrismError::AmbiguousEnvelope` ([`security_record`]), the Python worker's compiled path
/// (`clients/rust/python`) as the `AmbiguousEnvelopeError` texts of `app/security/signing.py`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityFault {
    /// The security record's own records cannot be walked.
    Wire(wire::WireFault),
    /// A singular top-level field appears twice; `at` is the second one's start.
    RepeatedField { field: u32, at: usize },
    /// A singular top-level field has another wire type than its own.
    WrongWireType {
        field: u32,
        wire_type: u8,
        expected: u8,
        at: usize,
    },
    /// A known security-context field appears twice.
    RepeatedSecurityField { field: u32, at: usize },
    /// A known security-context field has another wire type than its own.
    WrongSecurityWireType {
        field: u32,
        wire_type: u8,
        expected: u8,
        at: usize,
    },
}

/// The one security record of received bytes, its records, and the declared scope (the
/// varint's full value; 0, legacy, when absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecurityRecord {
    pub rec: Record,
    pub inner: Vec<Record>,
    pub scope: u128,
}

/// Find the security record among `records` (`wire::scan` of `data`) after the ambiguity
/// checks of docs/signing.md (steps 2 and 3); `None` when there is none.
pub fn locate_security_record(
    data: &[u8],
    records: &[Record],
    lay: Layout,
) -> std::result::Result<Option<SecurityRecord>, SecurityFault> {
    let mut seen: Vec<u32> = Vec::new();
    let mut sec: Option<Record> = None;
    for r in records {
        let Some((_, wt)) = top_singular(lay, r.field) else {
            continue;
        };
        if seen.contains(&r.field) {
            return Err(SecurityFault::RepeatedField {
                field: r.field,
                at: r.start,
            });
        }
        if r.wire_type != wt {
            return Err(SecurityFault::WrongWireType {
                field: r.field,
                wire_type: r.wire_type,
                expected: wt,
                at: r.start,
            });
        }
        seen.push(r.field);
        if r.field == lay.security_field() {
            sec = Some(*r);
        }
    }
    let Some(rec) = sec else { return Ok(None) };
    let inner = wire::walk(data, rec.value_start, rec.end).map_err(SecurityFault::Wire)?;
    let mut fields: Vec<u32> = Vec::new();
    let mut scope = u128::from(SCOPE_LEGACY);
    for r in &inner {
        let Some(expected) = sec_wire_type(r.field) else {
            continue;
        };
        if fields.contains(&r.field) {
            return Err(SecurityFault::RepeatedSecurityField {
                field: r.field,
                at: r.start,
            });
        }
        if r.wire_type != expected {
            return Err(SecurityFault::WrongSecurityWireType {
                field: r.field,
                wire_type: r.wire_type,
                expected,
                at: r.start,
            });
        }
        fields.push(r.field);
        if r.field == F_SCOPE {
            scope = wire::read_varint_wide(data, r.value_start, r.end)
                .map_err(SecurityFault::Wire)?
                .0;
        }
    }
    Ok(Some(SecurityRecord { rec, inner, scope }))
}

impl SecurityFault {
    /// This crate's wording (the texts the Python worker uses too).
    fn into_error(self, lay: Layout) -> PrismError {
        let top = |field| top_singular(lay, field).map_or("", |(name, _)| name);
        match self {
            SecurityFault::Wire(f) => f.into(),
            SecurityFault::RepeatedField { field, at } => ambiguous(
                format!(
                    "{} (field {field}) appears more than once in the envelope; protobuf would merge \
                the copies, so what was signed and what is read could differ",
                    top(field)
                ),
                at,
                "a producer writes each context once; a second copy was appended or the encoder is broken",
            ),
            SecurityFault::WrongWireType {
                field,
                wire_type,
                expected,
                at,
            } => ambiguous(
                format!(
                    "{} (field {field}) has wire type {wire_type}, not {expected}",
                    top(field)
                ),
                at,
                "the bytes are not an envelope of this layout",
            ),
            SecurityFault::RepeatedSecurityField { field, at } => ambiguous(
                format!(
                    "security.{} appears more than once in the security context",
                    SEC_NAMES[field as usize]
                ),
                at,
                "each security field is written once",
            ),
            SecurityFault::WrongSecurityWireType {
                field,
                wire_type,
                expected,
                at,
            } => ambiguous(
                format!(
                    "security.{} has wire type {wire_type}, not {expected}",
                    SEC_NAMES[field as usize]
                ),
                at,
                "the security context is malformed",
            ),
        }
    }
}

fn security_record(data: &[u8], records: &[Record], lay: Layout) -> Result<Option<SecRecord>> {
    let found = locate_security_record(data, records, lay).map_err(|f| f.into_error(lay))?;
    Ok(found.map(|s| SecRecord {
        rec: s.rec,
        inner: s.inner,
        scope: u64::try_from(s.scope).unwrap_or(u64::MAX),
    }))
}

/// Raise `AmbiguousEnvelope` if the bytes repeat a singular top-level or security field or
/// give one the wrong wire type, signed or not (docs/signing.md, steps 2 and 3).
pub fn check_unambiguous(data: &[u8], layout: Option<Layout>) -> Result<()> {
    let records = wire::scan(data, 0, data.len())?;
    let lay = match layout {
        Some(l) => l,
        None => layout_of_records(&records)?,
    };
    security_record(data, &records, lay).map(|_| ())
}

/// The security record re-framed with the `cut` fields removed: minimal tag, minimal length,
/// the remaining records byte for byte in received order.
fn reframe(data: &[u8], rec: &Record, inner: &[Record], lay: Layout, cut: &[u32], out: &mut Vec<u8>) {
    let mut body_len = 0usize;
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut run = rec.value_start;
    for r in inner {
        if cut.contains(&r.field) {
            if r.start > run {
                runs.push((run, r.start));
            }
            run = r.end;
        }
    }
    if run < rec.end {
        runs.push((run, rec.end));
    }
    for (a, b) in &runs {
        body_len += b - a;
    }
    wire::len_tag(out, lay.security_field());
    wire::put_varint(out, body_len as u64);
    for (a, b) in runs {
        out.extend_from_slice(&data[a..b]);
    }
}

fn not_signed(what: &str) -> PrismError {
    err!(
        BadSignature,
        what,
        "security.signature",
        "sign it in the producer, or accept unsigned messages explicitly"
    )
}

fn copy_digest(data: &[u8], sec: &SecRecord, lay: Layout, cut: &[u32]) -> [u8; 32] {
    let mut mid = Vec::with_capacity(sec.rec.end - sec.rec.start);
    reframe(data, &sec.rec, &sec.inner, lay, cut, &mut mid);
    let mut h = Sha256::new();
    h.update(&data[..sec.rec.start]);
    h.update(&mid);
    h.update(&data[sec.rec.end..]);
    h.finalize().into()
}

/// RFC 9162 leaf hash of one message's two digests, in layout order.
pub fn leaf_hash(draft_digest: &[u8; 32], reviewed_digest: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(draft_digest);
    h.update(reviewed_digest);
    h.finalize().into()
}

fn node(left: &[u8], right: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The root a `tree_path` leads to from `leaf` (RFC 9162 §2.1.3.2 without its final comparison).
pub fn root_from_path(leaf: [u8; 32], index: u64, size: u64, path: &[u8]) -> Result<[u8; 32]> {
    root_fault(leaf, u128::from(index), u128::from(size), path).map_err(StatementFault::into_error)
}

/// The root of `d` (RFC 9162 §2.1.1), pushing onto `paths[i]` (the path of leaf `lo + i`) the
/// hash of every sibling subtree on the way down: each node is hashed once, O(n log n) in all
/// (a separate PATH recursion per leaf would hash the tree again for every leaf: O(n²)).
fn mth_paths(d: &[[u8; 32]], paths: &mut [Vec<u8>]) -> [u8; 32] {
    if d.len() == 1 {
        return d[0];
    }
    let k = largest_pow2_below(d.len());
    let (left_paths, right_paths) = paths.split_at_mut(k);
    let left = mth_paths(&d[..k], left_paths);
    let right = mth_paths(&d[k..], right_paths);
    for p in left_paths {
        p.extend_from_slice(&right);
    }
    for p in right_paths {
        p.extend_from_slice(&left);
    }
    node(&left, &right)
}

fn largest_pow2_below(n: usize) -> usize {
    let mut k = 1;
    while k * 2 < n {
        k *= 2;
    }
    k
}

/// The Merkle root of `leaves` and the audit path of each (RFC 9162 §2.1.1, §2.1.3.1), each
/// path its hashes concatenated, nearest the leaf first.
pub fn merkle_tree(leaves: &[[u8; 32]]) -> Result<([u8; 32], Vec<Vec<u8>>)> {
    if leaves.is_empty() {
        return Err(err!(
            Validation,
            "a Merkle tree needs at least one leaf",
            "batch",
            "sign a non-empty batch"
        ));
    }
    let depth = (usize::BITS - (leaves.len() - 1).leading_zeros()) as usize;
    let mut paths = vec![Vec::with_capacity(depth * DIGEST_BYTES); leaves.len()];
    let root = mth_paths(leaves, &mut paths);
    Ok((root, paths))
}

/// `Q || uint64_be(size) || root`: the batch scope's signed statement.
pub fn batch_statement(size: u64, root: &[u8; 32]) -> Vec<u8> {
    let mut m = Vec::with_capacity(SCOPE_BATCH_CONTEXT.len() + 40);
    m.extend_from_slice(SCOPE_BATCH_CONTEXT);
    m.extend_from_slice(&size.to_be_bytes());
    m.extend_from_slice(root);
    m
}

fn pair_statement(lay: Layout, own: &[u8; 32], other: &[u8; 32]) -> Vec<u8> {
    let (d, r) = if lay == Layout::Draft {
        (own, other)
    } else {
        (other, own)
    };
    [SCOPE_PAIR_CONTEXT, d, r].concat()
}

/// Why the signed message of a pair- or batch-scope envelope cannot be formed (its security
/// record already passed the ambiguity checks). The numbers are the varints' full values, so a
/// caller can word them as it likes (the Python verifier's texts differ from this crate's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatementFault {
    /// A pair or batch scope without a 32-byte `sibling_digest` (`scope` is "pair" or "batch").
    NoSibling { scope: &'static str },
    /// `tree_size` outside 1..=`MAX_TREE_SIZE`.
    TreeSize { size: u128 },
    /// `tree_index` not below `tree_size`.
    TreeIndex { index: u128, size: u128 },
    /// `tree_path` is not whole 32-byte hashes.
    PathNotWhole { len: usize },
    /// `tree_path` has more hashes than the tree is deep.
    PathTooLong,
    /// `tree_path` has fewer hashes than the tree is deep.
    PathTooShort,
    /// A scope this verifier does not know.
    UnsupportedScope { scope: u128 },
}

impl StatementFault {
    fn into_error(self) -> PrismError {
        let tree = |what: String| {
            err!(
                BadSignature,
                what,
                "security.tree_path",
                "the envelope was changed after signing"
            )
        };
        match self {
            StatementFault::NoSibling { scope } => err!(
                BadSignature,
                format!("{scope}-scope signature without a {DIGEST_BYTES}-byte sibling_digest"),
                "security.sibling_digest",
                "the envelope was changed after signing, or its producer is broken"
            ),
            StatementFault::TreeSize { size } => tree(format!(
                "batch-scope tree_size {} is outside 1..{MAX_TREE_SIZE}",
                saturate(size)
            )),
            StatementFault::TreeIndex { index, size } => tree(format!(
                "batch-scope tree_index {} is not below tree_size {}",
                saturate(index),
                saturate(size)
            )),
            StatementFault::PathNotWhole { len } => tree(format!(
                "batch-scope tree_path is {len} bytes, not a multiple of {DIGEST_BYTES}"
            )),
            StatementFault::PathTooLong => tree("batch-scope tree_path is longer than the tree is deep".into()),
            StatementFault::PathTooShort => tree("batch-scope tree_path is shorter than the tree is deep".into()),
            StatementFault::UnsupportedScope { scope } => err!(
                UnsupportedSignatureScope,
                format!("signature scope {} is not supported by this verifier", saturate(scope)),
                "security.signature_scope",
                "supported: 0 (legacy), 2 (v2), 3 (pair), 4 (batch); upgrade the verifier or have the producer sign with scope v2"
            ),
        }
    }
}

/// This crate's errors show a varint over 64 bits as `u64::MAX` (`wire::read_varint`).
fn saturate(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

fn root_fault(leaf: [u8; 32], index: u128, size: u128, path: &[u8]) -> std::result::Result<[u8; 32], StatementFault> {
    if size == 0 || size > u128::from(MAX_TREE_SIZE) {
        return Err(StatementFault::TreeSize { size });
    }
    if index >= size {
        return Err(StatementFault::TreeIndex { index, size });
    }
    if path.len() % DIGEST_BYTES != 0 {
        return Err(StatementFault::PathNotWhole { len: path.len() });
    }
    // both fit: size <= MAX_TREE_SIZE and index < size
    let (mut fn_, mut sn, mut r) = (index as u64, size as u64 - 1, leaf);
    for p in path.chunks_exact(DIGEST_BYTES) {
        if sn == 0 {
            return Err(StatementFault::PathTooLong);
        }
        if fn_ & 1 == 1 || fn_ == sn {
            r = node(p, &r);
            if fn_ & 1 == 0 {
                while fn_ & 1 == 0 && fn_ != 0 {
                    fn_ >>= 1;
                    sn >>= 1;
                }
            }
        } else {
            r = node(&r, p);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    if sn != 0 {
        return Err(StatementFault::PathTooShort);
    }
    Ok(r)
}

fn sibling_fault(data: &[u8], inner: &[Record], scope: &'static str) -> std::result::Result<[u8; 32], StatementFault> {
    inner
        .iter()
        .find(|r| r.field == F_SIBLING)
        .and_then(|r| <[u8; 32]>::try_from(&data[r.value_start..r.end]).ok())
        .ok_or(StatementFault::NoSibling { scope })
}

/// The signed message `M` of received envelope bytes whose security record `sec` was found
/// by `locate_security_record` (docs/signing.md, steps 4 and 5): the envelope with its
/// security record re-framed (scope v2: context string first) or as received (legacy), the
/// pair statement (context, both copies' digests in layout order), or the batch statement
/// (context, tree size, the root `tree_path` leads to from this message's leaf).
pub fn signed_statement(
    data: &[u8],
    sec: &SecurityRecord,
    lay: Layout,
) -> std::result::Result<Vec<u8>, StatementFault> {
    let with_inner = |cut: &[u32]| {
        let mut mid = Vec::with_capacity(sec.rec.end - sec.rec.start);
        reframe(data, &sec.rec, &sec.inner, lay, cut, &mut mid);
        mid
    };
    let digest = |cut: &[u32]| -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(&data[..sec.rec.start]);
        h.update(with_inner(cut));
        h.update(&data[sec.rec.end..]);
        h.finalize().into()
    };
    match sec.scope {
        s if s == u128::from(SCOPE_PAIR) => {
            let other = sibling_fault(data, &sec.inner, "pair")?;
            Ok(pair_statement(lay, &digest(CUT_PAIR), &other))
        }
        s if s == u128::from(SCOPE_BATCH) => {
            let (mut index, mut size, mut path): (u128, u128, &[u8]) = (0, 0, &[]);
            for r in &sec.inner {
                let value = || {
                    wire::read_varint_wide(data, r.value_start, r.end)
                        .map(|(v, _)| v)
                        .unwrap_or(u128::MAX)
                };
                match r.field {
                    F_TREE_INDEX => index = value(),
                    F_TREE_SIZE => size = value(),
                    F_TREE_PATH => path = &data[r.value_start..r.end],
                    _ => {}
                }
            }
            let other = sibling_fault(data, &sec.inner, "batch")?;
            let own = digest(CUT_BATCH);
            let leaf = if lay == Layout::Draft {
                leaf_hash(&own, &other)
            } else {
                leaf_hash(&other, &own)
            };
            Ok(batch_statement(saturate(size), &root_fault(leaf, index, size, path)?))
        }
        s if s == u128::from(SCOPE_V2) || s == u128::from(SCOPE_LEGACY) => {
            let mut m = Vec::with_capacity(data.len() + 40);
            if s == u128::from(SCOPE_V2) {
                m.extend_from_slice(if lay == Layout::Draft {
                    SCOPE_V2_CONTEXT_DRAFT
                } else {
                    SCOPE_V2_CONTEXT_REVIEWED
                });
            }
            m.extend_from_slice(&data[..sec.rec.start]);
            if s == u128::from(SCOPE_V2) {
                m.extend_from_slice(&with_inner(CUT_V2));
            }
            m.extend_from_slice(&data[sec.rec.end..]);
            Ok(m)
        }
        scope => Err(StatementFault::UnsupportedScope { scope }),
    }
}

/// HMAC-SHA256 of `m` under `secret` (any length: HMAC hashes a long key).
pub fn hmac_sha256(secret: &[u8], m: &[u8]) -> [u8; 32] {
    let mut h = <Hmac<Sha256> as Mac>::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
    h.update(m);
    h.finalize().into_bytes().into()
}

fn message_for(data: &[u8], sec: &SecRecord, lay: Layout) -> Result<Vec<u8>> {
    let located = SecurityRecord {
        rec: sec.rec,
        inner: sec.inner.clone(),
        scope: u128::from(sec.scope),
    };
    signed_statement(data, &located, lay).map_err(StatementFault::into_error)
}

/// The signed message `M` of received envelope bytes, per the scope they declare (steps 1-5).
pub fn signed_message(data: &[u8], layout: Option<Layout>) -> Result<(Layout, u64, Vec<u8>)> {
    let records = wire::scan(data, 0, data.len())?;
    let lay = match layout {
        Some(l) => l,
        None => layout_of_records(&records)?,
    };
    let sec = security_record(data, &records, lay)?
        .ok_or_else(|| not_signed("envelope is not signed (no security context)"))?;
    let m = message_for(data, &sec, lay)?;
    Ok((lay, sec.scope, m))
}

/// The signature fields of a security context, read with the layout's own schema (so a
/// context that does not parse, nested encryption included, is malformed whatever its scope).
fn parse_security(value: &[u8], lay: Layout) -> Result<(Vec<u8>, String, String)> {
    // a known field with another wire type is an unknown field to protobuf (upb, Python), not an error
    let cleaned = crate::unknown::without_mistyped(value, 0, value.len(), lay == Layout::Draft, ".security")?;
    let value = cleaned.as_slice();
    let bad = |e: prost::DecodeError| {
        err!(
            Malformed,
            format!("security context is not valid protobuf: {e}"),
            "security",
            "the producer is broken"
        )
    };
    Ok(match lay {
        Layout::Reviewed => {
            let s = v1::SecurityContext::decode(value).map_err(bad)?;
            (
                s.signature.unwrap_or_default(),
                s.signature_algorithm.unwrap_or_default(),
                s.signature_key_id.unwrap_or_default(),
            )
        }
        Layout::Draft => {
            let s = draft::SecurityContext::decode(value).map_err(bad)?;
            (s.signature, s.signature_algorithm, s.signature_key_id)
        }
    })
}

/// Verify the signature on received envelope bytes. `accept_legacy_scope: None` takes the
/// keys' setting (default: refuse, `LegacySignatureScope`).
pub fn verify(
    data: &[u8],
    keys: &VerificationKeys,
    layout: Option<Layout>,
    accept_legacy_scope: Option<bool>,
) -> Result<SignatureInfo> {
    let records = wire::scan(data, 0, data.len())?;
    let lay = match layout {
        Some(l) => l,
        None => layout_of_records(&records)?,
    };
    verify_records(data, &records, lay, keys, accept_legacy_scope)
}

pub(crate) fn verify_records(
    data: &[u8],
    records: &[Record],
    lay: Layout,
    keys: &VerificationKeys,
    accept_legacy_scope: Option<bool>,
) -> Result<SignatureInfo> {
    let sec = security_record(data, records, lay)?
        .ok_or_else(|| not_signed("envelope is not signed (no security context)"))?;
    let (signature, alg, key_id) = parse_security(&data[sec.rec.value_start..sec.rec.end], lay)?;
    if signature.is_empty() {
        return Err(not_signed("envelope is not signed"));
    }
    if sec.scope == SCOPE_LEGACY && !accept_legacy_scope.unwrap_or(keys.accept_legacy_scope) {
        return Err(err!(LegacySignatureScope,
            "envelope is signed with the legacy scope, which does not cover its security context (publisher, \
             classification, PII flag, encryption metadata could have been changed)",
            "security.signature_scope",
            "sign with scope v2 (the SDK default), or accept the legacy scope while old producers migrate (a downgrade risk)"));
    }
    let m = message_for(data, &sec, lay)?;
    if alg != HMAC_SHA256 && alg != ED25519 {
        return Err(err!(
            Algorithm,
            format!("signature algorithm {alg:?} is not supported"),
            "security.signature_algorithm",
            "use hmac-sha256 or ed25519"
        ));
    }
    let candidates = keys.candidates(&key_id, &alg)?;
    let entry =
        (sec.scope == SCOPE_BATCH).then(|| [alg.as_bytes(), b"\0", key_id.as_bytes(), b"\0", &m, &signature].concat());
    if let Some(e) = &entry {
        let hit = keys.verified.lock().ok().and_then(|mut c| c.get(e));
        if let Some(kid) = hit.filter(|kid| candidates.iter().any(|k| k.key_id() == kid)) {
            return Ok(SignatureInfo {
                key_id: kid,
                algorithm: alg,
                scope: sec.scope,
            });
        }
    }
    for k in candidates {
        // the enum's fields are public, so a keyring can hold an HMAC key built without
        // `SigningKey::hmac_sha256` and an empty or short secret - HMAC under an empty key is
        // anyone's to compute
        if let VerificationKey::Hmac { key_id, secret } = k {
            if secret.len() < MIN_HMAC_KEY_BYTES {
                return Err(err!(
                    KeyNotUsable,
                    format!(
                        "HMAC key {key_id:?} is {} bytes; at least {MIN_HMAC_KEY_BYTES} required",
                        secret.len()
                    ),
                    "security.signature_key_id",
                    "build verification keys with SigningKey::hmac_sha256(..).verification_key(), from 32+ random bytes"
                ));
            }
        }
        if k.verifies(&m, &signature) {
            if let (Some(e), Ok(mut c)) = (entry, keys.verified.lock()) {
                c.put(e, k.key_id().to_owned());
            }
            return Ok(SignatureInfo {
                key_id: k.key_id().to_owned(),
                algorithm: alg,
                scope: sec.scope,
            });
        }
    }
    Err(err!(
        BadSignature,
        "signature does not match the envelope (forged or tampered)",
        "security.signature",
        "the bytes changed after signing, or the producer used a different key"
    ))
}

/// Record algorithm, key id and scope, and clear any old signature output.
fn begin(env: &Envelope, key: &SigningKey, scope: u64) -> Envelope {
    let mut env = env.clone();
    let s = env.security_mut();
    s.signature_algorithm = Some(key.algorithm().to_owned());
    s.signature_key_id = Some(key.key_id().to_owned());
    s.signature_scope = if scope == SCOPE_LEGACY {
        None
    } else {
        Some(scope as i32)
    };
    s.signature = None;
    s.sibling_digest = None;
    s.tree_index = None;
    s.tree_size = None;
    s.tree_path = None;
    env
}

/// Serialized bytes of one copy, and the offsets of its security record.
struct Copy {
    bytes: Vec<u8>,
    layout: Layout,
}

impl Copy {
    fn new(env: &Envelope, layout: Layout) -> Result<Self> {
        crate::codec::check_encodable(env, layout)?;
        let (mut head, sec, payload) = encode_parts(env, layout);
        head.extend_from_slice(&sec);
        head.extend_from_slice(&payload);
        Ok(Copy { bytes: head, layout })
    }
    fn sec(&self) -> Result<SecRecord> {
        let records = wire::scan(&self.bytes, 0, self.bytes.len())?;
        security_record(&self.bytes, &records, self.layout)?.ok_or_else(|| {
            err!(
                Validation,
                "encoded envelope has no security record",
                "security",
                "this is a bug"
            )
        })
    }
    /// Append records to the security record's value and re-frame it; no other byte moves.
    fn append_to_security(self, extra: &[u8]) -> Result<Vec<u8>> {
        let sec = self.sec()?;
        let value = &self.bytes[sec.rec.value_start..sec.rec.end];
        let mut out = Vec::with_capacity(self.bytes.len() + extra.len() + 4);
        out.extend_from_slice(&self.bytes[..sec.rec.start]);
        wire::len_tag(&mut out, self.layout.security_field());
        wire::put_varint(&mut out, (value.len() + extra.len()) as u64);
        out.extend_from_slice(value);
        out.extend_from_slice(extra);
        out.extend_from_slice(&self.bytes[sec.rec.end..]);
        Ok(out)
    }
}

/// Sign an envelope in one layout with scope v2 (or legacy, for tests of old producers).
/// Returns the bytes to send.
pub fn sign(env: &Envelope, key: &SigningKey, layout: Layout, scope: u64) -> Result<Vec<u8>> {
    if scope != SCOPE_V2 && scope != SCOPE_LEGACY {
        return Err(err!(
            UnsupportedSignatureScope,
            format!("scope {scope} signs both layouts at once"),
            "scope",
            "use sign_pair or sign_batch for the pair and batch scopes"
        ));
    }
    let copy = Copy::new(&begin(env, key, scope), layout)?;
    let (_, _, m) = signed_message(&copy.bytes, Some(layout))?;
    let mut extra = Vec::new();
    wire::put_len_record(&mut extra, F_SIGNATURE, &key.sign_message(&m));
    copy.append_to_security(&extra)
}

/// Sign both layouts' copies of one message with one pair-scope signature.
/// Returns `(draft bytes, reviewed bytes)`.
pub fn sign_pair(env: &Envelope, key: &SigningKey) -> Result<(Vec<u8>, Vec<u8>)> {
    let env = begin(env, key, SCOPE_PAIR);
    let d = Copy::new(&env, Layout::Draft)?;
    let r = Copy::new(&env, Layout::Reviewed)?;
    let dd = copy_digest(&d.bytes, &d.sec()?, Layout::Draft, CUT_PAIR);
    let rd = copy_digest(&r.bytes, &r.sec()?, Layout::Reviewed, CUT_PAIR);
    let sig = key.sign_message(&pair_statement(Layout::Draft, &dd, &rd));
    let tail = |other: &[u8; 32]| {
        let mut e = Vec::new();
        wire::put_len_record(&mut e, F_SIGNATURE, &sig);
        wire::put_len_record(&mut e, F_SIBLING, other);
        e
    };
    Ok((d.append_to_security(&tail(&rd))?, r.append_to_security(&tail(&dd))?))
}

/// Sign a batch of messages (both layouts each) with one batch-scope signature over a Merkle
/// tree of their pair digests. Returns `(draft bytes, reviewed bytes)` per message.
pub fn sign_batch(envs: &[Envelope], key: &SigningKey) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let n = envs.len() as u64;
    if n == 0 || n > MAX_TREE_SIZE {
        return Err(err!(
            Validation,
            format!("a batch-scope signature covers 1 to {MAX_TREE_SIZE} messages, not {n}"),
            "batch",
            "split the batch"
        ));
    }
    let mut copies = Vec::with_capacity(envs.len());
    let mut leaves = Vec::with_capacity(envs.len());
    for env in envs {
        let env = begin(env, key, SCOPE_BATCH);
        let d = Copy::new(&env, Layout::Draft)?;
        let r = Copy::new(&env, Layout::Reviewed)?;
        let dd = copy_digest(&d.bytes, &d.sec()?, Layout::Draft, CUT_BATCH);
        let rd = copy_digest(&r.bytes, &r.sec()?, Layout::Reviewed, CUT_BATCH);
        leaves.push(leaf_hash(&dd, &rd));
        copies.push((d, r, dd, rd));
    }
    let (root, paths) = merkle_tree(&leaves)?;
    let sig = key.sign_message(&batch_statement(n, &root));
    let mut out = Vec::with_capacity(copies.len());
    for (i, ((d, r, dd, rd), path)) in copies.into_iter().zip(paths).enumerate() {
        let tail = |other: &[u8; 32]| {
            let mut e = Vec::new();
            wire::put_len_record(&mut e, F_SIGNATURE, &sig);
            wire::put_len_record(&mut e, F_SIBLING, other);
            wire::put_varint(&mut e, u64::from(F_TREE_INDEX << 3));
            wire::put_varint(&mut e, i as u64);
            wire::put_varint(&mut e, u64::from(F_TREE_SIZE << 3));
            wire::put_varint(&mut e, n);
            if !path.is_empty() {
                wire::put_len_record(&mut e, F_TREE_PATH, &path);
            }
            e
        };
        out.push((d.append_to_security(&tail(&rd))?, r.append_to_security(&tail(&dd))?));
    }
    Ok(out)
}

/// Verify and decode in one pass over the records, as a consumer does (Python's
/// `verify_and_decode`): the records and their ambiguity checks, the header-only decode within
/// `limits`, then the signature. An unsigned envelope is `BadSignature`.
pub fn verify_and_decode<'a>(
    data: &'a [u8],
    keys: &VerificationKeys,
    layout: Option<Layout>,
    limits: &crate::Limits,
    accept_legacy_scope: Option<bool>,
) -> Result<(crate::EnvelopeView<'a>, SignatureInfo)> {
    if data.len() > limits.max_message_bytes {
        return Err(err!(
            SizeLimit,
            format!(
                "envelope is {} bytes, over the {}-byte limit",
                data.len(),
                limits.max_message_bytes
            ),
            "",
            "raise Limits::max_message_bytes or have the producer split the message"
        ));
    }
    let records = crate::codec::scan_envelope(data, layout, limits.max_header_bytes)?;
    let lay = match layout {
        Some(l) => l,
        None => layout_of_records(&records)?,
    };
    security_record(data, &records, lay)?.ok_or_else(|| not_signed("envelope is not signed (no security context)"))?;
    let view = crate::codec::decode_records(data, &records, lay, limits)?;
    let info = verify_records(data, &records, lay, keys, accept_legacy_scope)?;
    Ok((view, info))
}
