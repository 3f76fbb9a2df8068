//! Avro: schemas parsed from their JSON form, the reader/writer compatibility
//! rules of Avro's schema resolution as the Java library (and so the Confluent
//! registry) decides them, and a check that a binary datum decodes with a schema.
//!
//! Logical types (`date`, `decimal`, ...) are read as their underlying type: the
//! Java library's compatibility check ignores them, and so does this one.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

/// A type: a primitive, a container, or a named type (record, enum, fixed) by its
/// index in [`Schema::named`], so recursive types are plain indices.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    Array(Box<Node>),
    Map(Box<Node>),
    Union(Vec<Node>),
    Named(usize),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Named {
    /// The full name (`namespace.name`).
    pub full_name: String,
    /// Full names this type also answers to, as a reader.
    pub aliases: Vec<String>,
    pub kind: NamedKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum NamedKind {
    Record(Vec<Field>),
    Enum {
        symbols: Vec<String>,
        default: Option<String>,
    },
    Fixed(usize),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    pub name: String,
    pub aliases: Vec<String>,
    pub node: Node,
    pub has_default: bool,
}

/// A parsed schema: its root type and the named types it defines.
#[derive(Clone, Debug, PartialEq)]
pub struct Schema {
    pub root: Node,
    pub named: Vec<Named>,
}

/// Types nested deeper than this are refused.
const DEPTH_MAX: usize = 64;
/// Values nested deeper than this (through recursive types) are refused: the
/// check recurses, and its stack is bounded.
const DATUM_DEPTH_MAX: usize = 256;

impl Schema {
    /// Parses a schema's JSON text.
    pub fn parse(text: &str) -> Result<Schema, String> {
        Schema::parse_with(text, &[])
    }

    /// Parses a schema that may name types defined by `imports` (the schemas
    /// it references, each parsed first, dependencies before dependents).
    pub fn parse_with(text: &str, imports: &[&str]) -> Result<Schema, String> {
        let mut p = Parser {
            named: Vec::new(),
            by_name: HashMap::new(),
        };
        for (i, import) in imports.iter().enumerate() {
            let json: Value = serde_json::from_str(import)
                .map_err(|e| format!("reference {i} is not JSON: {e}"))?;
            p.node(&json, "", 0)
                .map_err(|e| format!("reference {i}: {e}"))?;
        }
        let json: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let root = p.node(&json, "", 0)?;
        Ok(Schema {
            root,
            named: p.named,
        })
    }
}

struct Parser {
    named: Vec<Named>,
    by_name: HashMap<String, usize>,
}

fn primitive(name: &str) -> Option<Node> {
    Some(match name {
        "null" => Node::Null,
        "boolean" => Node::Boolean,
        "int" => Node::Int,
        "long" => Node::Long,
        "float" => Node::Float,
        "double" => Node::Double,
        "bytes" => Node::Bytes,
        "string" => Node::String,
        _ => return None,
    })
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The full name of `name` in `namespace` (a dotted name is already full).
fn full_name(name: &str, namespace: &str) -> String {
    if name.contains('.') || namespace.is_empty() {
        name.to_string()
    } else {
        format!("{namespace}.{name}")
    }
}

/// A type's name as messages give it: the primitive's, the container's, or the
/// named type's full name.
fn type_name(named: &[Named], n: &Node) -> String {
    match n {
        Node::Null => "null",
        Node::Boolean => "boolean",
        Node::Int => "int",
        Node::Long => "long",
        Node::Float => "float",
        Node::Double => "double",
        Node::Bytes => "bytes",
        Node::String => "string",
        Node::Array(_) => "array",
        Node::Map(_) => "map",
        Node::Union(_) => "union",
        Node::Named(i) => return named[*i].full_name.clone(),
    }
    .to_string()
}

fn simple_name(full: &str) -> &str {
    full.rsplit('.').next().unwrap_or(full)
}

impl Parser {
    fn node(&mut self, json: &Value, namespace: &str, depth: usize) -> Result<Node, String> {
        if depth > DEPTH_MAX {
            return Err(format!("nested deeper than {DEPTH_MAX}"));
        }
        match json {
            Value::String(name) => self.reference(name, namespace),
            Value::Array(branches) => {
                let mut nodes = Vec::with_capacity(branches.len());
                let mut kinds = HashSet::new();
                for b in branches {
                    let n = self.node(b, namespace, depth + 1)?;
                    if matches!(n, Node::Union(_)) {
                        return Err("a union directly inside a union".into());
                    }
                    let kind = type_name(&self.named, &n);
                    if !kinds.insert(kind.clone()) {
                        return Err(format!("the union holds {kind} twice"));
                    }
                    nodes.push(n);
                }
                Ok(Node::Union(nodes))
            }
            Value::Object(o) => {
                let ty = o.get("type").ok_or("a schema object without \"type\"")?;
                let Some(ty) = ty.as_str() else {
                    // {"type": {...}} or {"type": [...]}: the inner schema.
                    return self.node(ty, namespace, depth + 1);
                };
                match ty {
                    "record" | "error" | "enum" | "fixed" => self.define(o, ty, namespace, depth),
                    "array" => {
                        let items = o.get("items").ok_or("an array without \"items\"")?;
                        Ok(Node::Array(Box::new(self.node(
                            items,
                            namespace,
                            depth + 1,
                        )?)))
                    }
                    "map" => {
                        let values = o.get("values").ok_or("a map without \"values\"")?;
                        Ok(Node::Map(Box::new(self.node(
                            values,
                            namespace,
                            depth + 1,
                        )?)))
                    }
                    other => self.reference(other, namespace),
                }
            }
            other => Err(format!("{other} is not a schema")),
        }
    }

    fn reference(&self, name: &str, namespace: &str) -> Result<Node, String> {
        if let Some(p) = primitive(name) {
            return Ok(p);
        }
        let found = self
            .by_name
            .get(&full_name(name, namespace))
            .or_else(|| self.by_name.get(name));
        found
            .map(|&i| Node::Named(i))
            .ok_or_else(|| format!("unknown type {name:?}"))
    }

    fn define(
        &mut self,
        o: &serde_json::Map<String, Value>,
        ty: &str,
        namespace: &str,
        depth: usize,
    ) -> Result<Node, String> {
        let name = o
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("a {ty} without a \"name\""))?;
        let namespace = match o.get("namespace") {
            Some(Value::String(ns)) if !name.contains('.') => ns.as_str(),
            Some(Value::String(_)) | None => namespace,
            Some(_) => return Err(format!("{name}: \"namespace\" is not a string")),
        };
        let full = full_name(name, namespace);
        if !full.split('.').all(valid_name) {
            return Err(format!("{full:?} is not a valid name"));
        }
        if primitive(simple_name(&full)).is_some() {
            return Err(format!("{full:?} redefines a primitive type"));
        }
        if self.by_name.contains_key(&full) {
            return Err(format!("{full} is defined twice"));
        }
        // Its own namespace for what it encloses.
        let inner_ns = full.rsplit_once('.').map_or("", |(ns, _)| ns).to_string();
        let aliases = aliases(o, &inner_ns)?;
        let index = self.named.len();
        self.named.push(Named {
            full_name: full.clone(),
            aliases,
            kind: NamedKind::Fixed(0),
        });
        self.by_name.insert(full.clone(), index);
        let kind = match ty {
            "record" | "error" => {
                let fields = o
                    .get("fields")
                    .and_then(Value::as_array)
                    .ok_or_else(|| format!("{full}: \"fields\" must be an array"))?;
                let mut out: Vec<Field> = Vec::with_capacity(fields.len());
                for f in fields {
                    let f = f
                        .as_object()
                        .ok_or_else(|| format!("{full}: a field is not an object"))?;
                    let fname = f
                        .get("name")
                        .and_then(Value::as_str)
                        .filter(|n| valid_name(n))
                        .ok_or_else(|| format!("{full}: a field without a valid \"name\""))?;
                    if out.iter().any(|x| x.name == fname) {
                        return Err(format!("{full}: field {fname} is defined twice"));
                    }
                    let fty = f
                        .get("type")
                        .ok_or_else(|| format!("{full}.{fname}: no \"type\""))?;
                    let node = self.node(fty, &inner_ns, depth + 1)?;
                    let field_aliases = match f.get("aliases") {
                        None => Vec::new(),
                        Some(Value::Array(a)) => a
                            .iter()
                            .map(|v| v.as_str().map(str::to_string))
                            .collect::<Option<Vec<_>>>()
                            .ok_or_else(|| format!("{full}.{fname}: bad \"aliases\""))?,
                        Some(_) => return Err(format!("{full}.{fname}: bad \"aliases\"")),
                    };
                    out.push(Field {
                        name: fname.to_string(),
                        aliases: field_aliases,
                        node,
                        has_default: f.contains_key("default"),
                    });
                }
                NamedKind::Record(out)
            }
            "enum" => {
                let symbols = o
                    .get("symbols")
                    .and_then(Value::as_array)
                    .ok_or_else(|| format!("{full}: \"symbols\" must be an array"))?;
                let mut out: Vec<String> = Vec::with_capacity(symbols.len());
                for s in symbols {
                    let s = s
                        .as_str()
                        .filter(|s| valid_name(s))
                        .ok_or_else(|| format!("{full}: {s} is not a valid symbol"))?;
                    if out.iter().any(|x| x == s) {
                        return Err(format!("{full}: symbol {s} is listed twice"));
                    }
                    out.push(s.to_string());
                }
                let default = match o.get("default") {
                    None => None,
                    Some(Value::String(d)) if out.contains(d) => Some(d.clone()),
                    Some(d) => return Err(format!("{full}: default {d} is not a symbol")),
                };
                NamedKind::Enum {
                    symbols: out,
                    default,
                }
            }
            _ => {
                let size = o
                    .get("size")
                    .and_then(Value::as_u64)
                    .filter(|s| *s <= i32::MAX as u64)
                    .ok_or_else(|| format!("{full}: \"size\" must be a count of bytes"))?;
                NamedKind::Fixed(size as usize)
            }
        };
        self.named[index].kind = kind;
        Ok(Node::Named(index))
    }
}

fn aliases(o: &serde_json::Map<String, Value>, namespace: &str) -> Result<Vec<String>, String> {
    match o.get("aliases") {
        None => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(|s| full_name(s, namespace)))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| "\"aliases\" must be strings".to_string()),
        Some(_) => Err("\"aliases\" must be an array".into()),
    }
}

