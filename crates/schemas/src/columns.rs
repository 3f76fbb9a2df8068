//! A schema's top-level fields as table columns, and payloads decoded into them
//! (a stream exported as a table, docs/tables.md): a JSON Schema's `properties`,
//! an Avro record's fields, a Protobuf message's fields. Scalars keep their type;
//! anything nested (objects, arrays, maps, unions of several types) is one column
//! of JSON text.

use std::collections::BTreeMap;

use prost_reflect::{
    DynamicMessage, Kind as PKind, MessageDescriptor, ReflectMessage, Value as PValue,
};
use serde_json::Value;

use crate::avro::{self, Datum, Named, NamedKind, Node};
use crate::parsed::Parsed;

/// Columns one schema may give at most (the rest of its fields stay in the raw
/// body only).
pub const COLUMNS_MAX: usize = 500;

/// A column's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnKind {
    Boolean,
    /// 32-bit.
    Int,
    /// 64-bit.
    Long,
    Double,
    String,
    Binary,
    /// A nested value as JSON text.
    Json,
}

/// One value of a decoded payload.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    Null,
    Bool(bool),
    Long(i64),
    Double(f64),
    Text(String),
    Bytes(Vec<u8>),
}

/// The columns of `parsed`'s top-level fields, in the schema's order (none when
/// its root is not a record, an object or a message).
pub fn columns(parsed: &Parsed) -> Vec<(String, ColumnKind)> {
    let mut out = match parsed {
        Parsed::Json(v) => json_columns(v),
        Parsed::Avro(s) => match &s.root {
            Node::Named(i) => match &s.named[*i].kind {
                NamedKind::Record(fields) => fields
                    .iter()
                    .map(|f| (f.name.clone(), avro_kind(&s.named, &f.node)))
                    .collect(),
                _ => Vec::new(),
            },
            _ => Vec::new(),
        },
        Parsed::Protobuf(p) => p
            .message(&[0])
            .map(|m| {
                m.fields()
                    .map(|f| {
                        let kind = if f.is_list() || f.is_map() {
                            ColumnKind::Json
                        } else {
                            proto_kind(&f.kind())
                        };
                        (f.name().to_string(), kind)
                    })
                    .collect()
            })
            .unwrap_or_default(),
    };
    out.truncate(COLUMNS_MAX);
    out
}

fn json_columns(schema: &Value) -> Vec<(String, ColumnKind)> {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    props
        .iter()
        .map(|(name, p)| {
            let types: Vec<&str> = match p.get("type") {
                Some(Value::String(t)) => vec![t.as_str()],
                Some(Value::Array(ts)) => ts
                    .iter()
                    .filter_map(Value::as_str)
                    .filter(|t| *t != "null")
                    .collect(),
                _ => Vec::new(),
            };
            let kind = match types.as_slice() {
                ["boolean"] => ColumnKind::Boolean,
                ["integer"] => ColumnKind::Long,
                ["number"] | ["integer", "number"] | ["number", "integer"] => ColumnKind::Double,
                ["string"] => ColumnKind::String,
                _ => ColumnKind::Json,
            };
            (name.clone(), kind)
        })
        .collect()
}

fn avro_kind(named: &[Named], node: &Node) -> ColumnKind {
    match node {
        Node::Boolean => ColumnKind::Boolean,
        Node::Int => ColumnKind::Int,
        Node::Long => ColumnKind::Long,
        Node::Float | Node::Double => ColumnKind::Double,
        Node::String => ColumnKind::String,
        Node::Bytes => ColumnKind::Binary,
        Node::Named(i) => match &named[*i].kind {
            NamedKind::Fixed(_) => ColumnKind::Binary,
            NamedKind::Enum { .. } => ColumnKind::String,
            NamedKind::Record(_) => ColumnKind::Json,
        },
        // An optional value: `["null", T]` is a nullable T.
        Node::Union(branches) => {
            let rest: Vec<&Node> = branches.iter().filter(|b| **b != Node::Null).collect();
            match rest.as_slice() {
                [one] => avro_kind(named, one),
                _ => ColumnKind::Json,
            }
        }
        Node::Null | Node::Array(_) | Node::Map(_) => ColumnKind::Json,
    }
}

fn proto_kind(k: &PKind) -> ColumnKind {
    match k {
        PKind::Bool => ColumnKind::Boolean,
        PKind::Int32 | PKind::Sint32 | PKind::Sfixed32 => ColumnKind::Int,
        PKind::Int64
        | PKind::Sint64
        | PKind::Sfixed64
        | PKind::Uint32
        | PKind::Fixed32
        | PKind::Uint64
        | PKind::Fixed64 => ColumnKind::Long,
        PKind::Float | PKind::Double => ColumnKind::Double,
        PKind::String | PKind::Enum(_) => ColumnKind::String,
        PKind::Bytes => ColumnKind::Binary,
        PKind::Message(_) => ColumnKind::Json,
    }
}

