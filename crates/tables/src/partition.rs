//! Partition transforms: `day(timestamp)` and the like turn a row into the values
//! that decide which data file it goes to.

use serde::{Deserialize, Serialize};

use crate::parquet::{Field, Kind};
use crate::Error;

/// A transform of a source column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transform {
    Identity,
    Year,
    Month,
    Day,
    Hour,
}

impl Transform {
    pub fn name(self) -> &'static str {
        match self {
            Transform::Identity => "identity",
            Transform::Year => "year",
            Transform::Month => "month",
            Transform::Day => "day",
            Transform::Hour => "hour",
        }
    }

    /// What the transform makes of `source`, or why it cannot apply to it.
    pub fn result(self, source: Kind) -> Result<PartKind, Error> {
        match (self, source) {
            (Transform::Identity, Kind::String) => Ok(PartKind::String),
            (Transform::Identity, Kind::Long) => Ok(PartKind::Long),
            (Transform::Identity, Kind::Int) => Ok(PartKind::Int),
            (Transform::Day, Kind::TimestampTz) => Ok(PartKind::Date),
            (Transform::Year | Transform::Month | Transform::Hour, Kind::TimestampTz) => {
                Ok(PartKind::Int)
            }
            (t, k) => Err(Error::Invalid(format!(
                "{}() does not apply to a {} column",
                t.name(),
                k.iceberg()
            ))),
        }
    }
}

/// The type of a partition value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartKind {
    Int,
    Long,
    Date,
    String,
}

impl PartKind {
    /// Its Avro type in a manifest.
    pub fn avro(self) -> &'static str {
        match self {
            PartKind::Int => r#""int""#,
            PartKind::Long => r#""long""#,
            PartKind::Date => r#"{"type":"int","logicalType":"date"}"#,
            PartKind::String => r#""string""#,
        }
    }
}

/// A partition value.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PartValue {
    Int(i32),
    Long(i64),
    String(String),
}

impl PartValue {
    /// Iceberg's single-value serialization (manifest bounds).
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            PartValue::Int(i) => i.to_le_bytes().to_vec(),
            PartValue::Long(i) => i.to_le_bytes().to_vec(),
            PartValue::String(s) => s.as_bytes().to_vec(),
        }
    }

    /// A path segment for data files (readable, and safe in object keys).
    pub fn segment(&self) -> String {
        match self {
            PartValue::Int(i) => i.to_string(),
            PartValue::Long(i) => i.to_string(),
            PartValue::String(s) => s
                .bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.' {
                        (b as char).to_string()
                    } else {
                        format!("%{b:02X}")
                    }
                })
                .collect(),
        }
    }
}

/// One field of a partition spec, resolved against the table's columns.
#[derive(Clone, Debug, PartialEq)]
pub struct PartField {
    pub source_id: i32,
    pub field_id: i32,
    pub name: String,
    pub transform: Transform,
    pub kind: PartKind,
}

/// Parses `day(timestamp)`, `hour(timestamp)`, `month(..)`, `year(..)`,
/// `identity(stream)` or a bare column name (identity) against `columns`.
pub fn parse(expr: &str, columns: &[Field], field_id: i32) -> Result<PartField, Error> {
    let expr = expr.trim();
    let (transform, column) = match expr.split_once('(') {
        None => (Transform::Identity, expr),
        Some((t, rest)) => {
            let column = rest.strip_suffix(')').ok_or_else(|| {
                Error::Invalid(format!("partitionBy {expr:?}: no closing parenthesis"))
            })?;
            let t = match t.trim() {
                "identity" => Transform::Identity,
                "year" | "years" => Transform::Year,
                "month" | "months" => Transform::Month,
                "day" | "days" => Transform::Day,
                "hour" | "hours" => Transform::Hour,
                other => {
                    return Err(Error::Invalid(format!(
                        "partitionBy {expr:?}: unknown transform {other:?} (identity, year, month, day or hour)"
                    )))
                }
            };
            (t, column.trim())
        }
    };
    let source = columns
        .iter()
        .find(|c| c.name == column)
        .ok_or_else(|| Error::Invalid(format!("partitionBy {expr:?}: no column {column:?}")))?;
    let kind = transform.result(source.kind)?;
    let name = match transform {
        Transform::Identity => source.name.clone(),
        t => format!("{}_{}", source.name, t.name()),
    };
    Ok(PartField {
        source_id: source.id,
        field_id,
        name,
        transform,
        kind,
    })
}

const MICROS_PER_DAY: i64 = 86_400_000_000;
const MICROS_PER_HOUR: i64 = 3_600_000_000;

/// (year, month 1-12) of a day count since 1970-01-01 (Howard Hinnant's civil
/// calendar algorithm).
fn civil(days: i64) -> (i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    (y, m)
}

/// The partition value of a timestamp (microseconds since the epoch) under `t`.
pub fn of_timestamp(t: Transform, micros: i64) -> PartValue {
    let days = micros.div_euclid(MICROS_PER_DAY);
    match t {
        Transform::Identity => PartValue::Long(micros),
        Transform::Hour => PartValue::Int(micros.div_euclid(MICROS_PER_HOUR) as i32),
        Transform::Day => PartValue::Int(days as i32),
        Transform::Month => {
            let (y, m) = civil(days);
            PartValue::Int(((y - 1970) * 12 + m - 1) as i32)
        }
        Transform::Year => PartValue::Int((civil(days).0 - 1970) as i32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols() -> Vec<Field> {
        vec![
            Field {
                id: 1,
                name: "stream".into(),
                kind: Kind::String,
                required: true,
            },
            Field {
                id: 4,
                name: "timestamp".into(),
                kind: Kind::TimestampTz,
                required: true,
            },
        ]
    }

    #[test]
    fn parses_transforms() {
        let p = parse("day(timestamp)", &cols(), 1000).unwrap();
        assert_eq!(
            (p.source_id, p.transform, p.kind),
            (4, Transform::Day, PartKind::Date)
        );
        assert_eq!(p.name, "timestamp_day");
        let p = parse("stream", &cols(), 1001).unwrap();
        assert_eq!(
            (p.transform, p.kind, p.name.as_str()),
            (Transform::Identity, PartKind::String, "stream")
        );
        for bad in [
            "day(stream)",
            "week(timestamp)",
            "day(timestamp",
            "nope",
            "hour(nope)",
        ] {
            assert!(parse(bad, &cols(), 1000).is_err(), "{bad}");
        }
    }

    #[test]
    fn timestamp_transforms_match_iceberg() {
        // 2026-12-06T10:30:00Z
        let t = 1_796_553_000_000_000i64;
        assert_eq!(of_timestamp(Transform::Day, t), PartValue::Int(20_793));
        assert_eq!(of_timestamp(Transform::Hour, t), PartValue::Int(499_042));
        assert_eq!(
            of_timestamp(Transform::Month, t),
            PartValue::Int(56 * 12 + 11)
        );
        assert_eq!(of_timestamp(Transform::Year, t), PartValue::Int(56));
        // Before the epoch, floor: 1969-12-31T23:00:00Z.
        assert_eq!(
            of_timestamp(Transform::Day, -3_600_000_000),
            PartValue::Int(-1)
        );
        assert_eq!(
            of_timestamp(Transform::Month, -3_600_000_000),
            PartValue::Int(-1)
        );
        assert_eq!(
            of_timestamp(Transform::Year, -3_600_000_000),
            PartValue::Int(-1)
        );
    }
}