/// Why a reader cannot read what a writer wrote, with the path where it fails.
pub type Problem = String;

/// Whether `reader` can read every datum written with `writer` (Avro's schema
/// resolution); empty when it can.
pub fn can_read(reader: &Schema, writer: &Schema) -> Vec<Problem> {
    let mut c = Checker {
        reader,
        writer,
        assumed: HashSet::new(),
        problems: Vec::new(),
    };
    c.check(&reader.root, &writer.root, "/");
    c.problems
}

struct Checker<'a> {
    reader: &'a Schema,
    writer: &'a Schema,
    /// Named pairs being checked (recursive types): assumed compatible.
    assumed: HashSet<(usize, usize)>,
    problems: Vec<Problem>,
}

impl Checker<'_> {
    fn fail(&mut self, path: &str, why: String) {
        self.problems.push(format!("{path}: {why}"));
    }

    fn check(&mut self, r: &Node, w: &Node, path: &str) {
        // A writer's union: every branch it may write must be readable.
        if let Node::Union(ws) = w {
            for (i, wb) in ws.iter().enumerate() {
                self.check(r, wb, &format!("{path}[union branch {i}]"));
            }
            return;
        }
        if let Node::Union(rs) = r {
            let fits = rs.iter().any(|rb| {
                let mut probe = Checker {
                    reader: self.reader,
                    writer: self.writer,
                    assumed: self.assumed.clone(),
                    problems: Vec::new(),
                };
                probe.check(rb, w, path);
                probe.problems.is_empty()
            });
            if !fits {
                let w = type_name(&self.writer.named, w);
                self.fail(path, format!("no branch of the reader's union reads {w}"));
            }
            return;
        }
        use Node::*;
        match (r, w) {
            (Null, Null)
            | (Boolean, Boolean)
            | (Int, Int)
            | (Long, Long)
            | (Float, Float)
            | (Double, Double)
            | (Bytes, Bytes)
            | (String, String) => {}
            // Promotions.
            (Long | Float | Double, Int) | (Float | Double, Long) | (Double, Float) => {}
            (Bytes, String) | (String, Bytes) => {}
            (Array(ri), Array(wi)) => self.check(ri, wi, &format!("{path}items/")),
            (Map(rv), Map(wv)) => self.check(rv, wv, &format!("{path}values/")),
            (Named(ri), Named(wi)) => self.named(*ri, *wi, path),
            _ => {
                let (rd, wd) = (
                    type_name(&self.reader.named, r),
                    type_name(&self.writer.named, w),
                );
                self.fail(path, format!("a reader's {rd} cannot read a writer's {wd}"));
            }
        }
    }

    fn named(&mut self, ri: usize, wi: usize, path: &str) {
        if !self.assumed.insert((ri, wi)) {
            return;
        }
        let (rn, wn) = (&self.reader.named[ri], &self.writer.named[wi]);
        let same_name = simple_name(&rn.full_name) == simple_name(&wn.full_name)
            || rn.aliases.contains(&wn.full_name);
        if !same_name {
            let why = format!("names differ: {} and {}", rn.full_name, wn.full_name);
            return self.fail(path, why);
        }
        match (&rn.kind, &wn.kind) {
            (NamedKind::Fixed(a), NamedKind::Fixed(b)) => {
                if a != b {
                    self.fail(path, format!("fixed sizes differ: {a} and {b}"));
                }
            }
            (
                NamedKind::Enum {
                    symbols: rs,
                    default,
                },
                NamedKind::Enum { symbols: ws, .. },
            ) => {
                if default.is_none() {
                    let missing: Vec<&String> = ws.iter().filter(|s| !rs.contains(s)).collect();
                    if !missing.is_empty() {
                        self.fail(path, format!("the reader's enum lacks {missing:?}"));
                    }
                }
            }
            (NamedKind::Record(rf), NamedKind::Record(wf)) => {
                for f in rf {
                    let found = wf
                        .iter()
                        .find(|x| x.name == f.name)
                        .or_else(|| wf.iter().find(|x| f.aliases.contains(&x.name)));
                    let fpath = format!("{path}{}/", f.name);
                    match found {
                        Some(x) => self.check(&f.node, &x.node, &fpath),
                        None if f.has_default => {}
                        None => self.fail(
                            &fpath,
                            "a field the writer lacks, without a default".to_string(),
                        ),
                    }
                }
            }
            _ => {
                let why = format!("{} is a different kind of type", rn.full_name);
                self.fail(path, why);
            }
        }
    }
}