/// The top-level fields of a payload written with `parsed`, by name: `datum` is
/// JSON text for a JSON Schema, else the unframed datum of the message at
/// `message_path` (Protobuf) or of the schema (Avro).
pub fn decode(
    parsed: &Parsed,
    message_path: &[usize],
    datum: &[u8],
) -> Result<BTreeMap<String, Cell>, String> {
    match parsed {
        Parsed::Json(_) => {
            let doc: Value = serde_json::from_slice(datum).map_err(|e| format!("not JSON: {e}"))?;
            let Value::Object(fields) = doc else {
                return Err("the document is not an object".into());
            };
            Ok(fields.into_iter().map(|(k, v)| (k, json_cell(v))).collect())
        }
        Parsed::Avro(s) => match avro::decode_datum(s, datum)? {
            Datum::Record(fields) => {
                Ok(fields.into_iter().map(|(k, v)| (k, avro_cell(v))).collect())
            }
            _ => Err("the schema is not a record".into()),
        },
        Parsed::Protobuf(p) => {
            let m: MessageDescriptor = p.message(message_path)?;
            let msg = DynamicMessage::decode(m.clone(), datum)
                .map_err(|e| format!("not a {}: {e}", m.full_name()))?;
            let d = msg.descriptor();
            Ok(d.fields()
                .map(|f| {
                    let v = msg.get_field(&f);
                    let cell = if f.is_list() || f.is_map() {
                        Cell::Text(proto_json(&v).to_string())
                    } else if f.supports_presence() && !msg.has_field(&f) {
                        Cell::Null
                    } else {
                        proto_cell(&f.kind(), &v)
                    };
                    (f.name().to_string(), cell)
                })
                .collect())
        }
    }
}

fn json_cell(v: Value) -> Cell {
    match v {
        Value::Null => Cell::Null,
        Value::Bool(b) => Cell::Bool(b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Cell::Long(i),
            None => n.as_f64().map_or(Cell::Null, Cell::Double),
        },
        Value::String(s) => Cell::Text(s),
        other => Cell::Text(other.to_string()),
    }
}

fn avro_cell(v: Datum) -> Cell {
    match v {
        Datum::Null => Cell::Null,
        Datum::Boolean(b) => Cell::Bool(b),
        Datum::Long(n) => Cell::Long(n),
        Datum::Double(d) => Cell::Double(d),
        Datum::Bytes(b) => Cell::Bytes(b),
        Datum::String(s) => Cell::Text(s),
        nested => Cell::Text(nested.to_json().to_string()),
    }
}

fn proto_cell(kind: &PKind, v: &PValue) -> Cell {
    match v {
        PValue::Bool(b) => Cell::Bool(*b),
        PValue::I32(n) => Cell::Long(i64::from(*n)),
        PValue::I64(n) => Cell::Long(*n),
        PValue::U32(n) => Cell::Long(i64::from(*n)),
        PValue::U64(n) => Cell::Long(*n as i64),
        PValue::F32(f) => Cell::Double(f64::from(*f)),
        PValue::F64(f) => Cell::Double(*f),
        PValue::String(s) => Cell::Text(s.clone()),
        PValue::Bytes(b) => Cell::Bytes(b.to_vec()),
        PValue::EnumNumber(n) => match kind {
            PKind::Enum(e) => Cell::Text(
                e.get_value(*n)
                    .map_or_else(|| n.to_string(), |v| v.name().to_string()),
            ),
            _ => Cell::Long(i64::from(*n)),
        },
        other => Cell::Text(proto_json(other).to_string()),
    }
}

