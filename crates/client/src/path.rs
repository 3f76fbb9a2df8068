//! Stream names as URL paths: the one place the SDK turns a name into the path of
//! its requests.

/// A stream name as the path of its URL: `/` plus the name, with characters a path
/// cannot hold literally percent-encoded (`/` stays: names may have segments;
/// `%` stays, so names a server listed round-trip).
pub fn stream_path(name: &str) -> String {
    let name = name.trim_start_matches('/');
    let mut path = String::with_capacity(name.len() + 1);
    path.push('/');
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/%".contains(&b) {
            path.push(b as char);
        } else {
            path.push_str(&format!("%{b:02X}"));
        }
    }
    path
}

/// A query parameter's value, percent-encoded (unreserved characters stay).
pub(crate) fn query_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_paths() {
        assert_eq!(stream_path("orders"), "/orders");
        assert_eq!(stream_path("/logs/app"), "/logs/app");
        assert_eq!(stream_path("a b?c#d"), "/a%20b%3Fc%23d");
        assert_eq!(query_value("0000_0001"), "0000_0001");
        assert_eq!(query_value("a+b&c"), "a%2Bb%26c");
    }
}
