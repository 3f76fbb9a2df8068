//! Protobuf: a schema is one `.proto` file, given as text or as a base64
//! `FileDescriptorProto` (what confluent-kafka's serializer registers), compiled
//! with the files it imports; compatibility as the Confluent registry's diff
//! decides it; and payloads decoded with the message type their frame names.
//!
//! Imports resolve to the files given beside the schema (the registry's
//! references) and to Google's well-known types (`google/protobuf/*.proto`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use base64::Engine;
use prost_reflect::{
    Cardinality, DescriptorPool, DynamicMessage, FieldDescriptor, FileDescriptor, Kind,
    MessageDescriptor,
};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

/// A compiled schema: the pool holding the file and its imports.
#[derive(Clone, Debug)]
pub struct ProtoSchema {
    pub file: FileDescriptor,
}

/// The file name a schema gets when it does not carry one.
const DEFAULT_NAME: &str = "schema.proto";

struct InMemory(HashMap<String, String>);

impl FileResolver for InMemory {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        let text = self
            .0
            .get(name)
            .ok_or_else(|| protox::Error::file_not_found(name))?;
        // An import that is neither says why as text: that is how it was meant.
        File::from_source(name, text).or_else(|text_error| descriptor(text).ok_or(text_error))
    }
}

/// A base64 `FileDescriptorProto`, if `text` is one.
fn descriptor(text: &str) -> Option<File> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()?;
    File::decode_file_descriptor_proto(bytes.as_slice()).ok()
}

/// A file from its text, or else from a base64 `FileDescriptorProto`.
fn source_file(name: &str, text: &str) -> Result<File, String> {
    File::from_source(name, text).or_else(|text_error| {
        descriptor(text).ok_or_else(|| {
            format!("not a .proto file ({text_error}) nor a base64 FileDescriptorProto")
        })
    })
}

impl ProtoSchema {
    /// Compiles `schema` with `imports` (file name to text or base64), which its
    /// `import`s may name.
    pub fn parse(schema: &str, imports: &[(String, String)]) -> Result<ProtoSchema, String> {
        // The name the file gives itself (a descriptor carries one), else ours.
        let name = source_file(DEFAULT_NAME, schema)?
            .file_descriptor_proto()
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| DEFAULT_NAME.to_string());
        let mut files: HashMap<String, String> = imports.iter().cloned().collect();
        files.insert(name.clone(), schema.to_string());
        let mut chain = ChainFileResolver::new();
        chain.add(InMemory(files));
        chain.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(chain);
        compiler.include_imports(true);
        compiler
            .open_file(&name)
            .map_err(|e| format!("invalid Protobuf schema: {e}"))?;
        let pool: DescriptorPool = compiler.descriptor_pool();
        let file = pool
            .get_file_by_name(&name)
            .ok_or_else(|| format!("{name} did not compile"))?;
        Ok(ProtoSchema { file })
    }

    /// The message type at `path` (`[i]`: the file's i-th message; `[i, j]`: its
    /// j-th nested message, ...).
    pub fn message(&self, path: &[usize]) -> Result<MessageDescriptor, String> {
        let (&first, rest) = path.split_first().ok_or("an empty message path")?;
        let mut m = self
            .file
            .messages()
            .nth(first)
            .ok_or_else(|| format!("the schema has no message {first}"))?;
        for &i in rest {
            let child = m.child_messages().nth(i);
            m = child.ok_or_else(|| format!("{} has no nested message {i}", m.full_name()))?;
        }
        Ok(m)
    }

    /// Checks that `datum` decodes as the message at `path`.
    pub fn check_datum(&self, path: &[usize], datum: &[u8]) -> Result<(), String> {
        let m = self.message(path)?;
        DynamicMessage::decode(m.clone(), datum)
            .map(|_| ())
            .map_err(|e| format!("not a {}: {e}", m.full_name()))
    }
}

/// Every message of a file, nested ones included, by full name.
fn messages(file: &FileDescriptor) -> BTreeMap<String, MessageDescriptor> {
    let mut out = BTreeMap::new();
    let mut todo: Vec<MessageDescriptor> = file.messages().collect();
    while let Some(m) = todo.pop() {
        todo.extend(m.child_messages().filter(|c| !c.is_map_entry()));
        out.insert(m.full_name().to_string(), m);
    }
    out
}

/// Scalars that share a wire encoding: a change within a group reads back.
fn scalar_group(k: &Kind) -> Option<u8> {
    Some(match k {
        Kind::Int32 | Kind::Int64 | Kind::Uint32 | Kind::Uint64 | Kind::Bool | Kind::Enum(_) => 0,
        Kind::Sint32 | Kind::Sint64 => 1,
        Kind::String | Kind::Bytes => 2,
        Kind::Fixed32 | Kind::Sfixed32 => 3,
        Kind::Fixed64 | Kind::Sfixed64 => 4,
        Kind::Float => 5,
        Kind::Double => 6,
        Kind::Message(_) => return None,
    })
}

