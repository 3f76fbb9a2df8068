//! A schema of any format: parsed, checked, and in the canonical text its identity
//! is computed from (docs/schemas.md, "Ids, versions, identity"), so that the same
//! schema written with other whitespace, key order or encoding gets the same id.

use base64::Engine;
use prost::Message;
use serde_json::Value;

use crate::compat::{self, Level};
use crate::protobuf::ProtoSchema;
use crate::{avro, json};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemaType {
    Avro,
    Json,
    Protobuf,
}

impl SchemaType {
    pub fn as_str(self) -> &'static str {
        match self {
            SchemaType::Avro => "AVRO",
            SchemaType::Json => "JSON",
            SchemaType::Protobuf => "PROTOBUF",
        }
    }

    /// A request's `schemaType` (absent: Avro, as the registry has it).
    pub fn parse(name: Option<&str>) -> Result<SchemaType, String> {
        match name.map(str::to_ascii_uppercase).as_deref() {
            None | Some("AVRO") => Ok(SchemaType::Avro),
            Some("JSON") => Ok(SchemaType::Json),
            Some("PROTOBUF") => Ok(SchemaType::Protobuf),
            Some(other) => Err(format!(
                "unknown schemaType {other:?}: AVRO, JSON or PROTOBUF"
            )),
        }
    }
}

/// A parsed schema.
#[derive(Clone, Debug)]
pub enum Parsed {
    Avro(avro::Schema),
    Json(Value),
    Protobuf(ProtoSchema),
}

impl Parsed {
    pub fn schema_type(&self) -> SchemaType {
        match self {
            Parsed::Avro(_) => SchemaType::Avro,
            Parsed::Json(_) => SchemaType::Json,
            Parsed::Protobuf(_) => SchemaType::Protobuf,
        }
    }
}

/// A schema ready to check payloads: what the append paths keep per schema id.
pub struct Compiled {
    pub parsed: Parsed,
    json: Option<crate::validate::JsonValidator>,
}

impl Compiled {
    pub fn new(parsed: Parsed) -> Result<Compiled, String> {
        let json = match &parsed {
            Parsed::Json(v) => Some(crate::validate::JsonValidator::compile(v)?),
            _ => None,
        };
        Ok(Compiled { parsed, json })
    }

    /// Checks a JSON document (a JSON Schema only).
    pub fn check_document(&self, doc: &Value) -> Result<(), crate::validate::Violation> {
        match &self.json {
            Some(v) => v.check(doc),
            None => Err(crate::validate::Violation {
                path: String::new(),
                rule: "schemaType".into(),
                message: format!(
                    "the schema is {}, not a JSON Schema",
                    self.parsed.schema_type().as_str()
                ),
            }),
        }
    }

    /// Checks the datum of a framed payload (after the schema id and, for
    /// Protobuf, the message path): Avro's binary encoding, a Protobuf message,
    /// or UTF-8 JSON text.
    pub fn check_datum(&self, message_path: &[usize], datum: &[u8]) -> Result<(), String> {
        match &self.parsed {
            Parsed::Avro(s) => avro::check_datum(s, datum),
            Parsed::Protobuf(p) => p.check_datum(message_path, datum),
            Parsed::Json(_) => {
                let doc: Value =
                    serde_json::from_slice(datum).map_err(|e| format!("not JSON: {e}"))?;
                self.check_document(&doc)
                    .map_err(|v| format!("at {:?}, {}: {}", v.path, v.rule, v.message))
            }
        }
    }
}

