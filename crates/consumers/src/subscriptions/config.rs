//! What a subscription is asked to be: the PUT body parsed and checked, its
//! normalized form and hash (the idempotent re-confirmation compares hashes), the
//! glob rules of `pattern`, and the webhook URL checks against SSRF.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use crate::error::ConsumerError;

/// Lease bounds of PROTOCOL.md section 6.2.
pub const LEASE_TTL_MS_MIN: u64 = 1_000;
pub const LEASE_TTL_MS_MAX: u64 = 600_000;
pub const LEASE_TTL_MS_DEFAULT: u64 = 30_000;
/// Explicit streams one request may name, and links one subscription may hold.
pub const STREAMS_MAX: usize = 1_000;
pub const DESCRIPTION_BYTES_MAX: usize = 1_024;
pub const URL_BYTES_MAX: usize = 2_048;
pub const ID_BYTES_MAX: usize = 128;
pub const WORKER_BYTES_MAX: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    #[serde(rename = "webhook")]
    Webhook,
    #[serde(rename = "pull-wake")]
    PullWake,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Webhook => "webhook",
            Kind::PullWake => "pull-wake",
        }
    }
}

/// A subscription's configuration, normalized: explicit streams sorted and
/// deduplicated, defaults filled in. Its JSON is what the hash is taken of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubConfig {
    #[serde(rename = "type")]
    pub kind: Kind,
    pub pattern: Option<String>,
    pub streams: Vec<String>,
    pub webhook_url: Option<String>,
    pub wake_stream: Option<String>,
    pub lease_ttl_ms: u64,
    pub description: Option<String>,
}

impl SubConfig {
    /// Hex SHA-256 of the normalized configuration.
    pub fn hash(&self) -> String {
        let json = serde_json::to_vec(self).expect("a config serializes");
        let digest = ring::digest::digest(&ring::digest::SHA256, &json);
        digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PutBody {
    #[serde(rename = "type")]
    kind: Option<String>,
    pattern: Option<String>,
    #[serde(default)]
    streams: Vec<String>,
    webhook: Option<WebhookBody>,
    wake_stream: Option<String>,
    lease_ttl_ms: Option<u64>,
    description: Option<String>,
}

#[derive(Deserialize)]
struct WebhookBody {
    url: String,
}

fn invalid(message: impl Into<String>) -> ConsumerError {
    ConsumerError::invalid(message).with_code("INVALID_REQUEST")
}

/// Parses and checks a PUT body against the protocol's rules. `allow_private`
/// lifts the network checks of webhook URLs (a receiver inside a private
/// network). The protocol's development exception (`http://localhost`) passes
/// here; whether this server grants it is [`WebhookRule`]'s, checked when the
/// subscription is created.
pub fn parse_put(body: &[u8], allow_private: bool) -> Result<SubConfig, ConsumerError> {
    let body: PutBody = serde_json::from_slice(body)
        .map_err(|e| invalid(format!("subscription body is not valid: {e}")))?;
    let kind = match body.kind.as_deref() {
        Some("webhook") => Kind::Webhook,
        Some("pull-wake") => Kind::PullWake,
        Some(other) => {
            return Err(invalid(format!(
                "type {other:?} is not known; use webhook or pull-wake"
            )))
        }
        None => return Err(invalid("type is required (webhook or pull-wake)")),
    };
    if body.pattern.is_none() && body.streams.is_empty() {
        return Err(invalid("a subscription needs a pattern, streams, or both"));
    }
    if let Some(p) = &body.pattern {
        check_pattern(p)?;
    }
    if body.streams.len() > STREAMS_MAX {
        return Err(invalid(format!(
            "{} streams named; at most {STREAMS_MAX}",
            body.streams.len()
        )));
    }
    let mut streams = Vec::with_capacity(body.streams.len());
    for s in body.streams {
        streams.push(check_path(&s)?);
    }
    streams.sort();
    streams.dedup();
    let lease_ttl_ms = body.lease_ttl_ms.unwrap_or(LEASE_TTL_MS_DEFAULT);
    if !(LEASE_TTL_MS_MIN..=LEASE_TTL_MS_MAX).contains(&lease_ttl_ms) {
        return Err(invalid(format!(
            "lease_ttl_ms is {lease_ttl_ms}; it must be from {LEASE_TTL_MS_MIN} to {LEASE_TTL_MS_MAX}"
        )));
    }
    if body
        .description
        .as_ref()
        .is_some_and(|d| d.len() > DESCRIPTION_BYTES_MAX)
    {
        return Err(invalid(format!(
            "description is longer than {DESCRIPTION_BYTES_MAX} bytes"
        )));
    }
    let (webhook_url, wake_stream) = match kind {
        Kind::Webhook => {
            let url = body
                .webhook
                .ok_or_else(|| invalid("webhook subscriptions require webhook.url"))?
                .url;
            check_webhook_url(
                &url,
                WebhookRule {
                    allow_private,
                    development: true,
                },
            )?;
            if body.wake_stream.is_some() {
                return Err(invalid("wake_stream is for pull-wake subscriptions"));
            }
            (Some(url), None)
        }
        Kind::PullWake => {
            let wake = body
                .wake_stream
                .ok_or_else(|| invalid("pull-wake subscriptions require wake_stream"))?;
            if body.webhook.is_some() {
                return Err(invalid("webhook is for webhook subscriptions"));
            }
            (None, Some(check_path(&wake)?))
        }
    };
    Ok(SubConfig {
        kind,
        pattern: body.pattern,
        streams,
        webhook_url,
        wake_stream,
        lease_ttl_ms,
        description: body.description,
    })
}

/// A stream-root-relative path: segments without `.`/`..`, not under `__ds`.
pub fn check_path(path: &str) -> Result<String, ConsumerError> {
    let path = path.trim_matches('/');
    if path.is_empty() || path.len() > 1024 {
        return Err(invalid(format!(
            "stream path {path:?} must have 1 to 1024 bytes"
        )));
    }
    for seg in path.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." || seg.contains('*') {
            return Err(invalid(format!("stream path {path:?} is not a valid path")));
        }
    }
    if path.starts_with("__") {
        return Err(invalid(format!(
            "stream path {path:?} is reserved (paths starting with __ are the server's)"
        )));
    }
    Ok(path.to_string())
}

