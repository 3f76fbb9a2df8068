//! Typed body columns: a table with a `schemaSubject` gets a column per top-level
//! field of the subject's latest schema (beside the base columns, which keep the
//! raw body), and each record's body is decoded with the schema it was written
//! with (its Confluent frame's id; the latest for unframed JSON).
//!
//! Schema evolution: a column keeps its Iceberg field id while its name and type
//! (or a promotion: int to long) stay; a field whose type changes otherwise, or a
//! new field, gets a new id; a field the latest schema no longer has leaves the
//! current Iceberg schema (older data files keep it). Each change is a new schema
//! id in the table's metadata, committed with the round that first sees it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use picomq_engine::EngineError;
use picomq_registry::state::State;
use picomq_registry::Registry;
use picomq_schemas::columns::{self, Cell, ColumnKind};
use picomq_schemas::parsed::{Compiled, Parsed};

use crate::parquet::{Datum, Field, Kind};

/// Base columns a body field's name may collide with get this prefix.
const COLLISION_PREFIX: &str = "value_";

/// The first field id body columns take (the base columns are 1-9).
const FIRST_BODY_ID: i32 = 10;

fn kind_of(c: ColumnKind) -> Kind {
    match c {
        ColumnKind::Boolean => Kind::Boolean,
        ColumnKind::Int => Kind::Int,
        ColumnKind::Long => Kind::Long,
        ColumnKind::Double => Kind::Double,
        ColumnKind::String | ColumnKind::Json => Kind::String,
        ColumnKind::Binary => Kind::Binary,
    }
}

/// The column name of body field `name` among `base` columns.
pub fn column_name(base: &[Field], name: &str) -> String {
    if base.iter().any(|f| f.name == name) || name.starts_with(COLLISION_PREFIX) {
        format!("{COLLISION_PREFIX}{name}")
    } else {
        name.to_string()
    }
}

/// The body field a body column holds (the inverse of [`column_name`]).
pub fn source_of(column: &str) -> &str {
    column.strip_prefix(COLLISION_PREFIX).unwrap_or(column)
}

/// The table's columns for body fields `wanted`: `base` first, then one per
/// field, ids kept from `current` where name and type allow (see the module
/// docs); `last_id` is the table's highest field id so far.
pub fn evolve(
    base: &[Field],
    current: &[Field],
    wanted: &[(String, ColumnKind)],
    last_id: i32,
) -> Vec<Field> {
    let mut next = last_id.max(FIRST_BODY_ID - 1);
    let mut out = base.to_vec();
    for (name, kind) in wanted {
        let name = column_name(base, name);
        let kind = kind_of(*kind);
        let keep = current.iter().find(|f| {
            f.name == name
                && f.id >= FIRST_BODY_ID
                && (f.kind == kind || (f.kind == Kind::Int && kind == Kind::Long))
        });
        let id = match keep {
            Some(f) => f.id,
            None => {
                next += 1;
                next
            }
        };
        out.push(Field {
            id,
            name,
            kind,
            required: false,
        });
    }
    out
}

/// A round's view of the registry: the subject's latest schema and the schemas
/// records were written with, compiled once.
pub struct Typing {
    registry: Arc<Registry>,
    state: Arc<State>,
    pub latest: Arc<Compiled>,
    by_id: HashMap<u32, Option<Arc<Compiled>>>,
}

impl Typing {
    /// The subject's latest schema, if the subject has one.
    pub async fn open(
        registry: &Arc<Registry>,
        subject: &str,
    ) -> Result<Option<Typing>, EngineError> {
        let state = registry
            .fresh()
            .await
            .map_err(|e| EngineError::Unavailable(format!("schema registry: {}", e.message)))?;
        let Some((_, version)) = state.latest(subject, false) else {
            return Ok(None);
        };
        let latest = registry
            .compiled(&state, version.id)
            .map_err(|e| EngineError::Internal(format!("schema {}: {e}", version.id)))?;
        Ok(Some(Typing {
            registry: registry.clone(),
            state,
            latest,
            by_id: HashMap::new(),
        }))
    }

    /// The columns the latest schema gives.
    pub fn wanted(&self) -> Vec<(String, ColumnKind)> {
        columns::columns(&self.latest.parsed)
    }

