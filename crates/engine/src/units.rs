//! How durations, sizes and timestamps are written in flags, the TOML file, headers
//! and query parameters, and how they are printed back: the one parser and printer of
//! each. `500ms`, `30s`, `5m`, `7d`; `1048576`, `256KiB`, `64MiB`, `1GiB`; RFC 3339.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A duration: `500ms`, `30s`, `1h 30m`, `7d` (humantime's grammar).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{e} (examples: 500ms, 30s, 5m)"))
}

/// A duration, or a plain number of seconds (`3600`), as whole seconds.
pub fn parse_seconds(s: &str) -> Result<u64, String> {
    let s = s.trim();
    s.parse::<u64>()
        .or_else(|_| parse_duration(s).map(|d| d.as_secs()))
        .map_err(|_| format!("{s:?} is not a duration (examples: 3600, 90s, 1h, 30d)"))
}

/// The shortest form [`parse_duration`] reads back: `25s`, `1m 30s`, `500ms`.
pub fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    humantime::format_duration(d).to_string()
}

/// A size in bytes: a plain number, or one with a binary (`KiB`, `MiB`, `GiB`, `TiB`)
/// or decimal (`kB`, `MB`, `GB`) unit.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (examples: 1048576, 256KiB, 64MiB)"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "TiB" | "T" => 1 << 40,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "{s:?}: unknown unit {other:?} (use B, KiB, MiB, GiB, TiB, kB, MB or GB)"
            ))
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Bytes as [`parse_size`] reads them back, in the largest binary unit that divides
/// them exactly: `256KiB`, `8MiB`, `1000`.
pub fn format_size(bytes: u64) -> String {
    for (unit, scale) in [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ] {
        if bytes >= scale && bytes.is_multiple_of(scale) {
            return format!("{}{unit}", bytes / scale);
        }
    }
    bytes.to_string()
}

/// An RFC 3339 timestamp as milliseconds since the Unix epoch.
pub fn parse_rfc3339_ms(s: &str) -> Option<u64> {
    let t = time::OffsetDateTime::parse(s.trim(), &time::format_description::well_known::Rfc3339)
        .ok()?;
    u64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// Milliseconds since the Unix epoch in RFC 3339 (UTC; fractional seconds only when
/// there are any).
pub fn format_rfc3339_ms(ms: u64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// A duration flag or setting (`--dormancy 60s`): parsed by [`parse_duration`],
/// printed by [`format_duration`] (so defaults show as they are written).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_duration(s).map(HumanDuration)
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

/// A size flag or setting (`--tail-cache-bytes 256KiB`): parsed by [`parse_size`],
/// printed by [`format_size`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size(pub u64);

impl Size {
    pub fn bytes(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl FromStr for Size {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_size(s).map(Size)
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_size(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_trip() {
        for s in ["500ms", "30s", "5m", "1h 30m", "7days", "0s"] {
            let d = parse_duration(s).unwrap();
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d, "{s}");
        }
        assert_eq!(format_duration(Duration::from_secs(25)), "25s");
        assert!(parse_duration("soon").unwrap_err().contains("examples"));
        assert_eq!(parse_seconds("3600").unwrap(), 3600);
        assert_eq!(parse_seconds("30d").unwrap(), 30 * 86_400);
        assert!(parse_seconds("-1").is_err());
    }

    #[test]
    fn sizes_round_trip() {
        assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
        assert_eq!(parse_size("256KiB").unwrap(), 256 << 10);
        assert_eq!(parse_size("64 MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("2MB").unwrap(), 2_000_000);
        for n in [0, 1000, 256 << 10, 8 << 20, 3 << 30, (1 << 20) + 1] {
            assert_eq!(parse_size(&format_size(n)).unwrap(), n);
        }
        assert_eq!(format_size(256 << 10), "256KiB");
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999999999999TiB").is_err());
        assert!(parse_size("18446744073709551615TiB").is_err());
    }

    #[test]
    fn timestamps_round_trip() {
        let ms = parse_rfc3339_ms("2030-01-01T00:00:00Z").unwrap();
        assert_eq!(ms, 1_893_456_000_000);
        assert_eq!(format_rfc3339_ms(ms), "2030-01-01T00:00:00Z");
        assert_eq!(parse_rfc3339_ms(&format_rfc3339_ms(ms + 7)), Some(ms + 7));
        assert_eq!(parse_rfc3339_ms("yesterday"), None);
    }
}
