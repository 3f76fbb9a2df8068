//! The check every append passes (docs/schemas.md, "Validation on append"): a
//! stream bound to a subject takes only what the subject's schema accepts; a
//! Kafka produce is also checked against `TOPIC-value` and `TOPIC-key` when the
//! stream has no binding and the registry holds those subjects.
//!
//! On a JSON stream each message is a JSON document checked against the JSON
//! Schema (the subject's latest version, or the pinned one). Elsewhere a payload
//! framed with a schema id (byte 0, the id, for Protobuf the message path) must
//! name a version of the subject and decode with that schema; an unframed payload
//! passes only a JSON Schema, as a JSON document.

use std::sync::Arc;

use picomq_engine::schemas::{AppendCheck, SchemaViolation, StreamRef};
use picomq_engine::{EngineError, NewRecord, RecordExt};
use picomq_schemas::parsed::SchemaType;
use picomq_schemas::wire;

use crate::registry::{find_version, Registry, VersionRef};
use crate::state::State;

/// What a record is checked against.
struct Target<'a> {
    subject: &'a str,
    pinned: Option<u32>,
    /// An explicit binding: a subject without versions refuses everything (an
    /// implied Kafka subject that is gone checks nothing).
    bound: bool,
}

impl AppendCheck for Registry {
    fn check(
        &self,
        stream: &StreamRef<'_>,
        topic: Option<&str>,
        records: &[NewRecord],
    ) -> picomq_engine::Result<()> {
        if !self.is_loaded() {
            return Err(EngineError::Unavailable(
                "the schema registry is still loading; retry".into(),
            ));
        }
        let state = self.snapshot();
        if state.subjects.is_empty() && state.bindings.is_empty() {
            return Ok(());
        }
        let binding = state
            .bindings
            .get(stream.name)
            .filter(|b| b.stream_id == stream.id);
        let value_subject;
        let value = match (binding, topic) {
            (Some(b), _) => Some(Target {
                subject: &b.subject,
                pinned: b.version,
                bound: true,
            }),
            (None, Some(t)) => {
                value_subject = format!("{t}-value");
                state.has_subject(&value_subject).then_some(Target {
                    subject: &value_subject,
                    pinned: None,
                    bound: false,
                })
            }
            (None, None) => None,
        };
        let key_subject = topic
            .map(|t| format!("{t}-key"))
            .filter(|s| state.has_subject(s));
        if value.is_none() && key_subject.is_none() {
            return Ok(());
        }
        for (index, record) in records.iter().enumerate() {
            let ext = record.ext.as_ref().and_then(|e| RecordExt::decode(e).ok());
            if let Some(target) = &value {
                // A null or empty Kafka value is stored as a placeholder: nothing
                // to check (a tombstone).
                let placeholder = ext.as_ref().is_some_and(|e| e.null_value || e.empty_value);
                if !placeholder {
                    self.check_one(&state, target, stream.json, &record.data, index, "")?;
                }
            }
            if let (Some(subject), Some(key)) =
                (&key_subject, ext.as_ref().and_then(|e| e.key.as_ref()))
            {
                let target = Target {
                    subject,
                    pinned: None,
                    bound: false,
                };
                self.check_one(&state, &target, false, key, index, "key")?;
            }
        }
        Ok(())
    }
}

impl Registry {
    fn check_one(
        &self,
        state: &State,
        target: &Target<'_>,
        json_stream: bool,
        data: &[u8],
        index: usize,
        part: &str,
    ) -> picomq_engine::Result<()> {
        let refuse = |version: Option<u32>, path: String, rule: &str, message: String| {
            EngineError::SchemaViolation(Box::new(SchemaViolation {
                subject: target.subject.to_string(),
                version,
                index,
                path: if part.is_empty() {
                    path
                } else {
                    format!("{part}{path}")
                },
                rule: rule.to_string(),
                message,
            }))
        };
        let wanted = match target.pinned {
            Some(v) => VersionRef::Number(v),
            None => VersionRef::Latest,
        };
        let version = match find_version(state, target.subject, wanted, false) {
            Ok(v) => v,
            Err(_) if !target.bound => return Ok(()),
            Err(e) => {
                return Err(refuse(
                    target.pinned,
                    String::new(),
                    "subject",
                    format!("the stream is bound to it, but {}", e.message),
                ))
            }
        };
        let compiled = |id: u32| {
            self.compiled(state, id).map_err(|e| {
                EngineError::Internal(format!("schema {id} of subject {:?}: {e}", target.subject))
            })
        };
        if json_stream
            || (data.first() != Some(&0) && version.schema.schema_type() == SchemaType::Json)
        {
            if version.schema.schema_type() != SchemaType::Json {
                return Err(refuse(
                    Some(version.version),
                    String::new(),
                    "schemaType",
                    format!(
                        "a JSON message is checked against a JSON Schema; the subject holds {}",
                        version.schema.kind
                    ),
                ));
            }
            let doc: serde_json::Value = serde_json::from_slice(data).map_err(|e| {
                refuse(
                    Some(version.version),
                    String::new(),
                    "json",
                    format!("neither framed with a schema id nor JSON: {e}"),
                )
            })?;
            let c = compiled(version.id)?;
            return c
                .check_document(&doc)
                .map_err(|v| refuse(Some(version.version), v.path, &v.rule, v.message));
        }
        if data.first() != Some(&0) || data.len() < 5 {
            return Err(refuse(
                Some(version.version),
                String::new(),
                "framing",
                "the payload is not framed with a schema id (byte 0, then the id in 4 bytes)"
                    .into(),
            ));
        }
        let id = u32::from_be_bytes([data[1], data[2], data[3], data[4]]);
        // The id must be one of the subject's versions clients see (the pinned
        // one, if the binding names one).
        let named = state
            .versions(target.subject, false)
            .into_iter()
            .rev()
            .find(|(v, r)| r.id == id && target.pinned.is_none_or(|p| p == *v));
        let Some((v, _)) = named else {
            return Err(refuse(
                None,
                String::new(),
                "schemaId",
                match target.pinned {
                    Some(p) => format!("schema id {id} is not version {p} of the subject"),
                    None => format!("schema id {id} is not a version of the subject"),
                },
            ));
        };
        let Some(row) = state.schemas.get(&id).map(Arc::clone) else {
            return Err(refuse(
                Some(v),
                String::new(),
                "schemaId",
                format!("no schema has id {id}"),
            ));
        };
        let framed = wire::unframe(data, row.schema_type() == SchemaType::Protobuf)
            .map_err(|e| refuse(Some(v), String::new(), "framing", e))?;
        let c = compiled(id)?;
        c.check_datum(&framed.message_path, framed.datum)
            .map_err(|e| refuse(Some(v), String::new(), "decode", e))
    }
}

impl Registry {
    /// Checks `records` against `subject` (at `version`, or its latest) as a stream
    /// bound to it would: a create's first records, before the stream exists.
    pub fn check_against(
        &self,
        subject: &str,
        version: Option<u32>,
        json: bool,
        records: &[NewRecord],
    ) -> picomq_engine::Result<()> {
        let state = self.snapshot();
        let target = Target {
            subject,
            pinned: version,
            bound: true,
        };
        for (index, record) in records.iter().enumerate() {
            self.check_one(&state, &target, json, &record.data, index, "")?;
        }
        Ok(())
    }
}
