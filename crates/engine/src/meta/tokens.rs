//! Access tokens and server keys in the metadata database. Rows only: what a token
//! means (scopes, namespaces, hashing) is the HTTP edge's `auth` module.

use sqlx::Row;

use super::Meta;
use crate::error::Result;

/// One token as stored: never the secret, only its SHA-256.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRow {
    pub id: String,
    pub secret_hash: Vec<u8>,
    /// The token that issued this one (`None` for the bootstrap token).
    pub parent_id: Option<String>,
    pub description: String,
    /// The scopes in their text form (`read,append:orders/**`), one per line.
    pub scopes: String,
    /// Prepended to every stream name the token addresses; empty for none.
    pub namespace: String,
    pub created_ms: u64,
    pub expires_ms: Option<u64>,
    pub revoked_ms: Option<u64>,
}

fn token_row(r: &sqlx::sqlite::SqliteRow) -> TokenRow {
    TokenRow {
        id: r.get(0),
        secret_hash: r.get(1),
        parent_id: r.get(2),
        description: r.get(3),
        scopes: r.get(4),
        namespace: r.get(5),
        created_ms: r.get::<i64, _>(6) as u64,
        expires_ms: r.get::<Option<i64>, _>(7).map(|v| v as u64),
        revoked_ms: r.get::<Option<i64>, _>(8).map(|v| v as u64),
    }
}

impl Meta {
    /// Every token, revoked ones included (they stay as a record of what existed).
    pub async fn tokens(&self) -> Result<Vec<TokenRow>> {
        let rows = sqlx::query("SELECT id, secret_hash, parent_id, description, scopes, namespace, created_ms, expires_ms, revoked_ms FROM tokens ORDER BY created_ms, id")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(token_row).collect())
    }

    /// Inserts `t`, or replaces the row with its id (the bootstrap token's rotation).
    pub async fn put_token(&self, t: &TokenRow) -> Result<()> {
        self.wrote_locally();
        // An upsert on the id only: a secret hash already held by another token is an
        // error, never a silent replacement of that token.
        sqlx::query("INSERT INTO tokens (id, secret_hash, parent_id, description, scopes, namespace, created_ms, expires_ms, revoked_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET secret_hash = excluded.secret_hash, parent_id = excluded.parent_id, description = excluded.description, scopes = excluded.scopes, namespace = excluded.namespace, created_ms = excluded.created_ms, expires_ms = excluded.expires_ms, revoked_ms = excluded.revoked_ms")
            .bind(&t.id)
            .bind(&t.secret_hash)
            .bind(&t.parent_id)
            .bind(&t.description)
            .bind(&t.scopes)
            .bind(&t.namespace)
            .bind(t.created_ms as i64)
            .bind(t.expires_ms.map(|v| v as i64))
            .bind(t.revoked_ms.map(|v| v as i64))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Marks `ids` revoked at `at_ms` (those already revoked keep their time).
    pub async fn revoke_tokens(&self, ids: &[String], at_ms: u64) -> Result<()> {
        self.wrote_locally();
        let mut tx = self.pool.begin().await?;
        for id in ids {
            sqlx::query("UPDATE tokens SET revoked_ms = COALESCE(revoked_ms, ?) WHERE id = ?")
                .bind(at_ms as i64)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The key named `name`, created from `fresh` if there is none yet; the stored
    /// one wins, so every start of the node signs with the same key.
    pub async fn server_key(&self, name: &str, fresh: &[u8]) -> Result<Vec<u8>> {
        self.wrote_locally();
        sqlx::query("INSERT OR IGNORE INTO server_keys (name, key) VALUES (?, ?)")
            .bind(name)
            .bind(fresh)
            .execute(&self.pool)
            .await?;
        let row = sqlx::query("SELECT key FROM server_keys WHERE name = ?")
            .bind(name)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.get(0))
    }

    /// Live streams whose names start with `prefix`, counting no further than `limit`.
    pub async fn count_streams_with_prefix(&self, prefix: &str, limit: u64) -> Result<u64> {
        let n: i64 = sqlx::query("SELECT COUNT(*) FROM (SELECT 1 FROM streams WHERE soft_deleted = 0 AND substr(name, 1, ?) = ? LIMIT ?)")
            .bind(prefix.len() as i64)
            .bind(prefix)
            .bind(limit as i64)
            .fetch_one(&self.pool)
            .await?
            .get(0);
        Ok(n as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, hash: u8) -> TokenRow {
        TokenRow {
            id: id.into(),
            secret_hash: vec![hash; 32],
            parent_id: None,
            description: "d".into(),
            scopes: "read:**".into(),
            namespace: String::new(),
            created_ms: 1,
            expires_ms: Some(5),
            revoked_ms: None,
        }
    }

    #[tokio::test]
    async fn tokens_round_trip_and_revoke() {
        let meta = Meta::open("sqlite::memory:").await.unwrap();
        meta.put_token(&row("a", 1)).await.unwrap();
        meta.put_token(&row("b", 2)).await.unwrap();
        assert_eq!(meta.tokens().await.unwrap(), vec![row("a", 1), row("b", 2)]);
        meta.revoke_tokens(&["a".into()], 10).await.unwrap();
        meta.revoke_tokens(&["a".into()], 20).await.unwrap();
        let all = meta.tokens().await.unwrap();
        assert_eq!(all[0].revoked_ms, Some(10));
        assert_eq!(all[1].revoked_ms, None);
        // Two tokens can never share a hash, and a clash leaves both rows alone.
        assert!(meta.put_token(&row("c", 2)).await.is_err());
        assert_eq!(meta.tokens().await.unwrap().len(), 2);
        // The same id replaces its row (the bootstrap token's rotation).
        meta.put_token(&row("b", 3)).await.unwrap();
        assert_eq!(meta.tokens().await.unwrap()[1].secret_hash, vec![3; 32]);
    }

    #[tokio::test]
    async fn server_key_is_created_once() {
        let meta = Meta::open("sqlite::memory:").await.unwrap();
        assert_eq!(meta.server_key("k", &[1, 2]).await.unwrap(), vec![1, 2]);
        assert_eq!(meta.server_key("k", &[3, 4]).await.unwrap(), vec![1, 2]);
    }
}
