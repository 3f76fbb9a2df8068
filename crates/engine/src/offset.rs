//! Stream offsets: the one place that decides how a position is written on the wire.
//!
//! An offset is a byte position in a stream's logical content. On the wire it is
//! `GGGGGGGGGGGGGGGG_PPPPPPPPPPPPPPPP`: two zero-padded 16-digit decimal fields, so
//! offsets sort lexicographically. The first field is the stream generation (always 0
//! today; reserved so a future rewrite of a stream's history can mint fresh offsets),
//! the second the byte position.

use std::fmt;

/// Byte position within a stream's content.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Offset(pub u64);

/// Length of an offset on the wire: two 16-digit fields and the `_` between them.
pub const OFFSET_WIRE_BYTES: usize = 33;

/// Widest position the 16-digit wire field can hold.
pub const OFFSET_POSITION_MAX: u64 = 9_999_999_999_999_999;

/// What a reader asked for in `?offset=`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum OffsetQuery {
    /// `-1` or absent: the beginning of the stream.
    Start,
    /// `now`: the current tail.
    Now,
    /// A token minted by this server.
    At(Offset),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid offset {0:?}: expected -1, now, or a token returned in Stream-Next-Offset")]
pub struct OffsetError(pub String);

impl Offset {
    pub const ZERO: Offset = Offset(0);

    /// Parses a server-minted token. Anything else (wrong shape, a generation we
    /// never minted, overflow) is an error, never a guess.
    pub fn parse(token: &str) -> Result<Offset, OffsetError> {
        let bad = || OffsetError(token.chars().take(64).collect());
        let (generation, position) = token.split_once('_').ok_or_else(bad)?;
        let field_ok =
            |f: &str| !f.is_empty() && f.len() <= 16 && f.bytes().all(|b| b.is_ascii_digit());
        if !field_ok(generation) || !field_ok(position) {
            return Err(bad());
        }
        if generation.bytes().any(|b| b != b'0') {
            return Err(bad());
        }
        position.parse::<u64>().map(Offset).map_err(|_| bad())
    }

    /// The wire form as bytes, without the formatting machinery: every response
    /// carries one, so this is on the hot path.
    pub fn encode(self) -> [u8; OFFSET_WIRE_BYTES] {
        debug_assert!(
            self.0 <= OFFSET_POSITION_MAX,
            "offset beyond the wire field"
        );
        let mut out = [b'0'; OFFSET_WIRE_BYTES];
        out[16] = b'_';
        let mut rest = self.0;
        for digit in out[17..].iter_mut().rev() {
            *digit = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        out
    }

    pub fn advance(self, bytes: u64) -> Offset {
        Offset(self.0 + bytes)
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016}_{:016}", 0, self.0)
    }
}

impl OffsetQuery {
    pub fn parse(raw: &str) -> Result<OffsetQuery, OffsetError> {
        match raw {
            "-1" => Ok(OffsetQuery::Start),
            "now" => Ok(OffsetQuery::Now),
            token => Offset::parse(token).map(OffsetQuery::At),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_sorts_lexicographically() {
        let a = Offset(9);
        let b = Offset(10);
        assert_eq!(Offset::parse(&a.to_string()), Ok(a));
        assert!(a.to_string() < b.to_string());
        assert_eq!(
            Offset::ZERO.to_string(),
            "0000000000000000_0000000000000000"
        );
    }

    #[test]
    fn encode_is_the_display_form() {
        for n in [0, 7, 10, 1_234_567_890, OFFSET_POSITION_MAX] {
            assert_eq!(
                Offset(n).encode().as_slice(),
                Offset(n).to_string().as_bytes()
            );
        }
    }

    #[test]
    fn rejects_foreign_shapes() {
        for bad in [
            "",
            "abc",
            "1_",
            "_1",
            "1_2_3",
            "0001_0",
            "../x",
            "0,1",
            "-2",
            "0_99999999999999999",
        ] {
            assert!(Offset::parse(bad).is_err(), "{bad} should be rejected");
        }
        assert_eq!(OffsetQuery::parse("-1"), Ok(OffsetQuery::Start));
        assert_eq!(OffsetQuery::parse("now"), Ok(OffsetQuery::Now));
    }
}
