//! The last step of a batch-scope signature, on bytes: each copy of each message gets the
//! batch's signature, its sibling's digest, its leaf index, the tree size and its audit path
//! spliced into its security context, which is re-framed, and the copy is joined.
//!
//! This is the Python worker's `app.security.signing.finish_batch` per-copy writes (set five
//! fields on a protobuf `SecurityContext`, serialize it again, join head + security record +
//! payload) done on the bytes `pair::pair_copies` already produced, for the compiled hot path
//! (`prism_native.finish_batch`): they were ~5 % of the worker's CPU per message (BENCHMARKS.md,
//! issue 29).
//!
//! **Why a splice gives the encoder's bytes.** A protobuf encoder (upb, prost) writes known
//! fields in field-number order and unknown fields after them. The security context this
//! starts from is the one `pair_copies` accepted - known fields only, strictly increasing,
//! minimal varints - with the signing fields (4, 11-14) cleared. Setting them and serializing
//! again therefore gives the same records with `signature` (4) before the first record of a
//! higher field and 11-14 at the end. The reviewed layout's fields are `optional` (a set zero
//! or empty value is written); the draft's are plain proto3 (a zero or empty value is not).
//! `tree_path` is set only when the path is not empty (a batch of one has none).
//!
//! **Contract.** Anything else - a record that does not walk canonically, a field above 10 or
//! a `signature` already there - gives `None`: the caller writes that message the general way
//! (protobuf), which gives the same bytes. Nothing here panics on any input.

use crate::pair::{canon_records, Rec};
use crate::signing::{leaf_hash, merkle_tree, F_SIBLING, F_SIGNATURE, F_TREE_INDEX, F_TREE_PATH, F_TREE_SIZE};
use crate::wire::{put_len_record, put_varint, LEN};

/// The highest security-context field a prepared (unsigned) context may hold.
const LAST_UNSIGNED: u32 = 10;

/// A layout's tags: the security record's and the payload record's.
const DRAFT_SECURITY_TAG: &[u8] = b"\x22"; // field 4, LEN
const REVIEWED_SECURITY_TAG: &[u8] = b"\x12"; // field 2, LEN
const DRAFT_PAYLOAD_TAG: &[u8] = b"\x1a"; // field 3, LEN
const REVIEWED_PAYLOAD_TAG: &[u8] = b"\x9a\x06"; // field 99, LEN

/// What every copy of one message gets from the batch (its sibling digest is per copy).
#[derive(Debug, Clone, Copy)]
pub struct BatchFields<'a> {
    /// The batch's one signature.
    pub signature: &'a [u8],
    /// This message's leaf index.
    pub index: u64,
    /// Leaves in the tree.
    pub size: u64,
    /// This message's audit path (empty for a batch of one).
    pub path: &'a [u8],
}

/// One message as `pair::pair_copies` left it: both heads, the draft security context's
/// value, the reviewed header serialized whole (its security record is found in it) and the
/// payload `Any`'s bytes (None: no payload), with both copies' digests.
#[derive(Debug, Clone, Copy)]
pub struct Pieces<'a> {
    pub head_draft: &'a [u8],
    pub security_draft: &'a [u8],
    pub head_reviewed: &'a [u8],
    pub header_reviewed: &'a [u8],
    pub payload: Option<&'a [u8]>,
    pub digest_draft: &'a [u8; 32],
    pub digest_reviewed: &'a [u8; 32],
}

/// The root and every leaf's audit path of a batch whose messages have these
/// `(draft digest, reviewed digest)` pairs: the leaves are [`leaf_hash`]es. `None` for an
/// empty batch.
pub fn batch_tree(digests: &[(&[u8; 32], &[u8; 32])]) -> Option<([u8; 32], Vec<Vec<u8>>)> {
    let leaves: Vec<[u8; 32]> = digests.iter().map(|(d, r)| leaf_hash(d, r)).collect();
    merkle_tree(&leaves).ok()
}

/// The value of the reviewed header's security record: the second record, right after the
/// metadata, as `pair_copies` requires.
fn reviewed_security(header: &[u8]) -> Option<&[u8]> {
    let top = canon_records(header, 0, header.len())?;
    match top.as_slice() {
        [m, s, ..] if m.field == 1 && m.wire_type == LEN && s.field == 2 && s.wire_type == LEN => {
            Some(&header[s.value_start..s.end])
        }
        _ => None,
    }
}

