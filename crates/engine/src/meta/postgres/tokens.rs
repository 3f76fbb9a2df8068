//! Access tokens and server keys in Postgres. Rows only, written by `apply` from the
//! WAL's system chunk: what a token means (scopes, namespaces, hashing) is the HTTP
//! edge's `auth` module. Also the namespace count, a prefix range of the name index.

use sqlx::{PgConnection, PgPool, Row};

use super::prefix_end;
use crate::error::Result;
use crate::wal::format::TokenRecord;

fn token_record(r: &sqlx::postgres::PgRow) -> TokenRecord {
    TokenRecord {
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

/// Every token, revoked ones included (they stay as a record of what existed).
pub(super) async fn all(pool: &PgPool) -> Result<Vec<TokenRecord>> {
    let rows = sqlx::query("SELECT id, secret_hash, parent_id, description, scopes, namespace, created_ms, expires_ms, revoked_ms FROM tokens ORDER BY created_ms, id")
        .fetch_all(pool)
        .await?;
    Ok(rows.iter().map(token_record).collect())
}

/// Inserts `t`, or replaces the row with its id (the bootstrap token's rotation). A
/// secret hash already held by another token is left alone: the edge refuses such a
/// token before it is logged, and a replay must not fail the index on it. (SQLite
/// says this with a second `ON CONFLICT DO NOTHING`; Postgres takes one clause.)
pub(super) async fn put(tx: &mut PgConnection, t: &TokenRecord) -> Result<()> {
    sqlx::query("INSERT INTO tokens (id, secret_hash, parent_id, description, scopes, namespace, created_ms, expires_ms, revoked_ms)
        SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9
        WHERE NOT EXISTS (SELECT 1 FROM tokens WHERE secret_hash = $2 AND id <> $1)
        ON CONFLICT (id) DO UPDATE SET secret_hash = excluded.secret_hash, parent_id = excluded.parent_id, description = excluded.description, scopes = excluded.scopes, namespace = excluded.namespace, created_ms = excluded.created_ms, expires_ms = excluded.expires_ms, revoked_ms = excluded.revoked_ms")
        .bind(&t.id)
        .bind(&t.secret_hash)
        .bind(&t.parent_id)
        .bind(&t.description)
        .bind(&t.scopes)
        .bind(&t.namespace)
        .bind(t.created_ms as i64)
        .bind(t.expires_ms.map(|v| v as i64))
        .bind(t.revoked_ms.map(|v| v as i64))
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Marks `ids` revoked at `at_ms` (those already revoked keep their time).
pub(super) async fn revoke(tx: &mut PgConnection, ids: &[String], at_ms: u64) -> Result<()> {
    sqlx::query("UPDATE tokens SET revoked_ms = COALESCE(revoked_ms, $1) WHERE id = ANY($2)")
        .bind(at_ms as i64)
        .bind(ids)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The first key logged under `name` wins.
pub(super) async fn put_server_key(tx: &mut PgConnection, name: &str, key: &[u8]) -> Result<()> {
    sqlx::query(
        "INSERT INTO server_keys (name, key) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
    )
    .bind(name)
    .bind(key)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

pub(super) async fn server_key(pool: &PgPool, name: &str) -> Result<Option<Vec<u8>>> {
    let row = sqlx::query("SELECT key FROM server_keys WHERE name = $1")
        .bind(name)
        .fetch_optional(pool)
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// Live streams whose names start with `prefix`, counting no further than `limit`.
pub(super) async fn count_streams_with_prefix(
    pool: &PgPool,
    prefix: &str,
    limit: u64,
) -> Result<u64> {
    let query = match prefix_end(prefix) {
        Some(end) => sqlx::query("SELECT COUNT(*) FROM (SELECT 1 FROM streams WHERE NOT soft_deleted AND name >= $1 AND name < $3 LIMIT $2) AS t")
            .bind(prefix)
            .bind(limit as i64)
            .bind(end),
        None => sqlx::query("SELECT COUNT(*) FROM (SELECT 1 FROM streams WHERE NOT soft_deleted AND starts_with(name, $1) LIMIT $2) AS t")
            .bind(prefix)
            .bind(limit as i64),
    };
    let n: i64 = query.fetch_one(pool).await?.get(0);
    Ok(n as u64)
}