/// A Protobuf value as JSON (bytes as base64, enums as numbers).
fn proto_json(v: &PValue) -> Value {
    use base64::Engine as _;
    match v {
        PValue::Bool(b) => Value::Bool(*b),
        PValue::I32(n) => Value::from(*n),
        PValue::I64(n) => Value::from(*n),
        PValue::U32(n) => Value::from(*n),
        PValue::U64(n) => Value::from(*n),
        PValue::F32(f) => {
            serde_json::Number::from_f64(f64::from(*f)).map_or(Value::Null, Value::Number)
        }
        PValue::F64(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        PValue::String(s) => Value::String(s.clone()),
        PValue::Bytes(b) => Value::String(base64::engine::general_purpose::STANDARD.encode(b)),
        PValue::EnumNumber(n) => Value::from(*n),
        PValue::Message(m) => Value::Object(
            m.fields()
                .map(|(f, v)| (f.name().to_string(), proto_json(v)))
                .collect(),
        ),
        PValue::List(items) => Value::Array(items.iter().map(proto_json).collect()),
        PValue::Map(pairs) => Value::Object(
            pairs
                .iter()
                .map(|(k, v)| {
                    let key = match k {
                        prost_reflect::MapKey::Bool(b) => b.to_string(),
                        prost_reflect::MapKey::I32(n) => n.to_string(),
                        prost_reflect::MapKey::I64(n) => n.to_string(),
                        prost_reflect::MapKey::U32(n) => n.to_string(),
                        prost_reflect::MapKey::U64(n) => n.to_string(),
                        prost_reflect::MapKey::String(s) => s.clone(),
                    };
                    (key, proto_json(v))
                })
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parsed::{parse, SchemaType};

    fn p(t: SchemaType, text: &str) -> Parsed {
        parse(t, text, &[]).expect("schema parses").0
    }

    #[test]
    fn json_schema_properties_become_columns() {
        let s = p(
            SchemaType::Json,
            r#"{"type":"object","properties":{"id":{"type":"integer"},"price":{"type":"number"},
               "name":{"type":["string","null"]},"ok":{"type":"boolean"},"tags":{"type":"array"}}}"#,
        );
        let cols = columns(&s);
        let kind = |n: &str| cols.iter().find(|c| c.0 == n).map(|c| c.1);
        assert_eq!(kind("id"), Some(ColumnKind::Long));
        assert_eq!(kind("price"), Some(ColumnKind::Double));
        assert_eq!(kind("name"), Some(ColumnKind::String));
        assert_eq!(kind("ok"), Some(ColumnKind::Boolean));
        assert_eq!(kind("tags"), Some(ColumnKind::Json));
        let row = decode(&s, &[], br#"{"id":7,"price":2.5,"tags":["a"],"name":null}"#).unwrap();
        assert_eq!(row["id"], Cell::Long(7));
        assert_eq!(row["price"], Cell::Double(2.5));
        assert_eq!(row["tags"], Cell::Text(r#"["a"]"#.into()));
        assert_eq!(row["name"], Cell::Null);
        assert!(decode(&s, &[], b"[1]").is_err());
        assert!(decode(&s, &[], b"{").is_err());
    }

    #[test]
    fn avro_records_decode_into_their_fields() {
        let s = p(
            SchemaType::Avro,
            r#"{"type":"record","name":"R","fields":[{"name":"id","type":"int"},
               {"name":"amount","type":"double"},{"name":"note","type":["null","string"]},
               {"name":"raw","type":"bytes"},{"name":"kind","type":{"type":"enum","name":"K","symbols":["A","B"]}},
               {"name":"items","type":{"type":"array","items":"long"}}]}"#,
        );
        let cols = columns(&s);
        assert_eq!(
            cols.iter().map(|c| c.1).collect::<Vec<_>>(),
            [
                ColumnKind::Int,
                ColumnKind::Double,
                ColumnKind::String,
                ColumnKind::Binary,
                ColumnKind::String,
                ColumnKind::Json
            ]
        );
        // id=3 (zigzag 6), amount=1.5, note=branch 1 "hi", raw=[1,2], kind=B, items=[5]
        let mut datum = vec![6];
        datum.extend(1.5f64.to_le_bytes());
        datum.extend([2, 4, b'h', b'i', 4, 1, 2, 2, 2, 10, 0]);
        let row = decode(&s, &[], &datum).unwrap();
        assert_eq!(row["id"], Cell::Long(3));
        assert_eq!(row["amount"], Cell::Double(1.5));
        assert_eq!(row["note"], Cell::Text("hi".into()));
        assert_eq!(row["raw"], Cell::Bytes(vec![1, 2]));
        assert_eq!(row["kind"], Cell::Text("B".into()));
        assert_eq!(row["items"], Cell::Text("[5]".into()));
        assert!(decode(&s, &[], &datum[..5]).is_err());
    }

    #[test]
    fn protobuf_messages_decode_into_their_fields() {
        let s = p(
            SchemaType::Protobuf,
            r#"syntax = "proto3"; message M { int64 id = 1; string name = 2; repeated int32 n = 3; optional bool flag = 4; }"#,
        );
        let cols = columns(&s);
        assert_eq!(
            cols,
            [
                ("id".to_string(), ColumnKind::Long),
                ("name".to_string(), ColumnKind::String),
                ("n".to_string(), ColumnKind::Json),
                ("flag".to_string(), ColumnKind::Boolean),
            ]
        );
        // id=150, name="ab", n=[1,2] packed
        let datum = [0x08, 0x96, 0x01, 0x12, 2, b'a', b'b', 0x1a, 2, 1, 2];
        let row = decode(&s, &[0], &datum).unwrap();
        assert_eq!(row["id"], Cell::Long(150));
        assert_eq!(row["name"], Cell::Text("ab".into()));
        assert_eq!(row["n"], Cell::Text("[1,2]".into()));
        assert_eq!(row["flag"], Cell::Null);
        assert!(decode(&s, &[0], &[0x08]).is_err());
    }
}