/// Append the security record (`tag`, length, value) of `sec` with the batch fields set:
/// what `security_bytes` gives after the protobuf writes. `draft`: plain proto3 fields, whose
/// zero or empty values are not written. `None` when `sec` is not a prepared context (see
/// the module's contract).
pub fn finished_security(
    out: &mut Vec<u8>,
    tag: &[u8],
    sec: &[u8],
    draft: bool,
    sibling: &[u8],
    f: &BatchFields,
) -> Option<()> {
    let recs: Vec<Rec> = canon_records(sec, 0, sec.len())?;
    if recs.iter().any(|r| r.field == F_SIGNATURE || r.field > LAST_UNSIGNED) {
        return None;
    }
    let at = recs
        .iter()
        .find(|r| r.field > F_SIGNATURE)
        .map_or(sec.len(), |r| r.start);
    let mut signature = Vec::with_capacity(f.signature.len() + 2);
    if !(draft && f.signature.is_empty()) {
        put_len_record(&mut signature, F_SIGNATURE, f.signature);
    }
    let mut tail = Vec::with_capacity(sibling.len() + f.path.len() + 32);
    if !(draft && sibling.is_empty()) {
        put_len_record(&mut tail, F_SIBLING, sibling);
    }
    for (field, v) in [(F_TREE_INDEX, f.index), (F_TREE_SIZE, f.size)] {
        if !(draft && v == 0) {
            put_varint(&mut tail, u64::from(field << 3));
            put_varint(&mut tail, v);
        }
    }
    if !f.path.is_empty() {
        put_len_record(&mut tail, F_TREE_PATH, f.path);
    }
    out.extend_from_slice(tag);
    put_varint(out, (sec.len() + signature.len() + tail.len()) as u64);
    out.extend_from_slice(&sec[..at]);
    out.extend_from_slice(&signature);
    out.extend_from_slice(&sec[at..]);
    out.extend_from_slice(&tail);
    Some(())
}

/// One finished copy: head, security record with the batch fields, payload record.
fn finished_copy(
    head: &[u8],
    tags: (&[u8], &[u8]),
    sec: &[u8],
    draft: bool,
    sibling: &[u8],
    payload: Option<&[u8]>,
    f: &BatchFields,
) -> Option<Vec<u8>> {
    let pay_len = payload.map_or(0, |p| p.len() + 12);
    let mut out = Vec::with_capacity(head.len() + sec.len() + f.signature.len() + f.path.len() + pay_len + 64);
    out.extend_from_slice(head);
    finished_security(&mut out, tags.0, sec, draft, sibling, f)?;
    if let Some(p) = payload {
        out.extend_from_slice(tags.1);
        put_varint(&mut out, p.len() as u64);
        out.extend_from_slice(p);
    }
    Some(out)
}

