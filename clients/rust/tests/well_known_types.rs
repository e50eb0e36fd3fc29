//! The protobuf well-known types in a schema (`google.protobuf.Timestamp`, `Duration`,
//! `Struct`/`Value`/`ListValue`, the wrappers, `Empty`, `FieldMask`, `Any`): resolved from the
//! descriptors the crate carries (the schema gives only its own file), decoded to the JSON
//! forms `MessageToDict` writes, read from theirs, and every hostile value - out of range, a
//! bad string, nesting past the limit, random bytes - a `PrismError`, never a panic.
//! tests/clients/test_rust_client.py checks the same against Python's protobuf runtime.

use prism_client::schema_decode::{validate_protobuf, well_known_files, ResolvedSchema};
use prism_client::PrismError;
use proptest::prelude::*;
use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto};
use serde_json::{json, Value};

fn field(name: &str, number: i32, type_name: &str) -> FieldDescriptorProto {
    let json_name: String = {
        let mut up = false;
        name.chars()
            .filter_map(|c| {
                if c == '_' {
                    up = true;
                    None
                } else if up {
                    up = false;
                    Some(c.to_ascii_uppercase())
                } else {
                    Some(c)
                }
            })
            .collect()
    };
    FieldDescriptorProto {
        name: Some(name.into()),
        json_name: Some(json_name),
        number: Some(number),
        r#type: Some(Type::Message as i32),
        label: Some(Label::Optional as i32),
        type_name: Some(type_name.into()),
        ..Default::default()
    }
}

/// shop.Event: one field of each well-known type (the file imports them, references none).
fn schema() -> ResolvedSchema {
    let wkt = |n: &str| format!(".google.protobuf.{n}");
    let mut history = field("history", 11, &wkt("Timestamp"));
    history.label = Some(Label::Repeated as i32);
    let event = DescriptorProto {
        name: Some("Event".into()),
        field: vec![
            field("at", 1, &wkt("Timestamp")),
            field("took", 2, &wkt("Duration")),
            field("attrs", 3, &wkt("Struct")),
            field("extra", 4, &wkt("Value")),
            field("big", 5, &wkt("Int64Value")),
            field("note", 6, &wkt("StringValue")),
            field("nothing", 7, &wkt("Empty")),
            field("mask", 8, &wkt("FieldMask")),
            field("any", 9, &wkt("Any")),
            field("tags", 10, &wkt("ListValue")),
            history,
        ],
        ..Default::default()
    };
    let imports = [
        "timestamp",
        "duration",
        "struct",
        "wrappers",
        "empty",
        "field_mask",
        "any",
    ]
    .map(|f| format!("google/protobuf/{f}.proto"));
    ResolvedSchema {
        subject: "events".into(),
        version: 1,
        format: "protobuf".into(),
        hash: String::new(),
        text: String::new(),
        descriptor: Some(FileDescriptorProto {
            name: Some("schema.proto".into()),
            package: Some("shop".into()),
            dependency: imports.to_vec(),
            message_type: vec![event],
            syntax: Some("proto3".into()),
            ..Default::default()
        }),
        imports: Vec::new(),
        references: Vec::new(),
    }
}

const EVENT: &str = "shop.Event";
const URL: &str = "type.googleapis.com/shop.Event";

/// A record of field `n` holding `msg` (length-delimited).
fn record(n: u32, msg: &impl Message) -> Vec<u8> {
    let body = msg.encode_to_vec();
    let mut out = Vec::new();
    prost::encoding::encode_key(n, prost::encoding::WireType::LengthDelimited, &mut out);
    prost::encoding::encode_varint(body.len() as u64, &mut out);
    out.extend(body);
    out
}

fn decode(b: &[u8]) -> prism_client::Result<Value> {
    schema().decode(b, "application/protobuf", EVENT).map(|d| d.value)
}

fn decode_json(doc: &Value) -> prism_client::Result<Value> {
    schema()
        .decode(doc.to_string().as_bytes(), "application/json", EVENT)
        .map(|d| d.value)
}

#[test]
fn the_crate_carries_the_well_known_files() {
    let names: Vec<&str> = well_known_files().iter().map(|f| f.name()).collect();
    for f in [
        "any",
        "duration",
        "empty",
        "field_mask",
        "struct",
        "timestamp",
        "wrappers",
    ] {
        assert!(
            names.contains(&format!("google/protobuf/{f}.proto").as_str()),
            "{names:?}"
        );
    }
}

