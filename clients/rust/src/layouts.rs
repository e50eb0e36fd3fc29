//! Lossless conversion between the RFC-031 draft layout and the reviewed (memo-031) layout,
//! the Rust twin of `app/envelope/layouts.py`. What the other side cannot hold is listed in
//! the returned `dropped` list, never silently lost:
//!
//! * draft -> reviewed: the sub-millisecond part of `published_at`;
//! * reviewed -> draft: explicit presence of zero values (`priority = 0`, `contains_pii = false`, ...).
//!
//! The revision-2 encryption fields the draft lacks travel in draft `extensions` under
//! `prism.enc.*` and are restored on the way back, exactly as Python does.

use prost::Message;

use crate::error::{err, Result};
use crate::gen::{draft, v1};
use crate::model::{content_encoding, content_type, set_content_encoding, set_content_type};

/// The draft `envelope_version` this SDK writes and fully understands.
pub const KNOWN_ENVELOPE_VERSION: i32 = 1;
/// Extension holding a newer producer's `envelope_version` (decimal text).
pub const PRODUCER_VERSION_EXT: &str = "prism.producer_envelope_version";
const ENC_TYPE_KEY: &str = "prism.enc.encryption_type";
const ENC_PUB_KEY: &str = "prism.enc.public_key_id";
const ENC_ENCAP_KEY: &str = "prism.enc.encapsulated_key";
const ENC_PARAMS_KEY: &str = "prism.enc.algorithm_params";

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

fn non_empty_bytes(b: &[u8]) -> Option<Vec<u8>> {
    (!b.is_empty()).then(|| b.to_vec())
}

/// Re-read a message of one layout as the same-numbered message of the other (observability
/// and schema contexts have identical numbering in both layouts).
fn recode<A: Message, B: Message + Default>(a: &A) -> B {
    B::decode(a.encode_to_vec().as_slice()).unwrap_or_default()
}

/// `prism.enc.encryption_type` for an `EncryptionType`: its name, or the decimal number when
/// this build does not know the value (proto3 keeps unknown enum numbers).
fn enc_type_name(value: i32) -> String {
    match v1::EncryptionType::try_from(value) {
        Ok(t) => t.as_str_name().to_owned(),
        Err(_) => value.to_string(),
    }
}

/// The inverse of [`enc_type_name`]: a name or a number; an unknown name is malformed.
fn enc_type_value(raw: &[u8]) -> Result<i32> {
    let bad = || {
        err!(
            Malformed,
            format!("extensions[{ENC_TYPE_KEY:?}] is neither an EncryptionType name nor a number"),
            format!("extensions[{ENC_TYPE_KEY:?}]"),
            "the producer wrote a value this build does not know by name"
        )
    };
    let text = std::str::from_utf8(raw).map_err(|_| bad())?;
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().map_err(|_| bad());
    }
    v1::EncryptionType::from_str_name(text)
        .map(|t| t as i32)
        .ok_or_else(bad)
}

