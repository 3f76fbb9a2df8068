//! What only Postgres has: generic plans that stay on the primary keys at scale,
//! migrations that nodes starting together run once, errors that never show the
//! password, and the prefix bound of name ranges. The behaviour both stores share
//! is the contract suite's (`tests/meta_contract.rs`).

use picomq_testkit::postgres::{with_database, Database};
use sqlx::Connection;

use super::apply::{TOUCH_SQL, UPDATE_STREAMS_SQL};
use super::*;

#[test]
fn prefix_end_bounds_exactly_the_names_with_the_prefix() {
    assert_eq!(prefix_end("a/"), Some("a0".into()));
    assert_eq!(prefix_end("é"), Some("ê".into()));
    assert_eq!(prefix_end("x\u{D7FF}"), Some("x\u{E000}".into()));
    assert_eq!(prefix_end("x\u{10FFFF}"), Some("y".into()));
    assert_eq!(prefix_end("\u{10FFFF}"), None);
    assert_eq!(prefix_end(""), None);
    for name in ["a/", "a/b", "a/\u{10FFFF}\u{10FFFF}"] {
        assert!(("a/".."a0").contains(&name), "{name}");
    }
}

/// Streams and chunk rows enough that a scan costs more than lookups.
const SEED_ROWS: i64 = 200_000;

async fn seeded(url: &str) -> PostgresMeta {
    let meta = PostgresMeta::open(url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO streams (id, name, content_type, created_ms, tail, last_access_ms, retention_secs)
             SELECT g, 'n/' || g, 'text/plain', 0, 10, 0, CASE WHEN g % 100 = 0 THEN 60 END
             FROM generate_series(1, {SEED_ROWS}) g;
         INSERT INTO chunks (stream_id, start_pos, end_pos, object_key, byte_start, byte_end, last_ts_ms)
             SELECT g, 0, 10, 'wal/' || lpad((g / 100)::text, 12, '0'), 0, 10, g
             FROM generate_series(1, {SEED_ROWS}) g;
         ANALYZE"
    )))
    .execute(meta.pool())
    .await
    .unwrap();
    meta
}