fn check_pattern(pattern: &str) -> Result<(), ConsumerError> {
    if pattern.is_empty() || pattern.len() > 1024 {
        return Err(invalid("pattern must have 1 to 1024 bytes"));
    }
    for seg in pattern.split('/') {
        if seg.is_empty() {
            return Err(invalid(format!("pattern {pattern:?} has an empty segment")));
        }
        if seg.contains("**") && seg != "**" {
            return Err(invalid(format!(
                "pattern {pattern:?}: ** must be a whole segment"
            )));
        }
    }
    Ok(())
}

/// Whether `path` matches `pattern`: `*` within a segment matches any characters
/// of that segment, a `**` segment zero or more segments.
pub fn glob_matches(pattern: &str, path: &str) -> bool {
    let pat: Vec<&str> = pattern.split('/').collect();
    let segs: Vec<&str> = path.split('/').collect();
    match_segments(&pat, &segs)
}

fn match_segments(pat: &[&str], segs: &[&str]) -> bool {
    match pat.split_first() {
        None => segs.is_empty(),
        Some((&"**", rest)) => (0..=segs.len()).any(|i| match_segments(rest, &segs[i..])),
        Some((p, rest)) => match segs.split_first() {
            Some((s, more)) => segment_matches(p, s) && match_segments(rest, more),
            None => false,
        },
    }
}

fn segment_matches(pat: &str, seg: &str) -> bool {
    let parts: Vec<&str> = pat.split('*').collect();
    if parts.len() == 1 {
        return pat == seg;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !seg.starts_with(first) || seg.len() < first.len() + last.len() || !seg.ends_with(last) {
        return false;
    }
    let mut rest = &seg[first.len()..seg.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(i) => rest = &rest[i + middle.len()..],
            None => return false,
        }
    }
    true
}

