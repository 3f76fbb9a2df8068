//! Credentials on the wire: bearer secrets (generated, parsed, hashed) and signed read
//! tokens for query parameters (minted and verified with the server's HMAC key).
//! Nothing here touches storage.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::rand::{SecureRandom, SystemRandom};
use ring::{digest, hmac};

/// Prefix of generated secrets, so secret scanners and people recognise them.
pub const SECRET_PREFIX: &str = "pmq_";
/// Shortest bearer secret accepted (a bootstrap file may hold any secret this long).
pub const SECRET_BYTES_MIN: usize = 32;
/// Longest bearer secret accepted.
pub const SECRET_BYTES_MAX: usize = 512;
/// Prefix and version of signed read tokens.
pub const READ_TOKEN_PREFIX: &str = "pmqr1.";
/// The query parameter that carries a signed read token.
pub const QUERY_PARAM: &str = "token";

pub type SecretHash = [u8; 32];

/// `n` bytes from the operating system's CSPRNG.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    SystemRandom::new()
        .fill(&mut out)
        .expect("the operating system's random source works");
    out
}

/// A fresh secret: 256 random bits.
pub fn new_secret() -> String {
    format!(
        "{SECRET_PREFIX}{}",
        URL_SAFE_NO_PAD.encode(random_bytes::<32>())
    )
}

/// A fresh public token id.
pub fn new_token_id() -> String {
    let b = random_bytes::<8>();
    let mut id = String::with_capacity(20);
    id.push_str("tok_");
    for byte in b {
        id.push_str(&format!("{byte:02x}"));
    }
    id
}

/// SHA-256 of a secret: what the database holds. A fast hash is enough because every
/// secret is high-entropy (see docs/security.md).
pub fn hash_secret(secret: &str) -> SecretHash {
    let d = digest::digest(&digest::SHA256, secret.as_bytes());
    d.as_ref().try_into().expect("SHA-256 is 32 bytes")
}

/// Checks the shape of a secret (from a header or the bootstrap file).
pub fn check_secret(secret: &str) -> Result<&str, &'static str> {
    if secret.len() < SECRET_BYTES_MIN {
        return Err("the token is too short to be a PicoMQ secret (at least 32 characters)");
    }
    if secret.len() > SECRET_BYTES_MAX {
        return Err("the token is too long (at most 512 characters)");
    }
    if !secret.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("the token must be visible ASCII without spaces");
    }
    Ok(secret)
}

/// The credential of an `Authorization` header value: `Bearer SECRET`.
pub fn parse_bearer(value: &[u8]) -> Result<&str, &'static str> {
    let value = std::str::from_utf8(value).map_err(|_| "Authorization is not ASCII text")?;
    let (scheme, rest) = value
        .trim()
        .split_once(' ')
        .ok_or("Authorization must be `Bearer TOKEN`")?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err("Authorization must use the Bearer scheme");
    }
    check_secret(rest.trim())
}

/// The signed read token in a raw query string, if there is exactly one.
pub fn query_token(query: &str) -> Result<Option<&str>, &'static str> {
    let mut found = None;
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == QUERY_PARAM {
            if found.is_some() {
                return Err("the token query parameter may be given only once");
            }
            found = Some(value);
        }
    }
    Ok(found)
}

/// Signs and verifies read tokens: `pmqr1.EXPIRY.MAC`, MAC = HMAC-SHA256 over the
/// purpose, the expiry (Unix seconds) and the stream name. Read-only by construction:
/// the purpose is part of what is signed and the server accepts it only on reads.
pub struct ReadTokenKey(hmac::Key);

/// Why a read token was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadTokenError {
    Malformed,
    Expired,
    BadSignature,
}

impl ReadTokenKey {
    pub fn new(key: &[u8]) -> ReadTokenKey {
        ReadTokenKey(hmac::Key::new(hmac::HMAC_SHA256, key))
    }

