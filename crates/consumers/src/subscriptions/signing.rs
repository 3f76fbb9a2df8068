//! The webhook signing keys: Ed25519 key pairs kept as server keys (WAL system ops,
//! so every node of a cluster and every restart signs with the same keys), the
//! JWK Set that publishes their public halves, and the `Webhook-Signature` header.
//!
//! Keys are numbered: `webhook-ed25519/1`, `/2`, ... The highest number is the
//! active key; a rotation logs the next one. Every key stays in the JWK Set, so a
//! delivery signed before a rotation still verifies after it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use picomq_engine::Engine;
use ring::signature::{Ed25519KeyPair, KeyPair};

use crate::error::ConsumerError;
use crate::random_bytes;

/// The server key name of signing key `n`.
fn key_name(n: u32) -> String {
    format!("webhook-ed25519/{n}")
}

/// How long the node trusts its list of keys before looking for a newer one (a
/// rotation another node of the cluster logged).
const KEYS_FRESH_FOR: Duration = Duration::from_secs(10);

/// At most this many keys are published (a rotation past it is refused).
const KEYS_MAX: u32 = 64;

pub struct SigningKey {
    pub kid: String,
    pair: Ed25519KeyPair,
    public: Vec<u8>,
}

impl SigningKey {
    fn from_seed(seed: &[u8]) -> Result<SigningKey, ConsumerError> {
        let pair = Ed25519KeyPair::from_seed_unchecked(seed)
            .map_err(|_| ConsumerError::internal("a webhook signing key is not 32 bytes"))?;
        let public = pair.public_key().as_ref().to_vec();
        Ok(SigningKey {
            kid: kid_of(&public),
            pair,
            public,
        })
    }

    /// The JWK of the public key.
    fn jwk(&self) -> serde_json::Value {
        serde_json::json!({
            "kty": "OKP",
            "crv": "Ed25519",
            "kid": self.kid,
            "use": "sig",
            "alg": "EdDSA",
            "x": URL_SAFE_NO_PAD.encode(&self.public),
        })
    }
}

/// `ds_` and the start of the key's RFC 7638 JWK thumbprint.
fn kid_of(public: &[u8]) -> String {
    let canonical = format!(
        r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#,
        URL_SAFE_NO_PAD.encode(public)
    );
    let digest = ring::digest::digest(&ring::digest::SHA256, canonical.as_bytes());
    format!("ds_{}", &URL_SAFE_NO_PAD.encode(digest.as_ref())[..22])
}

/// The node's view of the signing keys.
pub struct Signer {
    keys: Mutex<Keys>,
}

struct Keys {
    /// Keys 1..=n in order; the last is active.
    list: Vec<std::sync::Arc<SigningKey>>,
    checked: Option<Instant>,
}

impl Default for Signer {
    fn default() -> Self {
        Signer {
            keys: Mutex::new(Keys {
                list: Vec::new(),
                checked: None,
            }),
        }
    }
}

impl Signer {
    /// Every key, loading the first one (created on first use) and any a rotation
    /// added since the list was last looked at.
    pub async fn keys(
        &self,
        engine: &Engine,
    ) -> Result<Vec<std::sync::Arc<SigningKey>>, ConsumerError> {
        let (have, fresh) = {
            let keys = self.keys.lock().expect("signer lock");
            let fresh = keys.checked.is_some_and(|t| t.elapsed() < KEYS_FRESH_FOR);
            (keys.list.clone(), fresh)
        };
        if fresh && !have.is_empty() {
            return Ok(have);
        }
        let mut list = have;
        if list.is_empty() {
            let seed = engine
                .server_key(&key_name(1), &random_bytes::<32>())
                .await?;
            list.push(std::sync::Arc::new(SigningKey::from_seed(&seed)?));
        }
        while (list.len() as u32) < KEYS_MAX {
            let next = list.len() as u32 + 1;
            match engine.meta().server_key(&key_name(next)).await? {
                Some(seed) => list.push(std::sync::Arc::new(SigningKey::from_seed(&seed)?)),
                None => break,
            }
        }
        let mut keys = self.keys.lock().expect("signer lock");
        if list.len() >= keys.list.len() {
            keys.list = list;
        }
        keys.checked = Some(Instant::now());
        Ok(keys.list.clone())
    }

    /// The active key.
    pub async fn active(
        &self,
        engine: &Engine,
    ) -> Result<std::sync::Arc<SigningKey>, ConsumerError> {
        let keys = self.keys(engine).await?;
        Ok(keys.last().expect("at least one key").clone())
    }

    /// Logs a new key, which becomes the active one; returns its kid.
    pub async fn rotate(&self, engine: &Engine) -> Result<String, ConsumerError> {
        let n = {
            self.keys.lock().expect("signer lock").checked = None;
            self.keys(engine).await?.len() as u32
        };
        if n >= KEYS_MAX {
            return Err(ConsumerError::conflict(
                "too_many_keys",
                format!("{KEYS_MAX} webhook signing keys exist; no more can be added"),
            ));
        }
        engine
            .server_key(&key_name(n + 1), &random_bytes::<32>())
            .await?;
        self.keys.lock().expect("signer lock").checked = None;
        Ok(self.active(engine).await?.kid.clone())
    }

    /// The JWK Set of every key.
    pub async fn jwks(&self, engine: &Engine) -> Result<serde_json::Value, ConsumerError> {
        let keys = self.keys(engine).await?;
        Ok(serde_json::json!({ "keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>() }))
    }
}

/// The `Webhook-Signature` value for `body` sent at `unix_secs`: an Ed25519
/// signature over `<timestamp>.<body>`.
pub fn signature_header(key: &SigningKey, unix_secs: u64, body: &[u8]) -> String {
    let mut signed = Vec::with_capacity(body.len() + 21);
    signed.extend_from_slice(unix_secs.to_string().as_bytes());
    signed.push(b'.');
    signed.extend_from_slice(body);
    let sig = key.pair.sign(&signed);
    format!(
        "t={unix_secs},kid={},ed25519={}",
        key.kid,
        URL_SAFE_NO_PAD.encode(sig.as_ref())
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{UnparsedPublicKey, ED25519};

    #[test]
    fn a_signature_verifies_over_the_timestamp_and_the_body_only() {
        let key = SigningKey::from_seed(&[7u8; 32]).unwrap();
        let header = signature_header(&key, 1_700_000_000, b"{\"a\":1}");
        let (t, rest) = header.split_once(",kid=").unwrap();
        assert_eq!(t, "t=1700000000");
        let (kid, sig) = rest.split_once(",ed25519=").unwrap();
        assert_eq!(kid, key.kid);
        assert!(kid.starts_with("ds_"));
        let sig = URL_SAFE_NO_PAD.decode(sig).unwrap();
        let public = UnparsedPublicKey::new(&ED25519, &key.public);
        assert!(public.verify(b"1700000000.{\"a\":1}", &sig).is_ok());
        assert!(public.verify(b"1700000000.{\"a\":2}", &sig).is_err());
        assert!(public.verify(b"1700000001.{\"a\":1}", &sig).is_err());
    }

    #[test]
    fn the_kid_is_the_keys_thumbprint() {
        let a = SigningKey::from_seed(&[1u8; 32]).unwrap();
        let b = SigningKey::from_seed(&[2u8; 32]).unwrap();
        assert_eq!(a.kid, SigningKey::from_seed(&[1u8; 32]).unwrap().kid);
        assert_ne!(a.kid, b.kid);
        assert_eq!(a.jwk()["x"].as_str().unwrap().len(), 43);
    }
}
