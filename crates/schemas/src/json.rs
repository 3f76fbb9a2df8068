//! JSON Schema compatibility, as the Confluent registry's diff decides it (its
//! strict policy): `can_read(reader, writer)` holds when every document valid
//! under `writer` is valid under `reader`, judged keyword by keyword.
//!
//! The rules (docs/schemas.md): a type may widen (`integer` to `number`, more types,
//! a union with more branches); bounds may loosen (`max*` raised or removed, `min*`
//! lowered or removed, `multipleOf` divided); `enum` may gain values; `required`
//! may lose names, or gain one whose property has a default. Properties depend on
//! the writer's content model: where it is *open* (`additionalProperties` absent or
//! `true`), earlier documents may hold any name with any value, so a reader's new
//! property must accept anything (`{}`); where it is *closed* (`false`), a new
//! property is free; where it is a schema, the new property must accept what
//! that schema did. A property the reader drops is fine if the reader is open, and
//! must fit its `additionalProperties` otherwise.
//!
//! `$ref`s to the schema's own definitions (`#/...`) are followed; a remote
//! `$ref`, `dependencies`, `if`/`then`/`else` and `patternProperties` changes are
//! judged by equality: any change to them is reported as incompatible.

use std::collections::{BTreeSet, HashSet};

use serde_json::{Map, Value};

/// What an absent `additionalProperties`, `items` or `additionalItems` means.
static OPEN: Value = Value::Bool(true);

/// Schemas nested deeper than this are refused.
const DEPTH_MAX: usize = 64;

/// Parses a schema's JSON text: an object or a boolean.
pub fn parse(text: &str) -> Result<Value, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    match &v {
        Value::Object(_) | Value::Bool(_) => Ok(v),
        other => Err(format!(
            "a JSON Schema is an object or a boolean, not {other}"
        )),
    }
}

/// What `reader` would refuse of what `writer` accepts; empty when it reads all.
pub fn can_read(reader: &Value, writer: &Value) -> Vec<String> {
    let mut c = Checker {
        reader_root: reader,
        writer_root: writer,
        seen: HashSet::new(),
        problems: Vec::new(),
    };
    c.check(reader, writer, "#", 0);
    c.problems
}

struct Checker<'a> {
    reader_root: &'a Value,
    writer_root: &'a Value,
    /// `$ref` pairs being compared (recursive definitions): assumed readable.
    seen: HashSet<(String, String)>,
    problems: Vec<String>,
}

/// Whether a schema accepts everything (`true`, `{}`, or only annotations).
fn accepts_all(s: &Value) -> bool {
    const ANNOTATIONS: [&str; 8] = [
        "$schema",
        "$id",
        "id",
        "title",
        "description",
        "default",
        "examples",
        "$comment",
    ];
    match s {
        Value::Bool(b) => *b,
        Value::Object(o) => o.keys().all(|k| ANNOTATIONS.contains(&k.as_str())),
        _ => false,
    }
}

fn rejects_all(s: &Value) -> bool {
    matches!(s, Value::Bool(false))
}

/// The set of JSON types a schema's `type` allows (`None`: any).
fn types(o: &Map<String, Value>) -> Option<BTreeSet<String>> {
    match o.get("type")? {
        Value::String(t) => Some(BTreeSet::from([t.clone()])),
        Value::Array(ts) => Some(
            ts.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect(),
        ),
        _ => None,
    }
}

fn num(o: &Map<String, Value>, k: &str) -> Option<f64> {
    o.get(k).and_then(Value::as_f64)
}

/// Resolves a local `$ref` (`#`, `#/a/b`, with `~0`/`~1` escapes).
fn resolve<'v>(root: &'v Value, reference: &str) -> Option<&'v Value> {
    let pointer = reference.strip_prefix('#')?;
    if pointer.is_empty() {
        return Some(root);
    }
    root.pointer(pointer)
}

impl<'a> Checker<'a> {
    fn fail(&mut self, path: &str, why: impl Into<String>) {
        self.problems.push(format!("{path}: {}", why.into()));
    }