/// Parses `text` as a schema of type `t` with the schemas it references
/// (`imports`, by name: the Protobuf files it imports, the Avro schemas defining
/// types it names, dependencies first); returns it with its canonical text.
pub fn parse(
    t: SchemaType,
    text: &str,
    imports: &[(String, String)],
) -> Result<(Parsed, String), String> {
    match t {
        SchemaType::Avro => {
            let named: Vec<&str> = imports.iter().map(|(_, t)| t.as_str()).collect();
            let schema = avro::Schema::parse_with(text, &named)?;
            let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
            let mut out = String::new();
            canonical_json(&collapse_primitives(value), &mut out);
            Ok((Parsed::Avro(schema), out))
        }
        SchemaType::Json => {
            let value = json::parse(text)?;
            crate::validate::JsonValidator::compile(&value)?;
            let mut out = String::new();
            canonical_json(&value, &mut out);
            Ok((Parsed::Json(value), out))
        }
        SchemaType::Protobuf => {
            let schema = ProtoSchema::parse(text, imports)?;
            // The compiled descriptor without what does not change its meaning
            // (source positions, derived JSON names), whichever form it came in.
            let mut fdp = schema.file.file_descriptor_proto().clone();
            fdp.source_code_info = None;
            for m in fdp.message_type.iter_mut() {
                clear_json_names(m);
            }
            let out = base64::engine::general_purpose::STANDARD.encode(fdp.encode_to_vec());
            Ok((Parsed::Protobuf(schema), out))
        }
    }
}

fn clear_json_names(m: &mut prost_types::DescriptorProto) {
    for f in m.field.iter_mut() {
        f.json_name = None;
    }
    for n in m.nested_type.iter_mut() {
        clear_json_names(n);
    }
}

