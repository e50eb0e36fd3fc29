//! Avro payloads (`prism_client::avro`): hostile binary datums and JSON documents against
//! schemas with every type (records, recursive references, unions, enums, fixed, maps, arrays,
//! logical types) give a value or a typed `PrismError` - never a panic, never an allocation the
//! payload's bytes do not pay for - and validation agrees with decoding.
//! tests/clients/test_rust_client.py checks the values against fastavro's.

use prism_client::avro::AvroSchema;
use prism_client::PrismError;
use proptest::prelude::*;

const EVERYTHING: &str = r#"{"type": "record", "name": "All", "namespace": "t", "fields": [
    {"name": "b", "type": "boolean"}, {"name": "i", "type": "int"}, {"name": "l", "type": "long"},
    {"name": "f", "type": "float"}, {"name": "d", "type": "double"}, {"name": "s", "type": "string"},
    {"name": "by", "type": "bytes"}, {"name": "fx", "type": {"type": "fixed", "name": "F4", "size": 4}},
    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X", "Y", "Z"]}},
    {"name": "m", "type": {"type": "map", "values": ["null", "long", "string"]}},
    {"name": "a", "type": {"type": "array", "items": "F4"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "next", "type": ["null", "All"]}]}"#;

const NULLS: &str = r#"{"type": "map", "values": {"type": "array", "items": "null"}}"#;

proptest! {
    #[test]
    fn hostile_binary_gives_a_value_or_a_prism_error(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        for text in [EVERYTHING, NULLS] {
            let s = AvroSchema::parse(text).unwrap();
            let decoded = s.decode_binary(&data);
            prop_assert!(matches!(decoded, Ok(_) | Err(PrismError::Payload(_))));
            let checked = s.validate(&data, "application/avro");
            prop_assert!(matches!(checked, Ok(()) | Err(PrismError::Validation(_))));
            // validation ignores trailing bytes (fastavro's schemaless_reader); decoding refuses them
            if decoded.is_ok() {
                prop_assert!(checked.is_ok());
            }
        }
    }

    #[test]
    fn hostile_json_gives_a_verdict_or_a_prism_error(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        let s = AvroSchema::parse(EVERYTHING).unwrap();
        let checked = s.validate(&data, "application/json");
        prop_assert!(matches!(checked, Ok(()) | Err(PrismError::Validation(_))));
    }

    #[test]
    fn hostile_schemas_give_a_schema_or_a_prism_error(text in "[\\[\\]{}\":, a-z0-9]{0,200}") {
        prop_assert!(matches!(AvroSchema::parse(&text), Ok(_) | Err(PrismError::Config(_))));
    }
}

/// A schema built from names that may be invalid (digits first, spaces, dots, empty).
fn schema_with(names: &[String]) -> String {
    let n = |i: usize| serde_json::Value::String(names[i % names.len()].clone());
    serde_json::json!({"type": "record", "name": n(0), "namespace": n(1), "aliases": [n(2)], "fields": [
        {"name": n(3), "type": {"type": "enum", "name": n(4), "symbols": [n(5)]}},
        {"name": n(6), "aliases": [n(7)], "type": ["null", n(0), {"type": "fixed", "name": n(8), "size": 2}]},
        {"name": n(9), "type": {"type": n(10)}}]})
    .to_string()
}

proptest! {
    #[test]
    fn schemas_with_hostile_names_give_a_schema_or_a_prism_error(
        names in proptest::collection::vec("[a-cA1_. ]{0,4}", 11..12),
        data in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        match AvroSchema::parse(&schema_with(&names)) {
            Err(e) => prop_assert!(matches!(e, PrismError::Config(_))),
            Ok(s) => {
                prop_assert!(matches!(s.decode_binary(&data), Ok(_) | Err(PrismError::Payload(_))));
            }
        }
    }
}