    fn message(stream: &str, expires_secs: u64) -> Vec<u8> {
        let mut m = Vec::with_capacity(32 + stream.len());
        m.extend_from_slice(b"picomq read-only v1\n");
        m.extend_from_slice(expires_secs.to_string().as_bytes());
        m.push(b'\n');
        m.extend_from_slice(stream.as_bytes());
        m
    }

    pub fn mint(&self, stream: &str, expires_secs: u64) -> String {
        let tag = hmac::sign(&self.0, &Self::message(stream, expires_secs));
        format!(
            "{READ_TOKEN_PREFIX}{expires_secs}.{}",
            URL_SAFE_NO_PAD.encode(tag.as_ref())
        )
    }

    /// The token's expiry, checked for shape and time (not yet for a stream).
    pub fn parse(token: &str, now_secs: u64) -> Result<(u64, Vec<u8>), ReadTokenError> {
        let rest = token
            .strip_prefix(READ_TOKEN_PREFIX)
            .ok_or(ReadTokenError::Malformed)?;
        let (expires, mac) = rest.split_once('.').ok_or(ReadTokenError::Malformed)?;
        if expires.is_empty() || expires.len() > 12 || !expires.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(ReadTokenError::Malformed);
        }
        let expires: u64 = expires.parse().map_err(|_| ReadTokenError::Malformed)?;
        if mac.len() != 43 {
            return Err(ReadTokenError::Malformed);
        }
        let mac = URL_SAFE_NO_PAD
            .decode(mac)
            .map_err(|_| ReadTokenError::Malformed)?;
        if expires <= now_secs {
            return Err(ReadTokenError::Expired);
        }
        Ok((expires, mac))
    }

    /// Whether `mac` signs (`stream`, `expires_secs`); constant time.
    pub fn verify(&self, stream: &str, expires_secs: u64, mac: &[u8]) -> bool {
        hmac::verify(&self.0, &Self::message(stream, expires_secs), mac).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_fresh_and_well_formed() {
        let a = new_secret();
        assert!(a.starts_with(SECRET_PREFIX) && a.len() == 47);
        assert_ne!(a, new_secret());
        assert!(check_secret(&a).is_ok());
        assert_eq!(hash_secret(&a), hash_secret(&a));
        assert_ne!(hash_secret(&a), hash_secret(&new_secret()));
        assert!(new_token_id().starts_with("tok_"));
    }

    #[test]
    fn bearer_parsing() {
        let s = new_secret();
        assert_eq!(
            parse_bearer(format!("Bearer {s}").as_bytes()),
            Ok(s.as_str())
        );
        assert_eq!(
            parse_bearer(format!("bearer  {s} ").as_bytes()),
            Ok(s.as_str())
        );
        for bad in [
            format!("Basic {s}"),
            s.clone(),
            "Bearer short".into(),
            format!("Bearer {s} x"),
        ] {
            assert!(parse_bearer(bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(parse_bearer(&[0xff, 0xfe]).is_err());
    }

    #[test]
    fn read_tokens_bind_stream_and_expiry() {
        let key = ReadTokenKey::new(b"k");
        let t = key.mint("a/b", 1000);
        let (exp, mac) = ReadTokenKey::parse(&t, 999).unwrap();
        assert_eq!(exp, 1000);
        assert!(key.verify("a/b", exp, &mac));
        assert!(!key.verify("a/c", exp, &mac));
        assert!(!key.verify("a/b", exp + 1, &mac));
        assert!(!ReadTokenKey::new(b"other").verify("a/b", exp, &mac));
        assert_eq!(ReadTokenKey::parse(&t, 1000), Err(ReadTokenError::Expired));
        assert_eq!(
            ReadTokenKey::parse("pmqr1.x.y", 0),
            Err(ReadTokenError::Malformed)
        );
        assert_eq!(query_token("offset=-1&token=abc"), Ok(Some("abc")));
        assert!(query_token("token=a&token=b").is_err());
    }
}
