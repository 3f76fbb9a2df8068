//! Compatibility levels, as the Confluent registry names and applies them: which
//! earlier versions a new schema is checked against, and in which direction.

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    None,
    Backward,
    BackwardTransitive,
    Forward,
    ForwardTransitive,
    Full,
    FullTransitive,
}

impl Level {
    pub const ALL: [Level; 7] = [
        Level::None,
        Level::Backward,
        Level::BackwardTransitive,
        Level::Forward,
        Level::ForwardTransitive,
        Level::Full,
        Level::FullTransitive,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Level::None => "NONE",
            Level::Backward => "BACKWARD",
            Level::BackwardTransitive => "BACKWARD_TRANSITIVE",
            Level::Forward => "FORWARD",
            Level::ForwardTransitive => "FORWARD_TRANSITIVE",
            Level::Full => "FULL",
            Level::FullTransitive => "FULL_TRANSITIVE",
        }
    }

    fn transitive(self) -> bool {
        matches!(
            self,
            Level::BackwardTransitive | Level::ForwardTransitive | Level::FullTransitive
        )
    }

    fn backward(self) -> bool {
        matches!(
            self,
            Level::Backward | Level::BackwardTransitive | Level::Full | Level::FullTransitive
        )
    }

    fn forward(self) -> bool {
        matches!(
            self,
            Level::Forward | Level::ForwardTransitive | Level::Full | Level::FullTransitive
        )
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Level {
    type Err = String;

    /// Any case, as the registry accepts it.
    fn from_str(s: &str) -> Result<Level, String> {
        Level::ALL
            .into_iter()
            .find(|l| l.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let valid: Vec<String> = Level::ALL
                    .iter()
                    .map(|l| l.as_str().to_lowercase())
                    .collect();
                format!(
                    "Invalid compatibility level. Valid values are {}",
                    valid.join(", ")
                )
            })
    }
}

/// Checks `new` against the subject's undeleted versions, oldest first, at
/// `level`: the newest only, or every one for the transitive levels.
/// `can_read(reader, writer)` is the format's rule; the answer lists what fails,
/// empty when `new` may be registered.
pub fn check<S>(
    level: Level,
    new: &S,
    previous: &[S],
    can_read: impl Fn(&S, &S) -> Vec<String>,
) -> Vec<String> {
    let against: &[S] = if level.transitive() {
        previous
    } else {
        previous.last().map_or(&[], std::slice::from_ref)
    };
    let mut problems = Vec::new();
    let n = previous.len();
    for (i, old) in against.iter().enumerate() {
        let version = n - against.len() + i + 1;
        if level.backward() {
            for p in can_read(new, old) {
                problems.push(format!("reading data written with version {version}: {p}"));
            }
        }
        if level.forward() {
            for p in can_read(old, new) {
                problems.push(format!("version {version} reading new data: {p}"));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::avro::{can_read, Schema};

    fn record(fields: &str) -> Schema {
        Schema::parse(&format!(
            r#"{{"type":"record","name":"R","fields":[{fields}]}}"#
        ))
        .unwrap()
    }

    #[test]
    fn levels_parse_in_any_case_and_refuse_others() {
        for l in Level::ALL {
            assert_eq!(l.as_str().to_lowercase().parse::<Level>(), Ok(l));
            assert_eq!(l.to_string().parse::<Level>(), Ok(l));
        }
        let err = "SIDEWAYS".parse::<Level>().unwrap_err();
        assert!(err.contains("backward_transitive"), "{err}");
    }

    #[test]
    fn transitive_levels_check_every_version_and_the_others_the_last() {
        let v1 = record(r#"{"name":"f","type":"int"}"#);
        let v2 = record(r#"{"name":"f","type":"int"},{"name":"g","type":"string","default":""}"#);
        let v3 = record(r#"{"name":"f","type":"int"},{"name":"g","type":"string"}"#);
        let history = [v1, v2];
        let ok = |level: Level| check(level, &v3, &history, can_read).is_empty();
        assert!(ok(Level::Backward));
        assert!(!ok(Level::BackwardTransitive));
        let problems = check(Level::BackwardTransitive, &v3, &history, can_read);
        assert!(problems[0].contains("version 1"), "{problems:?}");
        assert!(ok(Level::Forward) && ok(Level::ForwardTransitive));
        assert!(ok(Level::Full) && !ok(Level::FullTransitive));
        assert!(ok(Level::None));
        // Nothing to check against: anything goes.
        assert!(check(Level::FullTransitive, &history[0], &[], can_read).is_empty());
    }
}