/// The literal part of `pattern` before its first wildcard segment: what a listing
/// of candidate streams can start from.
pub fn literal_prefix(pattern: &str) -> String {
    let mut out = String::new();
    for seg in pattern.split('/') {
        if seg.contains('*') {
            if let Some(i) = seg.find('*') {
                out.push_str(&seg[..i]);
            }
            return out;
        }
        out.push_str(seg);
        out.push('/');
    }
    out.pop();
    out
}

fn rejected(message: impl Into<String>) -> ConsumerError {
    ConsumerError::invalid(message).with_code("WEBHOOK_URL_REJECTED")
}

/// Where this server delivers webhooks. Production: `https://` to public
/// addresses only, decided again on every address a name resolves to when a
/// connection is made (`webhook.rs`). PROTOCOL.md 6.2's development exception
/// (`http://localhost`, `http://127.0.0.x`) holds only on a development server
/// (`--auth off`, which listens on loopback only). `--webhook-allow-private`
/// opens private, loopback and link-local targets, and `http://`, on purpose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WebhookRule {
    pub allow_private: bool,
    pub development: bool,
}

impl WebhookRule {
    /// Whether a connection to `ip` may carry a webhook to a URL that is
    /// (`dev_url`) or is not the development exception.
    pub fn allows(self, ip: IpAddr, dev_url: bool) -> bool {
        self.allow_private
            || address_allowed(ip)
            || (self.development && dev_url && is_loopback(ip))
    }
}

/// Whether `url` is the protocol's development exception: `http://localhost` or
/// `http://127.0.0.x` (any port, any path).
pub fn is_dev_url(url: &url::Url) -> bool {
    url.scheme() == "http"
        && match url.host() {
            Some(url::Host::Domain(d)) => d.trim_end_matches('.').eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(ip)) => is_dev_loopback(ip),
            _ => false,
        }
}

/// PROTOCOL.md 6.2 as `rule` grants it: `https://` to public hosts; `http://`
/// only for the development exception on a development server; no private,
/// loopback, link-local or other local targets (unless `rule.allow_private`),
/// whatever way the address is written (the URL parser turns `2130706433`,
/// `0x7f.1` and `127.1` into `127.0.0.1`; IPv4 inside IPv6 is looked at), and no
/// `.localhost` name. Names are checked again once resolved, at every connection.
pub fn check_webhook_url(raw: &str, rule: WebhookRule) -> Result<(), ConsumerError> {
    if raw.len() > URL_BYTES_MAX {
        return Err(rejected(format!(
            "webhook URL is longer than {URL_BYTES_MAX} bytes"
        )));
    }
    let url = url::Url::parse(raw).map_err(|e| rejected(format!("webhook URL: {e}")))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(rejected("webhook URL must not carry credentials"));
    }
    let host = url
        .host()
        .ok_or_else(|| rejected("webhook URL has no host"))?;
    let dev = is_dev_url(&url);
    if dev && rule.development {
        return Ok(());
    }
    match url.scheme() {
        "https" => {}
        "http" if rule.allow_private => {}
        "http" if rule.development => {
            return Err(rejected(
                "webhook URL must use https:// (http:// only to localhost or 127.0.0.x)",
            ))
        }
        "http" => {
            return Err(rejected(
                "webhook URL must use https:// (this server is not a development server: --auth is on, so http://localhost is not allowed either; --webhook-allow-private allows http:// and private receivers)",
            ))
        }
        other => {
            return Err(rejected(format!(
                "webhook URL scheme {other:?} is not http(s)"
            )))
        }
    }
    if rule.allow_private {
        return Ok(());
    }
    let ip = match host {
        url::Host::Ipv4(ip) => IpAddr::V4(ip),
        url::Host::Ipv6(ip) => IpAddr::V6(ip),
        url::Host::Domain(d) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            if d == "localhost" || d.ends_with(".localhost") {
                return Err(rejected(format!(
                    "webhook URL targets {d}, a loopback name"
                )));
            }
            return Ok(());
        }
    };
    if !address_allowed(ip) {
        return Err(rejected(format!(
            "webhook URL targets {ip}, a private, loopback or local network address"
        )));
    }
    Ok(())
}