/// A message's finished copies, one per entry of `reviewed` (true: the reviewed layout, false:
/// the draft), in that order: `finish_batch`'s `[written[layout] for layout in p.layouts]`.
/// `None` when a copy cannot be spliced exactly (the caller writes the message the general way).
pub fn finish_message(p: &Pieces, reviewed: &[bool], f: &BatchFields) -> Option<Vec<Vec<u8>>> {
    let mut sec_reviewed = None;
    let mut out = Vec::with_capacity(reviewed.len());
    for &r in reviewed {
        out.push(if r {
            let sec = match sec_reviewed {
                Some(s) => s,
                None => *sec_reviewed.insert(reviewed_security(p.header_reviewed)?),
            };
            finished_copy(
                p.head_reviewed,
                (REVIEWED_SECURITY_TAG, REVIEWED_PAYLOAD_TAG),
                sec,
                false,
                p.digest_draft,
                p.payload,
                f,
            )?
        } else {
            finished_copy(
                p.head_draft,
                (DRAFT_SECURITY_TAG, DRAFT_PAYLOAD_TAG),
                p.security_draft,
                true,
                p.digest_reviewed,
                p.payload,
                f,
            )?
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{draft, v1};
    use crate::pair::{pair_copies, CUT_BATCH};
    use crate::signing::root_from_path;
    use proptest::prelude::*;
    use prost::Message;
    use sha2::{Digest, Sha256};

    /// RFC 9162's definitions as written (MTH, PATH), each path computed on its own.
    fn rfc_mth(d: &[[u8; 32]]) -> [u8; 32] {
        if d.len() == 1 {
            return d[0];
        }
        let k = 1usize << (usize::BITS - 1 - (d.len() - 1).leading_zeros()); // largest power of 2 below
        let mut h = Sha256::new();
        h.update([1u8]);
        h.update(rfc_mth(&d[..k]));
        h.update(rfc_mth(&d[k..]));
        h.finalize().into()
    }

    fn rfc_path(m: usize, d: &[[u8; 32]]) -> Vec<u8> {
        if d.len() <= 1 {
            return Vec::new();
        }
        let k = 1usize << (usize::BITS - 1 - (d.len() - 1).leading_zeros()); // largest power of 2 below
        if m < k {
            [rfc_path(m, &d[..k]), rfc_mth(&d[k..]).to_vec()].concat()
        } else {
            [rfc_path(m - k, &d[k..]), rfc_mth(&d[..k]).to_vec()].concat()
        }
    }

    #[test]
    fn the_tree_is_rfc_9162s() {
        for n in (1..=70).chain([127, 128, 129, 500]) {
            let leaves: Vec<[u8; 32]> = (0..n)
                .map(|i| Sha256::digest((i as u32).to_be_bytes()).into())
                .collect();
            let (root, paths) = merkle_tree(&leaves).unwrap();
            assert_eq!(root, rfc_mth(&leaves), "{n}");
            for (i, p) in paths.iter().enumerate() {
                assert_eq!(p, &rfc_path(i, &leaves), "{n} {i}");
                assert_eq!(root_from_path(leaves[i], i as u64, n as u64, p).unwrap(), root);
            }
        }
        assert!(batch_tree(&[]).is_none());
    }

    /// The protobuf way: set the fields on the decoded context and encode it again (prost
    /// writes known fields in field-number order, as upb does).
    fn reference(h: &v1::PrismEnvelope, payload: Option<&[u8]>, reviewed: &[bool], f: &BatchFields) -> Vec<Vec<u8>> {
        let c = pair_copies(&h.encode_to_vec(), payload, CUT_BATCH).unwrap();
        let mut sr = h.security.clone().unwrap();
        sr.signature = Some(f.signature.to_vec());
        sr.sibling_digest = Some(c.digest_draft.to_vec());
        sr.tree_index = Some(f.index);
        sr.tree_size = Some(f.size);
        sr.tree_path = (!f.path.is_empty()).then(|| f.path.to_vec());
        let mut sd = draft::SecurityContext::decode(&c.security_draft[..]).unwrap();
        sd.signature = f.signature.to_vec();
        sd.sibling_digest = c.digest_reviewed.to_vec();
        sd.tree_index = f.index;
        sd.tree_size = f.size;
        sd.tree_path = f.path.to_vec();
        let copy = |head: &[u8], stag: u8, sec: Vec<u8>, ptag: &[u8]| {
            let mut o = head.to_vec();
            o.push(stag);
            put_varint(&mut o, sec.len() as u64);
            o.extend_from_slice(&sec);
            if let Some(p) = payload {
                o.extend_from_slice(ptag);
                put_varint(&mut o, p.len() as u64);
                o.extend_from_slice(p);
            }
            o
        };
        reviewed
            .iter()
            .map(|&r| {
                if r {
                    copy(&c.head_reviewed, 0x12, sr.encode_to_vec(), b"\x9a\x06")
                } else {
                    copy(&c.head_draft, 0x22, sd.encode_to_vec(), b"\x1a")
                }
            })
            .collect()
    }

    fn finish(
        h: &v1::PrismEnvelope,
        payload: Option<&[u8]>,
        reviewed: &[bool],
        f: &BatchFields,
    ) -> Option<Vec<Vec<u8>>> {
        let full = h.encode_to_vec();
        let c = pair_copies(&full, payload, CUT_BATCH)?;
        let p = Pieces {
            head_draft: &c.head_draft,
            security_draft: &c.security_draft,
            head_reviewed: &c.head_reviewed,
            header_reviewed: &full,
            payload,
            digest_draft: &c.digest_draft,
            digest_reviewed: &c.digest_reviewed,
        };
        finish_message(&p, reviewed, f)
    }

    fn opt_str() -> impl Strategy<Value = Option<String>> {
        prop_oneof![Just(None), Just(Some(String::new())), "[a-z/._-]{1,12}".prop_map(Some)]
    }

    /// Prepared reviewed headers: the signing fields cleared, the other security fields any.
    fn header() -> impl Strategy<Value = v1::PrismEnvelope> {
        (
            ("[a-z0-9-]{1,12}", any::<i64>()),
            (opt_str(), opt_str(), opt_str(), opt_str()),
            (prop::option::of(any::<bool>()), opt_str(), opt_str()),
            prop::option::of(prop_oneof![Just(0i32), Just(4), Just(-3)]),
        )
            .prop_map(
                |((id, ms), (pid, team, tok, alg), (pii, class, kid), scope)| v1::PrismEnvelope {
                    metadata: Some(v1::PrismMetadata {
                        message_id: id,
                        published_at_ms: ms,
                        ..Default::default()
                    }),
                    security: Some(v1::SecurityContext {
                        publisher_id: pid,
                        publisher_team: team,
                        auth_token: tok,
                        signature_algorithm: alg,
                        contains_pii: pii,
                        data_classification: class,
                        signature_key_id: kid,
                        signature_scope: scope,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )
    }

    fn layouts() -> impl Strategy<Value = Vec<bool>> {
        prop_oneof![
            Just(vec![false, true]),
            Just(vec![true, false]),
            Just(vec![false]),
            Just(vec![true]),
            Just(vec![]),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]
        #[test]
        fn the_splice_is_the_encoders_output(
            h in header(),
            payload in prop::option::of(prop::collection::vec(any::<u8>(), 0..300)),
            reviewed in layouts(),
            signature in prop_oneof![Just(vec![]), prop::collection::vec(any::<u8>(), 32..=64)],
            index in prop_oneof![Just(0u64), any::<u64>()],
            size in prop_oneof![Just(0u64), Just(1u64), any::<u64>()],
            hashes in 0usize..17,
        ) {
            let path = vec![7u8; hashes * 32];
            let f = BatchFields { signature: &signature, index, size, path: &path };
            let got = finish(&h, payload.as_deref(), &reviewed, &f);
            prop_assert_eq!(got, Some(reference(&h, payload.as_deref(), &reviewed, &f)));
        }

        #[test]
        fn any_bytes_give_copies_or_none(
            sec in prop::collection::vec(any::<u8>(), 0..64),
            header in prop::collection::vec(any::<u8>(), 0..64),
            reviewed in layouts(),
        ) {
            let f = BatchFields { signature: b"s", index: 1, size: 2, path: &[1; 32] };
            let p = Pieces {
                head_draft: b"", security_draft: &sec, head_reviewed: b"", header_reviewed: &header,
                payload: Some(&sec), digest_draft: &[0; 32], digest_reviewed: &[1; 32],
            };
            let _ = finish_message(&p, &reviewed, &f);
        }
    }

    #[test]
    fn what_the_splice_leaves_to_the_general_path() {
        let f = BatchFields {
            signature: b"sig",
            index: 0,
            size: 1,
            path: b"",
        };
        let mut out = Vec::new();
        // a baseline that splices: fields 1 and 5, the signature goes between them
        assert!(finished_security(&mut out, b"\x22", b"\x0a\x01a\x2a\x01b", true, &[2; 32], &f).is_some());
        let mut want = b"\x22\x2f\x0a\x01a\x22\x03sig\x2a\x01b\x5a\x20".to_vec(); // index 0: not in a draft
        want.extend_from_slice(&[2; 32]);
        want.extend_from_slice(b"\x68\x01");
        assert_eq!(out, want);
        for sec in [
            b"\x22\x01x".as_slice(), // a signature already there
            b"\x5a\x00",             // sibling_digest (11) already there
            b"\x60\x01",             // tree_index (12)
            b"\xa0\x06\x01",         // an unknown field, written last by an encoder
            b"\x2a\x01b\x0a\x01a",   // out of order
            b"\x08\x80\x00",         // a non-minimal varint
            b"\x0d\x00\x00\x00\x00", // fixed32
            b"\x0a\x05a",            // past the end
        ] {
            assert!(
                finished_security(&mut out, b"\x22", sec, true, &[2; 32], &f).is_none(),
                "{sec:?}"
            );
        }
        // a reviewed header whose second record is not the security context
        let p = Pieces {
            head_draft: b"",
            security_draft: b"",
            head_reviewed: b"",
            header_reviewed: b"\x0a\x00\x1a\x00",
            payload: None,
            digest_draft: &[0; 32],
            digest_reviewed: &[1; 32],
        };
        assert!(finish_message(&p, &[true], &f).is_none());
        assert_eq!(finish_message(&p, &[false], &f).map(|c| c.len()), Some(1));
    }
}
