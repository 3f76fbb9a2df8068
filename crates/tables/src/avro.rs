//! Avro object container files, write side: what Iceberg's manifests and manifest
//! lists are. Values are encoded against a schema the caller also passes as JSON
//! (the two are kept in step in [`crate::manifest`]).

/// An Avro datum.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i32),
    Long(i64),
    Bytes(Vec<u8>),
    String(String),
    /// The fields of a record, in schema order.
    Record(Vec<Value>),
    Array(Vec<Value>),
    /// A branch of a union, by index, and its value.
    Union(u32, Box<Value>),
}

impl Value {
    /// `["null", T]` with a value.
    pub fn some(v: Value) -> Value {
        Value::Union(1, Box::new(v))
    }

    /// `["null", T]` without one.
    pub fn none() -> Value {
        Value::Union(0, Box::new(Value::Null))
    }

    /// `["null", T]` from an option.
    pub fn opt(v: Option<Value>) -> Value {
        v.map_or_else(Value::none, Value::some)
    }
}

fn long(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    long(out, b.len() as i64);
    out.extend_from_slice(b);
}

/// Avro's binary encoding of `v`.
pub fn encode(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => {}
        Value::Bool(b) => out.push(*b as u8),
        Value::Int(i) => long(out, *i as i64),
        Value::Long(i) => long(out, *i),
        Value::Bytes(b) => bytes(out, b),
        Value::String(s) => bytes(out, s.as_bytes()),
        Value::Record(fields) => fields.iter().for_each(|f| encode(out, f)),
        Value::Array(items) => {
            if !items.is_empty() {
                long(out, items.len() as i64);
                items.iter().for_each(|i| encode(out, i));
            }
            out.push(0);
        }
        Value::Union(branch, v) => {
            long(out, *branch as i64);
            encode(out, v);
        }
    }
}

/// An object container file: `schema` (JSON), the extra metadata, and the rows in
/// one uncompressed block.
pub fn container(schema: &str, meta: &[(&str, String)], rows: &[Value]) -> Vec<u8> {
    let mut out = b"Obj\x01".to_vec();
    let entries = meta.len() + 2;
    long(&mut out, entries as i64);
    bytes(&mut out, b"avro.schema");
    bytes(&mut out, schema.as_bytes());
    // Written although "null" is Avro's default: some readers assume deflate.
    bytes(&mut out, b"avro.codec");
    bytes(&mut out, b"null");
    for (k, v) in meta {
        bytes(&mut out, k.as_bytes());
        bytes(&mut out, v.as_bytes());
    }
    out.push(0);
    let sync = *uuid::Uuid::new_v4().as_bytes();
    out.extend_from_slice(&sync);
    if !rows.is_empty() {
        let mut block = Vec::new();
        rows.iter().for_each(|r| encode(&mut block, r));
        long(&mut out, rows.len() as i64);
        long(&mut out, block.len() as i64);
        out.extend_from_slice(&block);
        out.extend_from_slice(&sync);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_longs() {
        let mut out = Vec::new();
        for v in [0, -1, 1, 64] {
            long(&mut out, v);
        }
        assert_eq!(out, vec![0, 1, 2, 0x80, 1]);
    }

    #[test]
    fn unions_arrays_and_records() {
        let mut out = Vec::new();
        encode(
            &mut out,
            &Value::Record(vec![
                Value::some(Value::Int(3)),
                Value::none(),
                Value::Array(vec![Value::String("a".into())]),
                Value::Array(vec![]),
            ]),
        );
        assert_eq!(out, vec![2, 6, 0, 2, 2, b'a', 0, 0]);
    }

    #[test]
    fn a_container_names_its_schema_and_codec() {
        let f = container("\"long\"", &[("k", "v".into())], &[Value::Long(5)]);
        assert_eq!(&f[..4], b"Obj\x01");
        let text = String::from_utf8_lossy(&f);
        assert!(text.contains("avro.schema") && text.contains("avro.codec"));
        // The block ends with the sync marker of the header.
        let sync = &f[f.len() - 16..];
        assert!(f[..f.len() - 16].windows(16).any(|w| w == sync));
    }
}
