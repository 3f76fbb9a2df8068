//! Topics and streams are one thing seen two ways (docs/kafka.md):
//!
//! - A stream whose name is a legal Kafka topic name (`[a-zA-Z0-9._-]`, at most
//!   249 characters) is the topic of that name. Any other stream is the topic
//!   `_s.` followed by its name with `/` written `.` and every other byte outside
//!   `[a-zA-Z0-9-]` written `_` and two hex digits (`chat/42` is `_s.chat.42`).
//!   Legal names that begin with `_s.` are written that way too, so the mapping
//!   is one to one and reversible.
//! - Partition 0 of a topic is its stream; partition `p` > 0 is the stream named
//!   `{stream}~{p}`. A topic has as many partitions as it has such streams, from
//!   `~1` up without a gap.

/// What begins every escaped topic name.
pub const ESCAPED: &str = "_s.";
/// Kafka's longest topic name.
pub const TOPIC_MAX: usize = 249;

fn legal(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-'
}

/// Is `name` a topic name Kafka accepts?
pub fn is_legal_topic(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= TOPIC_MAX
        && name != "."
        && name != ".."
        && name.bytes().all(legal)
}

/// The topic a stream is seen as; `None` when its escaped name is over Kafka's
/// length limit (the stream is then reachable over HTTP only).
pub fn topic_of(stream: &str) -> Option<String> {
    if is_legal_topic(stream) && !stream.starts_with(ESCAPED) {
        return Some(stream.to_string());
    }
    let mut out = String::from(ESCAPED);
    for b in stream.bytes() {
        match b {
            b'/' => out.push('.'),
            b if b.is_ascii_alphanumeric() || b == b'-' => out.push(b as char),
            b => out.push_str(&format!("_{b:02x}")),
        }
    }
    (out.len() <= TOPIC_MAX).then_some(out)
}

/// The stream a topic name stands for; `None` for a name that is not legal or
/// whose escaping is not the one [`topic_of`] writes.
pub fn stream_of(topic: &str) -> Option<String> {
    if !is_legal_topic(topic) {
        return None;
    }
    let Some(escaped) = topic.strip_prefix(ESCAPED) else {
        return Some(topic.to_string());
    };
    let bytes = escaped.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'.' => out.push(b'/'),
            b'_' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                if hex.bytes().any(|c| c.is_ascii_uppercase()) {
                    return None;
                }
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    let stream = String::from_utf8(out).ok()?;
    // Only the canonical spelling: one topic per stream.
    (topic_of(&stream).as_deref() == Some(topic)).then_some(stream)
}

/// The stream behind partition `p` of the topic whose partition 0 is `base`.
pub fn partition_stream(base: &str, p: i32) -> String {
    if p == 0 {
        base.to_string()
    } else {
        format!("{base}~{p}")
    }
}

/// `(base, p)` when `stream` is partition `p` > 0 of the topic whose partition 0
/// is `base`.
pub fn split_partition(stream: &str) -> Option<(&str, i32)> {
    let (base, p) = stream.rsplit_once('~')?;
    if base.is_empty()
        || p.is_empty()
        || p.starts_with('0')
        || !p.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let p: i32 = p.parse().ok()?;
    (p > 0).then_some((base, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legal_names_are_themselves() {
        for name in ["orders", "a.b_c-d", "__consumer_offsets", "X9"] {
            assert_eq!(topic_of(name).as_deref(), Some(name));
            assert_eq!(stream_of(name).as_deref(), Some(name));
        }
    }

    #[test]
    fn other_names_are_escaped_and_come_back() {
        for (stream, topic) in [
            ("chat/42", "_s.chat.42"),
            ("tenant/a.b/c_d", "_s.tenant.a_2eb.c_5fd"),
            ("orders~1", "_s.orders_7e1"),
            ("_s.x", "_s._5fs_2ex"),
            ("é", "_s._c3_a9"),
            ("a b", "_s.a_20b"),
        ] {
            assert_eq!(topic_of(stream).as_deref(), Some(topic), "{stream}");
            assert_eq!(stream_of(topic).as_deref(), Some(stream), "{topic}");
        }
    }

    #[test]
    fn non_canonical_and_illegal_topics_are_refused() {
        for topic in [
            "_s.a_2",
            "_s.a_zz",
            "_s.A_2E",
            "has space",
            "",
            ".",
            "..",
            "slash/no",
        ] {
            assert_eq!(stream_of(topic), None, "{topic}");
        }
        assert_eq!(stream_of("_s.a_2e.b").as_deref(), Some("a./b"));
        // A legal stream name escaped needlessly is not another way to reach it.
        assert_eq!(stream_of("_s.orders"), None);
        assert_eq!(stream_of("_s.a_2e"), None);
        assert_eq!(topic_of(&"x/".repeat(200)), None);
    }

    #[test]
    fn partitions_are_tilde_suffixed_streams() {
        assert_eq!(partition_stream("orders", 0), "orders");
        assert_eq!(partition_stream("orders", 3), "orders~3");
        assert_eq!(split_partition("orders~3"), Some(("orders", 3)));
        assert_eq!(split_partition("a~b~12"), Some(("a~b", 12)));
        for s in [
            "orders",
            "orders~",
            "orders~0",
            "orders~01",
            "~1",
            "o~x",
            "o~-1",
        ] {
            assert_eq!(split_partition(s), None, "{s}");
        }
    }
}