fn real_oneof(f: &FieldDescriptor) -> Option<String> {
    f.containing_oneof()
        .filter(|o| !o.is_synthetic())
        .map(|o| o.name().to_string())
}

/// What `reader` cannot read of what `writer` wrote; empty when it reads all.
pub fn can_read(reader: &ProtoSchema, writer: &ProtoSchema) -> Vec<String> {
    let mut problems = Vec::new();
    let (r, w) = (&reader.file, &writer.file);
    if r.package_name() != w.package_name() {
        problems.push(format!(
            "package changed from {:?} to {:?}",
            w.package_name(),
            r.package_name()
        ));
    }
    let (rm, wm) = (messages(r), messages(w));
    for (name, wmsg) in &wm {
        let Some(rmsg) = rm.get(name) else {
            problems.push(format!("{name}: message removed"));
            continue;
        };
        message(rmsg, wmsg, &mut problems);
    }
    problems
}

fn message(r: &MessageDescriptor, w: &MessageDescriptor, problems: &mut Vec<String>) {
    let name = r.full_name();
    let rf: BTreeMap<u32, FieldDescriptor> = r.fields().map(|f| (f.number(), f)).collect();
    let wf: BTreeMap<u32, FieldDescriptor> = w.fields().map(|f| (f.number(), f)).collect();
    for (n, f) in rf.iter().filter(|(n, _)| !wf.contains_key(n)) {
        if f.cardinality() == Cardinality::Required {
            problems.push(format!("{name}.{} ({n}): a required field added", f.name()));
        }
    }
    for (n, f) in wf.iter().filter(|(n, _)| !rf.contains_key(n)) {
        if f.cardinality() == Cardinality::Required {
            problems.push(format!(
                "{name}.{} ({n}): a required field removed",
                f.name()
            ));
        }
    }
    for (n, wfield) in &wf {
        let Some(rfield) = rf.get(n) else { continue };
        let at = format!("{name}.{} ({n})", rfield.name());
        let (rk, wk) = (rfield.kind(), wfield.kind());
        if rfield.is_map() != wfield.is_map() {
            problems.push(format!("{at}: changed between a map and not a map"));
            continue;
        }
        match (&rk, &wk) {
            (Kind::Message(a), Kind::Message(b)) => {
                if a.full_name() != b.full_name() {
                    problems.push(format!(
                        "{at}: message type changed from {} to {}",
                        b.full_name(),
                        a.full_name()
                    ));
                }
            }
            _ => match (scalar_group(&rk), scalar_group(&wk)) {
                (Some(a), Some(b)) if a == b => {}
                _ => problems.push(format!("{at}: type changed from {wk:?} to {rk:?}")),
            },
        }
        let textual = matches!(rk, Kind::String | Kind::Bytes);
        if rfield.is_list() != wfield.is_list() && !textual && !rfield.is_map() {
            problems.push(format!("{at}: changed between repeated and singular"));
        }
    }
    // Oneofs: a member leaving a oneof that stays, or existing fields gathered
    // into one, would let a reader see two values where one was written.
    let members = |m: &MessageDescriptor| -> BTreeMap<String, BTreeSet<u32>> {
        let mut out: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
        for f in m.fields() {
            if let Some(o) = real_oneof(&f) {
                out.entry(o).or_default().insert(f.number());
            }
        }
        out
    };
    let (ro, wo) = (members(r), members(w));
    for (oneof, wnums) in &wo {
        if let Some(rnums) = ro.get(oneof) {
            for n in wnums.difference(rnums) {
                if rf.contains_key(n) {
                    problems.push(format!("{name}: field {n} left oneof {oneof}"));
                }
            }
        }
    }
    for (oneof, rnums) in &ro {
        let moved_in: Vec<&u32> = rnums
            .iter()
            .filter(|n| {
                wf.get(n)
                    .is_some_and(|f| real_oneof(f).as_deref() != Some(oneof))
            })
            .collect();
        if moved_in.len() > 1 || (!moved_in.is_empty() && wo.contains_key(oneof)) {
            problems.push(format!(
                "{name}: fields {moved_in:?} moved into oneof {oneof}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn proto(body: &str) -> ProtoSchema {
        let text = format!("syntax = \"proto3\";\npackage p;\n{body}");
        ProtoSchema::parse(&text, &[]).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn directions(old: &str, new: &str) -> (bool, bool) {
        let (old, new) = (proto(old), proto(new));
        (
            can_read(&new, &old).is_empty(),
            can_read(&old, &new).is_empty(),
        )
    }

    #[test]
    fn the_compatibility_table() {
        let base = "message M { int32 a = 1; string s = 2; }";
        for (what, new, want) in [
            (
                "field added",
                "message M { int32 a = 1; string s = 2; int64 b = 3; }",
                (true, true),
            ),
            ("field removed", "message M { int32 a = 1; }", (true, true)),
            (
                "field renamed",
                "message M { int32 z = 1; string s = 2; }",
                (true, true),
            ),
            (
                "int32 to int64",
                "message M { int64 a = 1; string s = 2; }",
                (true, true),
            ),
            (
                "string to bytes",
                "message M { int32 a = 1; bytes s = 2; }",
                (true, true),
            ),
            (
                "int32 to sint32",
                "message M { sint32 a = 1; string s = 2; }",
                (false, false),
            ),
            (
                "int32 to string",
                "message M { string a = 1; string s = 2; }",
                (false, false),
            ),
            (
                "message added",
                "message M { int32 a = 1; string s = 2; } message N {}",
                (true, false),
            ),
            (
                "repeated int32",
                "message M { repeated int32 a = 1; string s = 2; }",
                (false, false),
            ),
            (
                "two fields into a new oneof",
                "message M { oneof o { int32 a = 1; string s = 2; } }",
                (false, true),
            ),
        ] {
            assert_eq!(directions(base, new), want, "{what}");
        }
        let moved = ProtoSchema::parse(
            "syntax = \"proto3\";\npackage q;\nmessage M { int32 a = 1; string s = 2; }",
            &[],
        )
        .unwrap();
        assert!(
            !can_read(&moved, &proto(base)).is_empty(),
            "package changed"
        );
    }

    #[test]
    fn descriptors_text_imports_and_datums() {
        let dep = "syntax = \"proto3\";\npackage d;\nmessage Inner { string v = 1; }";
        let main = "syntax = \"proto3\";\npackage p;\nimport \"d.proto\";\nimport \"google/protobuf/timestamp.proto\";\nmessage M { d.Inner inner = 1; google.protobuf.Timestamp at = 2; message Nested { int32 n = 1; } }";
        let s = ProtoSchema::parse(main, &[("d.proto".into(), dep.into())]).unwrap();
        // The same file as a base64 descriptor (what confluent-kafka registers).
        let fdp = s.file.file_descriptor_proto().encode_to_vec();
        let b64 = base64::engine::general_purpose::STANDARD.encode(fdp);
        let d = ProtoSchema::parse(&b64, &[("d.proto".into(), dep.into())]).unwrap();
        assert_eq!(d.file.name(), DEFAULT_NAME);
        assert!(can_read(&s, &d).is_empty() && can_read(&d, &s).is_empty());
        // A datum of M, and of M.Nested (path [0, 0]).
        let m = s.message(&[0]).unwrap();
        let mut msg = DynamicMessage::new(m.clone());
        let mut inner = DynamicMessage::new(
            m.get_field_by_name("inner")
                .unwrap()
                .kind()
                .as_message()
                .unwrap()
                .clone(),
        );
        inner.set_field_by_name("v", prost_reflect::Value::String("x".into()));
        msg.set_field_by_name("inner", prost_reflect::Value::Message(inner));
        let bytes = msg.encode_to_vec();
        assert_eq!(s.check_datum(&[0], &bytes), Ok(()));
        assert_eq!(s.message(&[0, 0]).unwrap().full_name(), "p.M.Nested");
        // Field 1 as a varint where M says a message: refused.
        assert!(s.check_datum(&[0], &[0x08, 0x01]).is_err());
        assert!(s.check_datum(&[0], &[0x0a, 0x05, 0x00]).is_err());
        assert!(s.message(&[3]).is_err() && s.message(&[0, 5]).is_err());
    }

    #[test]
    fn bad_schemas_say_why() {
        for (text, says) in [
            ("message {", "not a .proto file"),
            (
                "syntax = \"proto3\";\nimport \"missing.proto\";",
                "invalid Protobuf schema",
            ),
            (
                "syntax = \"proto3\";\nmessage M { Unknown u = 1; }",
                "invalid Protobuf schema",
            ),
            // An import that does not parse says where, not that it is missing.
            (
                "syntax = \"proto3\";\nimport \"bad.proto\";",
                "expected an identifier",
            ),
        ] {
            let imports = [("bad.proto".to_string(), "message {".to_string())];
            let err = ProtoSchema::parse(text, &imports).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