/// Checks that `datum` is exactly one value of `schema` in Avro's binary encoding.
pub fn check_datum(schema: &Schema, datum: &[u8]) -> Result<(), String> {
    let mut d = Decoder {
        schema,
        bytes: datum,
        at: 0,
        // Items of zero bytes (nulls in an array) still cost a step each.
        budget: 1_000_000 + datum.len() as u64,
    };
    d.value(&schema.root, 0)?;
    if d.at != datum.len() {
        return Err(format!("{} bytes left after the value", datum.len() - d.at));
    }
    Ok(())
}

/// A decoded Avro value (ints and longs as `Long`, floats and doubles as
/// `Double`, an enum as its symbol, a union as its branch's value).
#[derive(Clone, Debug, PartialEq)]
pub enum Datum {
    Null,
    Boolean(bool),
    Long(i64),
    Double(f64),
    Bytes(Vec<u8>),
    String(String),
    Array(Vec<Datum>),
    Map(Vec<(String, Datum)>),
    Record(Vec<(String, Datum)>),
}

impl Datum {
    /// Its JSON form (bytes as base64 text).
    pub fn to_json(&self) -> Value {
        use base64::Engine as _;
        match self {
            Datum::Null => Value::Null,
            Datum::Boolean(b) => Value::Bool(*b),
            Datum::Long(n) => Value::from(*n),
            Datum::Double(d) => serde_json::Number::from_f64(*d).map_or(Value::Null, Value::Number),
            Datum::Bytes(b) => Value::String(base64::engine::general_purpose::STANDARD.encode(b)),
            Datum::String(s) => Value::String(s.clone()),
            Datum::Array(items) => Value::Array(items.iter().map(Datum::to_json).collect()),
            Datum::Map(pairs) | Datum::Record(pairs) => Value::Object(
                pairs
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }
}

/// Decodes `datum`, exactly one value of `schema` in Avro's binary encoding.
pub fn decode_datum(schema: &Schema, datum: &[u8]) -> Result<Datum, String> {
    let mut d = Decoder {
        schema,
        bytes: datum,
        at: 0,
        budget: 1_000_000 + datum.len() as u64,
    };
    let v = d.decode(&schema.root, 0)?;
    if d.at != datum.len() {
        return Err(format!("{} bytes left after the value", datum.len() - d.at));
    }
    Ok(v)
}

struct Decoder<'a> {
    schema: &'a Schema,
    bytes: &'a [u8],
    at: usize,
    budget: u64,
}

impl Decoder<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("ends inside a value at byte {}", self.at))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn varint(&mut self, max_bytes: usize) -> Result<i64, String> {
        let mut v: u64 = 0;
        for i in 0..max_bytes {
            let b = self.take(1)?[0];
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok((v >> 1) as i64 ^ -((v & 1) as i64));
            }
        }
        Err(format!(
            "a number longer than {max_bytes} bytes at byte {}",
            self.at
        ))
    }

    fn int(&mut self) -> Result<i64, String> {
        let v = self.varint(5)?;
        i32::try_from(v)
            .map(i64::from)
            .map_err(|_| format!("{v} is out of an int's range"))
    }

    fn length(&mut self) -> Result<usize, String> {
        let n = self.varint(10)?;
        usize::try_from(n).map_err(|_| format!("a negative length {n}"))
    }

    fn step(&mut self) -> Result<(), String> {
        self.budget = self
            .budget
            .checked_sub(1)
            .ok_or("too many items for the payload's size")?;
        Ok(())
    }

    fn value(&mut self, node: &Node, depth: usize) -> Result<(), String> {
        if depth > DATUM_DEPTH_MAX {
            return Err(format!("nested deeper than {DATUM_DEPTH_MAX}"));
        }
        self.step()?;
        match node {
            Node::Null => {}
            Node::Boolean => {
                let b = self.take(1)?[0];
                if b > 1 {
                    return Err(format!("{b} is not a boolean"));
                }
            }
            Node::Int => {
                self.int()?;
            }
            Node::Long => {
                self.varint(10)?;
            }
            Node::Float => {
                self.take(4)?;
            }
            Node::Double => {
                self.take(8)?;
            }
            Node::Bytes => {
                let n = self.length()?;
                self.take(n)?;
            }
            Node::String => {
                let n = self.length()?;
                let s = self.take(n)?;
                std::str::from_utf8(s).map_err(|e| format!("a string that is not UTF-8: {e}"))?;
            }
            Node::Array(items) => self.blocks(|d| d.value(items, depth + 1))?,
            Node::Map(values) => self.blocks(|d| {
                d.value(&Node::String, depth + 1)?;
                d.value(values, depth + 1)
            })?,
            Node::Union(branches) => {
                let i = self.varint(10)?;
                let b = usize::try_from(i)
                    .ok()
                    .and_then(|i| branches.get(i))
                    .ok_or_else(|| format!("union branch {i} of {}", branches.len()))?;
                self.value(b, depth + 1)?;
            }
            Node::Named(i) => match &self.schema.named[*i].kind {
                NamedKind::Fixed(n) => {
                    self.take(*n)?;
                }
                NamedKind::Enum { symbols, .. } => {
                    let s = self.int()?;
                    if s < 0 || s as usize >= symbols.len() {
                        return Err(format!("enum symbol {s} of {}", symbols.len()));
                    }
                }
                NamedKind::Record(fields) => {
                    for f in fields {
                        self.value(&f.node, depth + 1)?;
                    }
                }
            },
        }
        Ok(())
    }

    /// [`Decoder::value`], keeping what it reads.
    fn decode(&mut self, node: &Node, depth: usize) -> Result<Datum, String> {
        if depth > DATUM_DEPTH_MAX {
            return Err(format!("nested deeper than {DATUM_DEPTH_MAX}"));
        }
        self.step()?;
        Ok(match node {
            Node::Null => Datum::Null,
            Node::Boolean => match self.take(1)?[0] {
                0 => Datum::Boolean(false),
                1 => Datum::Boolean(true),
                b => return Err(format!("{b} is not a boolean")),
            },
            Node::Int => Datum::Long(self.int()?),
            Node::Long => Datum::Long(self.varint(10)?),
            Node::Float => {
                let b = self.take(4)?;
                Datum::Double(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            }
            Node::Double => {
                let b = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                Datum::Double(f64::from_le_bytes(a))
            }
            Node::Bytes => {
                let n = self.length()?;
                Datum::Bytes(self.take(n)?.to_vec())
            }
            Node::String => {
                let n = self.length()?;
                let s = self.take(n)?;
                Datum::String(
                    std::str::from_utf8(s)
                        .map_err(|e| format!("a string that is not UTF-8: {e}"))?
                        .to_string(),
                )
            }
            Node::Array(items) => {
                let mut out = Vec::new();
                self.blocks(|d| {
                    out.push(d.decode(items, depth + 1)?);
                    Ok(())
                })?;
                Datum::Array(out)
            }
            Node::Map(values) => {
                let mut out = Vec::new();
                self.blocks(|d| {
                    let Datum::String(k) = d.decode(&Node::String, depth + 1)? else {
                        unreachable!("a string decodes as a string")
                    };
                    out.push((k, d.decode(values, depth + 1)?));
                    Ok(())
                })?;
                Datum::Map(out)
            }
            Node::Union(branches) => {
                let i = self.varint(10)?;
                let b = usize::try_from(i)
                    .ok()
                    .and_then(|i| branches.get(i))
                    .ok_or_else(|| format!("union branch {i} of {}", branches.len()))?;
                self.decode(b, depth + 1)?
            }
            Node::Named(i) => match &self.schema.named[*i].kind {
                NamedKind::Fixed(n) => Datum::Bytes(self.take(*n)?.to_vec()),
                NamedKind::Enum { symbols, .. } => {
                    let s = self.int()?;
                    let sym = usize::try_from(s)
                        .ok()
                        .and_then(|s| symbols.get(s))
                        .ok_or_else(|| format!("enum symbol {s} of {}", symbols.len()))?;
                    Datum::String(sym.clone())
                }
                NamedKind::Record(fields) => {
                    let mut out = Vec::with_capacity(fields.len());
                    for f in fields {
                        out.push((f.name.clone(), self.decode(&f.node, depth + 1)?));
                    }
                    Datum::Record(out)
                }
            },
        })
    }

    /// Array and map blocks: a count (negative: followed by the block's size in
    /// bytes), its items, until a count of 0.
    fn blocks(
        &mut self,
        mut item: impl FnMut(&mut Self) -> Result<(), String>,
    ) -> Result<(), String> {
        loop {
            let mut n = self.varint(10)?;
            if n == 0 {
                return Ok(());
            }
            if n < 0 {
                n = n.checked_neg().ok_or("a block count out of range")?;
                self.length()?;
            }
            for _ in 0..n {
                item(self)?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(text: &str) -> Schema {
        Schema::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn record(fields: &str) -> Schema {
        s(&format!(
            r#"{{"type":"record","name":"R","namespace":"ns","fields":[{fields}]}}"#
        ))
    }

    /// (backward, forward) of old -> new: new reads old, old reads new.
    fn directions(old: &Schema, new: &Schema) -> (bool, bool) {
        (can_read(new, old).is_empty(), can_read(old, new).is_empty())
    }

    #[test]
    fn the_compatibility_table() {
        let f = r#"{"name":"f","type":"int"}"#;
        let cases: Vec<(&str, Schema, Schema, (bool, bool))> = vec![
            (
                "add field with default",
                record(f),
                record(&format!(
                    r#"{f},{{"name":"g","type":"string","default":""}}"#
                )),
                (true, true),
            ),
            (
                "add field without default",
                record(f),
                record(&format!(r#"{f},{{"name":"g","type":"string"}}"#)),
                (false, true),
            ),
            (
                "remove field without default",
                record(&format!(r#"{f},{{"name":"g","type":"string"}}"#)),
                record(f),
                (true, false),
            ),
            (
                "int to long",
                record(f),
                record(r#"{"name":"f","type":"long"}"#),
                (true, false),
            ),
            (
                "string to bytes",
                s(r#""string""#),
                s(r#""bytes""#),
                (true, true),
            ),
            (
                "int to string",
                s(r#""int""#),
                s(r#""string""#),
                (false, false),
            ),
            (
                "enum symbol added",
                s(r#"{"type":"enum","name":"E","symbols":["A","B"]}"#),
                s(r#"{"type":"enum","name":"E","symbols":["A","B","C"]}"#),
                (true, false),
            ),
            (
                "string to a union with null",
                s(r#""string""#),
                s(r#"["null","string"]"#),
                (true, false),
            ),
            (
                "record renamed, with the old name as an alias",
                record(f),
                s(
                    r#"{"type":"record","name":"S","namespace":"ns","aliases":["R"],"fields":[{"name":"f","type":"int"}]}"#,
                ),
                (true, false),
            ),
            (
                "fixed size changed",
                s(r#"{"type":"fixed","name":"F","size":16}"#),
                s(r#"{"type":"fixed","name":"F","size":8}"#),
                (false, false),
            ),
            (
                "array items widened",
                s(r#"{"type":"array","items":"int"}"#),
                s(r#"{"type":"array","items":"double"}"#),
                (true, false),
            ),
            (
                "enum symbol added, reader has a default",
                s(r#"{"type":"enum","name":"E","symbols":["A","B"],"default":"A"}"#),
                s(r#"{"type":"enum","name":"E","symbols":["A","B","C"],"default":"A"}"#),
                (true, true),
            ),
        ];
        for (what, old, new, want) in cases {
            assert_eq!(directions(&old, &new), want, "{what}");
        }
    }

    #[test]
    fn references_define_types_the_schema_names() {
        let address = r#"{"type":"record","name":"Address","namespace":"com.x","fields":[{"name":"city","type":"string"}]}"#;
        let person = r#"{"type":"record","name":"Person","namespace":"com.x","fields":[{"name":"home","type":"Address"}]}"#;
        assert!(Schema::parse(person).unwrap_err().contains("unknown type"));
        let p = Schema::parse_with(person, &[address]).unwrap();
        // home.city = "ab"
        assert_eq!(check_datum(&p, &[4, b'a', b'b']), Ok(()));
        let err = Schema::parse_with(person, &["{"]).unwrap_err();
        assert!(err.contains("reference 0"), "{err}");
    }

    #[test]
    fn a_union_may_hold_several_named_types() {
        let u = s(
            r#"[{"type":"record","name":"A","fields":[]},{"type":"record","name":"B","fields":[]},"null"]"#,
        );
        assert_eq!(u.named.len(), 2);
        let err = Schema::parse(r#"[{"type":"record","name":"A","fields":[]},"A"]"#).unwrap_err();
        assert!(err.contains("A twice"), "{err}");
    }

    #[test]
    fn recursive_types_parse_and_check() {
        let list = r#"{"type":"record","name":"Node","fields":[{"name":"v","type":"int"},{"name":"next","type":["null","Node"]}]}"#;
        let a = s(list);
        assert!(can_read(&a, &a).is_empty());
        let wider = list.replace(r#""type":"int""#, r#""type":"long""#);
        assert!(can_read(&s(&wider), &a).is_empty());
        assert!(!can_read(&a, &s(&wider)).is_empty());
        // 1 -> 2 -> end: v=1, branch 1, v=2, branch 0.
        assert_eq!(check_datum(&a, &[2, 2, 4, 0]), Ok(()));
        assert!(check_datum(&a, &[2, 2, 4]).is_err());
        // A list deeper than the check recurses: refused, not a stack overflow.
        let mut long = [2u8, 2].repeat(5_000);
        long.extend([2, 0]);
        assert!(check_datum(&a, &long).unwrap_err().contains("deeper"));
    }

    #[test]
    fn bad_schemas_are_refused_with_a_reason() {
        for (text, says) in [
            ("{", "not JSON"),
            (r#""nope""#, "unknown type"),
            (r#"{"type":"record","fields":[]}"#, "name"),
            (
                r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int"},{"name":"a","type":"int"}]}"#,
                "twice",
            ),
            (r#"{"type":"enum","name":"E","symbols":["A","A"]}"#, "twice"),
            (
                r#"{"type":"enum","name":"E","symbols":["A"],"default":"Z"}"#,
                "not a symbol",
            ),
            (r#"{"type":"fixed","name":"F","size":-1}"#, "size"),
            (r#"["int","int"]"#, "twice"),
            (r#"["null",["int"]]"#, "inside a union"),
            (
                r#"[{"type":"array","items":"int"},{"type":"array","items":"long"}]"#,
                "array twice",
            ),
            (r#"{"type":"record","name":"int","fields":[]}"#, "primitive"),
            (
                r#"{"type":"record","name":"9x","fields":[]}"#,
                "not a valid name",
            ),
            (r#"{"type":"array"}"#, "items"),
            ("42", "not a schema"),
        ] {
            let err = Schema::parse(text).expect_err(text);
            assert!(err.contains(says), "{text}: {err}");
        }
        let deep = format!(
            "{}\"int\"{}",
            r#"{"type":"array","items":"#.repeat(100),
            "}".repeat(100)
        );
        assert!(Schema::parse(&deep).unwrap_err().contains("deeper"));
    }

    #[test]
    fn datums_decode_exactly_or_are_refused() {
        let r = record(
            r#"{"name":"i","type":"int"},{"name":"s","type":"string"},{"name":"m","type":{"type":"map","values":"long"}},{"name":"e","type":{"type":"enum","name":"E","symbols":["A","B"]}},{"name":"x","type":{"type":"fixed","name":"X","size":2}}"#,
        );
        // i=-1, s="hé", m={"k": 5} (one block), e=B, x=[9, 9].
        let good = [1, 6, b'h', 0xc3, 0xa9, 2, 2, b'k', 10, 0, 2, 9, 9];
        assert_eq!(check_datum(&r, &good), Ok(()));
        let mut extra = good.to_vec();
        extra.push(0);
        assert!(check_datum(&r, &extra).unwrap_err().contains("left after"));
        for bad in [
            &good[..good.len() - 1],                   // fixed cut short
            &[1, 6, b'h', 0xc3][..],                   // string cut short
            &[1, 4, 0xff, 0xfe, 0, 2, 9, 9][..],       // not UTF-8
            &[1, 0, 0, 4, 9, 9][..],                   // enum symbol 2 of 2
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0x01][..], // int too long
        ] {
            assert!(check_datum(&r, bad).is_err(), "{bad:?}");
        }
        // A negative block count carries the block's size.
        let a = s(r#"{"type":"array","items":"int"}"#);
        assert_eq!(check_datum(&a, &[3, 2, 2, 4, 0]), Ok(()));
        // A billion nulls claimed by a few bytes: refused, not looped over.
        let nulls = s(r#"{"type":"array","items":"null"}"#);
        let claim = [0x80, 0xa8, 0xd6, 0xb9, 0x07, 0];
        assert!(check_datum(&nulls, &claim)
            .unwrap_err()
            .contains("too many"));
        let u = s(r#"["null","int"]"#);
        assert!(check_datum(&u, &[4]).unwrap_err().contains("union branch"));
        assert_eq!(check_datum(&u, &[2, 4]), Ok(()));
    }
}