/// The reviewed model of a draft header (its payload is handled by the codec).
pub fn draft_to_reviewed(d: &draft::PrismEnvelope) -> Result<(v1::PrismEnvelope, Vec<String>)> {
    let mut dropped = Vec::new();
    let mut v = v1::PrismEnvelope::default();
    if let Some(dm) = &d.metadata {
        let mut vm = v1::PrismMetadata {
            message_id: dm.message_id.clone(),
            topic: dm.topic.clone(),
            namespace: dm.namespace.clone(),
            ..Default::default()
        };
        if let Some(ts) = &dm.published_at {
            let nanos = i64::from(ts.nanos);
            vm.published_at_ms = ts
                .seconds
                .saturating_mul(1000)
                .saturating_add(nanos.div_euclid(1_000_000));
            if nanos.rem_euclid(1_000_000) != 0 {
                dropped.push(format!(
                    "metadata.published_at: sub-millisecond part ({} ns)",
                    nanos.rem_euclid(1_000_000)
                ));
            }
        }
        if !dm.content_type.is_empty() {
            set_content_type(&mut vm, &dm.content_type);
        }
        if !dm.content_encoding.is_empty() {
            set_content_encoding(&mut vm, &dm.content_encoding);
        }
        vm.priority = (dm.priority != 0).then_some(dm.priority);
        vm.ttl_seconds = (dm.ttl_seconds != 0).then_some(dm.ttl_seconds);
        vm.correlation_id = non_empty(&dm.correlation_id);
        vm.causality_parent = non_empty(&dm.causality_parent);
        vm.producer_sdk_version = non_empty(&dm.producer_sdk_version);
        v.metadata = Some(vm);
    }
    let mut ext = d.extensions.clone();
    if let Some(ds) = &d.security {
        let mut vs = v1::SecurityContext {
            publisher_id: non_empty(&ds.publisher_id),
            publisher_team: non_empty(&ds.publisher_team),
            auth_token: non_empty(&ds.auth_token),
            signature: non_empty_bytes(&ds.signature),
            signature_algorithm: non_empty(&ds.signature_algorithm),
            contains_pii: ds.contains_pii.then_some(true),
            data_classification: non_empty(&ds.data_classification),
            signature_key_id: non_empty(&ds.signature_key_id),
            signature_scope: (ds.signature_scope != 0).then_some(ds.signature_scope),
            sibling_digest: non_empty_bytes(&ds.sibling_digest),
            ..Default::default()
        };
        if ds.tree_size != 0 {
            vs.tree_index = Some(ds.tree_index);
            vs.tree_size = Some(ds.tree_size);
            vs.tree_path = non_empty_bytes(&ds.tree_path);
        }
        if let Some(de) = &ds.encryption {
            let mut ve = v1::EncryptionMetadata {
                key_id: de.key_id.clone(),
                algorithm: de.algorithm.clone(),
                iv: non_empty_bytes(&de.iv),
                aad: non_empty_bytes(&de.aad),
                ..Default::default()
            };
            if let Some(t) = ext.get(ENC_TYPE_KEY) {
                ve.encryption_type = enc_type_value(t)?;
            }
            if let Some(p) = ext.get(ENC_PUB_KEY) {
                ve.public_key_id = Some(String::from_utf8_lossy(p).into_owned());
            }
            if let Some(k) = ext.get(ENC_ENCAP_KEY) {
                ve.encapsulated_key = Some(k.clone());
            }
            if let Some(p) = ext.get(ENC_PARAMS_KEY) {
                ve.algorithm_params = Some(String::from_utf8_lossy(p).into_owned());
            }
            vs.encryption = Some(ve);
        }
        v.security = Some(vs);
    }
    for k in [ENC_TYPE_KEY, ENC_PUB_KEY, ENC_ENCAP_KEY, ENC_PARAMS_KEY] {
        ext.remove(k);
    }
    if d.envelope_version > KNOWN_ENVELOPE_VERSION {
        ext.insert(
            PRODUCER_VERSION_EXT.to_owned(),
            d.envelope_version.to_string().into_bytes(),
        );
        dropped.push(format!(
            "envelope_version: {} is newer than {KNOWN_ENVELOPE_VERSION}; read on a best-effort basis (kept in extensions[{PRODUCER_VERSION_EXT:?}])",
            d.envelope_version
        ));
    } else if d.envelope_version < 0 {
        dropped.push(format!(
            "envelope_version: {} is not a version (read as {KNOWN_ENVELOPE_VERSION})",
            d.envelope_version
        ));
    }
    v.extensions = ext;
    v.observability = d.observability.as_ref().map(recode);
    v.schema = d.schema.as_ref().map(recode);
    Ok((v, dropped))
}

/// Optional fields explicitly set to their zero value: the draft's plain proto3 fields
/// cannot tell those from unset (`content_encoding` "none" travels as a string and is kept).
fn zero_presence(v: &v1::PrismEnvelope, dropped: &mut Vec<String>) {
    let mut note = |path: &str, shown: &str| {
        dropped.push(format!(
            "{path}: explicit {shown} is indistinguishable from unset in the draft layout"
        ))
    };
    if let Some(m) = &v.metadata {
        if m.content_type == Some(0) {
            note("metadata.content_type", "0");
        }
        if m.priority == Some(0) {
            note("metadata.priority", "0");
        }
        if m.ttl_seconds == Some(0) {
            note("metadata.ttl_seconds", "0");
        }
        for (name, val) in [
            ("correlation_id", &m.correlation_id),
            ("causality_parent", &m.causality_parent),
            ("content_type_custom", &m.content_type_custom),
            ("content_encoding_custom", &m.content_encoding_custom),
            ("producer_sdk_version", &m.producer_sdk_version),
        ] {
            if val.as_deref() == Some("") {
                note(&format!("metadata.{name}"), "''");
            }
        }
    }
    if let Some(s) = &v.security {
        for (name, val) in [
            ("publisher_id", &s.publisher_id),
            ("publisher_team", &s.publisher_team),
            ("auth_token", &s.auth_token),
            ("signature_algorithm", &s.signature_algorithm),
            ("data_classification", &s.data_classification),
            ("signature_key_id", &s.signature_key_id),
        ] {
            if val.as_deref() == Some("") {
                note(&format!("security.{name}"), "''");
            }
        }
        for (name, val) in [
            ("signature", &s.signature),
            ("sibling_digest", &s.sibling_digest),
            ("tree_path", &s.tree_path),
        ] {
            if val.as_deref() == Some(&[][..]) {
                note(&format!("security.{name}"), "b''");
            }
        }
        if s.contains_pii == Some(false) {
            note("security.contains_pii", "False");
        }
        if s.signature_scope == Some(0) {
            note("security.signature_scope", "0");
        }
        if s.tree_index == Some(0) && s.tree_size.unwrap_or(0) == 0 {
            note("security.tree_index", "0");
        }
        if s.tree_size == Some(0) {
            note("security.tree_size", "0");
        }
        if let Some(e) = &s.encryption {
            for (name, val) in [
                ("iv", &e.iv),
                ("aad", &e.aad),
                ("encapsulated_key", &e.encapsulated_key),
            ] {
                if val.as_deref() == Some(&[][..]) {
                    note(&format!("security.encryption.{name}"), "b''");
                }
            }
            for (name, val) in [
                ("public_key_id", &e.public_key_id),
                ("algorithm_params", &e.algorithm_params),
            ] {
                if val.as_deref() == Some("") {
                    note(&format!("security.encryption.{name}"), "''");
                }
            }
        }
    }
}