#[test]
fn every_type_round_trips_its_encoding() {
    let s = AvroSchema::parse(EVERYTHING).unwrap();
    let mut b = vec![1, 0x0e, 0x01];
    b.extend(1.5f32.to_le_bytes());
    b.extend(f64::NAN.to_le_bytes());
    b.extend([4, b'h', b'i', 2, 0xff, 1, 2, 3, 4, 4]);
    // map {"k": 5 (long branch)}, array [F4 "abcd"]
    b.extend([2, 2, b'k', 2, 10, 0, 2, b'a', b'b', b'c', b'd', 0]);
    b.extend([2, 4, 2, 0x7f, 2, b'u', 0]);
    let v = s.decode_binary(&b).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"b": true, "i": 7, "l": -1, "f": 1.5, "d": "NaN", "s": "hi", "by": "/w==",
            "fx": "AQIDBA==", "e": "Z", "m": {"k": 5}, "a": ["YWJjZA=="], "day": 1, "ts": 2,
            "dec": "fw==", "id": "u", "next": null})
    );
    assert!(s.validate(&b, "").is_ok());
    // every strict prefix is refused, as a typed error
    for n in 0..b.len() {
        assert!(matches!(s.decode_binary(&b[..n]), Err(PrismError::Payload(_))), "{n}");
    }
}

#[test]
fn odd_schemas_parse_or_are_refused_and_never_panic() {
    let odd = [
        r#"{"type": "fixed", "name": "F", "size": -1}"#,
        r#"{"type": "fixed", "name": "F", "size": 18446744073709551615}"#,
        r#"{"type": "record", "name": "R", "fields": [{"name": "a", "type": "R"}]}"#,
        r#"{"type": "array"}"#,
        r#"{"type": "map", "values": "nope"}"#,
        r#"{"type": "enum", "name": "E", "symbols": []}"#,
        r#"["null", "null"]"#,
        r#"[]"#,
        r#"{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int", "default": "x"}]}"#,
        r#"{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}, {"name": "a", "type": "int"}]}"#,
        r#"{"type": "bytes", "logicalType": "decimal", "precision": 0, "scale": 5}"#,
        r#"{"type": "fixed", "name": "D", "size": 3, "logicalType": "duration"}"#,
        r#"{"type": "string", "logicalType": "uuid"}"#,
        r#"{"type": "int", "logicalType": "nope"}"#,
        r#""record""#,
        r#"{"type": {"type": {"type": "int"}}}"#,
        r#"{"type": "record", "name": "1bad", "fields": []}"#,
        r#"{"type": "record", "name": "R", "aliases": ["S"], "fields": [{"name": "n", "type": ["null", "S"]}]}"#,
        r#"{"type": "enum", "name": "E", "symbols": ["1x"]}"#,
        r#"{"type": "enum", "name": "E", "symbols": [1]}"#,
        r#"{"type": "record", "name": "R", "fields": "x"}"#,
        r#"{"type": "record", "name": "R", "fields": [{"name": "a"}]}"#,
        r#"{"type": "record", "name": "R", "namespace": "1bad", "fields": []}"#,
        r#"{"type": "record", "name": "R", "aliases": ["1bad"], "fields": []}"#,
        r#"{"type": "record", "name": "R", "fields": [{"name": "a", "aliases": ["b c"], "type": "int"}]}"#,
        r#"{"type": "a b"}"#,
        r#"{"type": {"type": "record", "name": "x y", "fields": []}}"#,
        r#"{"type": "fixed", "name": "F", "size": 2, "default": "abc"}"#,
    ];
    let inputs: [&[u8]; 6] = [b"", &[0], &[2, 0], &[0xff; 12], &[1, 2, 3, 4, 5, 6, 7, 8, 9], &[3; 40]];
    for text in odd {
        match AvroSchema::parse(text) {
            Err(e) => assert!(matches!(e, PrismError::Config(_)), "{text}: {e:?}"),
            Ok(s) => {
                for b in inputs {
                    assert!(
                        matches!(s.decode_binary(b), Ok(_) | Err(PrismError::Payload(_))),
                        "{text}"
                    );
                    assert!(
                        matches!(s.validate(b, ""), Ok(()) | Err(PrismError::Validation(_))),
                        "{text}"
                    );
                }
                for doc in ["{}", "null", "[]", r#"{"a": {"a": {}}}"#, "1"] {
                    let checked = s.validate(doc.as_bytes(), "application/json");
                    assert!(matches!(checked, Ok(()) | Err(PrismError::Validation(_))), "{text}");
                }
            }
        }
    }
}
