//! The names consumers give things (groups, positions' consumers): keys of
//! companion streams, so never `/` (`cluster::slots::placed_by` splits at the first
//! one), and never a `.` or `..` segment.

use crate::error::ConsumerError;

/// A group or consumer name: 1 to `max` characters of `A-Z a-z 0-9 - _ .`, not
/// `.` or `..`.
pub fn check_key_name(what: &str, name: &str, max: usize) -> Result<(), ConsumerError> {
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= max
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(ConsumerError::invalid(format!(
            "a {what} name has 1 to {max} characters of A-Z a-z 0-9 - _ . and is not . or .."
        )))
    }
}
