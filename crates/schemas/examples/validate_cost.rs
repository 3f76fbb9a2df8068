//! What checking a 1 KiB JSON document against a 20-field schema costs, per
//! document, on one core: the figure the append paths' validation adds.
//!
//!   cargo run --release -p picomq-schemas --example validate_cost

use std::time::Instant;

use picomq_schemas::validate::JsonValidator;
use serde_json::{json, Map, Value};

fn main() {
    let mut properties = Map::new();
    let mut doc = Map::new();
    for i in 0..20 {
        let (schema, value) = match i % 4 {
            0 => (
                json!({"type": "string", "maxLength": 160}),
                json!(format!("value-{i}-{}", "x".repeat(110))),
            ),
            1 => (json!({"type": "integer", "minimum": 0}), json!(i * 1000)),
            2 => (json!({"type": "number"}), json!(i as f64 * 1.5)),
            _ => (
                json!({"type": "array", "items": {"type": "string"}, "maxItems": 8}),
                json!(["a-tag", "b-tag", "c-tag"]),
            ),
        };
        properties.insert(format!("field_{i:02}"), schema);
        doc.insert(format!("field_{i:02}"), value);
    }
    let required: Vec<Value> = properties.keys().map(|k| json!(k)).collect();
    let schema = json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false});
    let doc = Value::Object(doc);
    let text = doc.to_string();
    let v = JsonValidator::compile(&schema).expect("schema compiles");
    assert_eq!(v.check(&doc), Ok(()));
    let n = 200_000;
    // Parsing is paid with or without validation (a JSON append is parsed to be
    // checked as JSON); both are shown.
    let t = Instant::now();
    for _ in 0..n {
        let d: Value = serde_json::from_str(std::hint::black_box(&text)).unwrap();
        std::hint::black_box(d);
    }
    let parse = t.elapsed().as_nanos() as f64 / n as f64;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(v.check(std::hint::black_box(&doc))).unwrap();
    }
    let check = t.elapsed().as_nanos() as f64 / n as f64;
    println!("document: {} bytes, 20 fields", text.len());
    println!("parse into a Value: {:.0} ns per document", parse);
    println!(
        "check against the compiled schema: {:.0} ns per document",
        check
    );
}