/// The draft header (`envelope_version` = 1) for the reviewed model's header.
pub fn reviewed_to_draft(v: &v1::PrismEnvelope) -> (draft::PrismEnvelope, Vec<String>) {
    let mut dropped = Vec::new();
    zero_presence(v, &mut dropped);
    let mut d = draft::PrismEnvelope {
        envelope_version: KNOWN_ENVELOPE_VERSION,
        ..Default::default()
    };
    if let Some(vm) = &v.metadata {
        let ms = vm.published_at_ms;
        d.metadata = Some(draft::PrismMetadata {
            message_id: vm.message_id.clone(),
            topic: vm.topic.clone(),
            namespace: vm.namespace.clone(),
            published_at: Some(prost_types::Timestamp {
                seconds: ms.div_euclid(1000),
                nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
            }),
            content_type: content_type(vm).to_owned(),
            content_encoding: content_encoding(vm).to_owned(),
            priority: vm.priority.unwrap_or(0),
            ttl_seconds: vm.ttl_seconds.unwrap_or(0),
            correlation_id: vm.correlation_id.clone().unwrap_or_default(),
            causality_parent: vm.causality_parent.clone().unwrap_or_default(),
            producer_sdk_version: vm.producer_sdk_version.clone().unwrap_or_default(),
        });
    }
    d.extensions = v.extensions.clone();
    if let Some(vs) = &v.security {
        let mut ds = draft::SecurityContext {
            publisher_id: vs.publisher_id.clone().unwrap_or_default(),
            publisher_team: vs.publisher_team.clone().unwrap_or_default(),
            auth_token: vs.auth_token.clone().unwrap_or_default(),
            signature: vs.signature.clone().unwrap_or_default(),
            signature_algorithm: vs.signature_algorithm.clone().unwrap_or_default(),
            encryption: None,
            contains_pii: vs.contains_pii.unwrap_or(false),
            data_classification: vs.data_classification.clone().unwrap_or_default(),
            signature_key_id: vs.signature_key_id.clone().unwrap_or_default(),
            signature_scope: vs.signature_scope.unwrap_or(0),
            sibling_digest: vs.sibling_digest.clone().unwrap_or_default(),
            tree_index: vs.tree_index.unwrap_or(0),
            tree_size: vs.tree_size.unwrap_or(0),
            tree_path: vs.tree_path.clone().unwrap_or_default(),
        };
        if let Some(ve) = &vs.encryption {
            ds.encryption = Some(draft::EncryptionMetadata {
                key_id: ve.key_id.clone(),
                algorithm: ve.algorithm.clone(),
                iv: ve.iv.clone().unwrap_or_default(),
                aad: ve.aad.clone().unwrap_or_default(),
            });
            if ve.encryption_type != 0 {
                d.extensions
                    .insert(ENC_TYPE_KEY.to_owned(), enc_type_name(ve.encryption_type).into_bytes());
            }
            if let Some(p) = &ve.public_key_id {
                d.extensions.insert(ENC_PUB_KEY.to_owned(), p.as_bytes().to_vec());
            }
            if let Some(k) = &ve.encapsulated_key {
                d.extensions.insert(ENC_ENCAP_KEY.to_owned(), k.clone());
            }
            if let Some(p) = &ve.algorithm_params {
                d.extensions.insert(ENC_PARAMS_KEY.to_owned(), p.as_bytes().to_vec());
            }
        }
        d.security = Some(ds);
    }
    d.observability = v.observability.as_ref().map(recode);
    d.schema = v.schema.as_ref().map(recode);
    (d, dropped)
}