    fn check(&mut self, r: &'a Value, w: &'a Value, path: &str, depth: usize) {
        if depth > DEPTH_MAX {
            return self.fail(path, format!("nested deeper than {DEPTH_MAX}"));
        }
        if accepts_all(r) || rejects_all(w) {
            return;
        }
        if rejects_all(r) {
            return self.fail(path, "the reader accepts nothing here");
        }
        let (Value::Object(ro), Value::Object(wo)) = (r, w) else {
            // The writer accepts everything here and the reader does not.
            return self.fail(path, "the reader narrows a schema that accepted anything");
        };
        // References: compared by what they point at.
        let rref = ro.get("$ref").and_then(Value::as_str);
        let wref = wo.get("$ref").and_then(Value::as_str);
        if rref.is_some() || wref.is_some() {
            let key = (
                rref.unwrap_or("").to_string(),
                wref.unwrap_or("").to_string(),
            );
            if !self.seen.insert(key) {
                return;
            }
            let rt = match rref {
                Some(x) => match resolve(self.reader_root, x) {
                    Some(t) => t,
                    None => return self.fail(path, format!("cannot follow the reader's $ref {x}")),
                },
                None => r,
            };
            let wt = match wref {
                Some(x) => match resolve(self.writer_root, x) {
                    Some(t) => t,
                    None => return self.fail(path, format!("cannot follow the writer's $ref {x}")),
                },
                None => w,
            };
            return self.check(rt, wt, path, depth + 1);
        }
        self.combined(ro, wo, w, path);
        self.typed(ro, wo, path);
        self.bounds(ro, wo, path);
        self.values(ro, wo, path);
        self.object(ro, wo, path, depth);
        self.array(ro, wo, path, depth);
        for k in [
            "dependencies",
            "dependentRequired",
            "dependentSchemas",
            "if",
            "then",
            "else",
            "patternProperties",
            "propertyNames",
            "contains",
        ] {
            if ro.get(k) != wo.get(k) && ro.contains_key(k) {
                self.fail(path, format!("{k} changed"));
            }
        }
        if let Some(rn) = ro.get("not") {
            match wo.get("not") {
                // What the reader forbids, the writer must have forbidden.
                Some(wn) => self.check(wn, rn, &format!("{path}/not"), depth + 1),
                None => self.fail(path, "\"not\" added"),
            }
        }
    }

    fn combined(
        &mut self,
        ro: &'a Map<String, Value>,
        wo: &'a Map<String, Value>,
        w: &'a Value,
        path: &str,
    ) {
        for k in ["anyOf", "oneOf"] {
            let rb = ro.get(k).and_then(Value::as_array);
            let wb = wo.get(k).and_then(Value::as_array);
            match (rb, wb) {
                // Each branch the writer allowed is read by some branch of the reader.
                (Some(rb), Some(wb)) => {
                    for (i, wbranch) in wb.iter().enumerate() {
                        if !rb.iter().any(|rbranch| self.reads(rbranch, wbranch)) {
                            self.fail(
                                &format!("{path}/{k}/{i}"),
                                "no branch of the reader reads it",
                            );
                        }
                    }
                }
                // A union added around what the writer allowed.
                (Some(rb), None) => {
                    let mut bare = wo.clone();
                    bare.remove("anyOf");
                    bare.remove("oneOf");
                    let bare = Value::Object(bare);
                    if !rb.iter().any(|rbranch| self.reads(rbranch, &bare)) {
                        self.fail(
                            path,
                            format!("no branch of the reader's {k} reads the writer's schema"),
                        );
                    }
                }
                // A union the reader dropped: each branch must fit the rest of it.
                (None, Some(wb)) => {
                    let mut rest = ro.clone();
                    rest.remove("anyOf");
                    rest.remove("oneOf");
                    let rest = Value::Object(rest);
                    for (i, wbranch) in wb.iter().enumerate() {
                        if !self.reads(&rest, wbranch) {
                            self.fail(
                                &format!("{path}/{k}/{i}"),
                                "the reader no longer accepts this branch",
                            );
                        }
                    }
                }
                (None, None) => {}
            }
        }
        // allOf: every branch the reader requires must be implied by one the
        // writer required (removing branches widens).
        if let Some(rb) = ro.get("allOf").and_then(Value::as_array) {
            let wb: Vec<&Value> = match wo.get("allOf").and_then(Value::as_array) {
                Some(wb) => wb.iter().collect(),
                None => vec![w],
            };
            for (i, rbranch) in rb.iter().enumerate() {
                if !wb.iter().any(|wbranch| self.reads(rbranch, wbranch)) {
                    self.fail(
                        &format!("{path}/allOf/{i}"),
                        "a requirement the writer did not have",
                    );
                }
            }
        }
    }

