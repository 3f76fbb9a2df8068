//! Documents checked against a JSON Schema, compiled once: the append paths keep
//! a [`JsonValidator`] per schema and ask it about each message.
//!
//! Patterns run on the `regex` crate (linear time, no backtracking), so a schema
//! cannot make a check take exponential time; remote `$ref`s are not fetched (a
//! schema refers to its own definitions, or to schemas registered beside it).

use serde_json::Value;

/// Compiled patterns are bounded: a pattern that compiles larger is refused.
const PATTERN_BYTES_MAX: usize = 1 << 20;

pub struct JsonValidator {
    inner: jsonschema::Validator,
}

/// Why a document failed: where in it, which keyword, and the validator's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// A JSON Pointer into the document (`""`: the document itself).
    pub path: String,
    /// The keyword that failed (`type`, `required`, `maxLength`, ...).
    pub rule: String,
    pub message: String,
}

impl JsonValidator {
    /// Compiles `schema` (its `$schema` names the draft; draft 2020-12 without one).
    pub fn compile(schema: &Value) -> Result<JsonValidator, String> {
        let patterns = jsonschema::PatternOptions::regex().size_limit(PATTERN_BYTES_MAX);
        jsonschema::options()
            .with_pattern_options(patterns)
            .build(schema)
            .map(|inner| JsonValidator { inner })
            .map_err(|e| format!("invalid JSON Schema: {e}"))
    }

    /// The first rule `doc` breaks, if any.
    pub fn check(&self, doc: &Value) -> Result<(), Violation> {
        match self.inner.validate(doc) {
            Ok(()) => Ok(()),
            Err(e) => Err(Violation {
                path: e.instance_path().to_string(),
                rule: e.kind().keyword().to_string(),
                message: e.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn documents_pass_or_name_the_place_and_rule() {
        let v = JsonValidator::compile(&json!({
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}},
                "code": {"type": "string", "pattern": "^[A-Z]+$"}
            },
            "required": ["id"],
            "additionalProperties": false
        }))
        .unwrap();
        assert_eq!(
            v.check(&json!({"id": 1, "tags": ["a"], "code": "AB"})),
            Ok(())
        );
        let cases = [
            (json!({"tags": []}), "", "required"),
            (json!({"id": "1"}), "/id", "type"),
            (json!({"id": 1, "tags": ["abcd"]}), "/tags/0", "maxLength"),
            (json!({"id": 1, "code": "ab"}), "/code", "pattern"),
            (json!({"id": 1, "x": 1}), "", "additionalProperties"),
        ];
        for (doc, path, rule) in cases {
            let v = v.check(&doc).unwrap_err();
            assert_eq!(
                (v.path.as_str(), v.rule.as_str()),
                (path, rule),
                "{doc}: {v:?}"
            );
        }
    }

    #[test]
    fn bad_schemas_and_remote_references_are_refused() {
        for schema in [
            json!({"type": "no-such-type"}),
            json!({"$ref": "https://example.com/schema.json"}),
            json!({"type": "string", "pattern": "("}),
        ] {
            assert!(JsonValidator::compile(&schema).is_err(), "{schema}");
        }
    }
}