#[test]
fn wire_values_decode_to_their_json_forms() {
    use prost_types::value::Kind;
    let mut b = record(
        1,
        &prost_types::Timestamp {
            seconds: 1_709_209_845,
            nanos: 123_000_000,
        },
    );
    b.extend(record(
        2,
        &prost_types::Duration {
            seconds: -1,
            nanos: -500_000_000,
        },
    ));
    let s = prost_types::Struct {
        fields: [
            (
                "n".to_string(),
                prost_types::Value {
                    kind: Some(Kind::NumberValue(1.5)),
                },
            ),
            (
                "z".to_string(),
                prost_types::Value {
                    kind: Some(Kind::NullValue(0)),
                },
            ),
            (
                "l".to_string(),
                prost_types::Value {
                    kind: Some(Kind::ListValue(prost_types::ListValue {
                        values: vec![prost_types::Value {
                            kind: Some(Kind::BoolValue(true)),
                        }],
                    })),
                },
            ),
        ]
        .into_iter()
        .collect(),
    };
    b.extend(record(3, &s));
    b.extend(record(
        4,
        &prost_types::Value {
            kind: Some(Kind::StringValue("s".into())),
        },
    ));
    b.extend(record(5, &9_007_199_254_740_993_i64));
    b.extend(record(6, &String::from("note")));
    b.extend(record(7, &()));
    b.extend(record(
        8,
        &prost_types::FieldMask {
            paths: vec!["foo_bar".into(), "baz".into()],
        },
    ));
    let packed = prost_types::Any {
        type_url: "type.googleapis.com/google.protobuf.Duration".into(),
        value: prost_types::Duration { seconds: 2, nanos: 0 }.encode_to_vec(),
    };
    b.extend(record(9, &packed));
    b.extend(record(
        11,
        &prost_types::Timestamp {
            seconds: 0,
            nanos: 1_000,
        },
    ));
    b.extend(record(
        11,
        &prost_types::Timestamp {
            seconds: -62_135_596_800,
            nanos: 0,
        },
    ));
    assert_eq!(
        decode(&b).unwrap(),
        json!({"at": "2024-02-29T12:30:45.123Z", "took": "-1.500s", "attrs": {"n": 1.5, "z": null, "l": [true]},
               "extra": "s", "big": "9007199254740993", "note": "note", "nothing": {}, "mask": "fooBar,baz",
               "any": {"@type": "type.googleapis.com/google.protobuf.Duration", "value": "2s"},
               "history": ["1970-01-01T00:00:00.000001Z", "0001-01-01T00:00:00Z"]})
    );
    assert!(validate_protobuf(schema().descriptor.as_ref().unwrap(), &b, "application/protobuf", URL).is_ok());
}

#[test]
fn values_without_a_json_form_are_refused_where_validation_accepts_them() {
    use prost_types::value::Kind;
    let file = schema().descriptor.unwrap();
    let cases = [
        record(
            1,
            &prost_types::Timestamp {
                seconds: 253_402_300_800,
                nanos: 0,
            },
        ),
        record(
            1,
            &prost_types::Timestamp {
                seconds: 0,
                nanos: 1_000_000_000,
            },
        ),
        record(
            2,
            &prost_types::Duration {
                seconds: 315_576_000_001,
                nanos: 0,
            },
        ),
        record(2, &prost_types::Duration { seconds: 1, nanos: -1 }),
        record(
            4,
            &prost_types::Value {
                kind: Some(Kind::NumberValue(f64::NAN)),
            },
        ),
        record(
            8,
            &prost_types::FieldMask {
                paths: vec!["fooBar".into()],
            },
        ),
        record(
            9,
            &prost_types::Any {
                type_url: "type.googleapis.com/nope.Nope".into(),
                value: vec![],
            },
        ),
        record(
            9,
            &prost_types::Any {
                type_url: "no-slash".into(),
                value: vec![1],
            },
        ),
        // the schema's own message: not a well-known type, refused as the Python SDK refuses it
        record(
            9,
            &prost_types::Any {
                type_url: "type.googleapis.com/shop.Event".into(),
                value: vec![],
            },
        ),
    ];
    for b in cases {
        // the wire format is sound: the Python SDK's check (`FromString`) accepts it, so does Rust's
        assert!(
            validate_protobuf(&file, &b, "application/protobuf", URL).is_ok(),
            "{b:?}"
        );
        assert!(matches!(decode(&b), Err(PrismError::Payload(_))), "{b:?}");
    }
}