    /// Whether `r` reads all of `w`, without recording problems.
    fn reads(&self, r: &'a Value, w: &'a Value) -> bool {
        let mut probe = Checker {
            reader_root: self.reader_root,
            writer_root: self.writer_root,
            seen: self.seen.clone(),
            problems: Vec::new(),
        };
        probe.check(r, w, "#", 0);
        probe.problems.is_empty()
    }

    fn typed(&mut self, ro: &Map<String, Value>, wo: &Map<String, Value>, path: &str) {
        let Some(rt) = types(ro) else { return };
        let Some(wt) = types(wo) else {
            return self.fail(path, format!("type narrowed to {rt:?} from any"));
        };
        for t in &wt {
            let ok = rt.contains(t) || (t == "integer" && rt.contains("number"));
            if !ok {
                self.fail(path, format!("the reader's type {rt:?} does not allow {t}"));
            }
        }
    }

    fn bounds(&mut self, ro: &Map<String, Value>, wo: &Map<String, Value>, path: &str) {
        const UPPER: [&str; 6] = [
            "maxLength",
            "maximum",
            "exclusiveMaximum",
            "maxItems",
            "maxProperties",
            "maxContains",
        ];
        const LOWER: [&str; 6] = [
            "minLength",
            "minimum",
            "exclusiveMinimum",
            "minItems",
            "minProperties",
            "minContains",
        ];
        for k in UPPER {
            if let Some(rv) = num(ro, k) {
                match num(wo, k) {
                    Some(wv) if rv >= wv => {}
                    Some(wv) => self.fail(path, format!("{k} lowered from {wv} to {rv}")),
                    None => self.fail(path, format!("{k} {rv} added")),
                }
            }
        }
        for k in LOWER {
            if let Some(rv) = num(ro, k) {
                match num(wo, k) {
                    Some(wv) if rv <= wv => {}
                    Some(wv) => self.fail(path, format!("{k} raised from {wv} to {rv}")),
                    None => self.fail(path, format!("{k} {rv} added")),
                }
            }
        }
        if let Some(rv) = num(ro, "multipleOf") {
            match num(wo, "multipleOf") {
                Some(wv) if rv > 0.0 && (wv / rv).fract() == 0.0 => {}
                Some(wv) => self.fail(path, format!("multipleOf {rv} does not divide {wv}")),
                None => self.fail(path, format!("multipleOf {rv} added")),
            }
        }
        if ro.get("uniqueItems") == Some(&Value::Bool(true))
            && wo.get("uniqueItems") != Some(&Value::Bool(true))
        {
            self.fail(path, "uniqueItems added");
        }
    }

    fn values(&mut self, ro: &Map<String, Value>, wo: &Map<String, Value>, path: &str) {
        if let Some(rp) = ro.get("pattern") {
            if wo.get("pattern") != Some(rp) {
                self.fail(path, "pattern added or changed");
            }
        }
        if let Some(re) = ro.get("enum").and_then(Value::as_array) {
            match wo.get("enum").and_then(Value::as_array) {
                Some(we) => {
                    for v in we {
                        if !re.contains(v) {
                            self.fail(path, format!("enum value {v} removed"));
                        }
                    }
                }
                None => match wo.get("const") {
                    Some(c) if re.contains(c) => {}
                    _ => self.fail(path, "enum added"),
                },
            }
        }
        if let Some(rc) = ro.get("const") {
            if wo.get("const") != Some(rc) {
                self.fail(path, "const added or changed");
            }
        }
        if let Some(rf) = ro.get("format") {
            if wo.get("format") != Some(rf) {
                self.fail(path, "format added or changed");
            }
        }
    }