fn is_dev_loopback(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    o[0] == 127 && o[1] == 0 && o[2] == 0
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Whether a webhook may be delivered to `ip`: a public address. An IPv4 address
/// carried inside IPv6 (mapped, compatible, NAT64, 6to4) is judged as itself.
pub fn address_allowed(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4_public(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => v4_public(v4),
            None => v6_public(v6),
        },
    }
}

/// The IPv4 address an IPv6 address stands for: IPv4-mapped `::ffff:a.b.c.d`,
/// IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d` (RFC 6052) and 6to4
/// `2002:AABB:CCDD::` (RFC 3056).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    if s[..6] == [0; 6] && !ip.is_loopback() && !ip.is_unspecified() {
        return Some(low);
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(low);
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    None
}

fn v4_public(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    !(ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || o[0] == 0
        || (o[0] == 100 && (64..128).contains(&o[1])) // carrier-grade NAT
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF protocol assignments
        || (o[0] == 198 && (o[1] == 18 || o[1] == 19)) // benchmarking
        || o[0] >= 240)
}

fn v6_public(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00 // unique local
        || (s[0] & 0xffc0) == 0xfe80 // link-local
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (s[0] == 0x2001 && s[1] == 0) // Teredo: the peer is elsewhere
        || (s[0] == 0x2001 && s[1] == 0xdb8) // documentation
        || (s[0] == 0x0064 && s[1] == 0xff9b) // NAT64 for local use (64:ff9b:1::/48)
        || (s[0] == 0x0100 && s[1..4] == [0, 0, 0]) // discard-only
        || s[0] == 0) // the rest of ::/16 (IPv4-compatible forms are judged above)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_segments() {
        assert!(glob_matches("events/*", "events/a"));
        assert!(!glob_matches("events/*", "events/a/b"));
        assert!(!glob_matches("events/*", "events"));
        assert!(glob_matches("events/**", "events"));
        assert!(glob_matches("events/**", "events/a/b"));
        assert!(glob_matches("**/x", "a/b/x"));
        assert!(glob_matches("events/order-*", "events/order-12"));
        assert!(!glob_matches("events/order-*", "events/user-12"));
        assert!(glob_matches("a/*-*-z", "a/x-y-z"));
        assert!(!glob_matches("a/*-*-z", "a/x-z"));
        assert_eq!(literal_prefix("events/*"), "events/");
        assert_eq!(literal_prefix("events/order-*"), "events/order-");
        assert_eq!(literal_prefix("events/a"), "events/a");
        assert_eq!(literal_prefix("**"), "");
    }

    const PRODUCTION: WebhookRule = WebhookRule {
        allow_private: false,
        development: false,
    };
    const DEVELOPMENT: WebhookRule = WebhookRule {
        allow_private: false,
        development: true,
    };

    #[test]
    fn production_refuses_every_form_of_a_local_address() {
        let ok = |u: &str| check_webhook_url(u, PRODUCTION).is_ok();
        assert!(ok("https://hooks.example.com/x"));
        assert!(ok("https://93.184.216.34/x"));
        assert!(ok("https://[2606:2800:220:1:248:1893:25c8:1946]/x"));
        for bad in [
            "http://localhost:8080/hook",
            "http://127.0.0.1:9/hook",
            "http://2130706433:9/",
            "http://127.1:9/",
            "https://2130706433/",
            "https://0x7f000001/",
            "https://0177.0.0.1/",
            "https://127.1/",
            "https://127.0.0.1/",
            "https://localhost/",
            "https://foo.localhost/",
            "https://LOCALHOST./",
            "https://[::1]/",
            "https://[::ffff:127.0.0.1]/",
            "https://[::127.0.0.1]/",
            "https://[64:ff9b::7f00:1]/",
            "https://[64:ff9b::a00:1]/",
            "https://[2002:7f00:1::]/",
            "https://[2002:a00:1::]/",
            "https://[fe80::1]/",
            "https://[2001:db8::1]/",
            "https://0.0.0.0/",
            "https://[::]/",
            "https://100.64.0.1/",
            "https://192.0.0.1/",
        ] {
            assert!(!ok(bad), "{bad}");
        }
        assert!(check_webhook_url(
            "http://10.0.0.1/",
            WebhookRule {
                allow_private: true,
                development: false
            }
        )
        .is_ok());
        assert!(check_webhook_url(
            "http://localhost:9/",
            WebhookRule {
                allow_private: true,
                development: false
            }
        )
        .is_ok());
    }

    #[test]
    fn connections_are_judged_by_the_address_reached() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let lo6: IpAddr = "::1".parse().unwrap();
        let public: IpAddr = "93.184.216.34".parse().unwrap();
        assert!(!PRODUCTION.allows(lo, true));
        assert!(!PRODUCTION.allows(lo6, true));
        assert!(PRODUCTION.allows(public, false));
        assert!(DEVELOPMENT.allows(lo, true) && DEVELOPMENT.allows(lo6, true));
        assert!(
            !DEVELOPMENT.allows(lo, false),
            "only the development URLs reach loopback"
        );
        assert!(!DEVELOPMENT.allows("10.0.0.1".parse().unwrap(), true));
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert!(!PRODUCTION.allows(mapped, false));
    }

    #[test]
    fn webhook_urls_are_checked_against_ssrf() {
        let ok = |u: &str| check_webhook_url(u, DEVELOPMENT).is_ok();
        assert!(ok("https://hooks.example.com/x"));
        assert!(ok("http://localhost:8080/hook"));
        assert!(ok("http://127.0.0.1:9/hook"));
        assert!(!ok("http://10.0.0.1/hook"));
        assert!(!ok("https://10.0.0.1/hook"));
        assert!(!ok("https://192.168.1.2/hook"));
        assert!(!ok("https://169.254.169.254/latest/meta-data"));
        assert!(!ok("https://[::1]/hook"));
        assert!(!ok("https://[fd00::1]/hook"));
        assert!(!ok("http://hooks.example.com/x"));
        assert!(!ok("ftp://hooks.example.com/x"));
        assert!(!ok("https://user:pw@hooks.example.com/x"));
        assert!(!ok("http://127.0.1.1/hook"));
        assert!(!ok("https://foo.localhost/hook"));
        assert!(check_webhook_url(
            "http://10.0.0.1/hook",
            WebhookRule {
                allow_private: true,
                development: true
            }
        )
        .is_ok());
        assert!(address_allowed("93.184.216.34".parse().unwrap()));
        assert!(!address_allowed("::ffff:10.1.2.3".parse().unwrap()));
    }

    #[test]
    fn configs_are_normalized_before_hashing() {
        let a = parse_put(
            br#"{"type":"webhook","streams":["b","a","b"],"webhook":{"url":"https://h.example/x"}}"#,
            false,
        )
        .unwrap();
        let b = parse_put(
            br#"{"type":"webhook","streams":["a","b"],"webhook":{"url":"https://h.example/x"},"lease_ttl_ms":30000}"#,
            false,
        )
        .unwrap();
        assert_eq!(a.streams, vec!["a", "b"]);
        assert_eq!(a.hash(), b.hash());
        let c = parse_put(
            br#"{"type":"webhook","streams":["a"],"webhook":{"url":"https://h.example/x"}}"#,
            false,
        )
        .unwrap();
        assert_ne!(a.hash(), c.hash());
        for bad in [
            &br#"{"type":"webhook","webhook":{"url":"https://h.example/x"}}"#[..],
            br#"{"type":"queue","pattern":"a/*"}"#,
            br#"{"type":"pull-wake","pattern":"a/*"}"#,
            br#"{"type":"pull-wake","pattern":"a/*","wake_stream":"w","lease_ttl_ms":5}"#,
            br#"{"type":"pull-wake","pattern":"a/**b","wake_stream":"w"}"#,
            br#"{"type":"pull-wake","streams":["../x"],"wake_stream":"w"}"#,
            br#"not json"#,
        ] {
            assert!(
                parse_put(bad, false).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