/// `{"type": "int"}` is `"int"`: an object holding nothing but a primitive type
/// name says no more than the name.
fn collapse_primitives(v: Value) -> Value {
    match v {
        Value::Object(o) => {
            if o.len() == 1 {
                if let Some(Value::String(t)) = o.get("type") {
                    if matches!(
                        t.as_str(),
                        "null"
                            | "boolean"
                            | "int"
                            | "long"
                            | "float"
                            | "double"
                            | "bytes"
                            | "string"
                    ) {
                        return Value::String(t.clone());
                    }
                }
            }
            Value::Object(
                o.into_iter()
                    .map(|(k, v)| (k, collapse_primitives(v)))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.into_iter().map(collapse_primitives).collect()),
        other => other,
    }
}

/// Compact JSON with every object's keys in byte order, whatever order the map
/// keeps them in.
fn canonical_json(v: &Value, out: &mut String) {
    match v {
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical_json(&o[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// What keeps `new` from being registered after `previous` (the subject's
/// undeleted versions, oldest first) at `level`; empty when nothing does.
pub fn compatible(level: Level, new: &Parsed, previous: &[Parsed]) -> Vec<String> {
    compat::check(level, new, previous, |reader, writer| {
        match (reader, writer) {
            (Parsed::Avro(r), Parsed::Avro(w)) => avro::can_read(r, w),
            (Parsed::Json(r), Parsed::Json(w)) => json::can_read(r, w),
            (Parsed::Protobuf(r), Parsed::Protobuf(w)) => crate::protobuf::can_read(r, w),
            (r, w) => vec![format!(
                "Incompatible because of different schema type: {} and {}",
                w.schema_type().as_str(),
                r.schema_type().as_str()
            )],
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(t: SchemaType, text: &str) -> String {
        parse(t, text, &[])
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .1
    }

    #[test]
    fn whitespace_key_order_and_spelling_do_not_change_the_canonical_text() {
        let a = canon(
            SchemaType::Avro,
            r#"{"type":"record","name":"R","fields":[{"name":"f","type":{"type":"int"}}]}"#,
        );
        let b = canon(
            SchemaType::Avro,
            "{ \"fields\": [ {\"type\": \"int\", \"name\": \"f\"} ],\n \"name\": \"R\", \"type\": \"record\" }",
        );
        assert_eq!(a, b);
        assert_eq!(
            a,
            r#"{"fields":[{"name":"f","type":"int"}],"name":"R","type":"record"}"#
        );
        // Field order is meaning, not spelling.
        let swapped = canon(
            SchemaType::Avro,
            r#"{"type":"record","name":"R","fields":[{"name":"g","type":"int"},{"name":"f","type":"int"}]}"#,
        );
        assert_ne!(
            canon(
                SchemaType::Avro,
                r#"{"type":"record","name":"R","fields":[{"name":"f","type":"int"},{"name":"g","type":"int"}]}"#
            ),
            swapped
        );
        assert_eq!(
            canon(
                SchemaType::Json,
                r#"{ "type": "object", "properties": {"b": {}, "a": {}} }"#
            ),
            canon(
                SchemaType::Json,
                r#"{"properties":{"a":{},"b":{}},"type":"object"}"#
            )
        );
        // Protobuf: the same file as text and as a base64 descriptor.
        let text = "syntax = \"proto3\";\npackage p;\nmessage M {\n  int32 a = 1; // a comment\n}";
        let (parsed, from_text) = parse(SchemaType::Protobuf, text, &[]).unwrap();
        let Parsed::Protobuf(p) = parsed else {
            unreachable!()
        };
        let b64 = base64::engine::general_purpose::STANDARD
            .encode(p.file.file_descriptor_proto().encode_to_vec());
        assert_eq!(canon(SchemaType::Protobuf, &b64), from_text);
        let spaced = text.replace("int32 a = 1;", "int32   a=1 ;");
        assert_eq!(canon(SchemaType::Protobuf, &spaced), from_text);
    }

    #[test]
    fn compiled_schemas_check_payloads_of_their_format() {
        let compiled = |t, text: &str| Compiled::new(parse(t, text, &[]).unwrap().0).unwrap();
        let avro = compiled(
            SchemaType::Avro,
            r#"{"type":"record","name":"R","fields":[{"name":"n","type":"long"}]}"#,
        );
        assert_eq!(avro.check_datum(&[], &[4]), Ok(()));
        assert!(avro.check_datum(&[], &[4, 4]).is_err());
        assert!(
            avro.check_document(&serde_json::json!({}))
                .unwrap_err()
                .rule
                == "schemaType"
        );
        let json = compiled(SchemaType::Json, r#"{"type":"object","required":["n"]}"#);
        assert_eq!(json.check_datum(&[], br#"{"n":1}"#), Ok(()));
        let err = json.check_datum(&[], br#"{"m":1}"#).unwrap_err();
        assert!(err.contains("required"), "{err}");
        assert!(json
            .check_datum(&[], b"{")
            .unwrap_err()
            .contains("not JSON"));
        let proto = compiled(
            SchemaType::Protobuf,
            "syntax = \"proto3\";\nmessage M { int64 n = 1; }",
        );
        assert_eq!(proto.check_datum(&[0], &[0x08, 0x02]), Ok(()));
        assert!(proto.check_datum(&[0], &[0x0a, 0x02]).is_err());
        assert!(proto.check_datum(&[1], &[]).is_err());
    }

    #[test]
    fn types_parse_and_mixed_types_are_never_compatible() {
        assert_eq!(SchemaType::parse(None), Ok(SchemaType::Avro));
        assert_eq!(SchemaType::parse(Some("json")), Ok(SchemaType::Json));
        assert!(SchemaType::parse(Some("XML"))
            .unwrap_err()
            .contains("AVRO, JSON or PROTOBUF"));
        let (avro, _) = parse(SchemaType::Avro, r#""string""#, &[]).unwrap();
        let (json, _) = parse(SchemaType::Json, r#"{"type":"string"}"#, &[]).unwrap();
        let problems = compatible(Level::Backward, &json, std::slice::from_ref(&avro));
        assert!(
            problems[0].contains("different schema type"),
            "{problems:?}"
        );
        assert!(compatible(Level::None, &json, &[avro]).is_empty());
        assert!(parse(SchemaType::Json, r#"{"type":"nope"}"#, &[]).is_err());
    }
}