#[test]
fn json_forms_are_read_and_written_back_canonically() {
    let doc = json!({"at": "2020-01-01T00:00:00.5+01:00", "took": "0.000001s", "attrs": {"a": [1, {"b": null}]},
                     "extra": null, "big": 5, "note": "x", "nothing": {}, "mask": "fooBar,x.yZ", "tags": [1, "a"],
                     "any": {"@type": "type.googleapis.com/google.protobuf.Timestamp", "value": "1970-01-01T00:00:01Z"},
                     "history": ["1999-12-31T23:59:59.999999999-00:30"]});
    assert_eq!(
        decode_json(&doc).unwrap(),
        json!({"at": "2019-12-31T23:00:00.500Z", "took": "0.000001s", "attrs": {"a": [1.0, {"b": null}]},
               "extra": null, "big": "5", "note": "x", "nothing": {}, "mask": "fooBar,x.yZ", "tags": [1.0, "a"],
               "any": {"@type": "type.googleapis.com/google.protobuf.Timestamp", "value": "1970-01-01T00:00:01Z"},
               "history": ["2000-01-01T00:29:59.999999999Z"]})
    );
    let file = schema().descriptor.unwrap();
    for bad in [
        json!({"at": "2020-13-01T00:00:00Z"}),
        json!({"at": 5}),
        json!({"at": "0001-01-01T00:00:00+00:01"}),
        json!({"took": "5m"}),
        json!({"took": "-315576000001s"}),
        json!({"big": "9223372036854775808"}),
        json!({"big": 1.5}),
        json!({"note": true}),
        json!({"nothing": {"x": 1}}),
        json!({"mask": "a_b"}),
        json!({"any": {"value": 1}}),
        json!({"any": {"@type": "type.googleapis.com/nope.Nope"}}),
        json!({"any": {"@type": "type.googleapis.com/shop.Event"}}),
        json!({"attrs": [1]}),
        json!({"tags": {}}),
    ] {
        let e = validate_protobuf(&file, bad.to_string().as_bytes(), "application/json", URL).unwrap_err();
        assert!(matches!(e, PrismError::Validation(_)), "{bad}: {e:?}");
        assert!(matches!(decode_json(&bad), Err(PrismError::Payload(_))), "{bad}");
    }
}

#[test]
fn struct_nesting_past_the_limit_is_a_typed_error() {
    // JSON: 40 levels of objects are 80 messages (a Struct and its Value each), within the
    // limit of 100; 55 levels are over it
    let nest = |n: usize| (0..n).fold(json!("leaf"), |v, _| json!({ "k": v }));
    assert!(decode_json(&json!({ "attrs": nest(40) })).is_ok());
    assert!(matches!(
        decode_json(&json!({ "attrs": nest(55) })),
        Err(PrismError::Payload(_))
    ));
    // wire: a Value in a ListValue in a Value ..., 10,000 deep
    let mut v = prost_types::Value {
        kind: Some(prost_types::value::Kind::StringValue("x".into())),
    }
    .encode_to_vec();
    for _ in 0..10_000 {
        let list = record(1, &RawBytes(v));
        v = [vec![0x32], varint(list.len()), list].concat(); // Value.list_value (field 6)
    }
    let b = [vec![0x22], varint(v.len()), v].concat();
    assert!(matches!(decode(&b), Err(PrismError::Payload(_))));
    let file = schema().descriptor.unwrap();
    assert!(validate_protobuf(&file, &b, "application/protobuf", URL).is_err());
}

fn varint(n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::encode_varint(n as u64, &mut out);
    out
}

/// Bytes that encode as themselves (an already-encoded message).
#[derive(Clone, PartialEq, Default)]
struct RawBytes(Vec<u8>);

impl std::fmt::Debug for RawBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes", self.0.len())
    }
}

impl Message for RawBytes {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        buf.put_slice(&self.0);
    }
    fn merge_field(
        &mut self,
        _: u32,
        _: prost::encoding::WireType,
        _: &mut impl prost::bytes::Buf,
        _: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        Ok(())
    }
    fn encoded_len(&self) -> usize {
        self.0.len()
    }
    fn clear(&mut self) {
        self.0.clear();
    }
}

proptest! {
    #[test]
    fn any_bytes_give_a_value_or_a_prism_error(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&data);
        let _ = validate_protobuf(schema().descriptor.as_ref().unwrap(), &data, "application/protobuf", URL);
    }

    #[test]
    fn any_timestamp_is_a_string_that_reads_back_or_a_payload_error(seconds in any::<i64>(), nanos in any::<i32>()) {
        let b = record(1, &prost_types::Timestamp { seconds, nanos });
        match decode(&b) {
            Ok(v) => {
                let back = decode_json(&v).unwrap();
                prop_assert_eq!(&back, &v);
            }
            Err(e) => prop_assert!(matches!(e, PrismError::Payload(_))),
        }
    }

    #[test]
    fn any_duration_is_a_string_that_reads_back_or_a_payload_error(seconds in any::<i64>(), nanos in any::<i32>()) {
        let b = record(2, &prost_types::Duration { seconds, nanos });
        match decode(&b) {
            Ok(v) => {
                let back = decode_json(&v).unwrap();
                prop_assert_eq!(&back, &v);
            }
            Err(e) => prop_assert!(matches!(e, PrismError::Payload(_))),
        }
    }

    #[test]
    fn any_string_for_a_string_form_gives_a_value_or_a_prism_error(
        s in "[-+.:0-9TZtzs_a-zA-Z,é ]{0,40}",
        k in prop::sample::select(vec!["at", "took", "mask", "big", "note", "any"]),
    ) {
        let doc = json!({ k: s });
        match decode_json(&doc) {
            Ok(v) => {
                // what is read is written back in the canonical form, which reads back as itself
                prop_assert_eq!(decode_json(&v).unwrap(), v);
            }
            Err(e) => prop_assert!(matches!(e, PrismError::Payload(_))),
        }
    }
}