    fn object(
        &mut self,
        ro: &'a Map<String, Value>,
        wo: &'a Map<String, Value>,
        path: &str,
        depth: usize,
    ) {
        let rp = ro.get("properties").and_then(Value::as_object);
        let wp = wo.get("properties").and_then(Value::as_object);
        let radd = ro.get("additionalProperties").unwrap_or(&OPEN);
        let wadd = wo.get("additionalProperties").unwrap_or(&OPEN);
        let names = |o: &Map<String, Value>| -> BTreeSet<String> {
            o.get("required")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default()
        };
        let (rreq, wreq) = (names(ro), names(wo));
        for name in rreq.difference(&wreq) {
            let has_default = rp
                .and_then(|m| m.get(name))
                .and_then(Value::as_object)
                .is_some_and(|p| p.contains_key("default"));
            if !has_default {
                self.fail(
                    &format!("{path}/required"),
                    format!("{name} is now required, without a default"),
                );
            }
        }
        for (name, rs) in rp.into_iter().flatten() {
            let p = format!("{path}/properties/{name}");
            match wp.and_then(|m| m.get(name)) {
                Some(ws) => self.check(rs, ws, &p, depth + 1),
                // Added: earlier documents may hold it if the writer let them.
                None => self.check(rs, wadd, &p, depth + 1),
            }
        }
        for (name, ws) in wp.into_iter().flatten() {
            if !rp.is_some_and(|m| m.contains_key(name)) {
                // Removed: it now falls to the reader's additionalProperties.
                self.check(radd, ws, &format!("{path}/properties/{name}"), depth + 1);
            }
        }
        if ro.contains_key("additionalProperties") || wo.contains_key("additionalProperties") {
            self.check(
                radd,
                wadd,
                &format!("{path}/additionalProperties"),
                depth + 1,
            );
        }
    }

