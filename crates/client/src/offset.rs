//! A position in a Durable Streams stream, as the server writes it: opaque to
//! clients, which only hand back what a server gave them (`Stream-Next-Offset`), or
//! one of the two special values, `-1` (the start) and `now` (the tail).

use std::fmt;

/// A Durable Streams offset: an opaque token from a server, `-1` or `now`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Offset(String);

impl Offset {
    /// The start of the stream (`-1`): the first retained data.
    pub fn start() -> Offset {
        Offset("-1".to_string())
    }

    /// The tail of the stream at the time of the read (`now`): only what comes next.
    pub fn now() -> Offset {
        Offset("now".to_string())
    }

    /// The offset as the server wrote it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is `-1`.
    pub fn is_start(&self) -> bool {
        self.0 == "-1"
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Offset {
    fn from(s: &str) -> Offset {
        Offset(s.to_string())
    }
}

impl From<String> for Offset {
    fn from(s: String) -> Offset {
        Offset(s)
    }
}

impl AsRef<str> for Offset {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl serde::Serialize for Offset {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Offset {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Offset, D::Error> {
        String::deserialize(d).map(Offset)
    }
}
