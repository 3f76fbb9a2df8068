//! Values of the domain, validated once where they enter (the HTTP edge, or any
//! other API) and carried as types, so the engine never checks them again: stream
//! names, content types, producer ids. Also the typed reasons a request is invalid
//! ([`Invalid`]): the engine says what is wrong in its own terms, and each edge
//! words it for its clients (the Durable Streams edge names its headers).

use std::fmt;

/// The media type of JSON streams.
pub const JSON: &str = "application/json";
/// The media type of a stream created without one.
pub const OCTET_STREAM: &str = "application/octet-stream";

/// A stream's name: its URL path without the leading `/`, 1 to a configured number
/// of bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamName(String);

impl StreamName {
    /// `name` as given (the edge has already decoded and stripped it).
    pub fn new(name: impl Into<String>, max_bytes: usize) -> Result<StreamName, Invalid> {
        let name = name.into();
        if name.is_empty() {
            return Err(Invalid::EmptyName);
        }
        if name.len() > max_bytes {
            return Err(Invalid::NameTooLong {
                len: name.len(),
                max: max_bytes,
            });
        }
        Ok(StreamName(name))
    }

    /// A name read back from the metadata, checked when the stream was created.
    pub(crate) fn stored(name: String) -> StreamName {
        StreamName(name)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl std::ops::Deref for StreamName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StreamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A Content-Type value as a client sent it (trimmed, at most a configured number of
/// bytes): a stream's media type when it is created, compared with it on appends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContentType(String);

impl ContentType {
    /// `None` for an empty value, an error past `max_bytes`.
    pub fn new(value: &str, max_bytes: usize) -> Result<Option<ContentType>, Invalid> {
        let value = value.trim();
        if value.len() > max_bytes {
            return Err(Invalid::ContentTypeTooLong { max: max_bytes });
        }
        Ok((!value.is_empty()).then(|| ContentType(value.to_string())))
    }

    /// Shaped like `type/subtype` (parameters allowed). A create treats any other
    /// value as absent, as the protocol's reference server does.
    pub fn is_media_type(&self) -> bool {
        looks_like_media_type(&self.0)
    }

    pub fn octet_stream() -> ContentType {
        ContentType(OCTET_STREAM.into())
    }

    /// `application/json` (the server's own streams: consumer state, dead letters).
    pub fn json() -> ContentType {
        ContentType("application/json".into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }

    pub fn is_json(&self) -> bool {
        is_json(&self.0)
    }
}

fn looks_like_media_type(ct: &str) -> bool {
    let ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-+._".contains(&b))
    };
    media_essence(ct)
        .split_once('/')
        .is_some_and(|(t, s)| ok(t) && ok(s))
}

/// The media type of a Content-Type value: lowercased, parameters dropped.
pub fn media_type(content_type: &str) -> String {
    media_essence(content_type).to_ascii_lowercase()
}

/// Whether two Content-Type values name the same media type (`media_type` equality
/// without allocating: every append checks it).
pub fn same_media_type(a: &str, b: &str) -> bool {
    media_essence(a).eq_ignore_ascii_case(media_essence(b))
}

/// Whether a Content-Type names JSON (the stream then keeps message boundaries).
pub fn is_json(content_type: &str) -> bool {
    same_media_type(content_type, JSON)
}

fn media_essence(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or("").trim()
}

/// An idempotent producer's id: 1 to a configured number of bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ProducerId(String);

impl ProducerId {
    pub fn new(id: impl Into<String>, max_bytes: usize) -> Result<ProducerId, Invalid> {
        let id = id.into();
        if id.is_empty() || id.len() > max_bytes {
            return Err(Invalid::ProducerIdLength { max: max_bytes });
        }
        Ok(ProducerId(id))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// Why a request is invalid (400), in the engine's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invalid {
    EmptyName,
    NameTooLong {
        len: usize,
        max: usize,
    },
    ContentTypeTooLong {
        max: usize,
    },
    ProducerIdLength {
        max: usize,
    },
    StreamSeqTooLong {
        max: usize,
    },
    /// An append with no data that does not close the stream.
    EmptyAppend,
    /// Record `index` of a native append to a JSON stream is not one JSON value.
    RecordNotJson {
        index: usize,
    },
    TtlWithExpiry,
    ExpiryNotRfc3339,
    /// A retention outside 1 to `max` seconds.
    Retention {
        max: u64,
    },
    ForkOffsetPastTail,
    ForkSubOffsetWithoutOffset,
    ForkSubOffsetPastAppend,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invalid::EmptyName => write!(f, "stream name is empty"),
            Invalid::NameTooLong { len, max } => {
                write!(f, "stream name is {len} bytes; the limit is {max}")
            }
            Invalid::ContentTypeTooLong { max } => {
                write!(f, "content type is longer than {max} bytes")
            }
            Invalid::ProducerIdLength { max } => write!(f, "producer id must be 1 to {max} bytes"),
            Invalid::StreamSeqTooLong { max } => {
                write!(f, "writer sequence is longer than {max} bytes")
            }
            Invalid::EmptyAppend => write!(f, "append is empty (only a close may be empty)"),
            Invalid::RecordNotJson { index } => write!(
                f,
                "record {index}: the stream is application/json, so each record body must be one JSON value"
            ),
            Invalid::TtlWithExpiry => write!(f, "a TTL and an expiry time are mutually exclusive"),
            Invalid::ExpiryNotRfc3339 => write!(f, "the expiry time must be an RFC 3339 timestamp"),
            Invalid::Retention { max } => write!(f, "retention must be 1 to {max} seconds"),
            Invalid::ForkOffsetPastTail => {
                write!(f, "the fork offset is beyond the source stream's tail")
            }
            Invalid::ForkSubOffsetWithoutOffset => {
                write!(f, "a fork sub-offset needs an explicit fork offset")
            }
            Invalid::ForkSubOffsetPastAppend => {
                write!(f, "the fork sub-offset is past the end of the next append")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_once_where_they_are_made() {
        assert_eq!(StreamName::new("", 10), Err(Invalid::EmptyName));
        assert!(matches!(
            StreamName::new("a".repeat(11), 10),
            Err(Invalid::NameTooLong { len: 11, max: 10 })
        ));
        assert_eq!(&*StreamName::new("logs/a", 10).unwrap(), "logs/a");
        assert_eq!(
            ProducerId::new("", 4),
            Err(Invalid::ProducerIdLength { max: 4 })
        );
        assert!(ProducerId::new("abcde", 4).is_err());
        assert_eq!(ProducerId::new("w-1", 4).unwrap().as_str(), "w-1");
    }

    #[test]
    fn content_types_are_media_types_or_nothing() {
        let json = ContentType::new(" Application/JSON; charset=utf-8 ", 256)
            .unwrap()
            .unwrap();
        assert!(json.is_json() && json.is_media_type());
        assert_eq!(json.as_str(), "Application/JSON; charset=utf-8");
        assert_eq!(media_type(json.as_str()), "application/json");
        let odd = ContentType::new("not a type", 256).unwrap().unwrap();
        assert!(!odd.is_media_type());
        assert_eq!(ContentType::new("  ", 256), Ok(None));
        assert!(ContentType::new(&format!("text/{}", "x".repeat(300)), 256).is_err());
        assert!(same_media_type("text/plain", "TEXT/plain; charset=x"));
        assert!(!same_media_type("text/plain", "text/html"));
    }
}