    /// `body` decoded into its top-level fields; `None` when it is not a payload
    /// of the subject's schemas.
    pub fn decode(&mut self, body: &[u8]) -> Option<BTreeMap<String, Cell>> {
        let protobuf = matches!(self.latest.parsed, Parsed::Protobuf(_));
        if body.first() != Some(&0) {
            // Unframed: JSON text written to a JSON stream.
            return match &self.latest.parsed {
                Parsed::Json(_) => columns::decode(&self.latest.parsed, &[], body).ok(),
                _ => None,
            };
        }
        let framed = picomq_schemas::wire::unframe(body, protobuf).ok()?;
        let compiled = self
            .by_id
            .entry(framed.schema_id)
            .or_insert_with(|| self.registry.compiled(&self.state, framed.schema_id).ok())
            .clone()?;
        columns::decode(&compiled.parsed, &framed.message_path, framed.datum).ok()
    }
}

/// The value of a `kind` column for `cell`: a cell of another type is converted
/// where nothing is lost, else null. `scratch` holds text made on the way.
pub fn datum<'a>(kind: Kind, cell: Option<&'a Cell>, scratch: &'a mut String) -> Datum<'a> {
    use std::fmt::Write as _;
    let Some(cell) = cell else {
        return Datum::Null;
    };
    match (kind, cell) {
        (_, Cell::Null) => Datum::Null,
        (Kind::Boolean, Cell::Bool(b)) => Datum::Bool(*b),
        (Kind::Int, Cell::Long(n)) => i32::try_from(*n).map_or(Datum::Null, Datum::Int),
        (Kind::Long, Cell::Long(n)) => Datum::Long(*n),
        (Kind::Double, Cell::Double(d)) => Datum::Double(*d),
        (Kind::Double, Cell::Long(n)) => Datum::Double(*n as f64),
        (Kind::String, Cell::Text(s)) => Datum::Bytes(s.as_bytes()),
        (Kind::String, other) => {
            scratch.clear();
            match other {
                Cell::Bool(b) => write!(scratch, "{b}"),
                Cell::Long(n) => write!(scratch, "{n}"),
                Cell::Double(d) => write!(scratch, "{d}"),
                _ => return Datum::Null,
            }
            .expect("writing to a String");
            Datum::Bytes(scratch.as_bytes())
        }
        (Kind::Binary, Cell::Bytes(b)) => Datum::Bytes(b),
        (Kind::Binary, Cell::Text(s)) => Datum::Bytes(s.as_bytes()),
        _ => Datum::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(id: i32, name: &str, kind: Kind) -> Field {
        Field {
            id,
            name: name.into(),
            kind,
            required: false,
        }
    }

    #[test]
    fn ids_follow_names_and_compatible_types() {
        let base = crate::exporter::base_fields();
        let v1 = evolve(
            &base,
            &base,
            &[
                ("id".into(), ColumnKind::Int),
                ("name".into(), ColumnKind::String),
            ],
            9,
        );
        assert_eq!(
            v1[9..],
            [f(10, "id", Kind::Int), f(11, "name", Kind::String)]
        );
        // id widens (kept), name changes type (new id), a new field, one collides.
        let v2 = evolve(
            &base,
            &v1,
            &[
                ("id".into(), ColumnKind::Long),
                ("name".into(), ColumnKind::Long),
                ("offset".into(), ColumnKind::Boolean),
            ],
            11,
        );
        assert_eq!(
            v2[9..],
            [
                f(10, "id", Kind::Long),
                f(12, "name", Kind::Long),
                f(13, "value_offset", Kind::Boolean)
            ]
        );
        assert_eq!(source_of("value_offset"), "offset");
        assert_eq!(source_of("name"), "name");
        // The same schema again changes nothing; a dropped field leaves.
        assert_eq!(
            evolve(&base, &v2, &[("id".into(), ColumnKind::Long)], 13)[9..],
            [f(10, "id", Kind::Long)]
        );
    }

    #[test]
    fn cells_convert_only_without_loss() {
        let mut s = String::new();
        assert_eq!(
            datum(Kind::Int, Some(&Cell::Long(1 << 40)), &mut s),
            Datum::Null
        );
        assert_eq!(
            datum(Kind::Int, Some(&Cell::Long(7)), &mut s),
            Datum::Int(7)
        );
        assert_eq!(
            datum(Kind::Double, Some(&Cell::Long(2)), &mut s),
            Datum::Double(2.0)
        );
        assert_eq!(
            datum(Kind::Long, Some(&Cell::Text("x".into())), &mut s),
            Datum::Null
        );
        assert_eq!(
            datum(Kind::String, Some(&Cell::Long(5)), &mut s),
            Datum::Bytes(b"5")
        );
        assert_eq!(datum(Kind::Boolean, None, &mut s), Datum::Null);
    }
}