/// The generic plan of `sql` (what a prepared statement settles on after a few
/// runs) with `args`, as `EXPLAIN` prints it.
async fn generic_plan(meta: &PostgresMeta, sql: &str, args: &str) -> String {
    let mut conn = meta.pool().acquire().await.unwrap();
    let prepare = format!("SET plan_cache_mode = force_generic_plan; PREPARE q AS {sql}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(prepare))
        .execute(&mut *conn)
        .await
        .unwrap();
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN EXECUTE q({args})")))
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    sqlx::raw_sql("DEALLOCATE q; RESET plan_cache_mode")
        .execute(&mut *conn)
        .await
        .unwrap();
    let lines: Vec<String> = rows.iter().map(|r| r.get::<String, _>(0)).collect();
    lines.join("\n")
}

fn assert_no_scan(plan: &str, table: &str) {
    assert!(!plan.contains(&format!("Seq Scan on {table}")), "{plan}");
}

#[tokio::test]
async fn generic_plans_look_rows_up_by_primary_key() {
    with_database("plans", |url| async move {
        let meta = seeded(&url).await;
        let ids = "'{5,70000,199999}'::bigint[]";
        let update = generic_plan(
            &meta,
            UPDATE_STREAMS_SQL,
            &format!("{ids}, '{{1,2,3}}', '{{f,f,t}}', '{{NULL,NULL,NULL}}', '{{NULL,NULL,a}}', '{{1,2,3}}', '{{1,2,3}}'"),
        )
        .await;
        assert!(update.contains("streams_pkey"), "{update}");
        assert_no_scan(&update, "streams");
        let touch = generic_plan(&meta, TOUCH_SQL, &format!("{ids}, '{{1,2,3}}'")).await;
        assert!(touch.contains("streams_pkey"), "{touch}");
        assert_no_scan(&touch, "streams");
        let retention = generic_plan(&meta, RETENTION_CANDIDATES_SQL, "1000, '', 100").await;
        assert!(retention.contains("chunks_pkey"), "{retention}");
        assert!(retention.contains("streams_with_retention"), "{retention}");
        assert_no_scan(&retention, "chunks");
        assert_no_scan(&retention, "streams");
        let objects = format!(
            "SELECT {INDEX_COLUMNS} FROM chunks c JOIN UNNEST($1::text[]) WITH ORDINALITY AS k(key, n) ON c.object_key = k.key ORDER BY k.n, c.stream_id, c.start_pos"
        );
        let objects = generic_plan(&meta, &objects, "'{wal/000000000007}'").await;
        assert!(objects.contains("chunks_by_object"), "{objects}");
        assert_no_scan(&objects, "chunks");
    })
    .await;
}

/// The listing and namespace count read a range of the name index, not every name
/// after the cursor.
#[tokio::test]
async fn prefixes_read_a_range_of_the_name_index() {
    with_database("prefix_plans", |url| async move {
        let meta = seeded(&url).await;
        let list = generic_plan(&meta, LIST_RANGE_SQL, "'', 'n/7', 10, 'n/8'").await;
        assert!(list.contains("streams_by_name"), "{list}");
        assert!(
            list.contains("name >= $2") && list.contains("name < $4"),
            "{list}"
        );
        assert_eq!(
            meta.count_streams_with_prefix("n/19999", 100)
                .await
                .unwrap(),
            11
        );
        let listed = meta.list("n/19999", "", 100).await.unwrap();
        assert_eq!(listed.len(), 11);
    })
    .await;
}

/// Nodes starting together against a new database: one migrates, the others wait
/// for it and find the schema in place.
#[tokio::test]
async fn concurrent_opens_migrate_once() {
    with_database("migrate", |url| async move {
        let opens = (0..4).map(|_| PostgresMeta::open(&url));
        let metas = futures::future::try_join_all(opens).await.unwrap();
        let versions: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM schema_version ORDER BY version")
                .fetch_all(metas[0].pool())
                .await
                .unwrap();
        let all: Vec<i64> = (1..=SCHEMA_VERSION).collect();
        assert_eq!(versions, all, "each migration applied once");
        // And again, on a database already at this version.
        let again = PostgresMeta::open(&url).await.unwrap();
        assert_eq!(again.next_stream_id().await.unwrap(), 1);
    })
    .await;
}

/// A database of a newer schema is refused, not written to.
#[tokio::test]
async fn a_newer_schema_is_refused() {
    with_database("newer", |url| async move {
        let meta = PostgresMeta::open(&url).await.unwrap();
        sqlx::query("INSERT INTO schema_version (version) VALUES ($1)")
            .bind(SCHEMA_VERSION + 1)
            .execute(meta.pool())
            .await
            .unwrap();
        let err = PostgresMeta::open(&url).await.err().expect("refused");
        assert!(err.to_string().contains("upgrade PicoMQ"), "{err}");
    })
    .await;
}

/// Connection errors name the database URL, never its password.
#[tokio::test]
async fn errors_name_the_url_without_its_password() {
    let database = Database::create("password").await;
    let mut url = url::Url::parse(&database.url).unwrap();
    url.set_password(Some("not-the-password-0451")).unwrap();
    let err = PostgresMeta::open(url.as_str())
        .await
        .err()
        .expect("refused");
    let text = err.to_string();
    database.drop().await;
    assert!(!text.contains("not-the-password-0451"), "{text}");
    url.set_password(None).unwrap();
    assert!(text.contains(url.as_str()), "{text}");
    assert!(text.contains("password authentication failed"), "{text}");
    let shown = redacted_url("postgres://u:secret@h:5/db?sslmode=require&password=two");
    assert_eq!(shown, "postgres://u@h:5/db?sslmode=require");
}

/// The pool's sessions carry the statement timeout, unless the URL sets its own.
#[tokio::test]
async fn sessions_time_out_long_statements() {
    with_database("timeouts", |url| async move {
        let meta = PostgresMeta::open(&url).await.unwrap();
        let timeout: String = sqlx::query_scalar("SHOW statement_timeout")
            .fetch_one(meta.pool())
            .await
            .unwrap();
        assert_eq!(timeout, STATEMENT_TIMEOUT);
        let own = format!("{url}?options=-c%20statement_timeout%3D5s");
        let meta = PostgresMeta::open(&own).await.unwrap();
        let mut conn = meta.pool().acquire().await.unwrap();
        let timeout: String = sqlx::query_scalar("SHOW statement_timeout")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(timeout, "5s");
        conn.ping().await.unwrap();
    })
    .await;
}
