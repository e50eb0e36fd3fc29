//! An `extensions` map entry holding more than a key and a value is refused by every layout
//! change (convert, reading a draft header, writing a reviewed model as a draft, signing or
//! publishing a draft copy) with `PrismError::AmbiguousMapEntry` (`ambiguous_map_entry`), as
//! in Python and Go; the reviewed layout keeps it, written again as upb writes it (key, value,
//! then the rest). Odd trace `labels`/`baggage` entries convert. The shared vectors are in
//! conformance/conversion/map-entries.json (tests/conformance.rs); these are the API paths.

use prism_client::codec::{self, Layout, Limits};
use prism_client::signing::{self, SigningKey, SCOPE_V2};
use prism_client::{binding, Envelope, PrismError};

fn rec(field: u32, wire_type: u8, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    prism_client::wire::put_varint(&mut out, u64::from((field << 3) | u32::from(wire_type)));
    if wire_type == 2 {
        prism_client::wire::put_varint(&mut out, value.len() as u64);
    }
    out.extend_from_slice(value);
    out
}

fn shapes() -> Vec<(&'static str, Vec<u8>)> {
    let (key, value) = (rec(1, 2, b"tier"), rec(2, 2, b"gold"));
    vec![
        ("third field", [key.clone(), value.clone(), rec(3, 0, &[1])].concat()),
        ("unknown field only", [key.clone(), rec(10, 2, b"x")].concat()),
        ("varint key", [rec(1, 0, &[5]), value.clone()].concat()),
        ("varint value", [key, rec(2, 0, &[7])].concat()),
    ]
}

fn envelope() -> Envelope {
    let mut env = Envelope::builder("orders.created", "order-events")
        .extension("region", b"eu".to_vec())
        .text("{}")
        .build()
        .unwrap();
    env.security_mut().publisher_id = Some("svc".into());
    env
}

/// `env` in `layout` with `odd` added on the extensions map's number, before the security record.
fn with_odd(layout: Layout, odd: &[u8]) -> Vec<u8> {
    let data = codec::encode(&envelope(), layout);
    let sec = layout.security_field();
    let recs = prism_client::wire::scan(&data, 0, data.len()).unwrap();
    let at = recs.iter().find(|r| r.field == sec).unwrap().start;
    let field = if layout == Layout::Draft { 99 } else { 97 };
    [&data[..at], &rec(field, 2, odd), &data[at..]].concat()
}

fn is_refused<T: std::fmt::Debug>(r: prism_client::Result<T>, field: u32) {
    match r {
        Err(PrismError::AmbiguousMapEntry(d)) => {
            assert_eq!(d.at, format!("extensions (field {field})"));
            assert!(!d.hint.is_empty());
        }
        other => panic!("expected ambiguous_map_entry, got {other:?}"),
    }
}

#[test]
fn every_layout_change_refuses_an_odd_extensions_entry() {
    let limits = Limits::default();
    let key = SigningKey::hmac_sha256("k1", &[7u8; 32]).unwrap();
    for (name, odd) in shapes() {
        let reviewed = with_odd(Layout::Reviewed, &odd);
        let env = codec::decode(&reviewed, &limits).unwrap();
        assert_eq!(
            env.header.extensions.len(),
            1,
            "{name}: only the plain entry is in the map"
        );
        // same layout: kept (two records on field 97), and converting to it is not a change
        let again = codec::encode(&env, Layout::Reviewed);
        let recs = prism_client::wire::scan(&again, 0, again.len()).unwrap();
        assert_eq!(recs.iter().filter(|r| r.field == 97).count(), 2, "{name}");
        assert_eq!(codec::decode(&again, &limits).unwrap(), env, "{name}");
        is_refused(codec::convert(&reviewed, Layout::Draft, &limits), 97);
        is_refused(codec::try_encode(&env, Layout::Draft), 97);
        is_refused(binding::encode(&env, Layout::Draft, None, &[], None), 97);
        is_refused(signing::sign(&env, &key, Layout::Draft, SCOPE_V2), 97);
        is_refused(signing::sign_pair(&env, &key), 97);
        assert_eq!(
            PrismError::AmbiguousMapEntry(prism_client::Detail::new("", "", "")).reason(),
            "ambiguous_map_entry"
        );
        signing::sign(&env, &key, Layout::Reviewed, SCOPE_V2).unwrap();
        // a draft header is converted when it is read
        let draft = with_odd(Layout::Draft, &odd);
        is_refused(codec::decode(&draft, &limits), 99);
        is_refused(codec::convert(&draft, Layout::Reviewed, &limits), 99);
        is_refused(codec::convert(&draft, Layout::Draft, &limits), 99);
    }
}

#[test]
fn plain_entries_still_convert_both_ways() {
    let limits = Limits::default();
    for layout in [Layout::Reviewed, Layout::Draft] {
        // a key-only entry and an empty entry are plain
        let mut data = codec::encode(&envelope(), layout);
        let field = if layout == Layout::Draft { 99 } else { 97 };
        let at = prism_client::wire::scan(&data, 0, data.len())
            .unwrap()
            .iter()
            .find(|r| r.field == layout.security_field())
            .unwrap()
            .start;
        let extra = [rec(field, 2, &rec(1, 2, b"k")), rec(field, 2, b"")].concat();
        data.splice(at..at, extra);
        let other = if layout == Layout::Draft {
            Layout::Reviewed
        } else {
            Layout::Draft
        };
        let (out, _) = codec::convert(&data, other, &limits).unwrap();
        let (back, _) = codec::convert(&out, layout, &limits).unwrap();
        let ext = codec::decode(&back, &limits).unwrap().header.extensions;
        assert_eq!(ext.len(), 3);
        assert_eq!(ext["k"], b"");
        assert_eq!(ext[""], b"");
    }
}
