//! Access tokens and server keys, as the engine stores them: every change is an op
//! in the WAL's system chunk, answered once durable and indexed, so tokens survive
//! exactly as streams do, including a rebuild from the bucket alone. What a token
//! means (scopes, namespaces, secrets) is the HTTP edge's `auth` module.

use bytes::Bytes;

use crate::error::{EngineError, Result};
use crate::stream::Service;
use crate::wal::format::{Op, TokenRecord};

impl Service {
    /// Every token, revoked ones included.
    pub async fn tokens(&self) -> Result<Vec<TokenRecord>> {
        self.inner.meta.tokens().await
    }

    /// Creates `token`, or replaces the one with its id.
    pub async fn put_token(&self, token: TokenRecord) -> Result<()> {
        self.inner.wal.check_health()?;
        self.inner.system.commit(vec![Op::PutToken(token)]).await
    }

    /// Revokes `ids` at `at_ms` (tokens already revoked keep their time).
    pub async fn revoke_tokens(&self, ids: Vec<String>, at_ms: u64) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        self.inner.wal.check_health()?;
        self.inner
            .system
            .commit(vec![Op::RevokeTokens { ids, at_ms }])
            .await
    }

    /// The server key `name`, created from `fresh` if there is none yet. The first
    /// one logged wins, so every start of the node signs with the same key.
    pub async fn server_key(&self, name: &str, fresh: &[u8]) -> Result<Vec<u8>> {
        if let Some(key) = self.inner.meta.server_key(name).await? {
            return Ok(key);
        }
        self.inner.wal.check_health()?;
        let op = Op::PutServerKey {
            name: name.to_string(),
            key: Bytes::copy_from_slice(fresh),
        };
        self.inner.system.commit(vec![op]).await?;
        self.inner
            .meta
            .server_key(name)
            .await?
            .ok_or_else(|| EngineError::Internal(format!("server key {name} was not indexed")))
    }
}