    fn array(
        &mut self,
        ro: &'a Map<String, Value>,
        wo: &'a Map<String, Value>,
        path: &str,
        depth: usize,
    ) {
        let open = &OPEN;
        match (ro.get("items"), wo.get("items")) {
            (Some(Value::Array(ri)), Some(Value::Array(wi))) => {
                let radd = ro.get("additionalItems").unwrap_or(open);
                let wadd = wo.get("additionalItems").unwrap_or(open);
                for i in 0..ri.len().max(wi.len()) {
                    let rs = ri.get(i).unwrap_or(radd);
                    let ws = wi.get(i).unwrap_or(wadd);
                    self.check(rs, ws, &format!("{path}/items/{i}"), depth + 1);
                }
                self.check(radd, wadd, &format!("{path}/additionalItems"), depth + 1);
            }
            (Some(ri), Some(wi)) if !ri.is_array() && !wi.is_array() => {
                self.check(ri, wi, &format!("{path}/items"), depth + 1)
            }
            (Some(ri), None) => self.check(ri, open, &format!("{path}/items"), depth + 1),
            (None, _) => {}
            (Some(ri), Some(wi)) => {
                if ri != wi {
                    self.fail(path, "items changed between a list and a single schema");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn j(text: &str) -> Value {
        parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    /// (backward, forward) of old -> new.
    fn directions(old: &str, new: &str) -> (bool, bool) {
        let (old, new) = (j(old), j(new));
        (
            can_read(&new, &old).is_empty(),
            can_read(&old, &new).is_empty(),
        )
    }

    #[test]
    fn the_compatibility_table() {
        let closed = r#"{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false}"#;
        let open = r#"{"type":"object","properties":{"a":{"type":"string"}}}"#;
        let cases: [(&str, &str, String, (bool, bool)); 12] = [
            (
                "closed model, optional property added",
                closed,
                closed.replace(
                    r#""a":{"type":"string"}"#,
                    r#""a":{"type":"string"},"b":{"type":"integer"}"#,
                ),
                (true, false),
            ),
            (
                "open model, typed optional property added",
                open,
                open.replace(
                    r#""a":{"type":"string"}"#,
                    r#""a":{"type":"string"},"b":{"type":"integer"}"#,
                ),
                (false, true),
            ),
            (
                "open model, property accepting anything added",
                open,
                open.replace(
                    r#""a":{"type":"string"}"#,
                    r#""a":{"type":"string"},"b":{}"#,
                ),
                (true, true),
            ),
            (
                "open model, property removed",
                open,
                r#"{"type":"object","properties":{}}"#.to_string(),
                (true, false),
            ),
            (
                "required name added",
                open,
                open.replace(r#"}}}"#, r#"}},"required":["a"]}"#),
                (false, true),
            ),
            (
                "required name with a default added",
                open,
                open.replace(
                    r#""a":{"type":"string"}}}"#,
                    r#""a":{"type":"string","default":""}},"required":["a"]}"#,
                ),
                (true, true),
            ),
            (
                "integer to number",
                r#"{"type":"integer"}"#,
                r#"{"type":"number"}"#.into(),
                (true, false),
            ),
            (
                "string to integer",
                r#"{"type":"string"}"#,
                r#"{"type":"integer"}"#.into(),
                (false, false),
            ),
            (
                "enum value added",
                r#"{"enum":["a","b"]}"#,
                r#"{"enum":["a","b","c"]}"#.into(),
                (true, false),
            ),
            (
                "maxLength raised",
                r#"{"type":"string","maxLength":10}"#,
                r#"{"type":"string","maxLength":20}"#.into(),
                (true, false),
            ),
            (
                "string to string or null",
                r#"{"type":"string"}"#,
                r#"{"anyOf":[{"type":"string"},{"type":"null"}]}"#.into(),
                (true, false),
            ),
            (
                "additionalProperties false to true",
                closed,
                closed.replace("false", "true"),
                (true, false),
            ),
        ];
        for (what, old, new, want) in cases {
            assert_eq!(directions(old, &new), want, "{what}");
        }
    }

    #[test]
    fn references_are_followed_and_recursion_ends() {
        let tree = r##"{"$defs":{"n":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/n"}}}}},"$ref":"#/$defs/n"}"##;
        let wider = tree.replace(r#""v":{"type":"integer"}"#, r#""v":{"type":"number"}"#);
        assert!(can_read(&j(tree), &j(tree)).is_empty());
        assert!(can_read(&j(&wider), &j(tree)).is_empty());
        let problems = can_read(&j(tree), &j(&wider));
        assert!(
            problems.iter().any(|p| p.contains("properties/v")),
            "{problems:?}"
        );
        let dangling = r##"{"$ref":"#/$defs/missing"}"##;
        assert!(!can_read(&j(dangling), &j(tree)).is_empty());
    }

    #[test]
    fn bounds_and_constraints() {
        let d = directions;
        assert_eq!(d(r#"{"minimum":5}"#, r#"{"minimum":1}"#), (true, false));
        assert_eq!(
            d(r#"{"multipleOf":4}"#, r#"{"multipleOf":2}"#),
            (true, false)
        );
        assert_eq!(d(r#"{"pattern":"^a"}"#, r#"{}"#), (true, false));
        assert_eq!(
            d(r#"{"pattern":"^a"}"#, r#"{"pattern":"^b"}"#),
            (false, false)
        );
        assert_eq!(
            d(
                r#"{"type":"array","uniqueItems":true}"#,
                r#"{"type":"array"}"#
            ),
            (true, false)
        );
        assert_eq!(
            d(
                r#"{"type":"array","items":{"type":"integer"}}"#,
                r#"{"type":"array","items":{"type":"number"}}"#
            ),
            (true, false)
        );
        assert_eq!(d(r#"true"#, r#"false"#), (false, true));
        assert_eq!(d(r#"{"not":{"type":"string"}}"#, r#"{}"#), (true, false));
    }

    #[test]
    fn bad_schemas_are_refused_and_depth_is_bounded() {
        assert!(parse("[1]").unwrap_err().contains("object or a boolean"));
        assert!(parse("{").unwrap_err().contains("not JSON"));
        let deep = format!(
            "{}{{}}{}",
            r#"{"type":"array","items":"#.repeat(100),
            "}".repeat(100)
        );
        let deep_string = deep.replace("{}", r#"{"type":"string"}"#);
        let problems = can_read(&j(&deep_string), &j(&deep));
        assert!(
            problems.iter().any(|p| p.contains("deeper")),
            "{problems:?}"
        );
    }
}
