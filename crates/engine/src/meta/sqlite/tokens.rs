//! Access tokens, server keys and schema registry rows in SQLite. Rows only, written by `apply` from the
//! WAL's system chunk: what a token means (scopes, namespaces, hashing) is the HTTP
//! edge's `auth` module.

use sqlx::{Row, SqliteConnection, SqlitePool};

use crate::error::Result;
use crate::wal::format::TokenRecord;

fn token_record(r: &sqlx::sqlite::SqliteRow) -> TokenRecord {
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
pub(super) async fn all(pool: &SqlitePool) -> Result<Vec<TokenRecord>> {
    let rows = sqlx::query("SELECT id, secret_hash, parent_id, description, scopes, namespace, created_ms, expires_ms, revoked_ms FROM tokens ORDER BY created_ms, id")
        .fetch_all(pool)
        .await?;
    Ok(rows.iter().map(token_record).collect())
}

/// Inserts `t`, or replaces the row with its id (the bootstrap token's rotation). A
/// secret hash already held by another token is left alone: the edge refuses such a
/// token before it is logged, and a replay must not fail the index on it.
pub(super) async fn put(tx: &mut SqliteConnection, t: &TokenRecord) -> Result<()> {
    sqlx::query("INSERT INTO tokens (id, secret_hash, parent_id, description, scopes, namespace, created_ms, expires_ms, revoked_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET secret_hash = excluded.secret_hash, parent_id = excluded.parent_id, description = excluded.description, scopes = excluded.scopes, namespace = excluded.namespace, created_ms = excluded.created_ms, expires_ms = excluded.expires_ms, revoked_ms = excluded.revoked_ms ON CONFLICT DO NOTHING")
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
pub(super) async fn revoke(tx: &mut SqliteConnection, ids: &[String], at_ms: u64) -> Result<()> {
    for id in ids {
        sqlx::query("UPDATE tokens SET revoked_ms = COALESCE(revoked_ms, ?) WHERE id = ?")
            .bind(at_ms as i64)
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    Ok(())
}

/// The first key logged under `name` wins.
pub(super) async fn put_server_key(
    tx: &mut SqliteConnection,
    name: &str,
    key: &[u8],
) -> Result<()> {
    sqlx::query("INSERT OR IGNORE INTO server_keys (name, key) VALUES (?, ?)")
        .bind(name)
        .bind(key)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

pub(super) async fn server_key(pool: &SqlitePool, name: &str) -> Result<Option<Vec<u8>>> {
    let row = sqlx::query("SELECT key FROM server_keys WHERE name = ?")
        .bind(name)
        .fetch_optional(pool)
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// Live streams whose names start with `prefix`, counting no further than `limit`.
pub(super) async fn count_streams_with_prefix(
    pool: &SqlitePool,
    prefix: &str,
    limit: u64,
) -> Result<u64> {
    let n: i64 = sqlx::query("SELECT COUNT(*) FROM (SELECT 1 FROM streams WHERE soft_deleted = 0 AND substr(name, 1, ?) = ? LIMIT ?)")
        // substr counts characters of TEXT, not bytes.
        .bind(prefix.chars().count() as i64)
        .bind(prefix)
        .bind(limit as i64)
        .fetch_one(pool)
        .await?
        .get(0);
    Ok(n as u64)
}

/// A schema registry row: written, or with `replace` false left alone if it exists.
/// Every change counts one more in `registry_state`.
pub(super) async fn registry_put(
    tx: &mut SqliteConnection,
    table: &str,
    key: &str,
    value: &str,
    replace: bool,
) -> Result<()> {
    let sql = if replace {
        "INSERT INTO registry (tbl, key, value) VALUES (?, ?, ?) ON CONFLICT(tbl, key) DO UPDATE SET value = excluded.value"
    } else {
        "INSERT OR IGNORE INTO registry (tbl, key, value) VALUES (?, ?, ?)"
    };
    sqlx::query(sql)
        .bind(table)
        .bind(key)
        .bind(value)
        .execute(&mut *tx)
        .await?;
    registry_changed(tx).await
}

pub(super) async fn registry_delete(
    tx: &mut SqliteConnection,
    table: &str,
    key: &str,
) -> Result<()> {
    sqlx::query("DELETE FROM registry WHERE tbl = ? AND key = ?")
        .bind(table)
        .bind(key)
        .execute(&mut *tx)
        .await?;
    registry_changed(tx).await
}

async fn registry_changed(tx: &mut SqliteConnection) -> Result<()> {
    sqlx::query("INSERT INTO registry_state (one, generation) VALUES (1, 1) ON CONFLICT(one) DO UPDATE SET generation = generation + 1")
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Every registry row, as (table, key, value).
pub(super) async fn registry_rows(pool: &SqlitePool) -> Result<Vec<(String, String, String)>> {
    let rows = sqlx::query("SELECT tbl, key, value FROM registry ORDER BY tbl, key")
        .fetch_all(pool)
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

pub(super) async fn registry_generation(pool: &SqlitePool) -> Result<u64> {
    let row = sqlx::query("SELECT COALESCE((SELECT generation FROM registry_state), 0)")
        .fetch_one(pool)
        .await?;
    Ok(row.get::<i64, _>(0) as u64)
}
